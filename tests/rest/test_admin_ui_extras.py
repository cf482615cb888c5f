"""The admin API's smaller reads the admin UI makes: a user's invite and
join counts, account data and experimental features; an event by id; the
long jobs (``scheduled_tasks``); the largest rooms."""

from __future__ import annotations

from tests.harness.client_api import (
    DEFAULT_LAYOUT_STREAM_WRITERS,
    DEFAULT_LAYOUT_WORKERS,
    ThreeUsersTestCase,
    q,
)
from tests.harness.polling import eventually

ADMIN = "/_synapse/admin/v1"


class AdminUiExtrasTestCase(ThreeUsersTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        await super().setUp()
        await self.servers["main"].store.db_pool.execute(
            "t", "UPDATE users SET admin = TRUE WHERE name = ?", self.alice.user_id
        )
        self.room = await self.bob.create_room(preset="private_chat", name="Bob's")
        await self.bob.ok("POST", f"/rooms/{q(self.room)}/invite", {"user_id": self.eve.user_id})
        await self.eve.ok("POST", f"/join/{q(self.room)}", {})
        self.message = await self.bob.send(self.room, "hello")
        await self.bob.ok(
            "PUT", f"/user/{q(self.bob.user_id)}/account_data/org.example.x", {"a": 1}
        )

    async def test_user_reads(self) -> None:
        bob = q(self.bob.user_id)

        async def counted() -> bool:
            invites = await self.alice.ok(
                "GET", ADMIN + f"/users/{bob}/sent_invite_count?from_ts=0"
            )
            return bool(invites == {"invite_count": 1})

        await eventually(counted, what="bob's invite counted")
        later = await self.alice.ok(
            "GET", ADMIN + f"/users/{bob}/sent_invite_count?from_ts={2**50}"
        )
        self.assertEqual(later, {"invite_count": 0})
        joined = await self.alice.ok(
            "GET", ADMIN + f"/users/{q(self.eve.user_id)}/cumulative_joined_room_count?from_ts=0"
        )
        self.assertEqual(joined, {"cumulative_joined_room_count": 1})
        data = await self.alice.ok("GET", ADMIN + f"/users/{bob}/accountdata")
        self.assertEqual(data["account_data"]["global"]["org.example.x"], {"a": 1})
        self.assertEqual(data["account_data"]["rooms"], {})
        features = ADMIN + f"/experimental_features/{bob}"
        self.assertEqual(await self.alice.ok("GET", features), {"features": {}})
        self.assertEqual(await self.alice.ok("PUT", features, {"features": {}}), {})
        for method, path, body, code, errcode in [
            ("GET", f"/users/{bob}/sent_invite_count", None, 400, "M_MISSING_PARAM"),
            ("GET", f"/users/{bob}/cumulative_joined_room_count?from_ts=x", None, 400, None),
            ("GET", "/users/@nobody:test.local/accountdata", None, 404, "M_NOT_FOUND"),
            ("GET", "/users/@x:elsewhere/sent_invite_count?from_ts=0", None, 400, None),
            ("PUT", f"/experimental_features/{bob}", {"features": {"msc1": True}}, 400, None),
            ("PUT", f"/experimental_features/{bob}", {"features": 1}, 400, "M_BAD_JSON"),
            ("GET", "/experimental_features/@nobody:test.local", None, 404, "M_NOT_FOUND"),
        ]:
            got, answer = await self.alice.request(method, ADMIN + path, body)
            self.assertEqual(got, code, path)
            if errcode is not None:
                self.assertEqual(answer["errcode"], errcode, path)
        for path in (
            f"/users/{bob}/sent_invite_count?from_ts=0",
            f"/users/{bob}/cumulative_joined_room_count?from_ts=0",
            f"/users/{bob}/accountdata",
            f"/experimental_features/{bob}",
        ):
            got, answer = await self.eve.request("GET", ADMIN + path)
            self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"), path)

    async def test_fetch_event_tasks_and_largest_rooms(self) -> None:
        # alice (the admin) is not in bob's private room.
        async def fetched() -> bool:
            code, _ = await self.alice.request("GET", ADMIN + f"/fetch_event/{q(self.message)}")
            return code == 200

        await eventually(fetched, what="the event readable on alice's process")
        event = (await self.alice.ok("GET", ADMIN + f"/fetch_event/{q(self.message)}"))["event"]
        self.assertEqual((event["content"]["body"], event["room_id"]), ("hello", self.room))
        got, answer = await self.alice.request("GET", ADMIN + "/fetch_event/$nope")
        self.assertEqual((got, answer["errcode"]), (404, "M_NOT_FOUND"))
        # A job to list: a history purge of bob's room.
        purge_id = (
            await self.alice.ok(
                "POST",
                ADMIN + f"/purge_history/{q(self.room)}",
                {"purge_up_to_event_id": self.message},
            )
        )["purge_id"]

        async def purged() -> bool:
            status = await self.alice.ok("GET", ADMIN + f"/purge_history_status/{purge_id}")
            return bool(status["status"] == "complete")

        await eventually(purged, what="the purge complete")
        tasks = await self.alice.ok("GET", ADMIN + "/scheduled_tasks")
        [task] = tasks["scheduled_tasks"]
        self.assertEqual(
            (task["id"], task["action"], task["resource_id"]),
            (purge_id, "purge_history", self.room),
        )
        self.assertEqual(
            set(task), {"id", "action", "status", "timestamp_ms", "resource_id", "result", "error"}
        )
        for query, count in [
            ("?action_name=purge_history", 1),
            ("?action_name=delete_room", 0),
            (f"?resource_id={q(self.room)}", 1),
            ("?max_timestamp=1", 0),
        ]:
            found = await self.alice.ok("GET", ADMIN + "/scheduled_tasks" + query)
            self.assertEqual(len(found["scheduled_tasks"]), count, query)
        largest = await self.alice.ok("GET", ADMIN + "/statistics/database/rooms")
        self.assertIn(self.room, [r["room_id"] for r in largest["rooms"]])
        self.assertTrue(all(r["estimated_size"] > 0 for r in largest["rooms"]))
        for path in (
            f"/fetch_event/{q(self.message)}",
            "/scheduled_tasks",
            "/statistics/database/rooms",
        ):
            got, answer = await self.eve.request("GET", ADMIN + path)
            self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"), path)
        got, _ = await self.alice.request("GET", ADMIN + "/scheduled_tasks?max_timestamp=soon")
        self.assertEqual(got, 400)


class AdminUiExtrasDefaultLayoutTestCase(AdminUiExtrasTestCase):
    workers = DEFAULT_LAYOUT_WORKERS
    stream_writers = DEFAULT_LAYOUT_STREAM_WRITERS
