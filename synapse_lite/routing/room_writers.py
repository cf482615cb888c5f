"""Each room's events writer, for sending a room's events straight to it.

A room's writer is stored with the room (``rooms.event_writer``), chosen when
the room was created. The router reads it on the first request for a room and
keeps it; it changes only when a writer is retired and its rooms move, which
the main process announces on the caches stream. The router follows
replication for that alone: an invalidation of the room's writer (or of the
``instances`` table: writers changed) drops what it kept, and so does a
reconnection, since invalidations sent meanwhile were missed. A stale entry
would cost no more than a forward: a writer given another room's event hands
it to the right writer.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import deferLater

from synapse_lite.codec.rows import InvalidRow
from synapse_lite.config.homeserver import ROUTER_PROCESS, HomeServerConfig
from synapse_lite.replication.tcp.commands import Command, RdataCommand
from synapse_lite.replication.tcp.connection import ReplicationConnection
from synapse_lite.replication.tcp.tcp_client import ReplicationClientFactory
from synapse_lite.replication.transports import redis_bus, replication_endpoint
from synapse_lite.storage.database import DatabasePool
from synapse_lite.storage.databases.main.instances import (
    INSTANCES_CACHE_NAME,
    InstancesWorkerStore,
)
from synapse_lite.storage.databases.main.room import EVENT_WRITER_CACHE
from synapse_lite.storage.engines import create_engine
from synapse_lite.streams.definition import Reader

logger = logging.getLogger(__name__)

#: Rooms whose writer is kept (least recently used beyond it are forgotten).
MAX_ROOMS = 100_000

#: Between attempts to read the deployment id (the database may not be up).
DEPLOYMENT_RETRY_SECONDS = 1.0

#: The router acts on the caches stream alone (writer changes and room
#: assignments): it subscribes to the streams the catalog says the router
#: reads (``Reader.ROUTER``), and receives nothing of the others.
ROUTER_READS = frozenset({Reader.ROUTER})


class RoomWriters:
    """Room id -> events writer, read from the database and kept current."""

    def __init__(self, config: HomeServerConfig, pool: DatabasePool | None) -> None:
        self._config = config
        self._pool = pool
        self._writers: OrderedDict[str, str | None] = OrderedDict()
        #: Bumped by every invalidation: a lookup that began before one does
        #: not store its (possibly stale) answer.
        self._generation = 0

    @classmethod
    def from_config(cls, config: HomeServerConfig, reactor: Any) -> RoomWriters:
        engine = create_engine(config.database.engine, config.database.args)
        pool = DatabasePool(reactor, engine, name="router", min_connections=1, max_connections=2)
        return cls(config, pool)

    def cached(self, room_id: str) -> tuple[bool, str | None]:
        """``(known, writer)`` without waiting: whether the room's writer is
        kept here, and it (None: no such room)."""
        if room_id in self._writers:
            self._writers.move_to_end(room_id)
            return True, self._writers[room_id]
        return False, None

    async def writer_of(self, room_id: str) -> str | None:
        """The room's events writer; None if there is no such room."""
        known, writer = self.cached(room_id)
        if known:
            return writer
        if self._pool is None:
            return None
        generation = self._generation
        rows = await self._pool.select(
            "router_room_writer", "SELECT event_writer FROM rooms WHERE room_id = ?", room_id
        )
        if not rows:
            return None  # not kept: the room may be created in a moment
        writer = rows[0][0]
        if writer is None:
            # A room from before writers were recorded: the stable hash.
            writer = self._config.writers.writer_for("events", room_id)
        if generation == self._generation:
            self._writers[room_id] = writer
            if len(self._writers) > MAX_ROOMS:
                self._writers.popitem(last=False)
        return str(writer)

    def forget(self, room_id: str | None) -> None:
        """Drop one room's writer (every room's when None)."""
        self._generation += 1
        if room_id is None:
            self._writers.clear()
        else:
            self._writers.pop(room_id, None)

    async def deployment_id(self) -> str:
        """The deployment's id, as stored in the database (every replication
        message on Redis names it); "none" without a database."""
        if self._pool is None:
            return "none"
        return await self._pool.runInteraction(
            "router_deployment_id", InstancesWorkerStore.load_or_create_deployment_id_txn
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    # Replication (the ReplicationCommandReceiver contract)

    def new_connection(self, connection: ReplicationConnection) -> None:
        logger.info("Following replication (%s)", connection.describe())
        # Invalidations sent while disconnected were missed.
        self.forget(None)

    def lost_connection(self, connection: ReplicationConnection) -> None:
        logger.info("Replication connection lost (%s)", connection.describe())

    def read_started(self) -> None:
        """Each invalidation applies as it comes: nothing to hold back."""

    def read_done(self) -> None:
        pass

    def on_command(self, connection: ReplicationConnection, cmd: Command) -> None:
        if not isinstance(cmd, RdataCommand) or cmd.stream_name != "caches":
            return
        try:
            row = self._config.streams["caches"].parse_row(cmd.row)
        except InvalidRow as e:
            logger.warning("Dropping a caches row from %s: %s", cmd.instance_name, e)
            return
        if row.cache_func == EVENT_WRITER_CACHE:
            keys: Sequence[Any] | None = row.keys
            self.forget(str(keys[0]) if keys else None)
        elif row.cache_func == INSTANCES_CACHE_NAME:
            self.forget(None)


class ReplicationFollower:
    """The router's replication connection (TCP to the main process, or Redis),
    delivering commands to :class:`RoomWriters`.

    It names the deployment as every other process does (read from the
    database first, retried until the database answers): without it, on
    Redis every process would refuse the router's traffic and the router
    everyone's, so it would never hear that a room's writer changed."""

    def __init__(self, config: HomeServerConfig, receiver: RoomWriters, reactor: Any) -> None:
        self._config = config
        self._receiver = receiver
        self._reactor = reactor
        self._transport: Any = None
        self._stopped = False
        self._starting: Deferred[None] | None = None
        self._retry: Deferred[None] | None = None

    def start(self) -> None:
        self._starting = Deferred.fromCoroutine(self._start())

    async def _start(self) -> None:
        deployment_id = await self._read_deployment_id()
        if deployment_id is None:
            return  # stopped meanwhile
        config = self._config
        if config.replication.transport == "redis":
            bus = redis_bus(
                config,
                ROUTER_PROCESS,
                self._receiver,
                self._reactor,
                deployment_id,
                followed_streams=config.streams.read_by(ROUTER_READS),
            )
            bus.start()
            self._transport = bus
            return
        client = ReplicationClientFactory(
            config.server_name,
            ROUTER_PROCESS,
            config.worker_replication_secret,
            self._receiver,
            self._reactor,
            deployment_id=deployment_id,
            followed_streams=config.streams.read_by(ROUTER_READS),
        )
        client.connect(replication_endpoint(config, self._reactor))
        self._transport = client

    async def _read_deployment_id(self) -> str | None:
        while not self._stopped:
            try:
                return await self._receiver.deployment_id()
            except Exception as e:
                logger.warning(
                    "Cannot read the deployment id yet (%s); retrying in %g s",
                    e,
                    DEPLOYMENT_RETRY_SECONDS,
                )
            self._retry = deferLater(self._reactor, DEPLOYMENT_RETRY_SECONDS, lambda: None)
            try:
                await self._retry
            except CancelledError:
                return None
            finally:
                self._retry = None
        return None

    async def stop(self) -> None:
        self._stopped = True
        if self._retry is not None:
            self._retry.cancel()
        if self._starting is not None:
            await self._starting
        transport, self._transport = self._transport, None
        if transport is not None:
            result = transport.stop()
            if result is not None:
                await result
