"""Ephemeral EDUs across servers (docs/federation.md, "EDUs"): typing and
read receipts both ways between two servers of ours on loopback (``a.test``
one process, ``b.test`` main + ``fed1``, a federation worker that writes
neither stream), and hostile EDUs sent to b.test in one transaction with a
good one: each refused, the good one applied."""

from __future__ import annotations

import urllib.parse
from typing import Any

from twisted.internet import defer

from synapse_lite.replication.http.remote_devices import (
    REPLACE,
    WRITE_REMOTE_DEVICE_LIST,
    RemoteDeviceListWrite,
)
from synapse_lite.storage.id_generators import generator as id_generators
from tests.federation.test_rooms import CAROL, FederationRoomsBase
from tests.harness.client_api import ClientApi
from tests.harness.federation import LoopbackServers
from tests.harness.polling import eventually
from tests.rest.test_cross_signing import keys_of


def q(value: str | None) -> str:
    return urllib.parse.quote(value or "", safe="")


def typing_in(sync: dict[str, Any], room_id: str) -> list[str] | None:
    room = sync.get("rooms", {}).get("join", {}).get(room_id, {})
    for event in room.get("ephemeral", {}).get("events", []):
        if event["type"] == "m.typing":
            return list(event["content"]["user_ids"])
    return None


def readers_in(sync: dict[str, Any], room_id: str) -> dict[str, str]:
    """user -> event id of their m.read receipt, in ``sync``'s ephemeral part."""
    room = sync.get("rooms", {}).get("join", {}).get(room_id, {})
    found: dict[str, str] = {}
    for event in room.get("ephemeral", {}).get("events", []):
        if event["type"] == "m.receipt":
            for event_id, by_type in event["content"].items():
                for user_id in by_type.get("m.read", {}):
                    found[user_id] = event_id
    return found


class TwoServersBase(LoopbackServers):
    """a.test and b.test, and a room of b.test's alice that a.test's carol
    joins (no tests of its own)."""

    def setUp(self) -> None:
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)
        self.a = self.make_server("a.test", [])
        self.b = self.make_server("b.test", ["fed1"])
        self.connect(self.a, self.b)

    def client(self, server: dict[str, Any]) -> ClientApi:
        return ClientApi(self, server["main"].config.instance_map["main"].base_url)

    async def shared_room(self) -> tuple[ClientApi, ClientApi, str]:
        alice = await self.client(self.b).register("alice")
        room_id = await alice.create_room(preset="public_chat")
        carol = await self.client(self.a).register("carol")
        await carol.ok("POST", f"/join/{q(room_id)}?server_name=b.test", {})
        return alice, carol, room_id

    async def wait_sync(
        self, user: ClientApi, since: str, room_id: str, check: Any, what: str
    ) -> dict[str, Any]:
        seen: dict[str, Any] = {}

        async def arrived() -> bool:
            sync = await user.sync(since=since)
            if check(sync):
                seen.update(sync)
                return True
            return False

        await eventually(arrived, timeout=15, what=what)
        return seen


