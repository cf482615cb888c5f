"""What a process does with the replication commands it receives.

RDATA and POSITION are processed one at a time per stream, so a catch-up and
the rows arriving meanwhile never race. The rules (per connection, per stream
and writer):

* RDATA before the first POSITION from that writer on that connection is
  dropped: the POSITION's catch-up will read it.
* RDATA at or below what we already have from that writer is dropped.
* RDATA with token ``batch`` is held until the row carrying the real token.
* POSITION ``prev new`` promises the writer wrote nothing in ``(prev, new]``; if
  our position for the writer is below ``prev`` (or, for a stream that can
  reset, outside ``[prev, new]``) we read what we missed through the stream's
  update function, in pages, before taking ``new``.
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall

from synapse_lite.metrics import REPLICATION_LAG
from synapse_lite.replication.tcp.commands import (
    ClearUserSyncCommand,
    Command,
    FederationAckCommand,
    PositionCommand,
    RdataCommand,
    RemoteServerUpCommand,
    ReplicateCommand,
    UserIpCommand,
    UserSyncCommand,
)
from synapse_lite.replication.tcp.connection import ReplicationConnection
from synapse_lite.replication.tcp.streams import InvalidRow, Stream, StreamFromIdGen
from synapse_lite.replication.tcp.streams._base import Updates

if TYPE_CHECKING:
    from synapse_lite.server import HomeServer

logger = logging.getLogger(__name__)

#: How long ``wait_for_stream_position`` waits before giving up.
WAIT_FOR_REPLICATION_TIMEOUT_SECONDS = 30.0
#: Delay before retrying a catch-up that failed (database or writer unreachable).
CATCH_UP_RETRY_SECONDS = 1.0

StreamKey = tuple[str, str]  # (stream name, writer instance)
RowHook = Callable[[str, int, list[Any]], None]


def batch_updates(updates: Updates) -> Iterable[tuple[int, list[Any]]]:
    """Group consecutive updates sharing a token: rows written under one id are
    processed together."""
    batch: list[Any] = []
    token: int | None = None
    for update_token, row in updates:
        if token is not None and update_token != token:
            yield token, batch
            batch = []
        token = update_token
        batch.append(row)
    if token is not None:
        yield token, batch


class ReplicationDataHandler:
    """Applies new rows and positions to this process, in the order that keeps
    readers safe: invalidate caches, let handlers take their rows, advance the
    position, then wake whoever waits."""

    def __init__(self, hs: HomeServer) -> None:
        self._hs = hs
        self._store = hs.datastore
        self._row_hooks: dict[str, list[RowHook]] = defaultdict(list)
        self._waiters: dict[StreamKey, list[tuple[int, defer.Deferred[None]]]] = defaultdict(list)

    def add_row_hook(self, stream_name: str, hook: RowHook) -> None:
        """Call ``hook(instance_name, token, rows)`` for every batch of rows (or
        bare position, with no rows) of a stream, after cache invalidation and
        before the position advances."""
        self._row_hooks[stream_name].append(hook)

    def on_rdata(self, stream_name: str, instance_name: str, token: int, rows: list[Any]) -> None:
        self._store.process_replication_rows(stream_name, instance_name, token, rows)
        for hook in self._row_hooks.get(stream_name, ()):
            try:
                hook(instance_name, token, rows)
            except Exception:
                logger.exception("Handling %s rows from %s failed", stream_name, instance_name)
        self._store.process_replication_position(stream_name, instance_name, token)
        if rows:
            stream = self._hs.replication.streams.get(stream_name)
            if isinstance(stream, StreamFromIdGen):
                stream.row_received(instance_name, token)
        self._hs.notifier.on_new_replication_data(stream_name, instance_name, token, rows)
        self._resolve_waiters(stream_name, instance_name)

    def on_position(self, stream_name: str, instance_name: str, token: int) -> None:
        self.on_rdata(stream_name, instance_name, token, [])

    def _resolve_waiters(self, stream_name: str, instance_name: str) -> None:
        key = (stream_name, instance_name)
        waiters = self._waiters.get(key)
        if not waiters:
            return
        stream = self._hs.replication.streams[stream_name]
        current = stream.processed_position(instance_name)
        still_waiting = []
        for position, d in waiters:
            if position <= current:
                if not d.called:
                    d.callback(None)
            elif not d.called:
                still_waiting.append((position, d))
        self._waiters[key] = still_waiting

    async def wait_for_stream_position(
        self,
        instance_name: str,
        stream_name: str,
        position: int,
        timeout: float = WAIT_FOR_REPLICATION_TIMEOUT_SECONDS,
    ) -> None:
        """Return once this process has processed ``instance_name``'s rows up to
        ``position`` on ``stream_name`` (at once if it has, or if it is this
        process).
        Raises ``defer.TimeoutError`` after ``timeout`` seconds."""
        if instance_name == self._hs.instance_name:
            return
        stream = self._hs.replication.streams[stream_name]
        if position <= stream.processed_position(instance_name):
            return
        d: defer.Deferred[None] = defer.Deferred()
        self._waiters[(stream_name, instance_name)].append((position, d))
        self._hs.clock.timeout(d, timeout)
        await d


class ReplicationCommandHandler:
    """Receives data commands from the transports; sends this process's."""

    def __init__(self, hs: HomeServer, streams: dict[str, Stream], sourced: list[str]) -> None:
        self._hs = hs
        self._instance_name = hs.instance_name
        self.streams = streams
        #: Names of the streams this process writes (and so announces).
        self.sourced_stream_names = sourced
        self.data_handler = ReplicationDataHandler(hs)
        self._connections: list[ReplicationConnection] = []
        self._positions_seen: dict[ReplicationConnection, set[StreamKey]] = {}
        self._pending_batches: dict[StreamKey, list[Any]] = {}
        self._queues: dict[str, deque[Callable[[], Awaitable[None]]]] = defaultdict(deque)
        self._queue_running: set[str] = set()
        self._streamer_poke: Callable[[bool], None] | None = None
        self.streamer: Any = None
        #: Commands that a role-specific handler consumes, by command class.
        self._command_hooks: dict[type[Command], list[Callable[[Any], object]]] = defaultdict(list)
        self._retry_calls: set[IDelayedCall] = set()
        self._stopped = False

    def set_streamer(self, announce: Callable[[bool], None]) -> None:
        """``announce(True)`` asks the streamer to send every sourced position."""
        self._streamer_poke = announce

    def add_command_hook(self, command_type: type[Command], hook: Callable[[Any], object]) -> None:
        """Hand every received command of ``command_type`` to ``hook``."""
        self._command_hooks[command_type].append(hook)

    # Sending

    @property
    def connected(self) -> bool:
        return bool(self._connections)

    def send_command(self, cmd: Command) -> None:
        """Send to every other process (dropped, with a debug log, when
        disconnected: positions are re-announced on reconnection)."""
        if not self._connections:
            logger.debug("Not connected: dropping %s", type(cmd).__name__)
            return
        for connection in list(self._connections):
            connection.send_command(cmd)

    # Connections (the ReplicationCommandReceiver contract)

    def new_connection(self, connection: ReplicationConnection) -> None:
        logger.info("Replication connection %s is up", connection.describe())
        self._connections.append(connection)
        self._positions_seen[connection] = set()
        self._resend_user_syncs(connection)
        if self._streamer_poke is not None:
            self._streamer_poke(True)

    def lost_connection(self, connection: ReplicationConnection) -> None:
        logger.info("Replication connection %s is down", connection.describe())
        if connection in self._connections:
            self._connections.remove(connection)
        self._positions_seen.pop(connection, None)

    def on_command(self, connection: ReplicationConnection, cmd: Command) -> None:
        try:
            if isinstance(cmd, RdataCommand):
                self._on_rdata(connection, cmd)
            elif isinstance(cmd, PositionCommand):
                self._on_position(connection, cmd)
            elif isinstance(cmd, ReplicateCommand):
                if self._streamer_poke is not None:
                    self._streamer_poke(True)
            else:
                for hook in self._command_hooks.get(type(cmd), ()):
                    hook(cmd)
        except Exception:
            logger.exception("Handling %r from %s failed", cmd, connection.describe())

    # Per-stream ordered processing

    def _enqueue(self, stream_name: str, work: Callable[[], Awaitable[None]]) -> None:
        self._queues[stream_name].append(work)
        if stream_name not in self._queue_running:
            defer.ensureDeferred(self._drain(stream_name))

    async def _drain(self, stream_name: str) -> None:
        self._queue_running.add(stream_name)
        queue = self._queues[stream_name]
        try:
            while queue:
                work = queue.popleft()
                try:
                    await work()
                except Exception:
                    logger.exception("Processing replication for stream %s failed", stream_name)
        finally:
            self._queue_running.discard(stream_name)

    # RDATA

    def _on_rdata(self, connection: ReplicationConnection, cmd: RdataCommand) -> None:
        if cmd.instance_name == self._instance_name:
            return  # our own echo (Redis)
        stream = self.streams.get(cmd.stream_name)
        if stream is None:
            logger.warning(
                "RDATA for unknown stream %r from %s", cmd.stream_name, connection.describe()
            )
            return
        try:
            row = stream.parse_row(cmd.row)
        except InvalidRow as e:
            logger.warning("Dropping RDATA from %s: %s", connection.describe(), e)
            return
        self._enqueue(cmd.stream_name, lambda: self._process_rdata(connection, cmd, stream, row))

    async def _process_rdata(
        self, connection: ReplicationConnection, cmd: RdataCommand, stream: Stream, row: Any
    ) -> None:
        key = (cmd.stream_name, cmd.instance_name)
        if key not in self._positions_seen.get(connection, ()):
            # The POSITION we are about to get will catch this row up.
            logger.debug("RDATA %s before its POSITION: dropped", key)
            return
        if cmd.token is None:
            self._pending_batches.setdefault(key, []).append(row)
            return
        rows = self._pending_batches.pop(key, [])
        rows.append(row)
        # Compared with what we processed of this writer: its current token may
        # have been lifted past rows we have not seen yet by other writers'
        # announcements, and those rows must still be processed.
        if cmd.token <= stream.processed_position(cmd.instance_name):
            logger.debug("RDATA %s at %d is old: dropped", key, cmd.token)
            return
        self.data_handler.on_rdata(cmd.stream_name, cmd.instance_name, cmd.token, rows)

    # POSITION

    def _on_position(self, connection: ReplicationConnection, cmd: PositionCommand) -> None:
        if cmd.instance_name == self._instance_name:
            return
        stream = self.streams.get(cmd.stream_name)
        if stream is None:
            logger.warning(
                "POSITION for unknown stream %r from %s", cmd.stream_name, connection.describe()
            )
            return
        if self._can_discard(connection, stream, cmd):
            return
        self._enqueue(cmd.stream_name, lambda: self._process_position(connection, cmd, stream))

    def _can_discard(
        self, connection: ReplicationConnection, stream: Stream, cmd: PositionCommand
    ) -> bool:
        key = (cmd.stream_name, cmd.instance_name)
        return key in self._positions_seen.get(connection, ()) and stream.can_discard_position(
            cmd.instance_name, cmd.prev_token, cmd.new_token
        )

    async def _process_position(
        self, connection: ReplicationConnection, cmd: PositionCommand, stream: Stream
    ) -> None:
        if connection not in self._positions_seen or self._can_discard(connection, stream, cmd):
            return
        key = (cmd.stream_name, cmd.instance_name)
        for seen in self._positions_seen.values():
            seen.discard(key)
        self._pending_batches.pop(key, None)

        instance, prev, new = cmd.instance_name, cmd.prev_token, cmd.new_token
        current = stream.processed_position(instance)
        REPLICATION_LAG.labels(cmd.stream_name, instance).set(max(0, new - current))
        try:
            if self._needs_catch_up(stream, current, prev, new):
                await self._catch_up(stream, instance, current, new)
        except Exception:
            logger.warning(
                "Catching up stream %s of %s failed; retrying in %.0f s",
                cmd.stream_name,
                instance,
                CATCH_UP_RETRY_SECONDS,
                exc_info=True,
            )
            self._retry_later(self._retry_position, connection, cmd)
            return
        self.data_handler.on_position(cmd.stream_name, instance, new)
        REPLICATION_LAG.labels(cmd.stream_name, instance).set(0)
        if connection in self._positions_seen:
            self._positions_seen[connection].add(key)

    def _retry_later(self, retry: Callable[..., None], *args: Any) -> None:
        if self._stopped:
            return

        def run() -> None:
            self._retry_calls.discard(call)
            retry(*args)

        call = self._hs.clock.call_later(CATCH_UP_RETRY_SECONDS, run)
        self._retry_calls.add(call)

    def stop(self) -> None:
        """The process is stopping: retry nothing more."""
        self._stopped = True
        for call in self._retry_calls:
            if call.active():
                call.cancel()
        self._retry_calls.clear()

    def _retry_position(self, connection: ReplicationConnection, cmd: PositionCommand) -> None:
        if connection in self._positions_seen:
            self._on_position(connection, cmd)

    @staticmethod
    def _needs_catch_up(stream: Stream, current: int, prev: int, new: int) -> bool:
        if isinstance(stream, StreamFromIdGen):
            # Positions only grow: we miss rows only if we are behind prev.
            return current < prev
        # Streams kept in a writer's memory restart from 0 with the writer.
        return not (prev <= current <= new)

    async def _catch_up(self, stream: Stream, instance: str, current: int, new: int) -> None:
        limited = True
        while limited:
            updates, upto, limited = await stream.get_updates_since(instance, current, new)
            for token, raw_rows in batch_updates(updates):
                rows = [stream.parse_row(r) for r in raw_rows]
                self.data_handler.on_rdata(stream.NAME, instance, token, rows)
            if limited and upto <= current and not updates:
                raise RuntimeError(f"update function of {stream.NAME} made no progress at {upto}")
            current = upto

    # Writers leaving

    def forget_writer(self, stream_name: str, instance_name: str) -> None:
        """Stop tracking a writer that has stopped for good (an events writer
        retired at runtime), whose last position would otherwise hold the
        stream's persisted-up-to back. First read whatever it wrote beyond our
        position of it, so nothing it wrote is skipped. Runs in the stream's
        queue, after the commands received before."""
        stream = self.streams.get(stream_name)
        if not isinstance(stream, StreamFromIdGen) or instance_name == self._instance_name:
            return

        async def work() -> None:
            try:
                final = await stream.get_stopped_writer_token(instance_name)
                current = stream.current_token(instance_name)
                if current < final:
                    await self._catch_up(stream, instance_name, current, final)
            except Exception:
                logger.warning(
                    "Reading the last rows of %s on %s failed; retrying in %.0f s",
                    instance_name,
                    stream_name,
                    CATCH_UP_RETRY_SECONDS,
                    exc_info=True,
                )
                self._retry_later(self.forget_writer, stream_name, instance_name)
                return
            key = (stream_name, instance_name)
            for seen in self._positions_seen.values():
                seen.discard(key)
            self._pending_batches.pop(key, None)
            try:
                REPLICATION_LAG.remove(stream_name, instance_name)
            except KeyError:
                pass
            stream.id_gen.remove_writer(instance_name)

        self._enqueue(stream_name, work)

    # Other commands

    def _resend_user_syncs(self, connection: ReplicationConnection) -> None:
        presence = self._hs.presence_handler
        for cmd in presence.get_user_sync_commands():
            connection.send_command(cmd)


__all__ = [
    "ClearUserSyncCommand",
    "FederationAckCommand",
    "RemoteServerUpCommand",
    "ReplicationCommandHandler",
    "ReplicationDataHandler",
    "UserIpCommand",
    "UserSyncCommand",
    "batch_updates",
]
