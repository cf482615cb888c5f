"""Kicks and bans across servers: a user of b.test kicks and bans a user
of a.test from b.test's room, and a moderator of a.test (given power by
b.test's room creator) kicks a user of b.test; each server ends with the
same memberships, and each user's /sync says so. SQLite and PostgreSQL
(``SYNAPSE_LITE_TEST_DB``)."""

from __future__ import annotations

import urllib.parse

from tests.harness.client_api import ClientApi
from tests.harness.federation import TwoServers
from tests.harness.polling import eventually


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


class RemoteModerationTestCase(TwoServers):
    async def membership(self, user: ClientApi, room_id: str, target: str) -> str | None:
        code, body = await user.request(
            "GET", f"/rooms/{q(room_id)}/state/m.room.member/{q(target)}"
        )
        return body.get("membership") if code == 200 else None

    async def settled(
        self, user: ClientApi, room_id: str, target: str | None, membership: str
    ) -> None:
        assert target is not None, "a registered user has an id"

        async def done() -> bool:
            return await self.membership(user, room_id, target) == membership

        await eventually(done, timeout=10, what=f"{target} {membership} as {user.user_id} sees")

    async def test_kick_and_ban_of_and_by_remote_users(self) -> None:
        alice = await self.client(self.b).register("alice")
        room_id = await alice.create_room(preset="public_chat")
        carol = await self.client(self.a).register("carol")
        await carol.ok("POST", f"/join/{q(room_id)}?server_name=b.test", {})
        dave = await self.client(self.a).register("dave")
        await dave.ok("POST", f"/join/{q(room_id)}?server_name=b.test", {})
        bob = await self.client(self.b).register("bob")
        await bob.ok("POST", f"/join/{q(room_id)}", {})
        await self.settled(carol, room_id, bob.user_id, "join")

        # b.test's alice kicks a.test's carol: both servers see her leave.
        carol_since = (await carol.sync())["next_batch"]
        bob_since = (await bob.sync())["next_batch"]
        await alice.ok("POST", f"/rooms/{q(room_id)}/kick", {"user_id": carol.user_id})
        await self.settled(dave, room_id, carol.user_id, "leave")
        await self.settled(carol, room_id, carol.user_id, "leave")
        self.assertIn(room_id, (await carol.sync(since=carol_since))["rooms"]["leave"])
        # ... and bans dave, who cannot come back.
        await alice.ok("POST", f"/rooms/{q(room_id)}/ban", {"user_id": dave.user_id})
        await self.settled(alice, room_id, dave.user_id, "ban")
        await self.settled(dave, room_id, dave.user_id, "ban")
        code, _ = await dave.request("POST", f"/join/{q(room_id)}?server_name=b.test", {})
        self.assertEqual(code, 403)

        # carol back in, made a moderator by alice: she kicks b.test's bob.
        await carol.ok("POST", f"/join/{q(room_id)}?server_name=b.test", {})
        levels = await alice.ok("GET", f"/rooms/{q(room_id)}/state/m.room.power_levels")
        levels["users"][carol.user_id] = 50
        await alice.ok("PUT", f"/rooms/{q(room_id)}/state/m.room.power_levels", levels)

        async def carol_is_moderator() -> bool:
            seen = await carol.ok("GET", f"/rooms/{q(room_id)}/state/m.room.power_levels")
            return bool(seen["users"].get(carol.user_id) == 50)

        await eventually(carol_is_moderator, timeout=10, what="carol's power on a.test")
        await carol.ok("POST", f"/rooms/{q(room_id)}/kick", {"user_id": bob.user_id})
        await self.settled(alice, room_id, bob.user_id, "leave")
        self.assertIn(room_id, (await bob.sync(since=bob_since))["rooms"]["leave"])
