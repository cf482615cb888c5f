"""``POST /_synapse/admin/v1/users/{userId}/login``: an admin's token acting
as a user, on no device the user sees, until it ends or is logged out."""

from __future__ import annotations

import time

from tests.harness.client_api import (
    DEFAULT_LAYOUT_STREAM_WRITERS,
    DEFAULT_LAYOUT_WORKERS,
    ThreeUsersTestCase,
    q,
)
from tests.harness.polling import eventually

ADMIN = "/_synapse/admin"


class LoginAsTestCase(ThreeUsersTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        await super().setUp()
        await self.servers["main"].store.db_pool.execute(
            "t", "UPDATE users SET admin = TRUE WHERE name = ?", self.alice.user_id
        )
        self.login_path = ADMIN + f"/v1/users/{q(self.bob.user_id)}/login"

    async def test_act_as_then_log_out(self) -> None:
        answer = await self.alice.ok("POST", self.login_path, {})
        puppet = self.bob.as_user(answer["access_token"])
        me = await puppet.ok("GET", "/account/whoami")
        self.assertEqual(me["user_id"], self.bob.user_id)
        self.assertTrue(me["device_id"].startswith("ADMIN-"))
        room = await puppet.create_room(name="made by the admin")
        self.assertIn(room, (await self.bob.ok("GET", "/joined_rooms"))["joined_rooms"])
        # Bob's device list does not show it.
        devices = await self.bob.ok("GET", "/devices")
        self.assertEqual([d["device_id"] for d in devices["devices"]], [self.bob.device_id])
        await puppet.ok("POST", "/logout", {})
        code, body = await puppet.request("GET", "/account/whoami")
        self.assertEqual((code, body["errcode"]), (401, "M_UNKNOWN_TOKEN"))
        # Bob himself is still logged in.
        await self.bob.ok("GET", "/account/whoami")

    async def test_token_ends(self) -> None:
        until = int(time.time() * 1000) + 300
        answer = await self.alice.ok("POST", self.login_path, {"valid_until_ms": until})
        puppet = self.bob.as_user(answer["access_token"])
        await puppet.ok("GET", "/account/whoami")
        await eventually(lambda: time.time() * 1000 > until, what="the token's end")
        code, body = await puppet.request("GET", "/account/whoami")
        self.assertEqual((code, body["errcode"]), (401, "M_UNKNOWN_TOKEN"))

    async def test_errors(self) -> None:
        past = int(time.time() * 1000) - 1
        for user_id, body, code, errcode in [
            (self.alice.user_id, {}, 400, "M_INVALID_PARAM"),
            (self.bob.user_id, {"valid_until_ms": past}, 400, "M_INVALID_PARAM"),
            (self.bob.user_id, {"valid_until_ms": "soon"}, 400, "M_INVALID_PARAM"),
            ("@nobody:test.local", {}, 404, "M_NOT_FOUND"),
            ("@bob:elsewhere", {}, 400, "M_INVALID_PARAM"),
        ]:
            got, answer = await self.alice.request(
                "POST", ADMIN + f"/v1/users/{q(user_id)}/login", body
            )
            self.assertEqual((got, answer["errcode"]), (code, errcode), (user_id, body))
        got, answer = await self.eve.request("POST", self.login_path, {})
        self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"))


class LoginAsDefaultLayoutTestCase(LoginAsTestCase):
    workers = DEFAULT_LAYOUT_WORKERS
    stream_writers = DEFAULT_LAYOUT_STREAM_WRITERS
