"""Every read that serves events leaves out rejected and soft-failed ones:
/sync (initial and incremental), /messages, /context, /event, relations,
search and notifications. The events are planted: three thread replies
are sent as usual (so every index has them: relations, search, push
actions), then two are marked rejected and soft-failed in the database, as
if they had been received so; what is read must then show the third only.
On SQLite and PostgreSQL (``SYNAPSE_LITE_TEST_DB``)."""

from __future__ import annotations

from typing import Any

from tests.harness.client_api import ThreeUsersTestCase


class HiddenEventsTestCase(ThreeUsersTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        await super().setUp()
        store = self.servers["main"].store
        self.room = await self.alice.create_room(invite=[self.bob.user_id])
        await self.bob.ok("POST", f"/rooms/{self.room}/join", {})
        self.root = await self.alice.send(self.room, "the root")
        self.since = (await self.alice.sync())["next_batch"]
        ids = []
        self.after_visible = ""
        for tag in ("visible", "rejected", "softfailed"):
            body = {
                "msgtype": "m.text",
                "body": f"needle {tag}",
                "m.relates_to": {"rel_type": "m.thread", "event_id": self.root},
            }
            result = await self.bob.ok("PUT", f"/rooms/{self.room}/send/m.room.message/{tag}", body)
            ids.append(str(result["event_id"]))
            if tag == "visible":
                self.after_visible = (await self.alice.sync(since=self.since))["next_batch"]
        self.visible, self.rejected, self.soft_failed = ids
        await store.db_pool.execute(
            "test_plant_rejected",
            "UPDATE events SET rejected = TRUE WHERE event_id = ?",
            self.rejected,
        )
        await store.db_pool.execute(
            "test_plant_soft_failed",
            "UPDATE events SET soft_failed = TRUE WHERE event_id = ?",
            self.soft_failed,
        )
        for event_id in (self.rejected, self.soft_failed):
            store.invalidate_event_cache(event_id)
        # Nor does the writer hold them as served any longer (received so,
        # they never would have been).
        store.recent_room_events.forget_all()

    def assert_only_visible(self, ids: list[str]) -> None:
        self.assertIn(self.visible, ids)
        self.assertNotIn(self.rejected, ids)
        self.assertNotIn(self.soft_failed, ids)

    def timeline(self, sync: dict[str, Any]) -> list[str]:
        return [e["event_id"] for e in sync["rooms"]["join"][self.room]["timeline"]["events"]]

    async def test_sync(self) -> None:
        self.assert_only_visible(self.timeline(await self.alice.sync()))
        self.assert_only_visible(self.timeline(await self.alice.sync(since=self.since)))
        # Only hidden events since: the room has nothing new to show.
        later = await self.alice.sync(since=self.after_visible)
        self.assertNotIn(self.room, later.get("rooms", {}).get("join", {}))

    async def test_messages(self) -> None:
        for direction in ("b", "f"):
            page = await self.alice.ok(
                "GET", f"/rooms/{self.room}/messages?dir={direction}&limit=50"
            )
            self.assert_only_visible([e["event_id"] for e in page["chunk"]])

    async def test_context_and_event(self) -> None:
        context = await self.alice.ok("GET", f"/rooms/{self.room}/context/{self.root}?limit=10")
        self.assert_only_visible([e["event_id"] for e in context["events_after"]])
        for hidden in (self.rejected, self.soft_failed):
            for path in (f"/context/{hidden}", f"/event/{hidden}"):
                code, body = await self.alice.request("GET", f"/rooms/{self.room}{path}")
                self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"), path)

    async def test_relations(self) -> None:
        """/relations, /threads and the thread's bundled summary."""
        page = await self.alice.ok(
            "GET", f"/_matrix/client/v1/rooms/{self.room}/relations/{self.root}"
        )
        self.assertEqual([e["event_id"] for e in page["chunk"]], [self.visible])
        threads = await self.alice.ok("GET", f"/_matrix/client/v1/rooms/{self.room}/threads")
        [root] = threads["chunk"]
        summary = root["unsigned"]["m.relations"]["m.thread"]
        self.assertEqual((summary["count"], summary["latest_event"]["event_id"]), (1, self.visible))

    async def test_search(self) -> None:
        body = {"search_categories": {"room_events": {"search_term": "needle"}}}
        found = await self.alice.ok("POST", "/search", body)
        results = found["search_categories"]["room_events"]["results"]
        self.assertEqual([r["result"]["event_id"] for r in results], [self.visible])

    async def test_notifications(self) -> None:
        page = await self.alice.ok("GET", "/notifications")
        self.assert_only_visible([n["event"]["event_id"] for n in page["notifications"]])
