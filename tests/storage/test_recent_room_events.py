"""The timeline reads that ``RecentRoomEvents`` answers on a room's writer
(``get_room_events_between`` and its per-room form) give what the database
gives, and read nothing on the writer; a worker, whose rows do not carry
each event's own id, reads the database. On SQLite and PostgreSQL
(``SYNAPSE_LITE_TEST_DB``)."""

from __future__ import annotations

import functools
import random
from collections.abc import Awaitable, Callable
from typing import Any

from synapse_lite.storage.databases.main import GenericWorkerStore
from synapse_lite.tokens import RoomStreamToken
from tests.harness.client_api import ClientApi, caught_up_on_every_stream, start_cluster
from tests.harness.server import DatabaseTestCase


class HeldRoomEventsTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(self, self.test_db, workers=["worker1"])
        self.alice = await ClientApi(self, clients["main"].base_url).register("alice")
        self.rooms = [await self.alice.create_room(preset="public_chat") for _ in range(3)]

    async def both_ways(
        self, store: GenericWorkerStore, read: Callable[[], Awaitable[Any]]
    ) -> tuple[Any, Any, list[str]]:
        """``read()`` with the held events, counting its interactions, then
        with none held (the database's answer)."""
        names: list[str] = []
        run = store.db_pool.runInteraction

        async def counting(desc: str, *args: Any, **kwargs: Any) -> Any:
            names.append(desc)
            return await run(desc, *args, **kwargs)

        store.db_pool.runInteraction = counting  # type: ignore[method-assign]
        try:
            held = await read()
        finally:
            del store.db_pool.runInteraction
        store.recent_room_events.between = lambda *args: None  # type: ignore[method-assign]
        try:
            database = await read()
        finally:
            del store.recent_room_events.between
        return held, database, names

    async def per_room(
        self,
        store: GenericWorkerStore,
        since: RoomStreamToken | None,
        now: RoomStreamToken,
        limit: int,
    ) -> dict[str, list[str]]:
        found = await store.get_room_events_between_per_room(self.rooms, since, now, limit)
        return {room_id: [e.event_id for e in events] for room_id, events in found.items()}

    async def between(
        self,
        store: GenericWorkerStore,
        since: RoomStreamToken | None,
        now: RoomStreamToken,
        limit: int,
        newest_first: bool,
    ) -> list[str]:
        # No lower bound: one room's newest (what memory can answer).
        rooms = self.rooms[:2] if since is not None else self.rooms[:1]
        found = await store.get_room_events_between(
            rooms, since, now, limit, newest_first=newest_first
        )
        return [e.event_id for e in found]

    async def test_reads_agree_with_the_database(self) -> None:
        rng = random.Random(35)
        writer = self.servers["main"].store
        tokens = [writer.get_room_max_token()]
        for i in range(30):
            room = rng.choice(self.rooms)
            if rng.random() < 0.2:
                await self.alice.ok("PUT", f"/rooms/{room}/state/m.room.topic/", {"topic": f"{i}"})
            else:
                await self.alice.send(room, f"m{i}")
            tokens.append(writer.get_room_max_token())
        await caught_up_on_every_stream(self.servers)
        answered_here = 0
        for name, hs in self.servers.items():
            store = hs.store
            now = store.get_room_max_token()
            for since in [None, *tokens[::4]]:
                for limit in (1, 4, 50):
                    per_room = functools.partial(self.per_room, store, since, now, limit)
                    held, database, names = await self.both_ways(store, per_room)
                    self.assertEqual(held, database, (name, since, limit))
                    # With no lower bound memory answers a room's newest
                    # only when it holds that many (not 50: the rooms are
                    # smaller, and earlier events may lie before its horizon).
                    if name == "main" and (since is not None or limit < 50):
                        self.assertEqual(names, [], "the writer reads nothing")
                        answered_here += 1
                    for newest_first in (True, False):
                        between = functools.partial(
                            self.between, store, since, now, limit, newest_first
                        )
                        held, database, names = await self.both_ways(store, between)
                        self.assertEqual(held, database, (name, since, limit, newest_first))
                        if name == "main":
                            if since is not None or (newest_first and limit < 50):
                                self.assertEqual(names, [])
                        else:
                            self.assertNotEqual(names, [], "a worker reads the database")
        self.assertGreater(answered_here, 0)