class EdusBothWaysTestCase(TwoServersBase):
    async def test_typing_both_ways(self) -> None:
        alice, carol, room_id = await self.shared_room()
        a_since = (await carol.sync())["next_batch"]
        b_since = (await alice.sync())["next_batch"]

        # b.test -> a.test
        await alice.ok("PUT", f"/rooms/{q(room_id)}/typing/{q(alice.user_id)}", {"typing": True})
        await self.wait_sync(
            carol,
            a_since,
            room_id,
            lambda s: typing_in(s, room_id) == [alice.user_id],
            "alice typing on a.test",
        )
        # a.test -> b.test
        await carol.ok(
            "PUT",
            f"/rooms/{q(room_id)}/typing/{q(carol.user_id)}",
            {"typing": True, "timeout": 30000},
        )
        await self.wait_sync(
            alice,
            b_since,
            room_id,
            lambda s: typing_in(s, room_id) == sorted([alice.user_id or "", carol.user_id or ""]),
            "carol typing on b.test",
        )
        # Stopping crosses too.
        await carol.ok("PUT", f"/rooms/{q(room_id)}/typing/{q(carol.user_id)}", {"typing": False})
        await self.wait_sync(
            alice,
            b_since,
            room_id,
            lambda s: typing_in(s, room_id) == [alice.user_id],
            "carol stopped typing on b.test",
        )

    async def test_receipts_both_ways(self) -> None:
        alice, carol, room_id = await self.shared_room()
        event_id = await alice.send(room_id, "read me")

        async def carol_has_it() -> bool:
            page = await carol.ok("GET", f"/rooms/{q(room_id)}/messages?dir=b&limit=5")
            return any(e["event_id"] == event_id for e in page["chunk"])

        await eventually(carol_has_it, timeout=15, what="alice's message on a.test")
        a_since = (await carol.sync())["next_batch"]
        b_since = (await alice.sync())["next_batch"]
        # a.test -> b.test
        await carol.ok("POST", f"/rooms/{q(room_id)}/receipt/m.read/{q(event_id)}", {})
        await self.wait_sync(
            alice,
            b_since,
            room_id,
            lambda s: readers_in(s, room_id).get(carol.user_id or "") == event_id,
            "carol's receipt on b.test",
        )
        # b.test -> a.test (and a private receipt never leaves).
        reply = await carol.send(room_id, "a reply")

        async def alice_has_it() -> bool:
            page = await alice.ok("GET", f"/rooms/{q(room_id)}/messages?dir=b&limit=5")
            return any(e["event_id"] == reply for e in page["chunk"])

        await eventually(alice_has_it, timeout=15, what="carol's reply on b.test")
        await alice.ok("POST", f"/rooms/{q(room_id)}/receipt/m.read.private/{q(reply)}", {})
        await alice.ok("POST", f"/rooms/{q(room_id)}/receipt/m.read/{q(event_id)}", {})
        sync = await self.wait_sync(
            carol,
            a_since,
            room_id,
            lambda s: readers_in(s, room_id).get(alice.user_id or "") == event_id,
            "alice's receipt on a.test",
        )
        self.assertNotEqual(readers_in(sync, room_id).get(alice.user_id or ""), reply)


def presence_of(sync: dict[str, Any], user_id: str | None) -> dict[str, Any] | None:
    for event in sync.get("presence", {}).get("events", []):
        if event["sender"] == user_id:
            return dict(event["content"])
    return None


class PresenceBothWaysTestCase(TwoServersBase):
    async def test_presence_both_ways(self) -> None:
        alice, carol, _room_id = await self.shared_room()
        await self.presence_reaches(alice, carol, "from b")
        await self.presence_reaches(carol, alice, "from a")

    async def presence_reaches(self, sender: ClientApi, receiver: ClientApi, status: str) -> None:
        since = (await receiver.sync())["next_batch"]
        body = {"presence": "unavailable", "status_msg": status}
        await sender.ok("PUT", f"/presence/{q(sender.user_id)}/status", body)

        async def arrived() -> bool:
            content = presence_of(await receiver.sync(since=since), sender.user_id)
            return content is not None and content.get("status_msg") == status

        await eventually(arrived, timeout=15, what=f"presence {status}")
        content = presence_of(await receiver.sync(since=since), sender.user_id)
        assert content is not None
        self.assertEqual(content["presence"], "unavailable")


