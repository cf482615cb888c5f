"""Our rooms served to another server (docs/federation.md, "Rooms:
serving"): a remote user joins through make_join/send_join, and the room is
read over /event, /state, /state_ids, /event_auth, /backfill and
/get_missing_events.

``b.test`` is the server under test (main, the events writer, and ``fed1``,
a worker that serves federation, so a join goes through the internal call to
the room's writer). ``a.test`` is a real server too, but only for its key
endpoint: the tests speak for it, signing requests and events with its key.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from synapse_lite.api.room_versions import KNOWN_ROOM_VERSIONS, EventIdFormat, RoomVersion
from synapse_lite.event_graph.hashing import (
    content_hash_matches,
    event_id_of,
    sign_event,
    verify_event_signature,
)
from synapse_lite.federation.crypto import SigningKey, load_or_create_signing_key
from synapse_lite.storage.id_generators import generator as id_generators
from tests.harness.client_api import ClientApi
from tests.harness.federation import LoopbackServers

CAROL = "@carol:a.test"


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


class FederationRoomsBase(LoopbackServers):
    """b.test (main and ``fed1``) and a.test's key; requests and events
    signed for a.test (no tests: shared by the room tests)."""

    #: b.test's workers (the last one serves the federation requests) and
    #: config.
    b_workers: tuple[str, ...] = ("fed1",)
    b_config: dict[str, Any] = {}

    def setUp(self) -> None:
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)
        self.a = self.make_server("a.test", [])
        self.b = self.make_server("b.test", list(self.b_workers), **self.b_config)
        self.connect(self.a, self.b)
        self.a_key = load_or_create_signing_key(self.a["main"].config.data_dir, create=False)
        self.b_key = load_or_create_signing_key(self.b["main"].config.data_dir, create=False)

    async def federation(
        self,
        method: str,
        path: str,
        body: Any = None,
        key: SigningKey | None = None,
        origin: str = "a.test",
    ) -> tuple[int, Any]:
        """A request to b.test signed by ``origin`` (a.test's key)."""
        return await self.signed_request(key or self.a_key, origin, "b.test", method, path, body)

    async def room(self, **body: Any) -> tuple[ClientApi, str]:
        url = self.b["main"].config.instance_map["main"].base_url
        self.alices = getattr(self, "alices", 0) + 1
        alice = await ClientApi(self, url).register(f"alice{self.alices}")
        room_id = await alice.create_room(**{"preset": "public_chat", **body})
        await alice.send(room_id, "before carol")
        return alice, room_id

    async def make_join(self, room_id: str, user_id: str = CAROL) -> tuple[int, Any]:
        return await self.federation(
            "GET", f"/_matrix/federation/v1/make_join/{q(room_id)}/{q(user_id)}?ver=10&ver=11"
        )

    def signed_join(self, template: dict[str, Any], version: RoomVersion) -> dict[str, Any]:
        event = {**template, "origin": "a.test"}
        if version.event_ids is EventIdFormat.SERVER_SUFFIXED:
            event["event_id"] = "$carol-join:a.test"
        return sign_event(version, event, "a.test", self.a_key)

    async def send_join(
        self, room_id: str, event: dict[str, Any], version: RoomVersion, event_id: str | None = None
    ) -> tuple[int, Any]:
        event_id = event_id or event_id_of(version, event)
        return await self.federation(
            "PUT", f"/_matrix/federation/v2/send_join/{q(room_id)}/{q(event_id)}", event
        )

    async def members(self, alice: ClientApi, room_id: str) -> set[str]:
        joined = await alice.ok("GET", f"/rooms/{q(room_id)}/joined_members")
        return set(joined["joined"])

    def check_served(self, version: RoomVersion, pdu: dict[str, Any], whole: bool = True) -> str:
        """The id of a served PDU, after checking its sender's server's
        signature (which covers the redacted form) and, when it must be
        ``whole`` (not redacted), its content hash."""
        bare = {k: v for k, v in pdu.items() if k not in ("event_id", "unsigned")}
        if version.event_ids is EventIdFormat.SERVER_SUFFIXED:
            bare["event_id"] = pdu["event_id"]
        if whole:
            self.assertTrue(content_hash_matches(version, bare), pdu)
        key = self.b_key if pdu["sender"].endswith(":b.test") else self.a_key
        server = "b.test" if pdu["sender"].endswith(":b.test") else "a.test"
        verify_event_signature(version, bare, server, key.key_id, key.verify_key_base64)
        return event_id_of(version, bare)

    async def join_carol(self, room_id: str) -> RoomVersion:
        """carol of a.test joins ``room_id`` (make_join, send_join)."""
        code, made = await self.make_join(room_id)
        self.assertEqual(code, 200, made)
        version = KNOWN_ROOM_VERSIONS[made["room_version"]]
        code, answer = await self.send_join(
            room_id, self.signed_join(made["event"], version), version
        )
        self.assertEqual(code, 200, answer)
        return version


class FederationRoomsTestCase(FederationRoomsBase):
    async def test_remote_user_joins_and_reads_the_room(self) -> None:
        alice, room_id = await self.room()
        code, made = await self.make_join(room_id)
        self.assertEqual(code, 200, made)
        version = KNOWN_ROOM_VERSIONS[made["room_version"]]
        template = made["event"]
        self.assertEqual(template["sender"], CAROL)
        self.assertEqual(template["content"], {"membership": "join"})
        self.assertEqual(len(template["auth_events"]), 3)  # create, power levels, join rules

        join = self.signed_join(template, version)
        join_id = event_id_of(version, join)
        code, answer = await self.send_join(room_id, join, version)
        self.assertEqual(code, 200, answer)
        self.assertIs(answer["members_omitted"], False)
        self.assertEqual(answer["servers_in_room"], ["a.test", "b.test"])
        # Countersigned by b.test, otherwise the event carol's server signed.
        signed = answer["event"]
        verify_event_signature(
            version, signed, "b.test", self.b_key.key_id, self.b_key.verify_key_base64
        )
        self.assertEqual(event_id_of(version, signed), join_id)
        # The state before the join, and an auth chain that covers its auth events.
        state_ids = {self.check_served(version, pdu) for pdu in answer["state"]}
        chain_ids = {self.check_served(version, pdu) for pdu in answer["auth_chain"]}
        types = {(p["type"], p.get("state_key")) for p in answer["state"]}
        self.assertIn(("m.room.create", ""), types)
        self.assertIn(("m.room.member", alice.user_id), types)
        self.assertNotIn(("m.room.member", CAROL), types)
        for pdu in answer["state"]:
            refs = pdu["auth_events"]
            ids = [r[0] if isinstance(r, list) else r for r in refs]
            self.assertLessEqual(set(ids), chain_ids | state_ids)

        # On b.test: carol is a member, on main (the writer) and the worker.
        self.assertEqual(await self.members(alice, room_id), {alice.user_id, CAROL})
        room_state = await alice.ok("GET", f"/rooms/{q(room_id)}/state/m.room.member/{q(CAROL)}")
        self.assertEqual(room_state["membership"], "join")

        # A retried send_join is answered again, nothing doubled.
        code, again = await self.send_join(room_id, join, version)
        self.assertEqual(code, 200, again)

        # Reading the room as a server in it.
        code, served = await self.federation("GET", f"/_matrix/federation/v1/event/{q(join_id)}")
        self.assertEqual(code, 200, served)
        self.assertEqual(event_id_of(version, served["pdus"][0]), join_id)
        code, ids = await self.federation(
            "GET", f"/_matrix/federation/v1/state_ids/{q(room_id)}?event_id={q(join_id)}"
        )
        self.assertEqual(code, 200, ids)
        self.assertEqual(set(ids["pdu_ids"]), state_ids)
        code, full = await self.federation(
            "GET", f"/_matrix/federation/v1/state/{q(room_id)}?event_id={q(join_id)}"
        )
        self.assertEqual(code, 200, full)
        self.assertEqual({self.check_served(version, p) for p in full["pdus"]}, state_ids)
        code, auth = await self.federation(
            "GET", f"/_matrix/federation/v1/event_auth/{q(room_id)}/{q(join_id)}"
        )
        self.assertEqual(code, 200, auth)
        cited = set(join["auth_events"])
        self.assertLessEqual(cited, {self.check_served(version, p) for p in auth["auth_chain"]})

        after = await alice.send(room_id, "after carol")
        code, back = await self.federation(
            "GET", f"/_matrix/federation/v1/backfill/{q(room_id)}?v={q(after)}&limit=3"
        )
        self.assertEqual(code, 200, back)
        backfilled = [self.check_served(version, p) for p in back["pdus"]]
        self.assertEqual(backfilled[:2], [after, join_id])
        self.assertEqual(len(backfilled), 3)
        code, missing = await self.federation(
            "POST",
            f"/_matrix/federation/v1/get_missing_events/{q(room_id)}",
            {"earliest_events": [template["prev_events"][0]], "latest_events": [after]},
        )
        self.assertEqual(code, 200, missing)
        self.assertEqual([self.check_served(version, p) for p in missing["events"]], [join_id])

    async def test_bad_joins_are_refused_and_nothing_is_stored(self) -> None:
        alice, room_id = await self.room()
        code, made = await self.make_join(room_id)
        self.assertEqual(code, 200, made)
        version = KNOWN_ROOM_VERSIONS[made["room_version"]]
        join = self.signed_join(made["event"], version)

        unsigned = {k: v for k, v in join.items() if k != "signatures"}
        code, answer = await self.send_join(room_id, unsigned, version)
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"), answer)

        # Content the redacted form (and so the id and signature) does not
        # cover, changed after signing: the content hash no longer matches.
        tampered = {**join, "content": {**join["content"], "displayname": "Mallory"}}
        code, answer = await self.send_join(room_id, tampered, version)
        self.assertEqual((code, answer["errcode"]), (400, "M_BAD_JSON"), answer)

        code, answer = await self.send_join(room_id, join, version, event_id="$not-its-id")
        self.assertEqual((code, answer["errcode"]), (400, "M_INVALID_PARAM"), answer)

        other_room = await alice.create_room(preset="public_chat")
        code, answer = await self.send_join(other_room, join, version)
        self.assertEqual(code, 400, answer)

        # A user of another server than the one asking.
        code, answer = await self.make_join(room_id, "@dave:c.test")
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"), answer)
        foreign = self.signed_join(
            {**made["event"], "sender": "@dave:c.test", "state_key": "@dave:c.test"}, version
        )
        code, answer = await self.send_join(room_id, foreign, version)
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"), answer)

        code, answer = await self.make_join("!nowhere:b.test")
        self.assertEqual((code, answer["errcode"]), (404, "M_NOT_FOUND"), answer)
        code, answer = await self.send_join("!nowhere:b.test", join, version)
        self.assertEqual((code, answer["errcode"]), (404, "M_NOT_FOUND"), answer)

        code, answer = await self.federation(
            "GET", f"/_matrix/federation/v1/make_join/{q(room_id)}/{q(CAROL)}?ver=1"
        )
        self.assertEqual((code, answer["errcode"]), (400, "M_INCOMPATIBLE_ROOM_VERSION"), answer)
        self.assertEqual(answer["room_version"], version.identifier)

        self.assertEqual(await self.members(alice, room_id), {alice.user_id})
        store = self.b["main"].store
        self.assertEqual(await store.get_received_pdus([event_id_of(version, join)]), {})

    async def test_invite_only_room_refuses_the_join(self) -> None:
        _alice, room_id = await self.room(preset="private_chat")
        code, answer = await self.make_join(room_id)
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"), answer)
        self.assertIn("join", answer["error"])

    async def test_no_template_once_our_users_all_left(self) -> None:
        alice, room_id = await self.room()
        self.assertEqual((await self.make_join(room_id))[0], 200)
        await alice.ok("POST", f"/rooms/{q(room_id)}/leave", {})
        # No user of b.test is in the room: b.test is no resident server.
        code, answer = await self.make_join(room_id)
        self.assertEqual((code, answer["errcode"]), (404, "M_NOT_FOUND"), answer)

    async def test_servers_not_in_the_room_read_nothing(self) -> None:
        alice, room_id = await self.room()
        state = await alice.ok("GET", f"/rooms/{q(room_id)}/state")
        create_id = next(e["event_id"] for e in state if e["type"] == "m.room.create")
        for method, path, body in (
            ("GET", f"/_matrix/federation/v1/event/{q(create_id)}", None),
            ("GET", f"/_matrix/federation/v1/state_ids/{q(room_id)}?event_id={q(create_id)}", None),
            ("GET", f"/_matrix/federation/v1/event_auth/{q(room_id)}/{q(create_id)}", None),
            ("GET", f"/_matrix/federation/v1/backfill/{q(room_id)}?v={q(create_id)}", None),
            (
                "POST",
                f"/_matrix/federation/v1/get_missing_events/{q(room_id)}",
                {"earliest_events": [], "latest_events": [create_id]},
            ),
        ):
            code, answer = await self.federation(method, path, body)
            self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"), path)
        code, answer = await self.federation(
            "GET", "/_matrix/federation/v1/state_ids/!nowhere:b.test?event_id=$x"
        )
        self.assertEqual((code, answer["errcode"]), (404, "M_NOT_FOUND"))
        code, answer = await self.federation(
            "POST",
            f"/_matrix/federation/v1/get_missing_events/{q(room_id)}",
            {"latest_events": "not a list"},
        )
        self.assertEqual(code, 400, answer)

    async def test_remote_user_leaves(self) -> None:
        alice, room_id = await self.room()
        version = await self.join_carol(room_id)
        path = f"/_matrix/federation/v1/make_leave/{q(room_id)}/{q(CAROL)}"
        code, made = await self.federation("GET", path)
        self.assertEqual(code, 200, made)
        self.assertEqual(made["event"]["content"], {"membership": "leave"})
        leave = sign_event(version, {**made["event"], "origin": "a.test"}, "a.test", self.a_key)

        # A join sent to send_leave is not a leave.
        code, join = await self.make_join(room_id)
        wrong = self.signed_join(join["event"], version)
        leave_path = "/_matrix/federation/v2/send_leave/{}/{}"
        code, answer = await self.federation(
            "PUT", leave_path.format(q(room_id), q(event_id_of(version, wrong))), wrong
        )
        self.assertEqual((code, answer["errcode"]), (400, "M_BAD_JSON"), answer)
        self.assertEqual(await self.members(alice, room_id), {alice.user_id, CAROL})

        code, answer = await self.federation(
            "PUT", leave_path.format(q(room_id), q(event_id_of(version, leave))), leave
        )
        self.assertEqual((code, answer), (200, {}))
        self.assertEqual(await self.members(alice, room_id), {alice.user_id})

    async def test_server_acl_denies_joining_and_reading(self) -> None:
        alice, room_id = await self.room()
        await self.join_carol(room_id)
        await alice.ok(
            "PUT",
            f"/rooms/{q(room_id)}/state/m.room.server_acl",
            {"allow": ["*"], "deny": ["a.*"], "allow_ip_literals": False},
        )
        code, answer = await self.make_join(room_id)
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"), answer)
        self.assertIn("server ACL", answer["error"])
        state = await alice.ok("GET", f"/rooms/{q(room_id)}/state")
        create_id = next(e["event_id"] for e in state if e["type"] == "m.room.create")
        code, answer = await self.federation("GET", f"/_matrix/federation/v1/event/{q(create_id)}")
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"), answer)

    async def test_history_before_the_join_is_redacted_when_visibility_is_joined(self) -> None:
        alice, room_id = await self.room()
        await alice.ok(
            "PUT",
            f"/rooms/{q(room_id)}/state/m.room.history_visibility",
            {"history_visibility": "joined"},
        )
        secret = await alice.send(room_id, "before carol, hidden from a.test")
        version = await self.join_carol(room_id)
        after = await alice.send(room_id, "after carol")
        code, back = await self.federation(
            "GET", f"/_matrix/federation/v1/backfill/{q(room_id)}?v={q(after)}&limit=4"
        )
        self.assertEqual(code, 200, back)
        by_id = {self.check_served(version, p, whole=False): p for p in back["pdus"]}
        self.assertEqual(by_id[after]["content"]["body"], "after carol")
        # Still in the graph, still signed, its content gone.
        self.assertEqual(by_id[secret]["content"], {})
        self.assertFalse(content_hash_matches(version, by_id[secret]))
        code, served = await self.federation("GET", f"/_matrix/federation/v1/event/{q(secret)}")
        self.assertEqual((code, served["pdus"][0]["content"]), (200, {}))

    async def test_writer_refuses_unknown_parents_and_a_ban_since_make_join(self) -> None:
        alice, room_id = await self.room()
        code, made = await self.make_join(room_id)
        self.assertEqual(code, 200, made)
        version = KNOWN_ROOM_VERSIONS[made["room_version"]]
        store = self.b["main"].store

        orphan = self.signed_join({**made["event"], "prev_events": ["$nowhere"]}, version)
        code, answer = await self.send_join(room_id, orphan, version)
        self.assertEqual((code, answer["errcode"]), (400, "M_INVALID_PARAM"), answer)
        self.assertIn("prev_events", answer["error"])
        self.assertEqual(await store.get_received_pdus([event_id_of(version, orphan)]), {})

        # Banned between make_join and send_join: the writer checks the
        # join against the room's current state and refuses it.
        join = self.signed_join(made["event"], version)
        await alice.ok("POST", f"/rooms/{q(room_id)}/ban", {"user_id": CAROL})
        code, answer = await self.send_join(room_id, join, version)
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"), answer)
        self.assertEqual(await store.get_received_pdus([event_id_of(version, join)]), {})
        self.assertIsNone(await store.get_event(event_id_of(version, join)))
        self.assertEqual(await self.members(alice, room_id), {alice.user_id})

    async def test_join_in_room_versions_1_and_3(self) -> None:
        # 1: server-suffixed ids, [id, hashes] references, the event id's
        # server signs; 3: reference-hash ids in standard base64 ('/' and
        # '+' in paths).
        for room_version in ("1", "3"):
            alice, room_id = await self.room(room_version=room_version)
            path = f"/_matrix/federation/v1/make_join/{q(room_id)}/{q(CAROL)}?ver={room_version}"
            code, made = await self.federation("GET", path)
            self.assertEqual(code, 200, made)
            self.assertEqual(made["room_version"], room_version)
            version = KNOWN_ROOM_VERSIONS[room_version]
            join = self.signed_join(made["event"], version)
            code, answer = await self.send_join(room_id, join, version)
            self.assertEqual(code, 200, answer)
            for pdu in answer["state"] + answer["auth_chain"]:
                self.check_served(version, pdu)
            self.assertEqual(await self.members(alice, room_id), {alice.user_id, CAROL})
            join_id = event_id_of(version, join)
            code, served = await self.federation(
                "GET", f"/_matrix/federation/v1/event/{q(join_id)}"
            )
            self.assertEqual(code, 200, served)
            self.assertEqual(
                served["pdus"][0]["signatures"]["a.test"], join["signatures"]["a.test"]
            )
