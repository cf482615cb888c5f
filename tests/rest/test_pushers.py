"""Pushers over the client API: set, list, replace, remove, ``append``, bad
input, and the pushers stream written by a worker."""

from __future__ import annotations

import json
import os
from typing import Any

from twisted.internet.task import deferLater
from twisted.web.resource import Resource
from twisted.web.server import Site

from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase
from tests.harness.spec import assert_spec_response

URL = "https://push.example/_matrix/push/v1/notify"


def pusher(pushkey: str = "key1", **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "http",
        "app_id": "org.example.app.android",
        "pushkey": pushkey,
        "app_display_name": "Example",
        "device_display_name": "Phone",
        "lang": "en",
        "data": {"url": URL, "format": "event_id_only", "custom": 1},
    }
    body.update(changes)
    return body


class PushersApiTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        _, clients, _ = start_cluster(self, self.test_db)
        self.alice = await ClientApi(self, clients["main"].base_url).register("alice")
        self.bob = await ClientApi(self, clients["main"].base_url).register("bob")

    async def test_set_list_replace_and_remove(self) -> None:
        self.assertEqual(await self.alice.ok("GET", "/pushers"), {"pushers": []})
        await self.alice.ok("POST", "/pushers/set", pusher(profile_tag="tag"))
        listed = await self.alice.ok("GET", "/pushers")
        assert_spec_response(self, "pusher.yaml", "/pushers", "GET", 200, listed)
        [only] = listed["pushers"]
        self.assertEqual((only["pushkey"], only["profile_tag"]), ("key1", "tag"))
        self.assertEqual(only["data"], {"url": URL, "format": "event_id_only", "custom": 1})
        # The same (app_id, pushkey) replaces; another pushkey adds.
        await self.alice.ok("POST", "/pushers/set", pusher(lang="fr"))
        await self.alice.ok("POST", "/pushers/set", pusher("key2"))
        listed = (await self.alice.ok("GET", "/pushers"))["pushers"]
        self.assertEqual(
            [(p["pushkey"], p["lang"]) for p in listed], [("key1", "fr"), ("key2", "en")]
        )
        await self.alice.ok(
            "POST",
            "/pushers/set",
            {"kind": None, "app_id": "org.example.app.android", "pushkey": "key1"},
        )
        listed = (await self.alice.ok("GET", "/pushers"))["pushers"]
        self.assertEqual([p["pushkey"] for p in listed], ["key2"])
        self.assertEqual(await self.bob.ok("GET", "/pushers"), {"pushers": []})

    async def test_append(self) -> None:
        await self.alice.ok("POST", "/pushers/set", pusher("shared"))
        # Without append, bob taking the same pushkey removes alice's.
        await self.bob.ok("POST", "/pushers/set", pusher("shared"))
        self.assertEqual(await self.alice.ok("GET", "/pushers"), {"pushers": []})
        await self.alice.ok("POST", "/pushers/set", pusher("shared", append=True))
        self.assertEqual(len((await self.alice.ok("GET", "/pushers"))["pushers"]), 1)
        self.assertEqual(len((await self.bob.ok("GET", "/pushers"))["pushers"]), 1)

    async def test_bad_input_is_refused_and_nothing_is_stored(self) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            ({k: v for k, v in pusher().items() if k != "kind"}, "M_MISSING_PARAM"),
            ({k: v for k, v in pusher().items() if k != "pushkey"}, "M_MISSING_PARAM"),
            ({k: v for k, v in pusher().items() if k != "lang"}, "M_MISSING_PARAM"),
            ({k: v for k, v in pusher().items() if k != "data"}, "M_MISSING_PARAM"),
            (pusher(kind="email"), "M_INVALID_PARAM"),
            (pusher(kind=7), "M_INVALID_PARAM"),
            (pusher(app_id="a" * 65), "M_INVALID_PARAM"),
            (pusher(pushkey="é" * 300), "M_INVALID_PARAM"),
            (pusher(data={"url": "ftp://push.example/_matrix/push/v1/notify"}), "M_INVALID_PARAM"),
            (pusher(data={"url": "https://push.example/notify"}), "M_INVALID_PARAM"),
            (
                pusher(data={"url": "https://push.example/_matrix/push/v1/notify?" + "x" * 3000}),
                "M_INVALID_PARAM",
            ),
            (pusher(data={"url": "not a url"}), "M_INVALID_PARAM"),
            (pusher(data={}), "M_INVALID_PARAM"),
            (pusher(data={"url": URL, "format": 5}), "M_INVALID_PARAM"),
            (pusher(data="x"), "M_INVALID_PARAM"),
            (pusher(append="yes"), "M_INVALID_PARAM"),
            (pusher(profile_tag=5), "M_INVALID_PARAM"),
        ]
        for body, errcode in cases:
            code, answer = await self.alice.request("POST", "/pushers/set", body)
            self.assertEqual((code, answer["errcode"]), (400, errcode), body)
        self.assertEqual(await self.alice.ok("GET", "/pushers"), {"pushers": []})
        code, _ = await self.alice.request("GET", "/pushers", token=None)
        self.assertEqual(code, 401)


