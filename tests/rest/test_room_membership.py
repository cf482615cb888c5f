"""Membership requests as the spec and the auth rules say: bans keep a user
out until ``POST /unban`` (a banned user is neither invited nor kicked), a
join carries the content its request adds, ``joined_members`` always names
both fields. On the monolith and on a layout where the room's events are
written by an events writer and the users talk to different processes."""

from __future__ import annotations

import urllib.parse
from typing import Any

from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase


def q(value: str | None) -> str:
    assert value is not None
    return urllib.parse.quote(value, safe="")


class MembershipTestCase(DatabaseTestCase):
    """On the monolith."""

    workers: list[str] = []
    stream_writers: dict[str, Any] = {}

    async def start(self) -> None:
        servers, clients, _ = start_cluster(
            self, self.test_db, workers=self.workers, stream_writers=self.stream_writers
        )
        await eventually(lambda: all(hs.replication.connected for hs in servers.values()))
        names = list(clients)
        self.alice = await ClientApi(self, clients[names[0]].base_url).register("alice")
        self.bob = await ClientApi(self, clients[names[-1]].base_url).register("bob")

    async def member_content(self, client: ClientApi, room: str, user: str | None) -> Any:
        """The member event's content, once ``client``'s process has it."""
        found: list[Any] = []

        async def read() -> bool:
            code, body = await client.request("GET", f"/rooms/{room}/state/m.room.member/{q(user)}")
            found[:] = [body]
            return code == 200

        await eventually(read, what="the member event")
        return found[0]

    async def test_banned_user_stays_out_until_unbanned(self) -> None:
        await self.start()
        room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room}", {})
        await self.alice.ok(
            "POST", f"/rooms/{room}/ban", {"user_id": self.bob.user_id, "reason": "testing"}
        )
        banned = await self.member_content(self.alice, room, self.bob.user_id)
        self.assertEqual((banned["membership"], banned["reason"]), ("ban", "testing"))
        for client, method, path, body in (
            (self.bob, "POST", f"/join/{room}", {}),
            (self.bob, "POST", f"/rooms/{room}/join", {}),
            (self.alice, "POST", f"/rooms/{room}/invite", {"user_id": self.bob.user_id}),
            (self.alice, "POST", f"/rooms/{room}/kick", {"user_id": self.bob.user_id}),
        ):
            code, answer = await client.request(method, path, body)
            self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"), path)
        # Only someone with the ban level unbans.
        code, answer = await self.bob.request(
            "POST", f"/rooms/{room}/unban", {"user_id": self.alice.user_id}
        )
        self.assertEqual(code, 403)
        await self.alice.ok("POST", f"/rooms/{room}/unban", {"user_id": self.bob.user_id})
        unbanned = await self.member_content(self.alice, room, self.bob.user_id)
        self.assertEqual(unbanned["membership"], "leave")
        # Unbanning someone not banned is refused, and so is a second unban.
        code, answer = await self.alice.request(
            "POST", f"/rooms/{room}/unban", {"user_id": self.bob.user_id}
        )
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"))
        await self.bob.ok("POST", f"/rooms/{room}/join", {})
        code, answer = await self.alice.request("POST", f"/rooms/{room}/unban", {})
        self.assertEqual(code, 400)

    async def test_kicking_someone_not_in_the_room_is_refused(self) -> None:
        await self.start()
        room = await self.alice.create_room(preset="public_chat")
        code, answer = await self.alice.request(
            "POST", f"/rooms/{room}/kick", {"user_id": self.bob.user_id}
        )
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"))
        await self.bob.ok("POST", f"/join/{room}", {})
        await self.bob.ok("POST", f"/rooms/{room}/leave", {})
        code, answer = await self.alice.request(
            "POST", f"/rooms/{room}/kick", {"user_id": self.bob.user_id}
        )
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"))

    async def test_join_with_custom_content(self) -> None:
        await self.start()
        room = await self.alice.create_room(preset="public_chat", room_alias_name="custom")
        await self.bob.ok("POST", f"/join/{room}", {"foo": "bar", "membership": "leave"})
        content = await self.member_content(self.alice, room, self.bob.user_id)
        self.assertEqual(content, {"membership": "join", "displayname": "bob", "foo": "bar"})
        await self.bob.ok("POST", f"/rooms/{room}/leave", {})
        alias = q("#custom:test.local")
        await self.bob.ok(
            "POST",
            f"/join/{alias}",
            {"foo": {"nested": [1, 2]}, "displayname": "Bobby here", "reason": "hello"},
        )

        async def rejoined() -> bool:
            content = await self.member_content(self.alice, room, self.bob.user_id)
            return bool(content["membership"] == "join")

        await eventually(rejoined, what="bob's second join")
        content = await self.member_content(self.alice, room, self.bob.user_id)
        self.assertEqual(
            content,
            {
                "membership": "join",
                "displayname": "Bobby here",
                "foo": {"nested": [1, 2]},
                "reason": "hello",
            },
        )
        await self.bob.ok("POST", f"/rooms/{room}/leave", {})
        for bad in ({"avatar_url": "not-mxc"}, {"foo": 1.5}, {"foo": 2**60}):
            code, answer = await self.bob.request("POST", f"/join/{room}", bad)
            self.assertEqual((code, answer["errcode"]), (400, "M_BAD_JSON"), bad)

    async def test_joined_members_names_both_fields(self) -> None:
        await self.start()
        await self.bob.ok(
            "PUT", f"/profile/{q(self.bob.user_id)}/avatar_url", {"avatar_url": "mxc://x/y"}
        )
        room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room}", {})
        found: list[Any] = []

        async def both() -> bool:
            found[:] = [await self.alice.ok("GET", f"/rooms/{room}/joined_members")]
            return len(found[0]["joined"]) == 2

        await eventually(both, what="both members")
        self.assertEqual(
            found[0]["joined"],
            {
                self.alice.user_id: {"display_name": "alice", "avatar_url": None},
                self.bob.user_id: {"display_name": "bob", "avatar_url": "mxc://x/y"},
            },
        )


class MembershipThroughWorkersTestCase(MembershipTestCase):
    """Alice on the main process, Bob on a reader, the room's events written
    by an events writer."""

    workers = ["writer", "reader"]
    stream_writers = {"events": ["writer"]}


class ThirdPartyInviteTestCase(DatabaseTestCase):
    """Invites by email go through an identity server, which this server
    does not use: refused, with nothing sent (docs/client-api.md)."""

    async def test_refused(self) -> None:
        _, clients, _ = start_cluster(self, self.test_db)
        alice = await ClientApi(self, clients["main"].base_url).register("alice")
        room = await alice.create_room(preset="private_chat")
        before = [e["event_id"] for e in await alice.ok("GET", f"/rooms/{room}/state")]
        threepid = {
            "id_server": "id.example.org",
            "id_access_token": "token",
            "medium": "email",
            "address": "lemurs@monkeyworld.org",
        }
        code, body = await alice.request("POST", f"/rooms/{room}/invite", threepid)
        self.assertEqual((code, body["errcode"]), (400, "M_SERVER_NOT_TRUSTED"))
        code, body = await alice.request("POST", "/createRoom", {"invite_3pid": [threepid]})
        self.assertEqual((code, body["errcode"]), (400, "M_SERVER_NOT_TRUSTED"))
        after = [e["event_id"] for e in await alice.ok("GET", f"/rooms/{room}/state")]
        self.assertEqual(after, before)
        self.assertEqual((await alice.ok("GET", "/joined_rooms"))["joined_rooms"], [room])
