"""``POST /_synapse/admin/v1/send_server_notice[/{txnId}]``: a notice from
the system user, in a room of its own with the user, made anew once the
user has left it."""

from __future__ import annotations

from typing import Any

from tests.harness.client_api import (
    DEFAULT_LAYOUT_STREAM_WRITERS,
    DEFAULT_LAYOUT_WORKERS,
    ClientApi,
    start_cluster,
)
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase

NOTICE = "/_synapse/admin/v1/send_server_notice"
SYSTEM = "@notices:test.local"


class ServerNoticesTestCase(DatabaseTestCase):
    workers: list[str] = []
    stream_writers: dict[str, Any] = {}
    notices: dict[str, Any] = {
        "system_mxid_localpart": "notices",
        "system_mxid_display_name": "Server Notices",
        "room_name": "From the server",
    }

    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(
            self,
            self.test_db,
            workers=self.workers,
            stream_writers=self.stream_writers,
            server_notices=self.notices,
        )
        names = list(clients)
        self.alice = await ClientApi(self, clients[names[0]].base_url).register("alice")
        self.bob = await ClientApi(self, clients[names[-1]].base_url).register("bob")
        await self.servers["main"].store.db_pool.execute(
            "t", "UPDATE users SET admin = TRUE WHERE name = ?", self.alice.user_id
        )

    async def bobs_invites(self) -> dict[str, Any]:
        sync = await self.bob.sync()
        return dict(sync.get("rooms", {}).get("invite", {}))

    async def test_notice_room(self) -> None:
        content = {"msgtype": "m.text", "body": "Maintenance tonight"}
        first = await self.alice.ok(
            "POST", NOTICE, {"user_id": self.bob.user_id, "content": content}
        )
        self.assertTrue(first["event_id"].startswith("$"))
        invites: dict[str, Any] = {}

        async def invited() -> bool:
            invites.update(await self.bobs_invites())
            return bool(invites)

        await eventually(invited, what="bob invited to the notices room")
        [room] = invites
        names = [
            e["content"].get("name")
            for e in invites[room]["invite_state"]["events"]
            if e["type"] == "m.room.name"
        ]
        self.assertEqual(names, ["From the server"])
        await self.bob.ok("POST", f"/join/{room}", {})
        tags = await self.bob.ok("GET", f"/user/{self.bob.user_id}/rooms/{room}/tags")
        self.assertIn("m.server_notice", tags["tags"])
        # A second notice goes to the same room; a repeated transaction is
        # sent once.
        again = {"user_id": self.bob.user_id, "content": {"msgtype": "m.text", "body": "Done"}}
        one = await self.alice.ok("PUT", NOTICE + "/t1", again)
        self.assertEqual(await self.alice.ok("PUT", NOTICE + "/t1", again), one)
        messages = await self.bob.ok("GET", f"/rooms/{room}/messages?dir=b&limit=10")
        sent = [
            (e["sender"], e["content"]["body"])
            for e in messages["chunk"]
            if e["type"] == "m.room.message"
        ]
        self.assertEqual(sent, [(SYSTEM, "Done"), (SYSTEM, "Maintenance tonight")])
        # bob may not answer.
        code, _ = await self.bob.request(
            "PUT", f"/rooms/{room}/send/m.room.message/x", {"msgtype": "m.text", "body": "no"}
        )
        self.assertEqual(code, 403)
        # Once bob has left, the next notice comes in a new room.
        await self.bob.ok("POST", f"/rooms/{room}/leave", {})
        await self.alice.ok("POST", NOTICE, {"user_id": self.bob.user_id, "content": content})
        fresh: dict[str, Any] = {}

        async def invited_again() -> bool:
            fresh.update({r: v for r, v in (await self.bobs_invites()).items() if r != room})
            return bool(fresh)

        await eventually(invited_again, what="bob invited to a new notices room")

    async def test_errors(self) -> None:
        content = {"msgtype": "m.text", "body": "x"}
        for body, code, errcode in [
            ({"content": content}, 400, "M_MISSING_PARAM"),
            ({"user_id": "@x:elsewhere", "content": content}, 400, "M_INVALID_PARAM"),
            ({"user_id": "@nobody:test.local", "content": content}, 404, "M_NOT_FOUND"),
            ({"user_id": self.bob.user_id}, 400, "M_BAD_JSON"),
            ({"user_id": self.bob.user_id, "content": content, "type": 5}, 400, "M_BAD_JSON"),
            ({"user_id": SYSTEM, "content": content}, None, None),
        ]:
            got, answer = await self.alice.request("POST", NOTICE, body)
            if code is None:
                self.assertEqual(got // 100, 4, body)
                continue
            self.assertEqual((got, answer["errcode"]), (code, errcode), body)
        got, answer = await self.bob.request(
            "POST", NOTICE, {"user_id": self.alice.user_id, "content": content}
        )
        self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"))


class ServerNoticesDefaultLayoutTestCase(ServerNoticesTestCase):
    workers = DEFAULT_LAYOUT_WORKERS
    stream_writers = DEFAULT_LAYOUT_STREAM_WRITERS


class ServerNoticesOffTestCase(ServerNoticesTestCase):
    notices: dict[str, Any] = {}

    async def test_notice_room(self) -> None:
        got, answer = await self.alice.request(
            "POST", NOTICE, {"user_id": self.bob.user_id, "content": {"body": "x"}}
        )
        self.assertEqual(
            (got, answer["error"]), (400, "Server notices are not enabled on this server")
        )

    async def test_errors(self) -> None:
        # The switch is checked first: whatever the body.
        got, answer = await self.alice.request("POST", NOTICE, {})
        self.assertEqual(
            (got, answer["error"]), (400, "Server notices are not enabled on this server")
        )
