"""What admins restrict a user with: a shadow ban
(``/_synapse/admin/v1/users/{userId}/shadow_ban``: the user's sends answer
200 and reach nobody) and a message rate limit of their own
(``.../override_ratelimit``)."""

from __future__ import annotations

from typing import Any

from tests.harness.client_api import (
    DEFAULT_LAYOUT_STREAM_WRITERS,
    DEFAULT_LAYOUT_WORKERS,
    ClientApi,
    ThreeUsersTestCase,
    q,
    start_cluster,
)
from tests.harness.server import DatabaseTestCase

ADMIN = "/_synapse/admin"


async def make_admin(servers: dict[str, Any], user_id: str | None) -> None:
    await servers["main"].store.db_pool.execute(
        "t", "UPDATE users SET admin = TRUE WHERE name = ?", user_id
    )


class ShadowBanTestCase(ThreeUsersTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        await super().setUp()
        await make_admin(self.servers, self.alice.user_id)
        self.room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{self.room}", {})
        self.ban_path = ADMIN + f"/v1/users/{q(self.bob.user_id)}/shadow_ban"

    async def _bobs_ban_applies(self, banned: bool) -> None:
        """Wait until bob's process knows (the invalidation crosses the
        caches stream when bob talks to a worker)."""

        user = await self.alice.ok("GET", ADMIN + f"/v2/users/{q(self.bob.user_id)}")
        self.assertIs(user["shadow_banned"], banned)
        probe = f"probe-{banned}"
        sent: list[str] = []

        async def send_probe() -> None:
            sent.append(await self.bob.send(self.room, probe, txn_id=f"{probe}-{len(sent)}"))

        async def probe_is_fake() -> bool:
            await send_probe()
            code, _ = await self.alice.request("GET", f"/rooms/{self.room}/event/{q(sent[-1])}")
            return (code == 404) is banned

        for _ in range(200):
            if await probe_is_fake():
                return
        self.fail(f"bob's shadow ban never became {banned}")

    async def test_sends_answer_and_reach_nobody(self) -> None:
        self.assertEqual(await self.alice.ok("POST", self.ban_path), {})
        await self._bobs_ban_applies(True)
        listed = await self.alice.ok("GET", ADMIN + "/v3/users?order_by=shadow_banned&dir=b")
        self.assertEqual(listed["users"][0]["name"], self.bob.user_id)
        self.assertIs(listed["users"][0]["shadow_banned"], True)

        fake = await self.bob.send(self.room, "spam", txn_id="t1")
        self.assertRegex(fake, r"^\$[A-Za-z0-9_-]{43}$")
        # A retry of the same transaction gets the same id, as a real one.
        self.assertEqual(await self.bob.send(self.room, "spam", txn_id="t1"), fake)
        state = await self.bob.ok(
            "PUT", f"/rooms/{self.room}/state/m.room.topic", {"topic": "spam"}
        )
        redaction = await self.bob.ok("PUT", f"/rooms/{self.room}/redact/{q(fake)}/r1", {})
        self.assertEqual(
            await self.bob.ok("POST", f"/rooms/{self.room}/invite", {"user_id": self.eve.user_id}),
            {},
        )
        self.assertEqual(
            await self.bob.ok(
                "PUT",
                f"/rooms/{self.room}/typing/{q(self.bob.user_id)}",
                {"typing": True, "timeout": 10000},
            ),
            {},
        )
        for event_id in (fake, state["event_id"], redaction["event_id"]):
            code, _ = await self.alice.request("GET", f"/rooms/{self.room}/event/{q(event_id)}")
            self.assertEqual(code, 404, event_id)
        messages = await self.alice.ok("GET", f"/rooms/{self.room}/messages?dir=b&limit=50")
        bodies = [e["content"].get("body") for e in messages["chunk"]]
        self.assertNotIn("spam", bodies)
        eve_rooms = await self.alice.ok(
            "GET", ADMIN + f"/v1/users/{q(self.eve.user_id)}/memberships"
        )
        self.assertNotIn(self.room, eve_rooms["memberships"])
        topic_code, _ = await self.alice.request("GET", f"/rooms/{self.room}/state/m.room.topic")
        self.assertEqual(topic_code, 404)
        # A room bob creates is made, without its invites.
        own = await self.bob.create_room(invite=[self.eve.user_id])
        eve_rooms = await self.alice.ok(
            "GET", ADMIN + f"/v1/users/{q(self.eve.user_id)}/memberships"
        )
        self.assertNotIn(own, eve_rooms["memberships"])

        self.assertEqual(await self.alice.ok("DELETE", self.ban_path), {})
        await self._bobs_ban_applies(False)
        real = await self.bob.send(self.room, "hello again")
        event = await self.alice.ok("GET", f"/rooms/{self.room}/event/{q(real)}")
        self.assertEqual(event["content"]["body"], "hello again")

    async def test_errors(self) -> None:
        for method, path, code, errcode in [
            ("POST", "/v1/users/@nobody:test.local/shadow_ban", 404, "M_NOT_FOUND"),
            ("DELETE", "/v1/users/@x:elsewhere/shadow_ban", 400, "M_INVALID_PARAM"),
            ("POST", "/v1/users/not-a-user/shadow_ban", 400, None),
            ("GET", "/v1/users/@nobody:test.local/override_ratelimit", 404, "M_NOT_FOUND"),
            ("POST", "/v1/users/@x:elsewhere/override_ratelimit", 400, "M_INVALID_PARAM"),
        ]:
            got, answer = await self.alice.request(method, ADMIN + path, {})
            self.assertEqual(got, code, path)
            if errcode is not None:
                self.assertEqual(answer["errcode"], errcode, path)
        for method in ("POST", "DELETE"):
            got, answer = await self.eve.request(method, self.ban_path)
            self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"))
        override = ADMIN + f"/v1/users/{q(self.bob.user_id)}/override_ratelimit"
        for method in ("GET", "POST", "DELETE"):
            got, answer = await self.eve.request(method, override, {})
            self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"), method)
        for body in (
            {"messages_per_second": -1},
            {"burst_count": "3"},
            {"messages_per_second": True},
            {"burst_count": 1.5},
        ):
            got, answer = await self.alice.request("POST", override, body)
            self.assertEqual((got, answer["errcode"]), (400, "M_INVALID_PARAM"), body)
        self.assertEqual(await self.alice.ok("GET", override), {})


class ShadowBanDefaultLayoutTestCase(ShadowBanTestCase):
    workers = DEFAULT_LAYOUT_WORKERS
    stream_writers = DEFAULT_LAYOUT_STREAM_WRITERS


class RatelimitOverrideTestCase(DatabaseTestCase):
    """Message rate limits on (1 message, then one every 100 s): an
    override lifts or replaces bob's."""

    workers: list[str] = []

    async def test_override(self) -> None:
        servers, clients, _ = start_cluster(
            self,
            self.test_db,
            workers=self.workers,
            rate_limiting={
                "enabled": True,
                "messages": {"per_second": 0.01, "burst": 1},
                "registration": {"per_second": 100, "burst": 100},
            },
        )
        names = list(clients)
        alice = await ClientApi(self, clients[names[0]].base_url).register("alice")
        bob = await ClientApi(self, clients[names[-1]].base_url).register("bob")
        await make_admin(servers, alice.user_id)
        room = await bob.create_room()
        override = ADMIN + f"/v1/users/{q(bob.user_id)}/override_ratelimit"

        async def sends_allowed(count: int) -> int:
            done = 0
            for _ in range(count):
                code, body = await bob.request(
                    "POST", f"/rooms/{room}/send/m.room.message", {"msgtype": "m.text", "body": "x"}
                )
                if code == 429:
                    return done
                self.assertEqual(code, 200, body)
                done += 1
            return done

        self.assertEqual(await sends_allowed(3), 1)
        lifted = await alice.ok("POST", override, {"messages_per_second": 0, "burst_count": 0})
        self.assertEqual(lifted, {"messages_per_second": 0, "burst_count": 0})
        await eventually_allowed(self, sends_allowed, 5)
        self.assertEqual(await alice.ok("GET", override), lifted)
        await alice.ok("POST", override, {"messages_per_second": 1, "burst_count": 3})
        self.assertEqual(
            await alice.ok("GET", override), {"messages_per_second": 1, "burst_count": 3}
        )
        self.assertEqual(await alice.ok("DELETE", override), {})
        self.assertEqual(await alice.ok("GET", override), {})
        # The configured limit again: bob's bucket is still empty.
        for _ in range(200):
            if await sends_allowed(2) == 0:
                break
        else:
            self.fail("the override was never removed")


async def eventually_allowed(testcase: Any, sends_allowed: Any, count: int) -> None:
    """Until bob's process has read the override (at once on one process)."""
    for _ in range(200):
        if await sends_allowed(count) == count:
            return
    testcase.fail("the override never applied")


class RatelimitOverrideDefaultLayoutTestCase(RatelimitOverrideTestCase):
    workers = DEFAULT_LAYOUT_WORKERS


class SuspensionTestCase(ThreeUsersTestCase):
    """``PUT /v1/suspend/{userId}``: a suspended user reads, leaves and
    redacts their own events; what would add to rooms or their profile is a
    403 ``M_USER_SUSPENDED``."""

    async def setUp(self) -> None:  # type: ignore[override]
        await super().setUp()
        await make_admin(self.servers, self.alice.user_id)
        self.room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{self.room}", {})
        self.own = await self.bob.send(self.room, "mine")
        self.others = await self.alice.send(self.room, "alice's")
        self.other_room = await self.alice.create_room(preset="public_chat")
        self.path = ADMIN + f"/v1/suspend/{q(self.bob.user_id)}"

    async def _suspension_applies(self, suspended: bool) -> None:
        """Wait until bob's process knows (through the caches stream)."""
        for _ in range(300):
            code, _ = await self.bob.request(
                "PUT", "/profile/" + q(self.bob.user_id) + "/displayname", {"displayname": "Bob"}
            )
            if (code == 403) is suspended:
                return
        self.fail(f"bob's suspension never became {suspended}")

    async def test_suspend_and_lift(self) -> None:
        answer = await self.alice.ok("PUT", self.path, {"suspend": True})
        self.assertEqual(answer, {f"user_{self.bob.user_id}_suspended": True})
        user = await self.alice.ok("GET", ADMIN + f"/v2/users/{q(self.bob.user_id)}")
        self.assertIs(user["suspended"], True)
        await self._suspension_applies(True)
        room = f"/rooms/{q(self.room)}"
        for method, path, body in [
            ("POST", "/createRoom", {}),
            ("POST", f"/join/{q(self.other_room)}", {}),
            ("POST", f"/rooms/{q(self.other_room)}/join", {}),
            ("POST", f"/knock/{q(self.other_room)}", {}),
            ("POST", room + "/invite", {"user_id": self.eve.user_id}),
            ("PUT", room + "/send/m.room.message/t1", {"msgtype": "m.text", "body": "x"}),
            ("PUT", room + "/state/m.room.topic", {"topic": "x"}),
            ("PUT", room + f"/redact/{q(self.others)}/t2", {}),
            ("PUT", f"/profile/{q(self.bob.user_id)}/avatar_url", {"avatar_url": "mxc://a/b"}),
        ]:
            code, answer = await self.bob.request(method, path, body)
            self.assertEqual((code, answer.get("errcode")), (403, "M_USER_SUSPENDED"), path)
        # Reading, redacting their own event and leaving still work.
        await self.bob.ok("GET", room + "/messages?dir=b&limit=5")
        await self.bob.ok("PUT", room + f"/redact/{q(self.own)}/t3", {})
        await self.bob.ok("POST", room + "/leave", {})
        # Lifted: bob may join again.
        answer = await self.alice.ok("PUT", self.path, {"suspend": False})
        self.assertEqual(answer, {f"user_{self.bob.user_id}_suspended": False})
        await self._suspension_applies(False)
        await self.bob.ok("POST", f"/join/{q(self.room)}", {})

    async def test_errors(self) -> None:
        for path, body, code, errcode in [
            ("/v1/suspend/@nobody:test.local", {"suspend": True}, 404, "M_NOT_FOUND"),
            ("/v1/suspend/@x:elsewhere", {"suspend": True}, 400, "M_INVALID_PARAM"),
            (self.path[len(ADMIN) :], {}, 400, "M_MISSING_PARAM"),
            (self.path[len(ADMIN) :], {"suspend": "yes"}, 400, "M_BAD_JSON"),
        ]:
            got, answer = await self.alice.request("PUT", ADMIN + path, body)
            self.assertEqual((got, answer["errcode"]), (code, errcode), (path, body))
        got, answer = await self.eve.request("PUT", self.path, {"suspend": True})
        self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"))


class SuspensionDefaultLayoutTestCase(SuspensionTestCase):
    workers = DEFAULT_LAYOUT_WORKERS
    stream_writers = DEFAULT_LAYOUT_STREAM_WRITERS
