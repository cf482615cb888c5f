"""Each room's events writer as the router keeps it: read once, forgotten
when replication says the room moved (or writers changed), and everything
forgotten after a reconnection, when invalidations may have been missed."""

from __future__ import annotations

import uuid
from typing import Any, cast

import attrs
from prometheus_client import REGISTRY
from twisted.internet import defer, reactor
from twisted.trial import unittest

from synapse_lite.config.homeserver import RedisConfig
from synapse_lite.replication.tcp.commands import RdataCommand
from synapse_lite.replication.tcp.redis import RedisReplicationBus
from synapse_lite.routing import room_writers as room_writers_module
from synapse_lite.routing.room_writers import ReplicationFollower, RoomWriters
from synapse_lite.storage.database import DatabasePool
from synapse_lite.storage.databases.main.room import EVENT_WRITER_CACHE
from tests.harness.services import redis_address, require_redis
from tests.replication.tcp.recording_receiver import RecordingReceiver, wait_until
from tests.routing.test_relay import SECRET, RoomsInTheDatabase, _config


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


class DeploymentInTheDatabase(RoomsInTheDatabase):
    """Also answers the deployment id (as ``runInteraction`` would)."""

    def __init__(self, rooms: dict[str, str | None], deployment_id: str) -> None:
        super().__init__(rooms)
        self.deployment = deployment_id
        self.failures = 0

    async def runInteraction(self, desc: str, func: Any) -> str:
        if self.failures:
            self.failures -= 1
            raise OSError("database not up yet")
        return self.deployment


class CountedRoomWriters(RoomWriters):
    """Also keeps the connections it was told of."""

    def __init__(self, config: Any, pool: DatabasePool) -> None:
        super().__init__(config, pool)
        self.connections: list[Any] = []

    def new_connection(self, connection: Any) -> None:
        self.connections.append(connection)
        super().new_connection(connection)


class RouterOnRedisTestCase(unittest.TestCase):
    """The router on a Redis layout names the deployment like every other
    process, so it hears the main process announce a room's new writer."""

    async def test_follows_a_room_writer_change(self) -> None:
        require_redis()
        host, port = redis_address()
        config = _config({"main": 1, "reader1": 2, "reader2": 3, "writer1": 4}, 5)
        prefix = f"test-{uuid.uuid4().hex}-"
        redis = RedisConfig(host=host, port=port, channel_prefix=prefix)
        config = attrs.evolve(
            config, replication=attrs.evolve(config.replication, transport="redis", redis=redis)
        )
        database = DeploymentInTheDatabase({"!a:t": "writer1"}, "dep42")
        database.failures = 1  # the router retries until the database answers
        writers = CountedRoomWriters(config, cast(DatabasePool, database))
        follower = ReplicationFollower(config, writers, reactor)
        self.patch(room_writers_module, "DEPLOYMENT_RETRY_SECONDS", 0.01)
        follower.start()
        self.addCleanup(follower.stop)

        main = RedisReplicationBus.from_config(
            redis,
            server_name=config.server_name,
            instance_name="main",
            receiver=RecordingReceiver(),
            reactor=reactor,
            deployment_id="dep42",
            secret=SECRET,
        )
        main.start()
        self.addCleanup(main.stop)
        await wait_until(lambda: main.publisher_connected, what="main to connect")
        await wait_until(lambda: bool(writers.connections), what="the router to subscribe")
        refused_before = _foreign_refusals()

        await writers.writer_of("!a:t")
        self.assertTrue(writers.cached("!a:t")[0])
        main.send_command(caches_row(EVENT_WRITER_CACHE, ["!a:t"]))
        await wait_until(lambda: not writers.cached("!a:t")[0], what="the writer change")
        # Nobody took anyone for another deployment.
        self.assertEqual(main.problems(), [])
        self.assertEqual(_foreign_refusals(), refused_before)


def _foreign_refusals() -> float:
    value = REGISTRY.get_sample_value(
        "synapse_lite_replication_claims_refused_total",
        {"stream": "unknown", "reason": "foreign_deployment"},
    )
    return value or 0.0