class HostileEdusTestCase(FederationRoomsBase):
    """b.test receives EDUs the tests sign for a.test (carol, of a.test,
    joined to alice's room on b.test)."""

    async def test_hostile_edus_are_dropped_and_the_rest_applied(self) -> None:
        alice, room_id = await self.room()
        await self.join_carol(room_id)
        event_id = await alice.send(room_id, "hello")
        other_alice, other_room = await self.room()  # carol is not in this one
        since = (await alice.sync())["next_batch"]
        other_since = (await other_alice.sync())["next_batch"]
        edus: list[Any] = [
            # A user who is not of the origin.
            {
                "edu_type": "m.typing",
                "content": {"room_id": room_id, "user_id": alice.user_id, "typing": True},
            },
            {
                "edu_type": "m.typing",
                "content": {"room_id": room_id, "user_id": "@dave:c.test", "typing": True},
            },
            # Not in the room.
            {
                "edu_type": "m.typing",
                "content": {"room_id": other_room, "user_id": CAROL, "typing": True},
            },
            {
                "edu_type": "m.receipt",
                "content": {
                    other_room: {"m.read": {CAROL: {"event_ids": [event_id], "data": {"ts": 1}}}}
                },
            },
            # Malformed.
            {
                "edu_type": "m.typing",
                "content": {"room_id": room_id, "user_id": CAROL, "typing": "yes"},
            },
            {"edu_type": "m.typing", "content": {"room_id": 7, "user_id": CAROL, "typing": True}},
            {
                "edu_type": "m.receipt",
                "content": {room_id: {"m.read": {CAROL: {"event_ids": "x"}}}},
            },
            {"edu_type": "m.receipt", "content": {room_id: ["nope"]}},
            {
                "edu_type": "m.receipt",
                "content": {room_id: {"m.read": {alice.user_id: {"event_ids": [event_id]}}}},
            },
            {"edu_type": "m.device_list_update", "content": "not an object"},
            {"edu_type": "m.presence", "content": {"push": "nope"}},
            {
                "edu_type": "m.presence",
                "content": {
                    "push": [
                        {"user_id": alice.user_id, "presence": "online"},
                        {"user_id": "@zed:a.test", "presence": "online"},
                        {"user_id": CAROL, "presence": "dancing"},
                        {"user_id": CAROL, "presence": "online", "last_active_ago": -5},
                        {"user_id": CAROL, "presence": "online", "status_msg": 7},
                        {"user_id": CAROL, "presence": "online", "status_msg": "here"},
                    ]
                },
            },
            {"edu_type": 12, "content": {}},
            "not an edu",
            # And the good ones.
            {
                "edu_type": "m.typing",
                "content": {"room_id": room_id, "user_id": CAROL, "typing": True},
            },
            {
                "edu_type": "m.receipt",
                "content": {
                    room_id: {"m.read": {CAROL: {"event_ids": [event_id], "data": {"ts": 5}}}}
                },
            },
        ]
        body = {"origin": "a.test", "origin_server_ts": 1, "pdus": [], "edus": edus}
        code, answer = await self.federation("PUT", "/_matrix/federation/v1/send/hostile1", body)
        self.assertEqual(code, 200, answer)

        async def applied() -> bool:
            sync = await alice.sync(since=since)
            return typing_in(sync, room_id) == [CAROL] and readers_in(sync, room_id) == {
                CAROL: event_id
            }

        await eventually(applied, timeout=10, what="carol's typing and receipt on b.test")
        sync = await alice.sync(since=since)
        carol_presence = presence_of(sync, CAROL)
        assert carol_presence is not None
        self.assertEqual(
            (carol_presence["presence"], carol_presence["status_msg"]), ("online", "here")
        )
        self.assertIsNone(presence_of(sync, alice.user_id))
        self.assertEqual(typing_in(sync, room_id), [CAROL])
        self.assertEqual(readers_in(sync, room_id), {CAROL: event_id})
        other = await other_alice.sync(since=other_since)
        self.assertIsNone(typing_in(other, other_room))
        self.assertEqual(readers_in(other, other_room), {})

    async def test_edus_from_a_server_not_in_the_room(self) -> None:
        alice, room_id = await self.room()
        since = (await alice.sync())["next_batch"]
        edus = [
            {
                "edu_type": "m.typing",
                "content": {"room_id": room_id, "user_id": CAROL, "typing": True},
            },
        ]
        body = {"origin": "a.test", "origin_server_ts": 1, "pdus": [], "edus": edus}
        code, answer = await self.federation("PUT", "/_matrix/federation/v1/send/out1", body)
        self.assertEqual(code, 200, answer)
        sync = await alice.sync(since=since)
        self.assertIsNone(typing_in(sync, room_id))


