"""The admin API's event reports (``/_synapse/admin/v1/event_reports``): the
reports users filed, listed, read and deleted."""

from __future__ import annotations

from tests.harness.client_api import (
    DEFAULT_LAYOUT_STREAM_WRITERS,
    DEFAULT_LAYOUT_WORKERS,
    ThreeUsersTestCase,
    q,
)

ADMIN = "/_synapse/admin"


class AdminEventReportsTestCase(ThreeUsersTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        await super().setUp()
        await self.servers["main"].store.db_pool.execute(
            "t", "UPDATE users SET admin = TRUE WHERE name = ?", self.alice.user_id
        )
        self.room = await self.bob.create_room(preset="public_chat", name="Pub")
        await self.eve.ok("POST", f"/join/{self.room}", {})
        self.rude = await self.bob.send(self.room, "rude")
        self.ruder = await self.bob.send(self.room, "ruder")
        for event_id, reason in [(self.rude, "first"), (self.ruder, "second")]:
            await self.eve.ok("POST", f"/rooms/{self.room}/report/{event_id}", {"reason": reason})
        # A room report is not an event report: not listed.
        await self.eve.ok("POST", f"/rooms/{self.room}/report", {"reason": "the room"})

    async def test_list_read_delete(self) -> None:
        body = await self.alice.ok("GET", ADMIN + "/v1/event_reports")
        self.assertEqual(body["total"], 2)
        reports = body["event_reports"]
        # Newest first by default.
        self.assertEqual([r["reason"] for r in reports], ["second", "first"])
        first = reports[1]
        self.assertEqual(
            (first["event_id"], first["user_id"], first["sender"], first["room_id"], first["name"]),
            (self.rude, self.eve.user_id, self.bob.user_id, self.room, "Pub"),
        )
        paged = await self.alice.ok("GET", ADMIN + "/v1/event_reports?dir=f&limit=1")
        self.assertEqual(
            ([r["reason"] for r in paged["event_reports"]], paged["next_token"]), (["first"], 1)
        )
        mine = await self.alice.ok(
            "GET", ADMIN + f"/v1/event_reports?user_id={q(self.bob.user_id)}"
        )
        self.assertEqual(mine["total"], 0)
        one = await self.alice.ok("GET", ADMIN + f"/v1/event_reports/{first['id']}")
        self.assertEqual(one["event_json"]["content"]["body"], "rude")
        await self.alice.ok("DELETE", ADMIN + f"/v1/event_reports/{first['id']}")
        left = await self.alice.ok("GET", ADMIN + "/v1/event_reports")
        self.assertEqual([r["reason"] for r in left["event_reports"]], ["second"])
        for method, path, code, errcode in [
            ("GET", f"/v1/event_reports/{first['id']}", 404, "M_NOT_FOUND"),
            ("DELETE", f"/v1/event_reports/{first['id']}", 404, "M_NOT_FOUND"),
            ("GET", "/v1/event_reports/abc", 400, "M_INVALID_PARAM"),
            ("GET", "/v1/event_reports?dir=up", 400, "M_INVALID_PARAM"),
        ]:
            got, answer = await self.alice.request(method, ADMIN + path)
            self.assertEqual((got, answer["errcode"]), (code, errcode), path)
        for method, path in [("GET", "/v1/event_reports"), ("DELETE", "/v1/event_reports/1")]:
            got, answer = await self.eve.request(method, ADMIN + path)
            self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"), path)


class AdminEventReportsDefaultLayoutTestCase(AdminEventReportsTestCase):
    workers = DEFAULT_LAYOUT_WORKERS
    stream_writers = DEFAULT_LAYOUT_STREAM_WRITERS
