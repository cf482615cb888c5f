"""Knocking across servers (docs/federation.md, "Knocking across servers"):
``a.test``'s user knocks on a room of ``b.test`` (main, the events writer,
and ``fed1``, a federation worker) with ``POST /knock?via=``; b.test serves
``make_knock``/``send_knock``; the knock in a.test's /sync ``knock`` section
with the stripped state b.test answered; the room's admin lets her in with
an invite. Hostile knocks (a room version without knocks, a join rule that
takes none, another event than the path's, not a knock, a server the ACL
denies) are refused with nothing stored. And an invite from a server that is
gone is rejected on our side alone.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from synapse_lite.api.room_versions import KNOWN_ROOM_VERSIONS, EventIdFormat
from synapse_lite.event_graph.hashing import event_id_of, sign_event
from tests.harness.client_api import ClientApi
from tests.harness.federation import TwoServers
from tests.harness.polling import eventually

DAVE = "@dave:a.test"


def q(value: str | None) -> str:
    return urllib.parse.quote(value or "", safe="")


class KnockTestCase(TwoServers):
    async def b_room(self, **body: Any) -> tuple[ClientApi, str]:
        self.alices = getattr(self, "alices", 0) + 1
        alice = await self.client(self.b).register(f"alice{self.alices}")
        base: dict[str, Any] = {"preset": "private_chat", "name": "Knock Here"}
        room_id = await alice.create_room(**{**base, **body})
        await alice.send(room_id, "hello from b")
        return alice, room_id

    async def knock_room(self, room_version: str = "10") -> tuple[ClientApi, str]:
        alice, room_id = await self.b_room(room_version=room_version)
        await alice.ok(
            "PUT", f"/rooms/{q(room_id)}/state/m.room.join_rules/", {"join_rule": "knock"}
        )
        return alice, room_id

    async def federation(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """A request to b.test signed as a.test."""
        return await self.signed_request(self.a_key, "a.test", "b.test", method, path, body)

    async def make_knock(self, room_id: str, versions: str = "ver=10") -> tuple[int, Any]:
        path = f"/_matrix/federation/v1/make_knock/{q(room_id)}/{q(DAVE)}?{versions}"
        return await self.federation("GET", path)

    def signed(self, template: dict[str, Any], version_id: str) -> dict[str, Any]:
        version = KNOWN_ROOM_VERSIONS[version_id]
        event = {**template, "origin": "a.test"}
        if version.event_ids is EventIdFormat.SERVER_SUFFIXED:
            event["event_id"] = "$dave-knock:a.test"
        return sign_event(version, event, "a.test", self.a_key)

    async def send_knock(
        self, room_id: str, event: dict[str, Any], event_id: str | None = None
    ) -> tuple[int, Any]:
        event_id = event_id or event_id_of(KNOWN_ROOM_VERSIONS["10"], event)
        path = f"/_matrix/federation/v1/send_knock/{q(room_id)}/{q(event_id)}"
        return await self.federation("PUT", path, event)

    async def membership(self, alice: ClientApi, room_id: str, user_id: str | None) -> str | None:
        code, body = await alice.request(
            "GET", f"/rooms/{q(room_id)}/state/m.room.member/{q(user_id)}"
        )
        return body.get("membership") if code == 200 else None

    async def test_knock_through_the_other_server_then_invited_in(self) -> None:
        alice, room_id = await self.knock_room()
        carol = await self.client(self.a).register("carol")
        knocked = await carol.ok("POST", f"/knock/{q(room_id)}?via=b.test", {"reason": "let me in"})
        self.assertEqual(knocked["room_id"], room_id)
        # b.test holds the knock, its reason with it.
        member = await alice.ok(
            "GET", f"/rooms/{q(room_id)}/state/m.room.member/{q(carol.user_id)}"
        )
        self.assertEqual((member["membership"], member["reason"]), ("knock", "let me in"))
        # carol's /sync: the room in ``knock`` with the stripped state b.test answered.
        sync = await carol.sync()
        events = sync["rooms"]["knock"][room_id]["knock_state"]["events"]
        by_key = {(e["type"], e["state_key"]): e for e in events}
        self.assertEqual(by_key[("m.room.name", "")]["content"]["name"], "Knock Here")
        self.assertEqual(by_key[("m.room.join_rules", "")]["content"]["join_rule"], "knock")
        self.assertEqual(by_key[("m.room.member", carol.user_id)]["content"]["membership"], "knock")
        self.assertNotIn(room_id, sync["rooms"]["join"])

        # alice accepts: an invite to a.test (the room's outbound /invite),
        # then carol joins through b.test.
        await alice.ok("POST", f"/rooms/{q(room_id)}/invite", {"user_id": carol.user_id})
        sync = await carol.sync(since=sync["next_batch"])
        self.assertIn(room_id, sync["rooms"]["invite"])
        await carol.ok("POST", f"/rooms/{q(room_id)}/join", {})
        self.assertEqual(await self.membership(alice, room_id, carol.user_id), "join")

    async def test_knock_refusals_reach_the_client(self) -> None:
        carol = await self.client(self.a).register("carol")
        # An invite-only room takes no knocks: b.test's 403 passed on.
        _alice, invite_only = await self.b_room(room_version="10")
        code, body = await carol.request("POST", f"/knock/{q(invite_only)}?via=b.test", {})
        self.assertEqual(code, 403, body)
        # A room version without knocks: b.test's M_INCOMPATIBLE_ROOM_VERSION.
        _alice, old = await self.b_room(room_version="6")
        code, body = await carol.request("POST", f"/knock/{q(old)}?via=b.test", {})
        self.assertEqual((code, body["errcode"]), (400, "M_INCOMPATIBLE_ROOM_VERSION"), body)
        # Nothing shows in carol's /sync.
        self.assertEqual((await carol.sync())["rooms"].get("knock", {}), {})

    async def test_make_knock_and_send_knock(self) -> None:
        alice, room_id = await self.knock_room()
        code, made = await self.make_knock(room_id)
        self.assertEqual(code, 200, made)
        self.assertEqual(made["room_version"], "10")
        template = made["event"]
        self.assertEqual(
            (template["sender"], template["state_key"], template["content"]),
            (DAVE, DAVE, {"membership": "knock"}),
        )
        knock = self.signed(template, "10")
        code, answer = await self.send_knock(room_id, knock)
        self.assertEqual(code, 200, answer)
        state = {(e["type"], e["state_key"]) for e in answer["knock_room_state"]}
        self.assertLessEqual(
            {("m.room.create", ""), ("m.room.join_rules", ""), ("m.room.name", "")}, state
        )
        self.assertEqual(await self.membership(alice, room_id, DAVE), "knock")
        # Retried: answered again, nothing doubled.
        code, again = await self.send_knock(room_id, knock)
        self.assertEqual(code, 200, again)

    async def test_hostile_knocks_are_refused(self) -> None:
        alice, room_id = await self.knock_room()
        # A room version without knocks.
        _alice, old = await self.b_room(room_version="6", preset="public_chat")
        code, body = await self.make_knock(old, "ver=6")
        self.assertEqual((code, body["errcode"]), (400, "M_INCOMPATIBLE_ROOM_VERSION"), body)
        self.assertIn("does not support knocking", body["error"])
        # The knocking server does not have the room's version.
        code, body = await self.make_knock(room_id, "ver=9")
        self.assertEqual((code, body["room_version"]), (400, "10"), body)
        # A join rule that takes no knocks (public): 403.
        _alice, public = await self.b_room(preset="public_chat")
        code, body = await self.make_knock(public)
        self.assertEqual(code, 403, body)
        # A user of another server.
        path = f"/_matrix/federation/v1/make_knock/{q(room_id)}/{q('@x:c.test')}?ver=10"
        code, body = await self.federation("GET", path)
        self.assertEqual(code, 403, body)
        # An unknown room.
        code, body = await self.make_knock("!nowhere:b.test")
        self.assertEqual(code, 404, body)

        code, made = await self.make_knock(room_id)
        self.assertEqual(code, 200, made)
        knock = self.signed(made["event"], "10")
        # Another event than the path names.
        code, body = await self.send_knock(room_id, knock, "$other")
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"), body)
        # Not a knock (the template turned into a join).
        join = self.signed({**made["event"], "content": {"membership": "join"}}, "10")
        code, body = await self.send_knock(room_id, join)
        self.assertEqual(code, 400, body)
        self.assertIn("not a knock", body["error"])
        # Content changed after signing.
        tampered = {**knock, "content": {"membership": "knock", "reason": "forged"}}
        code, body = await self.send_knock(room_id, tampered)
        self.assertEqual(code, 400, body)
        # Unsigned.
        unsigned = {k: v for k, v in knock.items() if k != "signatures"}
        code, body = await self.send_knock(room_id, unsigned)
        self.assertEqual(code, 403, body)
        # A knock on a room version without knocks, sent anyway.
        code, made_old = await self.make_join_template(old)
        old_knock = self.signed({**made_old, "content": {"membership": "knock"}}, "6")
        path = (
            f"/_matrix/federation/v1/send_knock/{q(old)}/"
            f"{q(event_id_of(KNOWN_ROOM_VERSIONS['6'], old_knock))}"
        )
        code, body = await self.federation("PUT", path, old_knock)
        self.assertEqual((code, body["errcode"]), (400, "M_INCOMPATIBLE_ROOM_VERSION"), body)
        self.assertIsNone(await self.membership(alice, room_id, DAVE))

        # The room's server ACL denies a.test: both refused.
        await alice.ok(
            "PUT",
            f"/rooms/{q(room_id)}/state/m.room.server_acl/",
            {"allow": ["*"], "deny": ["a.test"]},
        )
        # The ACL is written by the room's writer; the process answering
        # other servers has it once it followed the write (CI, PostgreSQL:
        # one make_knock answered 200 just before).
        refused: dict[str, Any] = {}

        async def acl_applied() -> bool:
            code, body = await self.make_knock(room_id)
            refused.update(body)
            return code == 403

        await eventually(acl_applied, timeout=10, what="make_knock refused by the server ACL")
        self.assertIn("server ACL", refused["error"])
        code, body = await self.send_knock(room_id, knock)
        self.assertEqual(code, 403, body)
        self.assertIsNone(await self.membership(alice, room_id, DAVE))

    async def make_join_template(self, room_id: str) -> tuple[int, Any]:
        """A join template of dave's (for a room that takes joins)."""
        path = f"/_matrix/federation/v1/make_join/{q(room_id)}/{q(DAVE)}?ver=6"
        code, body = await self.federation("GET", path)
        return code, body.get("event")

    async def test_invite_from_a_server_that_is_gone_is_rejected_here(self) -> None:
        alice, room_id = await self.b_room()
        carol = await self.client(self.a).register("carol")
        await alice.ok("POST", f"/rooms/{q(room_id)}/invite", {"user_id": carol.user_id})
        since = (await carol.sync())["next_batch"]
        # b.test is gone (a.test's connections to it, pooled by server
        # name, closed).
        for hs in self.a.values():
            hs.config.federation.destinations["b.test"] = "http://127.0.0.1:1"
            if hs.keyring is not None:
                await hs.keyring._client.close()
        await carol.ok("POST", f"/rooms/{q(room_id)}/leave", {})
        sync = await carol.sync(since=since)
        self.assertIn(room_id, sync["rooms"]["leave"])
        self.assertEqual(sync["rooms"].get("invite", {}), {})
        # b.test never heard of it: carol is still invited there.
        self.assertEqual(await self.membership(alice, room_id, carol.user_id), "invite")

    async def test_knock_rejected_by_the_room(self) -> None:
        alice, room_id = await self.knock_room()
        carol = await self.client(self.a).register("carol")
        await carol.ok("POST", f"/knock/{q(room_id)}?via=b.test", {})
        # alice rejects the knock (a leave of carol by alice), then may
        # still let her in later with an invite. (a.test does not take the
        # leave b.test sends it: carol's /sync keeps the knock; see
        # docs/federation.md "Limits".)
        await alice.ok("POST", f"/rooms/{q(room_id)}/kick", {"user_id": carol.user_id})
        self.assertEqual(await self.membership(alice, room_id, carol.user_id), "leave")
        await alice.ok("POST", f"/rooms/{q(room_id)}/invite", {"user_id": carol.user_id})
        await carol.ok("POST", f"/rooms/{q(room_id)}/join", {})
        self.assertEqual(await self.membership(alice, room_id, carol.user_id), "join")

    async def test_knock_withdrawn(self) -> None:
        alice, room_id = await self.knock_room()
        carol = await self.client(self.a).register("carol")
        await carol.ok("POST", f"/knock/{q(room_id)}?via=b.test", {})
        since = (await carol.sync())["next_batch"]
        # carol withdraws her knock: a leave through the room id's server.
        await carol.ok("POST", f"/rooms/{q(room_id)}/leave", {})
        self.assertEqual(await self.membership(alice, room_id, carol.user_id), "leave")
        sync = await carol.sync(since=since)
        self.assertIn(room_id, sync["rooms"]["leave"])