class PushersWorkersTestCase(DatabaseTestCase):
    async def test_written_by_its_worker_and_followed_by_the_others(self) -> None:
        servers, clients, _ = start_cluster(
            self, self.test_db, workers=["writer1"], stream_writers={"pushers": "writer1"}
        )
        self.assertIn("pushers", servers["writer1"].streamer.sourced_stream_names)
        alice = await ClientApi(self, clients["main"].base_url).register("alice")
        # Through main, which forwards to the writer.
        await alice.ok("POST", "/pushers/set", pusher())
        writer_stream = servers["writer1"].streams["pushers"].positions
        position = writer_stream.persisted_upto_position()
        self.assertGreater(position, 0)
        main_stream = servers["main"].streams["pushers"].positions

        def main_followed() -> bool:
            return main_stream.received_position("writer1") >= position

        await eventually(main_followed, what="main to follow the pushers stream")
        listed = (await alice.ok("GET", "/pushers"))["pushers"]
        self.assertEqual([p["pushkey"] for p in listed], ["key1"])


class Gateway(Resource):
    """A push gateway: records each notification; can be told to fail
    (status 500) or to reject pushkeys."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.received: list[dict[str, Any]] = []
        self.failing = False
        self.rejected: list[str] = []

    def render_POST(self, request: Any) -> bytes:
        if self.failing:
            request.setResponseCode(500)
            return b"down"
        body = json.loads(request.content.read())
        self.received.append(body["notification"])
        return json.dumps({"rejected": self.rejected}).encode()


class DeliveryTestCase(DatabaseTestCase):
    async def test_delivered_in_order_retried_and_removed_when_rejected(self) -> None:
        from twisted.internet import reactor

        from synapse_lite.handlers import pusher_delivery

        self.patch(pusher_delivery, "POLL_SECONDS", 0.05)
        self.patch(pusher_delivery, "FIRST_BACKOFF_SECONDS", 0.2)
        gateway = Gateway()
        any_reactor: Any = reactor
        port = any_reactor.listenTCP(0, Site(gateway), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        url = f"http://127.0.0.1:{port.getHost().port}/_matrix/push/v1/notify"
        _, clients, _ = start_cluster(self, self.test_db)
        base = clients["main"].base_url
        alice = await ClientApi(self, base).register("alice")
        bob = await ClientApi(self, base).register("bob")
        room_id = await alice.create_room(preset="public_chat")
        await bob.ok("POST", f"/join/{room_id}")
        await alice.send(room_id, "before the pusher")  # not pushed: older than it
        await bob.ok("POST", "/pushers/set", pusher(data={"url": url}))
        for i in range(3):
            await alice.send(room_id, f"message {i}")

        def bodies() -> list[str]:
            return [n.get("content", {}).get("body") for n in gateway.received]

        await eventually(lambda: len(gateway.received) >= 3, what="three notifications")
        self.assertEqual(bodies(), ["message 0", "message 1", "message 2"])
        first = gateway.received[0]
        self.assertEqual(first["room_id"], room_id)
        self.assertEqual(first["sender"], alice.user_id)
        self.assertEqual(first["devices"][0]["pushkey"], "key1")
        self.assertNotIn("url", first["devices"][0]["data"])

        # The gateway down: nothing lost, nothing repeated once it is back.
        gateway.failing = True
        await alice.send(room_id, "while down 1")
        await alice.send(room_id, "while down 2")
        await deferLater(reactor, 0.5, lambda: None)
        self.assertEqual(len(gateway.received), 3)
        gateway.failing = False
        await eventually(lambda: len(gateway.received) >= 5, timeout=10, what="the backlog")
        await deferLater(reactor, 0.3, lambda: None)
        self.assertEqual(bodies()[3:], ["while down 1", "while down 2"])

        # A rejected pushkey: the pusher is removed.
        gateway.rejected = ["key1"]
        await alice.send(room_id, "last one")

        async def removed() -> bool:
            return (await bob.ok("GET", "/pushers"))["pushers"] == []

        await eventually(removed, what="the rejected pusher to be removed")
        await alice.send(room_id, "never pushed")
        await deferLater(reactor, 0.3, lambda: None)
        self.assertEqual(bodies()[-1], "last one")


class ShardedDeliveryTestCase(DatabaseTestCase):
    async def test_each_pusher_delivered_once_and_resumed_after_a_restart(self) -> None:
        from twisted.internet import reactor

        from synapse_lite.handlers import pusher_delivery
        from tests.harness.server import make_homeserver

        self.patch(pusher_delivery, "POLL_SECONDS", 0.05)
        gateway = Gateway()
        any_reactor: Any = reactor
        port = any_reactor.listenTCP(0, Site(gateway), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        url = f"http://127.0.0.1:{port.getHost().port}/_matrix/push/v1/notify"
        instances = ["main", "pusher1"]
        servers, clients, bus = start_cluster(
            self, self.test_db, workers=["pusher1"], pusher_instances=instances
        )
        base = clients["main"].base_url
        alice = await ClientApi(self, base).register("alice")
        bob = await ClientApi(self, base).register("bob")
        room_id = await alice.create_room(preset="public_chat")
        await bob.ok("POST", f"/join/{room_id}")
        keys = [f"key{i}" for i in range(6)]
        owners = {
            pusher_delivery.owner_of(("org.example.app.android", k, bob.user_id or ""), instances)
            for k in keys
        }
        self.assertEqual(owners, set(instances))  # both instances own some
        for key in keys:
            await bob.ok("POST", "/pushers/set", pusher(key, data={"url": url}, append=True))

        def per_key() -> dict[str, list[str]]:
            found: dict[str, list[str]] = {k: [] for k in keys}
            for n in gateway.received:
                found[n["devices"][0]["pushkey"]].append(n["content"]["body"])
            return found

        for i in range(3):
            last = await alice.send(room_id, f"m{i}")
        await eventually(lambda: len(gateway.received) >= 18, timeout=10, what="18 deliveries")
        store = servers["main"].store
        event = await store.get_event(last)
        assert event is not None

        async def positions_stored() -> bool:
            pushers = await store.get_all_pushers()
            return all(p.last_stream_ordering >= event.stream_ordering for p in pushers)

        # A process stopped between a gateway's answer and recording it would
        # push that one again (at least once): stop it after the recording.
        await eventually(positions_stored, what="the positions to be recorded")

        # pusher1 stops; what its pushers miss meanwhile is delivered by the
        # restarted process, from the position it stored.
        worker = servers["pusher1"]
        bus.leave(next(e for e in bus.endpoints if e.hs is worker))
        await worker.service.stopService()
        for i in range(3, 5):
            await alice.send(room_id, f"m{i}")
        restarted = make_homeserver(self, worker.config, "pusher1")
        bus.join(restarted)
        await eventually(lambda: len(gateway.received) >= 30, timeout=10, what="30 deliveries")
        await deferLater(reactor, 0.3, lambda: None)
        expected = [f"m{i}" for i in range(5)]
        self.assertEqual(per_key(), {k: expected for k in keys})


class WokenDeliveryTestCase(DatabaseTestCase):
    """Delivery is woken by new events, not only by its poll: with the poll
    an hour away, notifications still go out, on the events writer itself
    (its own ids finishing) and on a pusher worker (replication rows), and
    more than a batch at a time (a full batch looks again at once)."""

    async def check_woken(self, **cluster: Any) -> None:
        from twisted.internet import reactor

        from synapse_lite.handlers import pusher_delivery

        self.patch(pusher_delivery, "POLL_SECONDS", 3600.0)
        self.patch(pusher_delivery, "BATCH", 2)
        self.patch(pusher_delivery, "FIRST_BACKOFF_SECONDS", 0.01)
        gateway = Gateway()
        any_reactor: Any = reactor
        port = any_reactor.listenTCP(0, Site(gateway), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        url = f"http://127.0.0.1:{port.getHost().port}/_matrix/push/v1/notify"
        _, clients, _ = start_cluster(self, self.test_db, **cluster)
        base = clients["main"].base_url
        alice = await ClientApi(self, base).register("alice")
        bob = await ClientApi(self, base).register("bob")
        room_id = await alice.create_room(preset="public_chat")
        await bob.ok("POST", f"/join/{room_id}")
        await bob.ok("POST", "/pushers/set", pusher(data={"url": url}))
        # The pusher may be listed only after the first wake-up: no
        # notification is older than it, so each send wakes delivery again.
        for i in range(5):
            await alice.send(room_id, f"message {i}")
        await eventually(lambda: len(gateway.received) >= 5, timeout=10, what="five pushes")
        bodies = [n["content"]["body"] for n in gateway.received]
        self.assertEqual(bodies, [f"message {i}" for i in range(5)])

        # A backlog of three batches (the gateway was down), woken once.
        gateway.failing = True
        for i in range(5, 11):
            await alice.send(room_id, f"message {i}")
        await deferLater(reactor, 0.2, lambda: None)
        gateway.failing = False
        await alice.send(room_id, "message 11")
        await eventually(lambda: len(gateway.received) >= 12, timeout=10, what="the backlog")
        bodies = [n["content"]["body"] for n in gateway.received]
        self.assertEqual(bodies, [f"message {i}" for i in range(12)])

    async def test_woken_on_the_events_writer(self) -> None:
        await self.check_woken()

    async def test_woken_on_a_pusher_worker(self) -> None:
        await self.check_woken(workers=["pusher1"], pusher_instances=["pusher1"])


async def gateway_url(testcase: DatabaseTestCase, gateway: Gateway) -> str:
    from twisted.internet import reactor

    any_reactor: Any = reactor
    port = any_reactor.listenTCP(0, Site(gateway), interface="127.0.0.1")
    testcase.addCleanup(port.stopListening)
    return f"http://127.0.0.1:{port.getHost().port}/_matrix/push/v1/notify"


class NotificationContentTestCase(DatabaseTestCase):
    """What a gateway is told (the Push Gateway API's ``notification``): the
    event, its room's name and alias, the sender's name, whether a
    membership event is about the user, the unread count over every room;
    a read receipt sends the new count alone; ``event_id_only`` sends ids."""

    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        from synapse_lite.handlers import pusher_delivery

        self.patch(pusher_delivery, "POLL_SECONDS", 0.05)
        self.gateway = Gateway()
        self.url = await gateway_url(self, self.gateway)
        _, clients, _ = start_cluster(self, self.test_db)
        base = clients["main"].base_url
        self.alice = await ClientApi(self, base).register("alice")
        self.bob = await ClientApi(self, base).register("bob")

    async def next_push(self, count: int) -> dict[str, Any]:
        await eventually(lambda: len(self.gateway.received) >= count, what=f"push {count}")
        return self.gateway.received[count - 1]

    async def test_full_format(self) -> None:
        await self.bob.ok("POST", "/pushers/set", pusher(data={"url": self.url, "custom": 1}))
        [listed] = (await self.bob.ok("GET", "/pushers"))["pushers"]
        room_id = await self.alice.create_room(preset="private_chat")
        await self.alice.ok("POST", f"/rooms/{room_id}/invite", {"user_id": self.bob.user_id})
        invite = await self.next_push(1)
        self.assertEqual(
            (invite["type"], invite["membership"], invite["user_is_target"]),
            ("m.room.member", "invite", True),
        )
        self.assertEqual((invite["room_id"], invite["sender"]), (room_id, self.alice.user_id))
        self.assertEqual(invite["id"], invite["event_id"])
        self.assertEqual(invite["counts"], {"unread": 0})  # not joined: counted from the join
        [device] = invite["devices"]
        self.assertEqual((device["app_id"], device["pushkey"]), (listed["app_id"], "key1"))
        self.assertEqual(device["data"], {"custom": 1})  # without the url
        self.assertGreater(device["pushkey_ts"], 1_600_000_000)
        self.assertLess(device["pushkey_ts"], 100_000_000_000)  # seconds, not ms

        await self.bob.ok("POST", f"/join/{room_id}")
        first = await self.alice.send(room_id, "no name yet")
        pushed = await self.next_push(2)
        self.assertEqual(pushed["event_id"], first)
        self.assertNotIn("room_name", pushed)
        self.assertEqual(pushed["sender_display_name"], "alice")
        # The message, and the invite (a notification of bob's own, unread).
        self.assertEqual(pushed["counts"], {"unread": 2})

        alias = "#named:test.local"
        await self.alice.ok("PUT", "/directory/room/%23named:test.local", {"room_id": room_id})
        await self.alice.ok(
            "PUT", f"/rooms/{room_id}/state/m.room.canonical_alias", {"alias": alias}
        )
        await self.alice.send(room_id, "an alias")
        pushed = await self.next_push(3)
        self.assertEqual((pushed["room_name"], pushed["room_alias"]), (alias, alias))
        self.assertEqual(pushed["counts"], {"unread": 3})

        await self.alice.ok("PUT", f"/rooms/{room_id}/state/m.room.name", {"name": "Garden"})
        last = await self.alice.send(room_id, "a name")
        pushed = await self.next_push(4)
        self.assertEqual((pushed["room_name"], pushed["room_alias"]), ("Garden", alias))
        self.assertEqual(pushed["content"], {"msgtype": "m.text", "body": "a name"})

        # Bob reads: the gateway hears the new count alone.
        await self.bob.ok("POST", f"/rooms/{room_id}/receipt/m.read/{last}", {})
        badge = await self.next_push(5)
        self.assertEqual(badge["counts"], {"unread": 0})
        self.assertNotIn("event_id", badge)
        self.assertEqual(badge["devices"][0]["pushkey"], "key1")
        # Once: nothing more without a new receipt.
        await deferLater(reactor_any(), 0.3, lambda: None)
        self.assertEqual(len(self.gateway.received), 5)

    async def test_event_id_only(self) -> None:
        await self.bob.ok(
            "POST",
            "/pushers/set",
            pusher(data={"url": self.url, "format": "event_id_only"}),
        )
        room_id = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room_id}")
        event_id = await self.alice.send(room_id, "secret words")
        pushed = await self.next_push(1)
        self.assertEqual(set(pushed), {"event_id", "room_id", "counts", "prio", "devices"})
        self.assertEqual((pushed["event_id"], pushed["room_id"]), (event_id, room_id))

    async def test_unknown_format_is_kept_and_gets_the_full_format(self) -> None:
        # The spec defines event_id_only only; another string is the client's.
        await self.bob.ok(
            "POST", "/pushers/set", pusher(data={"url": self.url, "format": "id_event_only"})
        )
        [listed] = (await self.bob.ok("GET", "/pushers"))["pushers"]
        self.assertEqual(listed["data"]["format"], "id_event_only")
        room_id = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room_id}")
        await self.alice.send(room_id, "hello")
        pushed = await self.next_push(1)
        self.assertEqual(pushed["content"]["body"], "hello")


def reactor_any() -> Any:
    from twisted.internet import reactor

    return reactor


class HttpsGatewayTestCase(DatabaseTestCase):
    """A gateway serving HTTPS with a certificate of a private CA is reached
    when ``outbound_requests.extra_ca_paths`` names that CA, and never otherwise
    (verification stays on)."""

    async def deliveries(self, trust: bool) -> tuple[Gateway, ClientApi, str]:

        from synapse_lite.handlers import pusher_delivery
        from tests.harness.tls import TestCA

        self.patch(pusher_delivery, "POLL_SECONDS", 0.05)
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        ca = TestCA(directory)
        options = ca.server_options("gateway", ["localhost"])
        gateway = Gateway()
        port = reactor_any().listenSSL(0, Site(gateway), options, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        url = f"https://localhost:{port.getHost().port}/_matrix/push/v1/notify"
        trusted = {"outbound_requests": {"extra_ca_paths": [ca.ca_path]}}
        extra: dict[str, Any] = trusted if trust else {}
        _, clients, _ = start_cluster(self, self.test_db, **extra)
        base = clients["main"].base_url
        alice = await ClientApi(self, base).register("alice")
        bob = await ClientApi(self, base).register("bob")
        room_id = await alice.create_room(preset="public_chat")
        await bob.ok("POST", f"/join/{room_id}")
        await bob.ok("POST", "/pushers/set", pusher(data={"url": url}))
        await alice.send(room_id, "over TLS")
        return gateway, alice, room_id

    async def test_trusted_ca(self) -> None:
        gateway, _, _ = await self.deliveries(trust=True)
        await eventually(lambda: len(gateway.received) >= 1, what="a push over TLS")
        self.assertEqual(gateway.received[0]["content"]["body"], "over TLS")

    async def test_untrusted_ca(self) -> None:
        gateway, _, _ = await self.deliveries(trust=False)
        await deferLater(reactor_any(), 1.0, lambda: None)
        self.assertEqual(gateway.received, [])


class DevicePushersTestCase(DatabaseTestCase):
    """A pusher belongs to the device whose token set it: logging the device
    out (or a password change logging the other devices out) removes it;
    the requesting device's pushers stay. The same with the pushers stream
    written by a worker."""

    async def check(self, **cluster: Any) -> None:
        _, clients, _ = start_cluster(self, self.test_db, **cluster)
        base = clients["main"].base_url
        alice = await ClientApi(self, base).register("alice")

        async def another_device() -> ClientApi:
            login = {"type": "m.login.password", "user": "alice", "password": "secret-pw"}
            code, body = await alice.request("POST", "/login", login, token=None)
            self.assertEqual(code, 200, body)
            return alice.as_user(body["access_token"])

        phone, tablet = await another_device(), await another_device()
        await phone.ok("POST", "/pushers/set", pusher("phone"))
        await tablet.ok("POST", "/pushers/set", pusher("tablet"))
        await alice.ok("POST", "/pushers/set", pusher("laptop"))

        async def pushkeys() -> list[str]:
            return sorted(p["pushkey"] for p in (await alice.ok("GET", "/pushers"))["pushers"])

        self.assertEqual(await pushkeys(), ["laptop", "phone", "tablet"])
        await tablet.ok("POST", "/logout", {})
        self.assertEqual(await pushkeys(), ["laptop", "phone"])
        await alice.ok(
            "POST",
            "/account/password",
            {
                "new_password": "new-pw",
                "auth": {
                    "type": "m.login.password",
                    "identifier": {"type": "m.id.user", "user": "alice"},
                    "password": "secret-pw",
                },
            },
        )
        self.assertEqual(await pushkeys(), ["laptop"])
        code, _ = await phone.request("GET", "/pushers")
        self.assertEqual(code, 401)

    async def test_monolith(self) -> None:
        await self.check()

    async def test_pushers_written_by_a_worker(self) -> None:
        await self.check(workers=["writer1"], stream_writers={"pushers": "writer1"})
