"""Purging a room's history through the admin API (``POST
/_synapse/admin/v1/purge_history/{roomId}``) and the purge's status; a purge
interrupted by the process stopping resumes in the next one."""

from __future__ import annotations

import time
from typing import Any

from twisted.internet import defer

from synapse_lite.handlers import purge_history
from synapse_lite.handlers.purge_history import PurgeHistoryHandler
from tests.harness.client_api import (
    DEFAULT_LAYOUT_STREAM_WRITERS,
    DEFAULT_LAYOUT_WORKERS,
    ThreeUsersTestCase,
    q,
)
from tests.harness.polling import eventually

ADMIN = "/_synapse/admin/v1"


class AdminPurgeHistoryTestCase(ThreeUsersTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        await super().setUp()
        await self.servers["main"].store.db_pool.execute(
            "t", "UPDATE users SET admin = TRUE WHERE name = ?", self.alice.user_id
        )
        self.room = await self.bob.create_room(preset="public_chat", name="History")
        self.sent = [await self.bob.send(self.room, f"m{i}") for i in range(6)]
        # alice's process has read them all.
        await eventually(self._all_read, what="alice's process read bob's messages")

    async def _all_read(self) -> bool:
        newest = await self.alice.ok("GET", ADMIN + f"/rooms/{q(self.room)}/messages?limit=1")
        return bool(newest["chunk"]) and newest["chunk"][0]["event_id"] == self.sent[-1]

    async def bodies(self) -> list[Any]:
        """Each message's body, oldest first (None once pruned)."""
        page = await self.alice.ok("GET", ADMIN + f"/rooms/{q(self.room)}/messages?dir=f&limit=100")
        return [e["content"].get("body") for e in page["chunk"] if e["type"] == "m.room.message"]

    async def purged(self, body: dict[str, Any], event_id: str | None = None) -> dict[str, Any]:
        path = ADMIN + f"/purge_history/{q(self.room)}" + (f"/{q(event_id)}" if event_id else "")
        purge_id = (await self.alice.ok("POST", path, body))["purge_id"]

        async def done() -> bool:
            status = await self.alice.ok("GET", ADMIN + f"/purge_history_status/{purge_id}")
            return bool(status["status"] != "active")

        await eventually(done, what="the purge over")
        return dict(await self.alice.ok("GET", ADMIN + f"/purge_history_status/{purge_id}"))

    async def test_purge_before_an_event(self) -> None:
        # Local events are kept unless asked for.
        self.assertEqual(
            await self.purged({"purge_up_to_event_id": self.sent[3]}), {"status": "complete"}
        )
        self.assertEqual(await self.bodies(), [f"m{i}" for i in range(6)])
        status = await self.purged({"delete_local_events": True}, event_id=self.sent[3])
        self.assertEqual(status, {"status": "complete"})
        self.assertEqual(await self.bodies(), [None, None, None, "m3", "m4", "m5"])
        # The room's state is whole: its name, its members.
        name = await self.bob.ok("GET", f"/rooms/{self.room}/state/m.room.name")
        self.assertEqual(name, {"name": "History"})
        await self.bob.send(self.room, "still here")
        # Purged messages are not found by search any more.
        found = await self.bob.ok(
            "POST", "/search", {"search_categories": {"room_events": {"search_term": "m1"}}}
        )
        self.assertEqual(found["search_categories"]["room_events"]["count"], 0)

    async def test_purge_before_a_time(self) -> None:
        await self.purged(
            {"purge_up_to_ts": int(time.time() * 1000) + 60_000, "delete_local_events": True}
        )
        # Everything but the newest event (its children's parent) is pruned.
        self.assertEqual(await self.bodies(), [None] * 5 + ["m5"])

    async def test_errors(self) -> None:
        other = await self.bob.create_room()
        other_event = await self.bob.send(other, "elsewhere")
        purge = ADMIN + f"/purge_history/{q(self.room)}"
        for path, body, code, errcode in [
            (purge, {}, 400, "M_MISSING_PARAM"),
            (purge, {"purge_up_to_ts": "yesterday"}, 400, "M_INVALID_PARAM"),
            (purge, {"purge_up_to_ts": 1}, 404, "M_NOT_FOUND"),
            (purge, {"purge_up_to_event_id": other_event}, 400, "M_INVALID_PARAM"),
            (purge, {"purge_up_to_event_id": "$nope"}, 404, "M_NOT_FOUND"),
            (purge, {"purge_up_to_event_id": 3}, 400, "M_INVALID_PARAM"),
            (purge, {"purge_up_to_ts": 1, "delete_local_events": "yes"}, 400, "M_BAD_JSON"),
            (ADMIN + "/purge_history/!nope:test.local", {"purge_up_to_ts": 1}, 404, "M_NOT_FOUND"),
            (ADMIN + "/purge_history/not-a-room", {}, 400, "M_INVALID_PARAM"),
        ]:
            got, answer = await self.alice.request("POST", path, body)
            self.assertEqual((got, answer["errcode"]), (code, errcode), (path, body))
        got, answer = await self.alice.request("GET", ADMIN + "/purge_history_status/nope")
        self.assertEqual((got, answer["errcode"]), (404, "M_NOT_FOUND"))
        for method, path in [("POST", purge), ("GET", ADMIN + "/purge_history_status/x")]:
            got, answer = await self.eve.request(method, path, {"purge_up_to_ts": 1})
            self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"), path)

    async def test_interrupted_purge_resumes(self) -> None:
        main = self.servers["main"]
        handler = main.handlers.purge_history
        self.patch(purge_history, "PURGE_BATCH", 2)
        store = main.store
        real_expire = store.expire_event
        expired: list[str] = []
        stalled: defer.Deferred[None] = defer.Deferred()

        async def expire(event_id: str) -> None:
            if len(expired) == 2:
                # In the second batch: the process stops here.
                expired.append("stalled")
                await stalled
            await real_expire(event_id)
            expired.append(event_id)

        self.patch(store, "expire_event", expire)
        body = {"purge_up_to_event_id": self.sent[5], "delete_local_events": True}
        purge_id = (await self.alice.ok("POST", ADMIN + f"/purge_history/{q(self.room)}", body))[
            "purge_id"
        ]
        await eventually(lambda: "stalled" in expired, what="the purge stalled")
        handler.stop()
        stalled.callback(None)
        status = ADMIN + f"/purge_history_status/{purge_id}"

        async def stopped() -> bool:
            return purge_id not in handler.running

        await eventually(stopped, what="the purge stopped with its process")
        self.assertEqual(await self.alice.ok("GET", status), {"status": "active"})
        restarted = PurgeHistoryHandler(store, "test.local")
        restarted.start()
        self.addCleanup(restarted.stop)

        async def complete() -> bool:
            return bool((await self.alice.ok("GET", status))["status"] == "complete")

        await eventually(complete, what="the resumed purge complete")
        self.assertEqual(await self.bodies(), [None] * 5 + ["m5"])


class AdminPurgeHistoryDefaultLayoutTestCase(AdminPurgeHistoryTestCase):
    workers = DEFAULT_LAYOUT_WORKERS
    stream_writers = DEFAULT_LAYOUT_STREAM_WRITERS