def device_keys(user_id: str, device_id: str, key: str = "A") -> dict[str, Any]:
    return {
        "user_id": user_id,
        "device_id": device_id,
        "algorithms": ["m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"],
        "keys": {f"curve25519:{device_id}": f"curve{key}", f"ed25519:{device_id}": f"ed{key}"},
        "signatures": {},
    }


class DeviceListsAcrossServersTestCase(TwoServersBase):
    """alice of b.test and carol of a.test share a room: carol's server
    keeps alice's device list, current through b.test's EDUs."""

    async def upload(self, user: ClientApi, key: str = "A", **extra: Any) -> None:
        assert user.user_id is not None and user.device_id is not None
        body = {"device_keys": device_keys(user.user_id, user.device_id, key), **extra}
        await user.ok("POST", "/keys/upload", body)

    async def query(self, user: ClientApi, target: str) -> dict[str, Any]:
        return dict(await user.ok("POST", "/keys/query", {"device_keys": {target: []}}))

    async def test_keys_query_claim_and_device_list_updates(self) -> None:
        alice, carol, room_id = await self.shared_room()
        assert alice.user_id is not None and alice.device_id is not None
        await self.upload(
            alice, one_time_keys={"signed_curve25519:K1": {"key": "otk1", "signatures": {}}}
        )
        # carol's server fetches alice's list from b.test (GET /user/devices).
        answer = await self.query(carol, alice.user_id)
        self.assertEqual(answer["failures"], {})
        keys = answer["device_keys"][alice.user_id][alice.device_id]
        self.assertEqual(keys["keys"][f"curve25519:{alice.device_id}"], "curveA")
        state = await self.a["main"].store.get_remote_device_list_state(alice.user_id)
        self.assertIsNotNone(state)
        # Claiming asks b.test (POST /user/keys/claim): the key is handed out once.
        claim = {"one_time_keys": {alice.user_id: {alice.device_id: "signed_curve25519"}}}
        claimed = await carol.ok("POST", "/keys/claim", claim)
        self.assertEqual(
            claimed["one_time_keys"][alice.user_id][alice.device_id],
            {"signed_curve25519:K1": {"key": "otk1", "signatures": {}}},
        )
        again = await carol.ok("POST", "/keys/claim", claim)
        self.assertEqual(again["one_time_keys"].get(alice.user_id, {}), {})

        # alice logs in a second device and uploads its keys: b.test sends
        # m.device_list_update; carol's /sync says alice changed, and her
        # query is answered from a.test's copy, with the new device.
        since = (await carol.sync())["next_batch"]
        second = ClientApi(self, alice.base_url)
        login = await second.ok(
            "POST",
            "/login",
            {
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": "alice"},
                "password": "secret-pw",
            },
        )
        second.token, second.user_id, second.device_id = (
            login["access_token"],
            login["user_id"],
            login["device_id"],
        )
        await self.upload(second, "B")
        await self.wait_sync(
            carol,
            since,
            room_id,
            lambda s: alice.user_id in s.get("device_lists", {}).get("changed", []),
            "alice in carol's device_lists.changed",
        )

        async def copy_has_both() -> bool:
            devices = await self.a["main"].store.get_remote_devices(alice.user_id or "")
            return {d.device_id for d in devices if d.keys} == {alice.device_id, second.device_id}

        await eventually(copy_has_both, timeout=15, what="a.test's copy with both devices")
        answer = await self.query(carol, alice.user_id)
        self.assertEqual(
            set(answer["device_keys"][alice.user_id]), {alice.device_id, second.device_id}
        )
        # The second device logs out: the copy loses it.
        await second.ok("POST", "/logout", {})

        async def copy_has_one() -> bool:
            devices = await self.a["main"].store.get_remote_devices(alice.user_id or "")
            return {d.device_id for d in devices} == {alice.device_id}

        await eventually(copy_has_one, timeout=15, what="a.test's copy without the second device")

    async def test_a_list_changed_while_no_room_was_shared_is_fetched_on_rejoin(self) -> None:
        # carol's server keeps alice's list, then carol leaves the one room
        # they shared: b.test tells a.test nothing of alice's next keys.
        # When carol joins again (through b.test), a.test's copy is marked
        # stale: carol's /sync from before the leave lists alice as
        # changed, and her query has alice's new keys.
        alice, carol, room_id = await self.shared_room()
        assert alice.user_id is not None and alice.device_id is not None
        await self.upload(alice, "A")
        answer = await self.query(carol, alice.user_id)
        self.assertEqual(
            answer["device_keys"][alice.user_id][alice.device_id]["keys"][
                f"curve25519:{alice.device_id}"
            ],
            "curveA",
        )
        since = (await carol.sync())["next_batch"]
        await carol.ok("POST", f"/rooms/{q(room_id)}/leave", {})

        async def a_test_left() -> bool:
            joined = await self.b["main"].store.get_users_in_room(room_id)
            return carol.user_id not in joined

        await eventually(a_test_left, timeout=15, what="carol's leave at b.test")
        await self.upload(alice, "B")
        await carol.ok("POST", f"/join/{q(room_id)}?server_name=b.test", {})
        await self.wait_sync(
            carol,
            since,
            room_id,
            lambda s: alice.user_id in s.get("device_lists", {}).get("changed", []),
            "alice in carol's device_lists.changed after the rejoin",
        )

        async def new_keys() -> bool:
            answer = await self.query(carol, alice.user_id or "")
            device = answer["device_keys"].get(alice.user_id, {}).get(alice.device_id or "", {})
            return bool(device.get("keys", {}).get(f"curve25519:{alice.device_id}") == "curveB")

        await eventually(new_keys, timeout=15, what="alice's new keys in carol's query")

    async def test_signing_a_remote_users_master_key(self) -> None:
        """carol (a.test) verifies alice (b.test): her user-signing key's
        signature of alice's master key is stored on a.test and shown to
        carol alone (b.test is not told); carol's /sync says alice changed."""
        alice, carol, _ = await self.shared_room()
        assert alice.user_id is not None and carol.user_id is not None
        await alice.ok("POST", "/keys/device_signing/upload", keys_of(alice))
        await carol.ok("POST", "/keys/device_signing/upload", keys_of(carol, "CAROLM"))
        since = (await carol.sync())["next_batch"]
        master = (await self.query(carol, alice.user_id))["master_keys"][alice.user_id]
        signed = {**master, "signatures": {carol.user_id: {"ed25519:USKCAROLM": "carol-sig"}}}
        wrong = {**master, "signatures": {carol.user_id: {"ed25519:CAROLM": "x"}}}
        for body, failures in [
            ({alice.user_id: {"MASTER": wrong}}, {"MASTER": "M_INVALID_SIGNATURE"}),
            ({alice.user_id: {"NOSUCHKEY": signed}}, {"NOSUCHKEY": "M_NOT_FOUND"}),
            ({alice.user_id: {"MASTER": signed}}, {}),
        ]:
            answer = await carol.ok("POST", "/keys/signatures/upload", body)
            got = {k: v["errcode"] for k, v in answer["failures"].get(alice.user_id, {}).items()}
            self.assertEqual(got, failures)
        by_carol = (await self.query(carol, alice.user_id))["master_keys"][alice.user_id]
        self.assertEqual(by_carol, {**master, "signatures": signed["signatures"]})
        by_alice = (await self.query(alice, alice.user_id))["master_keys"][alice.user_id]
        self.assertNotIn(carol.user_id, by_alice.get("signatures", {}))
        sync = await carol.sync(since=since)
        self.assertIn(alice.user_id, sync["device_lists"]["changed"])


