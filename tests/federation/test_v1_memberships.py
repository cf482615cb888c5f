"""The v1 membership endpoints (deprecated, still used by some servers and
SyTest): ``PUT /v1/send_join`` and ``/v1/send_leave`` answer as v2 does,
inside a ``[200, {...}]`` list, and refuse what v2 refuses; our invites
fall back to ``/v1/invite``; a ``make_join`` refusal is passed through. b.test is a
main process and a federation worker (tests/federation/test_rooms.py)."""

from __future__ import annotations

import json
from typing import Any

import treq
from twisted.trial import unittest
from twisted.web.http_headers import Headers

from synapse_lite.api.room_versions import KNOWN_ROOM_VERSIONS
from synapse_lite.event_graph.hashing import event_id_of, sign_event
from synapse_lite.federation.client import FederationClient, FederationRequestError
from synapse_lite.handlers.federation_join import JoinAnswerError, read_answer_pdu
from synapse_lite.storage.id_generators import generator as id_generators
from tests.federation.test_rooms import CAROL, FederationRoomsBase, q
from tests.harness.client_api import ClientApi
from tests.harness.federation import LoopbackServers
from tests.harness.processes import NO_KEEPALIVE


class V1MembershipsTestCase(FederationRoomsBase):
    async def test_v1_send_join_and_send_leave(self) -> None:
        alice, room_id = await self.room()
        code, made = await self.make_join(room_id)
        self.assertEqual(code, 200, made)
        version = KNOWN_ROOM_VERSIONS[made["room_version"]]
        join = self.signed_join(made["event"], version)
        join_id = event_id_of(version, join)
        path = f"/_matrix/federation/v1/send_join/{q(room_id)}/{q(join_id)}"
        # Signed by another server than the one asking: refused as in v2.
        forged = sign_event(version, {**made["event"], "origin": "a.test"}, "b.test", self.b_key)
        code, _ = await self.federation("PUT", path, forged)
        self.assertIn(code, (400, 403))
        code, answer = await self.federation("PUT", path, join)
        self.assertEqual(code, 200, answer)
        self.assertEqual(answer[0], 200)
        self.assertIn("state", answer[1])
        # Oldest first, so a reader replacing state as it reads keeps the
        # newest of each key (SyTest's does).
        for events in (answer[1]["state"], answer[1]["auth_chain"]):
            depths = [e["depth"] for e in events]
            self.assertEqual(depths, sorted(depths))
        self.assertIn(CAROL, await self.members(alice, room_id))

        code, made = await self.federation(
            "GET", f"/_matrix/federation/v1/make_leave/{q(room_id)}/{q(CAROL)}"
        )
        self.assertEqual(code, 200, made)
        # Unsigned (no hashes either): refused as unsigned, 403.
        bare = {**made["event"], "origin": "a.test"}
        bare_id = event_id_of(version, bare)
        code, answer = await self.federation(
            "PUT", f"/_matrix/federation/v1/send_leave/{q(room_id)}/{q(bare_id)}", bare
        )
        self.assertEqual(code, 403, answer)
        leave = sign_event(version, bare, "a.test", self.a_key)
        leave_id = event_id_of(version, leave)
        code, answer = await self.federation(
            "PUT", f"/_matrix/federation/v1/send_leave/{q(room_id)}/{q(leave_id)}", leave
        )
        self.assertEqual((code, answer), (200, [200, {}]))
        self.assertNotIn(CAROL, await self.members(alice, room_id))

    async def test_a_body_that_is_not_canonical_json_is_bad_json(self) -> None:
        _alice, room_id = await self.room()
        # A float: no server could have signed it (answered before the
        # signature is looked at).
        response = await treq.request(
            "PUT",
            self.urls["b.test"] + f"/_matrix/federation/v2/send_join/{q(room_id)}/$x",
            data=json.dumps({"content": {"bad_val": 1.1}}).encode(),
            headers=Headers({"Authorization": ["X-Matrix origin=a.test,key=ed25519:x,sig=x"]}),
            pool=NO_KEEPALIVE,
        )
        self.assertEqual(response.code, 400)
        self.assertEqual(json.loads(await treq.content(response))["errcode"], "M_BAD_JSON")


class RemoteMembershipAnswersTestCase(LoopbackServers):
    """An invite to a room of version 1 or 2 for a server that knows only
    ``/v1/invite`` (its v2 answers 404 without a Matrix error, as SyTest's
    does) goes through v1; a server's 400 to ``make_join`` reaches the
    client as it was."""

    def setUp(self) -> None:
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)
        self.a = self.make_server("a.test", [])
        self.b = self.make_server("b.test", [])
        self.connect(self.a, self.b)

    async def test_invite_falls_back_to_v1(self) -> None:
        base = self.b["main"].config.instance_map["main"].base_url
        alice = await ClientApi(self, base).register("alice")
        room_id = await alice.create_room(preset="private_chat", name="Secret", room_version="1")
        bob = await ClientApi(self, self.a["main"].config.instance_map["main"].base_url).register(
            "bob"
        )
        original = FederationClient.put_json
        paths: list[str] = []

        async def put_json(client: Any, destination: str, path: str, content: Any) -> Any:
            paths.append(path)
            if "/v2/invite/" in path:
                raise FederationRequestError(destination, "404", 404, None)
            return await original(client, destination, path, content)

        self.patch(FederationClient, "put_json", put_json)
        await alice.ok("POST", f"/rooms/{q(room_id)}/invite", {"user_id": bob.user_id})
        self.assertTrue(any("/v1/invite/" in p for p in paths), paths)
        invite = (await bob.sync())["rooms"]["invite"][room_id]["invite_state"]["events"]
        names = [e for e in invite if e["type"] == "m.room.name"]
        self.assertEqual(names[0]["content"]["name"], "Secret")

    async def test_a_make_join_error_is_passed_through(self) -> None:
        base = self.b["main"].config.instance_map["main"].base_url
        alice = await ClientApi(self, base).register("alice")
        room_id = await alice.create_room(preset="public_chat")
        bob = await ClientApi(self, self.a["main"].config.instance_map["main"].base_url).register(
            "bob"
        )
        refusal = {"errcode": "M_INCOMPATIBLE_ROOM_VERSION", "error": "no", "room_version": "x"}

        async def get_json(client: Any, destination: str, path: str, signed: bool = True) -> Any:
            raise FederationRequestError(destination, "400", 400, refusal)

        self.patch(FederationClient, "get_json", get_json)
        code, body = await bob.request("POST", f"/join/{q(room_id)}?server_name=b.test", {})
        self.assertEqual(code, 400, body)
        self.assertEqual(body["errcode"], "M_INCOMPATIBLE_ROOM_VERSION")
        self.assertEqual(body["room_version"], "x")


class AnswerPduTestCase(unittest.TestCase):
    def test_an_answer_event_that_is_not_canonical_json_is_refused(self) -> None:
        # A float in a version 6 event's content (its id, over the redacted
        # form, could still be computed): refused, not a crash.
        version = KNOWN_ROOM_VERSIONS["6"]
        pdu = {
            "room_id": "!r:b.test",
            "type": "m.room.member",
            "state_key": "@bob:a.test",
            "sender": "@alice:b.test",
            "content": {"membership": "invite", "bad_val": 1.1},
            "origin_server_ts": 1,
            "depth": 3,
            "prev_events": ["$p"],
            "auth_events": [],
            "hashes": {"sha256": "x"},
            "signatures": {},
        }
        with self.assertRaises(JoinAnswerError) as raised:
            read_answer_pdu(version, "!r:b.test", pdu)
        self.assertIn("malformed for room version 6", raised.exception.reason)
