"""Transactions to an application service, on a real socket: the events
that concern it, in order, retried with the same id while it fails, and
neither lost nor repeated over a restart of the homeserver."""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor
from twisted.internet.task import deferLater

from synapse_lite.appservice import sender as sender_module
from synapse_lite.appservice.sender import (
    DEVICE_LISTS_FIELD as DEVICE_LISTS,
)
from synapse_lite.appservice.sender import (
    FALLBACK_KEYS_FIELD as FALLBACK_KEYS,
)
from synapse_lite.appservice.sender import (
    OTK_COUNTS_FIELD as OTK_COUNTS,
)
from synapse_lite.appservice.sender import (
    TO_DEVICE_FIELD as TO_DEVICE,
)
from tests.appservice.fake_service import FakeApplicationService
from tests.appservice.registrations import irc_registration, write_registrations
from tests.harness.client_api import ClientApi, q, serve, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase, make_homeserver
from tests.rest.test_keys import device_keys, one_time_keys

AS_TOKEN = "irc-as-token"


class TransactionsTestCase(DatabaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.patch(sender_module, "POLL_SECONDS", 0.05)
        self.patch(sender_module, "FIRST_BACKOFF_SECONDS", 0.05)
        self.patch(sender_module, "MAX_BACKOFF_SECONDS", 0.2)
        self.service = FakeApplicationService()
        url = self.service.listen()
        self.addCleanup(self.service.port.stopListening)
        self.servers, clients, self.bus = start_cluster(
            self,
            self.test_db,
            app_service_config_files=write_registrations(
                irc_registration(url, receive_ephemeral=True, **{"org.matrix.msc3202": True})
            ),
        )
        self.api = clients["main"]

    async def bridged_room(self) -> tuple[ClientApi, str]:
        """Alice's public room, joined by the service's user ``_irc_bob``."""
        bridge = self.api.as_user(AS_TOKEN)
        await bridge.ok(
            "POST",
            "/register",
            {"type": "m.login.application_service", "username": "_irc_bob", "inhibit_login": True},
        )
        alice = await ClientApi(self, self.api.base_url).register("alice")
        room_id = await alice.create_room(preset="public_chat")
        await bridge.ok("POST", f"/join/{room_id}?user_id=@_irc_bob:test.local", {})
        return alice, room_id

    async def test_events_that_concern_the_service_arrive_in_order(self) -> None:
        other = await ClientApi(self, self.api.base_url).register("carol")
        unrelated = await other.create_room()
        await other.send(unrelated, "not for the bridge")
        alice, room_id = await self.bridged_room()
        for i in range(5):
            await alice.send(room_id, f"m{i}")
        await eventually(lambda: len(self.service.bodies()) >= 5, what="five messages")
        self.assertEqual(self.service.bodies(), [f"m{i}" for i in range(5)])
        # Interest is decided when the sender reads an event, against the
        # room's members then: Alice's own join may come too if the sender
        # read it after the bridge's user had joined. Carol's room never does.
        members = [e["state_key"] for e in self.service.events if e["type"] == "m.room.member"]
        self.assertIn("@_irc_bob:test.local", members)
        self.assertEqual({e["room_id"] for e in self.service.events}, {room_id})
        # Transaction ids count up from 1, each used once when all goes well.
        self.assertEqual(
            self.service.attempts, [str(i + 1) for i in range(len(self.service.attempts))]
        )

    async def test_a_failing_service_gets_the_same_transaction_again(self) -> None:
        alice, room_id = await self.bridged_room()
        await eventually(lambda: self.service.events, what="the join")
        self.service.mode = "lost_ack"
        await alice.send(room_id, "once")
        await eventually(
            lambda: len(self.service.attempts) >= len(self.service.processed) + 2,
            what="retries",
        )
        self.service.mode = "error"
        await alice.send(room_id, "twice")
        await deferLater(reactor, 0.2, lambda: None)
        self.service.mode = "ok"
        await eventually(lambda: "twice" in self.service.bodies(), what="the second message")
        self.assertEqual(self.service.bodies(), ["once", "twice"])
        # The lost acknowledgement made the same id come again.
        retried = [t for t in set(self.service.attempts) if self.service.attempts.count(t) > 1]
        self.assertTrue(retried)

    async def test_nothing_lost_or_repeated_over_a_restart(self) -> None:
        alice, room_id = await self.bridged_room()
        await alice.send(room_id, "before")
        await eventually(lambda: "before" in self.service.bodies(), what="the first message")
        self.service.mode = "lost_ack"
        await alice.send(room_id, "during")
        await eventually(lambda: "during" in self.service.bodies(), what="the lost answer")
        self.service.mode = "error"
        await alice.send(room_id, "while down")
        await deferLater(reactor, 0.1, lambda: None)
        main = self.servers["main"]
        self.bus.leave(next(e for e in self.bus.endpoints if e.hs is main))
        await main.service.stopService()
        self.service.mode = "ok"
        restarted = make_homeserver(self, main.config, "main")
        self.bus.join(restarted)
        alice_again = ClientApi(self, serve(self, restarted)).as_user(alice.token)
        await alice_again.send(room_id, "after")
        await eventually(lambda: "after" in self.service.bodies(), timeout=10, what="all")
        self.assertEqual(self.service.bodies(), ["before", "during", "while down", "after"])
        ids = [int(t) for t in self.service.processed]
        self.assertEqual(ids, list(range(1, len(ids) + 1)))

    async def test_receipts_in_the_service_rooms_arrive_as_ephemeral(self) -> None:
        alice, room_id = await self.bridged_room()
        event_id = await alice.send(room_id, "read me")
        other = await ClientApi(self, self.api.base_url).register("carol")
        elsewhere = await other.create_room()
        other_event = await other.send(elsewhere, "not the bridge's")
        await other.ok("POST", f"/rooms/{elsewhere}/receipt/m.read/{other_event}", {})
        await alice.ok("POST", f"/rooms/{room_id}/receipt/m.read.private/{event_id}", {})
        await alice.ok("POST", f"/rooms/{room_id}/receipt/m.read/{event_id}", {})
        await eventually(lambda: self.service.ephemeral, what="the receipt")
        [receipt] = self.service.ephemeral
        self.assertEqual(receipt["type"], "m.receipt")
        self.assertEqual(receipt["room_id"], room_id)
        self.assertIn("@alice:test.local", receipt["content"][event_id]["m.read"])

    async def test_typing_in_the_service_rooms_arrives_as_ephemeral(self) -> None:
        alice, room_id = await self.bridged_room()
        await alice.ok(
            "PUT", f"/rooms/{room_id}/typing/@alice:test.local", {"typing": True, "timeout": 30000}
        )
        await eventually(
            lambda: any(e["type"] == "m.typing" for e in self.service.ephemeral),
            what="typing",
        )
        [typing] = [e for e in self.service.ephemeral if e["type"] == "m.typing"]
        self.assertEqual(typing["room_id"], room_id)
        self.assertEqual(typing["content"]["user_ids"], ["@alice:test.local"])

    async def test_presence_of_users_sharing_a_room_arrives_as_ephemeral(self) -> None:
        alice, _ = await self.bridged_room()
        carol = await ClientApi(self, self.api.base_url).register("carol")
        await carol.ok("PUT", "/presence/@carol:test.local/status", {"presence": "online"})
        await alice.ok(
            "PUT",
            "/presence/@alice:test.local/status",
            {"presence": "unavailable", "status_msg": "away"},
        )
        await eventually(
            lambda: any(e["type"] == "m.presence" for e in self.service.ephemeral),
            what="presence",
        )
        [presence] = [e for e in self.service.ephemeral if e["type"] == "m.presence"]
        self.assertEqual(presence["sender"], "@alice:test.local")
        self.assertEqual(presence["content"]["presence"], "unavailable")
        self.assertEqual(presence["content"]["status_msg"], "away")
        self.assertNotIn("room_id", presence)

    def field(self, name: str) -> list[Any]:
        """Every value of ``name`` in the transactions received so far."""
        return [t[name] for t in self.service.transactions if name in t]

    async def bob_device(self) -> ClientApi:
        """``_irc_bob`` (joined by ``bridged_room``) logged in as ``BOBDEV``."""
        bridge = self.api.as_user(AS_TOKEN)
        await bridge.ok(
            "POST",
            "/login",
            {
                "type": "m.login.application_service",
                "identifier": {"type": "m.id.user", "user": "_irc_bob"},
                "device_id": "BOBDEV",
            },
        )
        return bridge

    async def test_to_device_messages_of_the_service_users_arrive(self) -> None:
        alice, _ = await self.bridged_room()
        await self.bob_device()
        messages = {
            "@_irc_bob:test.local": {"BOBDEV": {"ask": 1}},
            "@alice:test.local": {"*": {"ask": 2}},
        }
        await alice.ok("PUT", "/sendToDevice/m.room_key_request/t1", {"messages": messages})
        await eventually(lambda: any(self.field(TO_DEVICE)), what="the to-device message")
        [message] = [m for batch in self.field(TO_DEVICE) for m in batch]
        self.assertEqual(
            message,
            {
                "type": "m.room_key_request",
                "sender": "@alice:test.local",
                "content": {"ask": 1},
                "to_user_id": "@_irc_bob:test.local",
                "to_device_id": "BOBDEV",
            },
        )

    async def test_msc3202_device_lists_and_key_counts(self) -> None:
        alice, room_id = await self.bridged_room()
        bridge = await self.bob_device()
        bob = "user_id=@_irc_bob:test.local&device_id=BOBDEV"
        await bridge.ok("POST", f"/keys/upload?{bob}", {"one_time_keys": one_time_keys(3)})
        await alice.ok("POST", "/keys/upload", {"device_keys": device_keys(alice)})
        await eventually(
            lambda: any("@alice:test.local" in d["changed"] for d in self.field(DEVICE_LISTS)),
            what="alice's device list change",
        )
        await bridge.ok(
            "PUT",
            f"/rooms/{room_id}/send/m.room.message/b1?{bob}",
            {"msgtype": "m.text", "body": "from bob"},
        )
        await eventually(lambda: "from bob" in self.service.bodies(), what="bob's message")
        [carrying] = [
            t
            for t in self.service.transactions
            if any(e["content"].get("body") == "from bob" for e in t["events"])
        ]
        self.assertEqual(
            carrying[OTK_COUNTS], {"@_irc_bob:test.local": {"BOBDEV": {"signed_curve25519": 3}}}
        )
        self.assertEqual(carrying[FALLBACK_KEYS], {"@_irc_bob:test.local": {"BOBDEV": []}})
        # Alice's own events carry no counts: she is not the service's.
        self.assertTrue(
            all("@alice:test.local" not in t[OTK_COUNTS] for t in self.service.transactions)
        )

    async def test_an_alias_brings_only_events_written_after_it(self) -> None:
        alice = await ClientApi(self, self.api.base_url).register("alice")
        room_id = await alice.create_room()
        await alice.send(room_id, "before the alias")
        bridge = self.api.as_user(AS_TOKEN)
        await bridge.ok(
            "PUT", "/directory/room/" + q("#_irc_late:test.local"), {"room_id": room_id}
        )
        await alice.send(room_id, "after the alias")
        await eventually(lambda: "after the alias" in self.service.bodies(), what="the message")
        # Whenever the sender read the first message, the alias was not
        # there when it was written.
        self.assertEqual(self.service.bodies(), ["after the alias"])

    async def test_a_service_on_the_legacy_routes_gets_its_transactions(self) -> None:
        """A service serving only the unprefixed ``/transactions`` (the
        spec's legacy routes) gets every event, in order."""
        self.service.routes = "legacy"
        alice, room_id = await self.bridged_room()
        for i in range(3):
            await alice.send(room_id, f"m{i}")
        await eventually(lambda: len(self.service.bodies()) >= 3, what="three messages")
        self.assertEqual(self.service.bodies(), ["m0", "m1", "m2"])
        # After the first fall back, straight to the old path.
        paths = [path for method, path in self.service.requests if method == "PUT"]
        self.assertEqual(paths[:2], ["/_matrix/app/v1/transactions/1", "/transactions/1"])
        self.assertTrue(all(p.startswith("/transactions/") for p in paths[2:]), paths)


class AliasNamespaceTestCase(DatabaseTestCase):
    """A service whose (shared) alias namespace names a room: the room's
    events concern it, from the first when the room is made with the alias,
    and none from before the alias when it is added later, whichever
    process adds it."""

    def setUp(self) -> None:
        super().setUp()
        self.patch(sender_module, "POLL_SECONDS", 0.05)
        self.patch(sender_module, "FIRST_BACKOFF_SECONDS", 0.05)
        self.patch(sender_module, "MAX_BACKOFF_SECONDS", 0.1)
        self.service = FakeApplicationService()
        url = self.service.listen()
        self.addCleanup(self.service.port.stopListening)
        registration = irc_registration(url)
        registration["namespaces"]["aliases"] = [
            {"exclusive": False, "regex": "#bridged_.*:test.local"}
        ]
        _, self.clients, self.bus = start_cluster(
            self,
            self.test_db,
            workers=["reader1"],
            app_service_config_files=write_registrations(registration),
        )
        self.api = self.clients["main"]

    async def test_create_room_with_an_alias_of_the_namespace_brings_its_first_events(
        self,
    ) -> None:
        alice = await ClientApi(self, self.api.base_url).register("alice")
        other = await alice.create_room(preset="public_chat")
        await alice.send(other, "not for the bridge")
        room_id = (
            await alice.ok(
                "POST", "/createRoom", {"preset": "public_chat", "room_alias_name": "bridged_x"}
            )
        )["room_id"]
        await alice.send(room_id, "hello")
        await eventually(lambda: "hello" in self.service.bodies(), what="the message")
        types = [e["type"] for e in self.service.events]
        self.assertEqual(types[0], "m.room.create")
        self.assertIn("m.room.canonical_alias", types)
        self.assertEqual({e["room_id"] for e in self.service.events}, {room_id})
        # Every event of the room, in order.
        messages = await alice.ok("GET", f"/rooms/{room_id}/messages?dir=f&limit=50")
        self.assertEqual(
            [e["event_id"] for e in self.service.events],
            [e["event_id"] for e in messages["chunk"]],
        )

    async def test_an_alias_added_by_a_lagging_process_brings_no_earlier_event(self) -> None:
        """The alias's position is the database's, not the view of the
        process serving ``PUT /directory/room`` (a reader, which may not
        have heard of the last events yet)."""
        alice = await ClientApi(self, self.api.base_url).register("alice")
        # The sender is held on a transaction the service keeps failing, so
        # it reads the next events only after the alias is made.
        lobby = await alice.create_room(preset="public_chat")
        self.service.mode = "error"
        await self.api.as_user(AS_TOKEN).ok("POST", f"/join/{lobby}", {})
        await eventually(lambda: self.service.attempts, what="a failing transaction")
        [reader] = [e for e in self.bus.endpoints if e.hs.instance_name == "reader1"]
        self.bus.leave(reader)  # reader1 hears of no event from now on
        room_id = await alice.create_room(preset="public_chat")
        await alice.send(room_id, "before the alias")
        bridge = self.clients["reader1"].as_user(AS_TOKEN)
        await bridge.ok(
            "PUT", "/directory/room/" + q("#bridged_late:test.local"), {"room_id": room_id}
        )
        await alice.send(room_id, "after the alias")
        self.service.mode = "ok"
        await eventually(lambda: "after the alias" in self.service.bodies(), what="the message")
        self.assertEqual(self.service.bodies(), ["after the alias"])
        self.assertEqual(
            [e["type"] for e in self.service.events if e["room_id"] == room_id],
            ["m.room.message"],
        )
