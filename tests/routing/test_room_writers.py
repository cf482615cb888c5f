"""Each room's events writer as the router keeps it: read once, forgotten
when replication says the room moved (or writers changed), and everything
forgotten after a reconnection, when invalidations may have been missed."""

from __future__ import annotations

from typing import Any, cast

from twisted.internet import defer
from twisted.trial import unittest

from synapse_lite.replication.tcp.commands import RdataCommand
from synapse_lite.routing.room_writers import RoomWriters
from synapse_lite.storage.database import DatabasePool
from synapse_lite.storage.databases.main.room import EVENT_WRITER_CACHE
from tests.routing.test_relay import RoomsInTheDatabase, _config


class SlowDatabase(RoomsInTheDatabase):
    """Answers when told to."""

    def __init__(self, rooms: dict[str, str | None]) -> None:
        super().__init__(rooms)
        self.waiting: list[defer.Deferred[None]] = []

    async def select(self, desc: str, sql: str, room_id: str) -> list[tuple[Any, ...]]:
        d: defer.Deferred[None] = defer.Deferred()
        self.waiting.append(d)
        await d
        return await super().select(desc, sql, room_id)


def caches_row(cache: str, keys: list[Any] | None) -> RdataCommand:
    return RdataCommand("caches", "main", 7, [cache, keys, 0])


class RoomWritersTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.config = _config({"main": 1, "reader1": 2, "reader2": 3, "writer1": 4}, 5)
        self.database = RoomsInTheDatabase({"!a:t": "writer1", "!old:t": None})
        self.writers = RoomWriters(self.config, cast(DatabasePool, self.database))

    async def test_read_once_then_kept(self) -> None:
        self.assertEqual(await self.writers.writer_of("!a:t"), "writer1")
        self.assertEqual(await self.writers.writer_of("!a:t"), "writer1")
        self.assertEqual(self.database.lookups, 1)
        self.assertEqual(self.writers.cached("!a:t"), (True, "writer1"))
        # An unknown room is not kept: it may be created in a moment.
        self.assertIsNone(await self.writers.writer_of("!new:t"))
        self.assertEqual(self.writers.cached("!new:t"), (False, None))
        # A room from before writers were recorded: the stable hash.
        self.assertEqual(
            await self.writers.writer_of("!old:t"),
            self.config.writers.writer_for("events", "!old:t"),
        )

    async def test_forgotten_when_replication_says_it_moved(self) -> None:
        await self.writers.writer_of("!a:t")
        self.writers.on_command(cast(Any, None), caches_row("get_user_by_access_token", ["x"]))
        self.assertTrue(self.writers.cached("!a:t")[0])
        self.writers.on_command(cast(Any, None), caches_row(EVENT_WRITER_CACHE, ["!a:t"]))
        self.assertFalse(self.writers.cached("!a:t")[0])
        await self.writers.writer_of("!a:t")
        self.writers.on_command(cast(Any, None), caches_row("instances", ["persister2"]))
        self.assertFalse(self.writers.cached("!a:t")[0])
        await self.writers.writer_of("!a:t")
        self.writers.new_connection(cast(Any, _Connection()))
        self.assertFalse(self.writers.cached("!a:t")[0])

    async def test_a_bad_row_is_dropped(self) -> None:
        await self.writers.writer_of("!a:t")
        with self.assertLogs("synapse_lite.routing.room_writers", "WARNING"):
            self.writers.on_command(cast(Any, None), RdataCommand("caches", "main", 7, ["x"]))
        self.assertTrue(self.writers.cached("!a:t")[0])

    async def test_a_lookup_overtaken_by_an_invalidation_is_not_kept(self) -> None:
        database = SlowDatabase({"!a:t": "writer1"})
        writers = RoomWriters(self.config, cast(DatabasePool, database))
        lookup = defer.ensureDeferred(writers.writer_of("!a:t"))
        writers.on_command(cast(Any, None), caches_row(EVENT_WRITER_CACHE, ["!a:t"]))
        database.waiting[0].callback(None)
        self.assertEqual(await lookup, "writer1")
        self.assertFalse(writers.cached("!a:t")[0])


class _Connection:
    def describe(self) -> str:
        return "test"