class HostileDeviceListsTestCase(FederationRoomsBase):
    """b.test keeping carol's (a.test's) device list, from EDUs the tests
    sign for a.test; and b.test's user key endpoints asked by a.test."""

    async def send_edus(self, txn_id: str, *edus: Any) -> None:
        body = {"origin": "a.test", "origin_server_ts": 1, "pdus": [], "edus": list(edus)}
        code, answer = await self.federation("PUT", f"/_matrix/federation/v1/send/{txn_id}", body)
        self.assertEqual(code, 200, answer)

    async def test_device_list_updates_and_gaps(self) -> None:
        alice, room_id = await self.room()
        await self.join_carol(room_id)
        store = self.b["main"].store
        since = (await alice.sync())["next_batch"]

        def update(stream_id: Any, prev: Any, device: str = "D1", **extra: Any) -> dict[str, Any]:
            content = {
                "user_id": CAROL,
                "device_id": device,
                "stream_id": stream_id,
                "prev_id": prev,
            }
            return {"edu_type": "m.device_list_update", "content": {**content, **extra}}

        # Refused: not of the origin, sharing no room, malformed.
        await self.send_edus(
            "dl1",
            {**update(1, []), "content": {**update(1, [])["content"], "user_id": alice.user_id}},
            {**update(1, []), "content": {**update(1, [])["content"], "user_id": "@zed:a.test"}},
            update("1", []),
            update(1, "0"),
            update(1, [], deleted="no"),
            update(1, [], device=""),
            {
                "edu_type": "m.signing_key_update",
                "content": {"user_id": CAROL, "master_key": {"user_id": "@x:y"}},
            },
        )
        self.assertEqual(
            (await alice.sync(since=since)).get("device_lists", {}).get("changed", []), []
        )
        # No copy kept yet: the change is told to alice, and b.test fetches
        # carol's list from a.test in the background (where she has no
        # devices: a.test only stands in for her server).
        await self.send_edus("dl2", update(1, []))
        sync = await alice.sync(since=since)
        self.assertEqual(sync["device_lists"]["changed"], [CAROL])

        async def copied() -> bool:
            state = await store.get_remote_device_list_state(CAROL)
            return state is not None and (state.stream_id, state.stale) == (0, False)

        await eventually(copied, timeout=10, what="carol's list fetched at her first update")
        # alice's query is answered from the copy.
        answer = await alice.ok("POST", "/keys/query", {"device_keys": {CAROL: []}})
        self.assertEqual(answer["device_keys"][CAROL], {})
        # An update following on from the copy is applied as it is...
        keys = {
            "user_id": CAROL,
            "device_id": "D3",
            "keys": {"ed25519:D3": "k3"},
            "algorithms": [],
            "signatures": {},
        }
        await self.send_edus(
            "dl3", update(3, [0], device="D3", keys=keys, device_display_name="tab")
        )
        devices = await store.get_remote_devices(CAROL)
        self.assertEqual(
            [(d.device_id, d.display_name, d.keys) for d in devices], [("D3", "tab", keys)]
        )
        answer = await alice.ok("POST", "/keys/query", {"device_keys": {CAROL: []}})
        self.assertEqual(answer["device_keys"][CAROL]["D3"]["keys"], {"ed25519:D3": "k3"})
        # ... an old one is ignored; one after a gap fetches the list again.
        await self.send_edus("dl4", update(2, [1], device="OLD"))
        self.assertEqual([d.device_id for d in await store.get_remote_devices(CAROL)], ["D3"])
        await self.send_edus("dl5", update(9, [8], device="D9"))

        async def refetched() -> bool:
            state = await store.get_remote_device_list_state(CAROL)
            return state is not None and not state.stale and state.stream_id == 0

        await eventually(refetched, timeout=10, what="carol's list fetched again")
        self.assertEqual(await store.get_remote_devices(CAROL), [])
        # The worker that fetched it waits to read its own write back before
        # it lets go: the test ends only once it has (else that wait outlives
        # the processes).
        written = self.b["main"].streams["device_lists"].positions.writer_position("main")
        await eventually(
            lambda: all(
                hs.streams["device_lists"].positions.writer_position("main") >= written
                for hs in self.b.values()
            ),
            what="every b.test process read the fetched list",
        )

    async def test_two_replacements_of_one_list_at_once(self) -> None:
        """The list fetched for a /keys/query and the one an EDU's gap made
        b.test fetch can reach the writer together: both are written, one
        after the other (PostgreSQL refused the second's rows as duplicates
        while both ran at once, seen in CI as a 500 from /keys/query)."""
        _alice, room_id = await self.room()
        await self.join_carol(room_id)
        calls = self.b["fed1"].calls

        def replacement(stream_id: int, name: str) -> RemoteDeviceListWrite:
            devices = [{"device_id": "D1", "display_name": name, "keys": None}]
            data = {"stream_id": stream_id, "devices": devices, "cross_signing": {}}
            return RemoteDeviceListWrite(CAROL, REPLACE, data)

        first, second = await defer.gatherResults(
            [
                defer.ensureDeferred(
                    calls.call(WRITE_REMOTE_DEVICE_LIST, replacement(5, "first"), instance="main")
                ),
                defer.ensureDeferred(
                    calls.call(WRITE_REMOTE_DEVICE_LIST, replacement(6, "second"), instance="main")
                ),
            ]
        )
        assert first.stream_id is not None and second.stream_id is not None
        self.assertLess(first.stream_id, second.stream_id)
        devices = await self.b["main"].store.get_remote_devices(CAROL)
        self.assertEqual([(d.device_id, d.display_name) for d in devices], [("D1", "second")])

    async def test_user_key_endpoints(self) -> None:
        alice, _room_id = await self.room()
        assert alice.user_id is not None and alice.device_id is not None
        await alice.ok(
            "POST",
            "/keys/upload",
            {
                "device_keys": device_keys(alice.user_id, alice.device_id),
                "one_time_keys": {"signed_curve25519:K": {"key": "otk", "signatures": {}}},
            },
        )
        prefix = "/_matrix/federation/v1/user"
        code, devices = await self.federation("GET", f"{prefix}/devices/{q(alice.user_id)}")
        self.assertEqual(code, 200, devices)
        self.assertEqual(devices["user_id"], alice.user_id)
        self.assertGreater(devices["stream_id"], 0)
        self.assertEqual([d["device_id"] for d in devices["devices"]], [alice.device_id])
        self.assertEqual(
            devices["devices"][0]["keys"]["keys"][f"curve25519:{alice.device_id}"], "curveA"
        )
        code, body = await self.federation("GET", f"{prefix}/devices/{q(CAROL)}")
        self.assertEqual(code, 400, body)
        code, body = await self.federation(
            "POST", f"{prefix}/keys/query", {"device_keys": {alice.user_id: [], CAROL: []}}
        )
        self.assertEqual(code, 200, body)
        self.assertEqual(list(body["device_keys"]), [alice.user_id])
        self.assertNotIn("user_signing_keys", body)
        bad: dict[str, Any]
        for bad in ({"device_keys": []}, {"device_keys": {alice.user_id: "D"}}, {}):
            code, body = await self.federation("POST", f"{prefix}/keys/query", bad)
            self.assertEqual(code, 400, (bad, body))
        claim = {
            "one_time_keys": {
                alice.user_id: {alice.device_id: "signed_curve25519"},
                CAROL: {"X": "a"},
            }
        }
        code, body = await self.federation("POST", f"{prefix}/keys/claim", claim)
        self.assertEqual(code, 200, body)
        self.assertEqual(list(body["one_time_keys"]), [alice.user_id])
        code, body = await self.federation(
            "POST", f"{prefix}/keys/claim", {"one_time_keys": {alice.user_id: {"D": 5}}}
        )
        self.assertEqual(code, 400, body)
        # Not signed by a.test's key: refused.
        code, body = await self.signed_request(
            self.b_key, "a.test", "b.test", "POST", f"{prefix}/keys/query", {"device_keys": {}}
        )
        self.assertEqual(code, 401, body)
