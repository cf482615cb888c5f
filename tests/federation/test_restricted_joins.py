"""Restricted joins across servers (docs/federation.md, "Restricted joins"):
``b.test`` (main, the events writer, and ``fed1``) is resident in a room
restricted to members of another of its rooms; ``a.test``'s user, joined to
that other room, joins through ``make_join``/``send_join`` and b.test
vouches for her (``join_authorised_via_users_server``, b.test's signature).
Refusals: a user in none of the allowed rooms (403), allowed rooms b.test
is not in (400 ``M_UNABLE_TO_AUTHORISE_JOIN``, passed to a.test's client), a
forged authoriser (403, nothing stored)."""

from __future__ import annotations

import urllib.parse
from typing import Any

from synapse_lite.api.room_versions import KNOWN_ROOM_VERSIONS
from synapse_lite.event_graph.hashing import event_id_of, sign_event, verify_event_signature
from synapse_lite.federation.crypto import load_or_create_signing_key
from tests.harness.client_api import ClientApi
from tests.harness.federation import TwoServers

DAVE = "@dave:a.test"
V10 = KNOWN_ROOM_VERSIONS["10"]


def q(value: str | None) -> str:
    return urllib.parse.quote(value or "", safe="")


class RestrictedJoinTestCase(TwoServers):
    async def rooms(self, allowed: str | None = None) -> tuple[ClientApi, str, str]:
        """alice of b.test, a public room ``space`` and a room restricted to
        its members (or to ``allowed``)."""
        self.alices = getattr(self, "alices", 0) + 1
        alice = await self.client(self.b).register(f"alice{self.alices}")
        space = await alice.create_room(preset="public_chat", room_version="10")
        room = await alice.create_room(preset="private_chat", room_version="10", name="Inner")
        rule = {"type": "m.room_membership", "room_id": allowed or space}
        await alice.ok(
            "PUT",
            f"/rooms/{q(room)}/state/m.room.join_rules/",
            {"join_rule": "restricted", "allow": [rule]},
        )
        return alice, space, room

    async def membership(self, alice: ClientApi, room_id: str, user_id: str | None) -> Any:
        code, body = await alice.request(
            "GET", f"/rooms/{q(room_id)}/state/m.room.member/{q(user_id)}"
        )
        return body if code == 200 else None

    async def make_join(self, room_id: str, user_id: str | None = DAVE) -> tuple[int, Any]:
        path = f"/_matrix/federation/v1/make_join/{q(room_id)}/{q(user_id)}?ver=10"
        return await self.signed_request(self.a_key, "a.test", "b.test", "GET", path)

    async def send_join(self, room_id: str, event: dict[str, Any]) -> tuple[int, Any]:
        path = f"/_matrix/federation/v2/send_join/{q(room_id)}/{q(event_id_of(V10, event))}"
        return await self.signed_request(self.a_key, "a.test", "b.test", "PUT", path, event)

    async def test_member_of_the_allowed_room_joins_through_the_resident_server(self) -> None:
        alice, space, room = await self.rooms()
        carol = await self.client(self.a).register("carol")
        # Not yet in the space: b.test refuses to vouch, a.test's client hears 403.
        code, body = await carol.request("POST", f"/join/{q(room)}?via=b.test", {})
        self.assertEqual(code, 403, body)
        await carol.ok("POST", f"/join/{q(space)}?via=b.test", {})
        await carol.ok("POST", f"/join/{q(room)}?via=b.test", {})
        member = await self.membership(alice, room, carol.user_id)
        self.assertEqual(
            (member["membership"], member["join_authorised_via_users_server"]),
            ("join", alice.user_id),
        )
        sync = await carol.sync()
        self.assertIn(room, sync["rooms"]["join"])
        # The join b.test stored and serves carries b.test's signature.
        join_id = await carol.ok("GET", f"/rooms/{q(room)}/state")
        mine = [
            e for e in join_id if e["type"] == "m.room.member" and e["state_key"] == carol.user_id
        ]
        code, served = await self.signed_request(
            self.a_key,
            "a.test",
            "b.test",
            "GET",
            f"/_matrix/federation/v1/event/{q(mine[0]['event_id'])}",
        )
        self.assertEqual(code, 200, served)
        b_key = load_or_create_signing_key(self.b["main"].config.data_dir, create=False)
        pdu = {k: v for k, v in served["pdus"][0].items() if k != "unsigned"}
        verify_event_signature(V10, pdu, "b.test", b_key.key_id, b_key.verify_key_base64)

    async def test_template_names_the_authoriser_and_refusals(self) -> None:
        alice, space, room = await self.rooms()
        # dave is in no allowed room: 403 at make_join.
        code, body = await self.make_join(room)
        self.assertEqual(code, 403, body)
        self.assertIn("not in any of the rooms", body["error"])
        # carol of a.test joins the space (through b.test), then gets a
        # template that names alice.
        carol = await self.client(self.a).register("carol")
        await carol.ok("POST", f"/join/{q(space)}?via=b.test", {})
        code, made = await self.make_join(room, carol.user_id)
        self.assertEqual(code, 200, made)
        self.assertEqual(
            made["event"]["content"],
            {"membership": "join", "join_authorised_via_users_server": alice.user_id},
        )
        # dave forges a join on carol's template: b.test does not vouch for him.
        forged = {**made["event"], "sender": DAVE, "state_key": DAVE, "origin": "a.test"}
        signed = sign_event(V10, forged, "a.test", self.a_key)
        code, body = await self.send_join(room, signed)
        self.assertEqual(code, 403, body)
        self.assertIsNone(await self.membership(alice, room, DAVE))
        # A join naming an authoriser where none is needed (a public room).
        code, made_public = await self.make_join(space)
        self.assertEqual(code, 200, made_public)
        event = {**made_public["event"], "origin": "a.test"}
        event["content"] = {**event["content"], "join_authorised_via_users_server": alice.user_id}
        code, body = await self.send_join(space, sign_event(V10, event, "a.test", self.a_key))
        self.assertEqual(code, 403, body)
        self.assertIn("vouch for nothing", body["error"])
        self.assertIsNone(await self.membership(alice, space, DAVE))

    async def test_allowed_rooms_the_resident_server_is_not_in(self) -> None:
        alice, _space, room = await self.rooms(allowed="!elsewhere:c.test")
        code, body = await self.make_join(room)
        self.assertEqual((code, body["errcode"]), (400, "M_UNABLE_TO_AUTHORISE_JOIN"), body)
        # a.test's client gets b.test's answer passed through.
        carol = await self.client(self.a).register("carol")
        code, body = await carol.request("POST", f"/join/{q(room)}?via=b.test", {})
        self.assertEqual((code, body["errcode"]), (400, "M_UNABLE_TO_AUTHORISE_JOIN"), body)
        self.assertIsNone(await self.membership(alice, room, carol.user_id))
