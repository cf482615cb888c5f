"""What a process does with the replication commands it receives, and how it sends its own.

RDATA and POSITION are processed one at a time per stream, so a catch-up and
the rows arriving meanwhile never race. The rules (per connection, per stream
and writer):

* Every RDATA and POSITION is a claim about a writer's position, checked
  before it moves anything (``replication/claims.py``): an unknown stream, a
  writer that does not write the stream, a token no /sync token could carry,
  or a token the stream's sequence never handed out is refused, logged and
  counted, and our view stays as it was. The last is taken as checked on a
  connection that vouches for its claims (a TCP worker's, to the main
  process, which checked them before relaying).
* RDATA before the first POSITION from that writer on that connection is
  dropped: the POSITION's catch-up will read it.
* RDATA at or below what we have already received from that writer is dropped.
* RDATA with token ``batch`` is held until the row carrying the real token.
* Rows a transport hands over within one read of its socket (between
  ``read_started`` and ``read_done``) are applied at the end of the read:
  each writer's rows of a stream that cannot reset as one batch at the last
  token, as if the writer had sent them as one. Anything queued for the
  stream (a POSITION, a claim still to check) applies them first, so a
  stream's order is kept; positions never stop inside a batch.
* POSITION ``prev new`` promises the writer wrote nothing in ``(prev, new]``; if
  our position for the writer is below ``prev`` (or, for a stream that can
  reset, outside ``[prev, new]``) we read what we missed through the stream's
  update function, in pages, before taking ``new``.

What a batch of rows does here is the receiver's business (``receiver.py``).
Commands go out through the transport's bus, encoded once however many
processes it reaches.
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Any, Protocol

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall

from synapse_lite.clock import Clock
from synapse_lite.codec.rows import InvalidRow
from synapse_lite.replication.claims import PeerClaims, claim_line
from synapse_lite.replication.lag import ReplicationLag
from synapse_lite.replication.streams import Stream
from synapse_lite.replication.tcp.commands import (
    CheckedCommand,
    Command,
    PositionCommand,
    RdataCommand,
    ReplicateCommand,
)
from synapse_lite.replication.tcp.connection import (
    OutgoingCommands,
    ReplicationBus,
    ReplicationConnection,
)
from synapse_lite.replication.tcp.receiver import ReplicationReceiver
from synapse_lite.streams.definition import Updates

logger = logging.getLogger(__name__)

#: Delay before retrying a catch-up that failed (database or writer unreachable).
CATCH_UP_RETRY_SECONDS = 1.0
#: Delay before checking again a claim whose check failed (database unreachable).
CHECK_RETRY_SECONDS = 1.0

StreamKey = tuple[str, str]  # (stream name, writer instance)


class _HeldRows:
    """Rows of one writer believed during a read, applied at its end."""

    __slots__ = ("rows", "token")

    def __init__(self, token: int, rows: list[Any]) -> None:
        self.token = token
        self.rows = rows


class RetiredWriters(Protocol):
    """Where writers retired for good are announced (the instance directory)."""

    def follow_retirements(self, forget: Callable[[str], None]) -> None:
        """Call ``forget(writer)`` for every writer retired: at once for those
        retired before this process started, later as they are retired."""


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


class ReplicationCommandHandler:
    """Receives data commands from the transports; sends this process's."""

    def __init__(
        self,
        *,
        instance_name: str,
        clock: Clock,
        streams: Mapping[str, Stream],
        receiver: ReplicationReceiver,
        claims: PeerClaims | None = None,
        outgoing: OutgoingCommands | None = None,
        greetings: Iterable[Callable[[], list[Command]]] = (),
        command_hooks: Iterable[tuple[type[Command], Callable[[Any], object]]] = (),
        retired_writers: RetiredWriters | None = None,
        followed_streams: Collection[str] | None = None,
    ) -> None:
        """``claims``: how peers' positions are checked (None: every writer
        name is accepted; tokens are still checked against range and sequence).
        ``outgoing``: this process's way out, shared with the components that
        send commands (a new one when None). ``greetings``: commands sent on
        every new connection (the presence follower re-sends its users'
        USER_SYNC). ``command_hooks``: ``(command class, hook)``, the role
        handlers taking the commands that are not stream data.
        ``retired_writers``: tells of writers retired for good (the instance
        directory): each is forgotten on every stream whose writers follow
        the ``instances`` table, after its last rows are read.
        ``followed_streams``: the streams this process reads (its role's
        subscription; None: every stream): RDATA and POSITION of the others
        are dropped unread (the transports do not deliver them anyway), and
        nothing is caught up for them, not even a retired writer's rows."""
        self._me = instance_name
        self.followed_streams = None if followed_streams is None else frozenset(followed_streams)
        self._clock = clock
        self.streams = streams
        self.receiver = receiver
        self.outgoing = outgoing if outgoing is not None else OutgoingCommands()
        self._greetings: list[Callable[[], list[Command]]] = list(greetings)
        self._positions_seen: dict[ReplicationConnection, set[StreamKey]] = {}
        self._pending_batches: dict[StreamKey, list[Any]] = {}
        #: Reads under way (``read_started`` without its ``read_done``).
        self._reads = 0
        #: Believed rows waiting for the end of the read, in arrival order.
        self._held: dict[StreamKey, _HeldRows] = {}
        self._queues: dict[str, deque[Callable[[], Awaitable[None]]]] = defaultdict(deque)
        self._queue_running: set[str] = set()
        self._on_connect: list[Callable[[], None]] = []
        #: Commands that a role-specific handler consumes, by command class.
        self._command_hooks: dict[type[Command], list[Callable[[Any], object]]] = defaultdict(list)
        for command_type, hook in command_hooks:
            self._command_hooks[command_type].append(hook)
        self._retry_calls: set[IDelayedCall] = set()
        self._stopped = False
        self.lag = ReplicationLag(clock, streams)
        self.claims = claims or PeerClaims(clock, streams, lambda stream: None)
        if retired_writers is not None:
            retired_writers.follow_retirements(self._forget_retired_writer)

    def set_bus(self, bus: ReplicationBus | None) -> None:
        """The transport's way out to every other process (None: send on each
        announced connection, as the in-memory test links do)."""
        self.outgoing.set_bus(bus)

    def add_connection_greeting(self, greeting: Callable[[], list[Command]]) -> None:
        """Also send ``greeting()``'s commands on every new connection (for
        tests; the composition root passes ``greetings``)."""
        self._greetings.append(greeting)

    def on_new_connection(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever a connection comes up (the streamer
        announces every position)."""
        self._on_connect.append(callback)

    def add_command_hook(self, command_type: type[Command], hook: Callable[[Any], object]) -> None:
        """Also hand every received command of ``command_type`` to ``hook``
        (for tests; the composition root passes ``command_hooks``)."""
        self._command_hooks[command_type].append(hook)

    # Sending

    @property
    def connected(self) -> bool:
        return self.outgoing.connected

    def send_command(self, cmd: Command) -> None:
        """Send to every other process (:class:`OutgoingCommands`)."""
        self.outgoing.send_command(cmd)

    # Connections (the ReplicationCommandReceiver contract)

    def new_connection(self, connection: ReplicationConnection) -> None:
        logger.info("Replication connection %s is up", connection.describe())
        self.outgoing.connection_up(connection)
        self._positions_seen[connection] = set()
        for greeting in self._greetings:
            for cmd in greeting():
                connection.send_command(cmd)
        for callback in self._on_connect:
            callback()

    def lost_connection(self, connection: ReplicationConnection) -> None:
        logger.info("Replication connection %s is down", connection.describe())
        self.outgoing.connection_down(connection)
        self._positions_seen.pop(connection, None)

    def read_started(self) -> None:
        self._reads += 1

    def read_done(self) -> None:
        self._reads -= 1
        if self._reads <= 0:
            self._reads = 0
            if self._held:
                self._apply_held()

    def on_command(self, connection: ReplicationConnection, cmd: Command) -> None:
        try:
            if isinstance(cmd, RdataCommand):
                self._on_rdata(connection, cmd)
            elif isinstance(cmd, PositionCommand):
                self._on_position(connection, cmd)
            elif isinstance(cmd, CheckedCommand):
                if self._follows(cmd.stream_name):
                    self.claims.on_note(cmd, connection.describe())
            elif isinstance(cmd, ReplicateCommand):
                for callback in self._on_connect:
                    callback()
            else:
                for hook in self._command_hooks.get(type(cmd), ()):
                    hook(cmd)
        except Exception:
            logger.exception("Handling %r from %s failed", cmd, connection.describe())

    # Per-stream ordered processing

    def _enqueue(
        self, stream_name: str, work: Callable[[], Awaitable[None]], after_held: bool = True
    ) -> None:
        """Run ``work`` after the stream's earlier work. ``after_held``: the
        stream's held rows are applied first (a POSITION or catch-up reads
        the positions they move); an RDATA waiting for its claim's check
        need not, as it only joins them or follows them."""
        if after_held and self._held:
            self._apply_held(stream_name)
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

    def _follows(self, stream_name: str) -> bool:
        return self.followed_streams is None or stream_name in self.followed_streams

    def _on_rdata(self, connection: ReplicationConnection, cmd: RdataCommand) -> None:
        if cmd.instance_name == self._me or not self._follows(cmd.stream_name):
            return  # our own echo (Redis), or a stream we do not read
        stream = self.claims.stream_in_range(cmd.stream_name, cmd.token)
        if stream is None:
            # Refused: the claims name, log and count it.
            sender, line = connection.describe(), claim_line(cmd)
            stream = self.claims.stream(cmd.stream_name, cmd.instance_name, sender, line)
            if stream is None or not self.claims.in_range(cmd.stream_name, sender, line, cmd.token):
                return
        try:
            row = stream.definition.parse_row(cmd.row)
        except InvalidRow as e:
            logger.warning("Dropping RDATA from %s: %s", connection.describe(), e)
            return
        if (
            cmd.stream_name not in self._queue_running
            and not self._queues[cmd.stream_name]
            and self.claims.believed_at_once(
                stream, cmd.instance_name, cmd.token, connection.vouches_for_claims
            )
        ):
            # Nothing of this stream ahead of it and nothing to read: applied
            # now, without a coroutine and a Deferred per row (issue 18).
            self._apply_rdata(connection, cmd, stream, row)
            return
        # Described now: over Redis the one connection names the sender of
        # the message being handed over only while it is.
        sender = connection.describe()
        self._enqueue(
            cmd.stream_name,
            lambda: self._process_rdata(connection, cmd, stream, row, sender),
            after_held=False,
        )

    async def _process_rdata(
        self,
        connection: ReplicationConnection,
        cmd: RdataCommand,
        stream: Stream,
        row: Any,
        sender: str,
    ) -> None:
        key = (cmd.stream_name, cmd.instance_name)
        if not await self._believe(connection, stream, cmd.instance_name, cmd.token, sender, cmd):
            # Rows held for this token go too: they are kept only up to what
            # the sequence allows.
            self._pending_batches.pop(key, None)
            return
        self._apply_rdata(connection, cmd, stream, row)

    async def _believe(
        self,
        connection: ReplicationConnection,
        stream: Stream,
        writer: str,
        token: int | None,
        sender: str,
        cmd: RdataCommand | PositionCommand,
    ) -> bool:
        """``claims.believe``, asked again every :data:`CHECK_RETRY_SECONDS`
        while it cannot answer (the sequence cannot be read: the database is
        down), the stream's later commands waiting behind it, as the main
        process holds what it relays over TCP. Dropping the claim instead
        skipped its row for good: the writer's next row moved our position
        past it (issue 35: an event lost in the PostgreSQL restart fault
        over Redis). False: refused, or the connection went down meanwhile
        (the next connection's POSITION catches up) or the process stops."""
        seen = self._positions_seen.get(connection)
        while True:
            try:
                return await self.claims.believe(
                    stream, writer, token, sender, claim_line(cmd), connection.vouches_for_claims
                )
            except Exception as e:
                if self._stopped or self._positions_seen.get(connection) is not seen:
                    return False
                logger.warning(
                    "Checking %s of %s from %s failed (%s); holding the stream's commands,"
                    " checking again in %.0f s",
                    cmd.NAME,
                    cmd.stream_name,
                    sender,
                    e,
                    CHECK_RETRY_SECONDS,
                )
            await self._pause(CHECK_RETRY_SECONDS)

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds``; for ever if the process stops meanwhile."""
        waited: defer.Deferred[None] = defer.Deferred()

        def run() -> None:
            self._retry_calls.discard(call)
            waited.callback(None)

        call = self._clock.call_later(seconds, run)
        self._retry_calls.add(call)
        await waited

    def _apply_rdata(
        self, connection: ReplicationConnection, cmd: RdataCommand, stream: Stream, row: Any
    ) -> None:
        """A believed RDATA, in its stream's order."""
        key = (cmd.stream_name, cmd.instance_name)
        token = cmd.token
        if key not in self._positions_seen.get(connection, ()):
            if token is not None:
                self.lag.announced(cmd.stream_name, cmd.instance_name, token)
            # The POSITION we are about to get will catch this row up.
            logger.debug("RDATA %s before its POSITION: dropped", key)
            return
        if token is None:
            self._pending_batches.setdefault(key, []).append(row)
            return
        rows = self._pending_batches.pop(key, [])
        rows.append(row)
        # Compared with what we received of this writer (held rows included):
        # its position may have been lifted past rows we have not seen yet by
        # other writers' announcements, and those rows must still be processed.
        held = self._held.get(key)
        if token <= (
            held.token if held is not None else stream.positions.received_position(key[1])
        ):
            self.lag.announced(cmd.stream_name, cmd.instance_name, token)
            logger.debug("RDATA %s at %d is old: dropped", key, token)
            return
        if self._reads and not stream.positions.can_reset:
            # Applied with the read's other rows of this writer (a stream that
            # can reset keeps one batch per id).
            if held is None:
                self._held[key] = _HeldRows(token, rows)
            else:
                held.token = token
                held.rows.extend(rows)
            return
        self._apply_rows(key, token, rows)

    def _apply_rows(self, key: StreamKey, token: int, rows: list[Any]) -> None:
        stream_name, writer = key
        self.receiver.on_rows(stream_name, writer, token, rows)
        self.lag.applied(stream_name, writer, token)

    def _apply_held(self, stream_name: str | None = None) -> None:
        """Apply the held rows (of ``stream_name`` only, if given), each
        writer's as one batch, in the order their writers first came."""
        if stream_name is None:
            batches, self._held = self._held, {}
        else:
            keys = [key for key in self._held if key[0] == stream_name]
            batches = {key: self._held.pop(key) for key in keys}
        for key, held in batches.items():
            try:
                self._apply_rows(key, held.token, held.rows)
            except Exception:
                logger.exception("Applying %d rows of %s failed", len(held.rows), key)

    # POSITION

    def _on_position(self, connection: ReplicationConnection, cmd: PositionCommand) -> None:
        if cmd.instance_name == self._me or not self._follows(cmd.stream_name):
            return
        sender = connection.describe()
        line = claim_line(cmd)
        stream = self.claims.stream(cmd.stream_name, cmd.instance_name, sender, line)
        if stream is None or not self.claims.in_range(
            cmd.stream_name, sender, line, cmd.prev_token, cmd.new_token
        ):
            return
        if self._can_discard(connection, stream, cmd):
            return
        self._enqueue(
            cmd.stream_name, lambda: self._process_position(connection, cmd, stream, sender)
        )

    def _can_discard(
        self, connection: ReplicationConnection, stream: Stream, cmd: PositionCommand
    ) -> bool:
        """Nothing new: a writer we follow on this connection announces a
        position we have already received (a resettable stream is never
        discarded: its position may have gone backwards)."""
        key = (cmd.stream_name, cmd.instance_name)
        return (
            key in self._positions_seen.get(connection, ())
            and not stream.positions.can_reset
            and cmd.new_token <= stream.positions.received_position(cmd.instance_name)
        )

    async def _process_position(
        self, connection: ReplicationConnection, cmd: PositionCommand, stream: Stream, sender: str
    ) -> None:
        if connection not in self._positions_seen or self._can_discard(connection, stream, cmd):
            return
        if not await self._believe(
            connection, stream, cmd.instance_name, cmd.new_token, sender, cmd
        ):
            return
        if not self.claims.not_backwards(
            stream, cmd.instance_name, cmd.new_token, sender, claim_line(cmd)
        ):
            return
        self.lag.announced(cmd.stream_name, cmd.instance_name, cmd.new_token)
        key = (cmd.stream_name, cmd.instance_name)
        # This connection's bookkeeping alone: a POSITION on one connection
        # says nothing of the rows another carries (issue 34: a second
        # connection naming a live writer made every row of the real one be
        # dropped as arriving "before its POSITION").
        seen = self._positions_seen.get(connection)
        if seen is not None:
            seen.discard(key)
        self._pending_batches.pop(key, None)

        writer, prev, new = cmd.instance_name, cmd.prev_token, cmd.new_token
        current = stream.positions.received_position(writer)
        try:
            if self._needs_catch_up(stream, current, prev, new):
                await self._catch_up(stream, writer, current, new)
        except Exception:
            logger.warning(
                "Catching up stream %s of %s failed; retrying in %.0f s",
                cmd.stream_name,
                writer,
                CATCH_UP_RETRY_SECONDS,
                exc_info=True,
            )
            self._retry_later(self._retry_position, connection, cmd)
            return
        self.receiver.on_rows(cmd.stream_name, writer, new, [])
        self.lag.received(cmd.stream_name, writer)
        if connection in self._positions_seen:
            self._positions_seen[connection].add(key)

    @staticmethod
    def _needs_catch_up(stream: Stream, current: int, prev: int, new: int) -> bool:
        if stream.positions.can_reset:
            # Streams kept in a writer's memory start afresh with the writer:
            # outside (prev, new] we read the writer's current state, unless
            # the writer has done nothing yet in its run (the row hook resets).
            if prev == new and stream.positions.starts_run(new):
                return False
            return not (prev <= current <= new)
        # Positions only grow: we miss rows only if we are behind prev.
        return current < prev

    async def _catch_up(self, stream: Stream, writer: str, current: int, new: int) -> None:
        limited = True
        while limited:
            updates, upto, limited = await stream.rows_since(writer, current, new)
            for token, rows in batch_updates(updates):
                self.receiver.on_rows(stream.name, writer, token, rows)
            self.lag.received(stream.name, writer)
            if limited and upto <= current and not updates:
                raise RuntimeError(f"update function of {stream.name} made no progress at {upto}")
            current = upto

    def _retry_later(self, retry: Callable[..., None], *args: Any) -> None:
        if self._stopped:
            return

        def run() -> None:
            self._retry_calls.discard(call)
            retry(*args)

        call = self._clock.call_later(CATCH_UP_RETRY_SECONDS, run)
        self._retry_calls.add(call)

    def _retry_position(self, connection: ReplicationConnection, cmd: PositionCommand) -> None:
        if connection in self._positions_seen:
            self._on_position(connection, cmd)

    def stop(self) -> None:
        """The process is stopping: retry nothing more."""
        self._stopped = True
        for call in self._retry_calls:
            if call.active():
                call.cancel()
        self._retry_calls.clear()

    # Writers leaving

    def _forget_retired_writer(self, writer: str) -> None:
        for stream in self.streams.values():
            if stream.definition.writers.follows_instances:
                self.forget_writer(stream.name, writer)

    def forget_writer(self, stream_name: str, writer: str) -> None:
        """Stop tracking a writer that has stopped for good (an events writer
        retired at runtime), whose last position would otherwise hold the
        stream's persisted-up-to back. First read whatever it wrote beyond our
        position of it, so nothing it wrote is skipped. Runs in the stream's
        queue, after the commands received before."""
        stream = self.streams.get(stream_name)
        if stream is None or writer == self._me:
            return
        positions = stream.positions

        async def work() -> None:
            try:
                if self._follows(stream_name):
                    final = await positions.read_stopped_writer_position(writer)
                    current = positions.received_position(writer)
                    if current < final:
                        await self._catch_up(stream, writer, current, final)
            except Exception:
                logger.warning(
                    "Reading the last rows of %s on %s failed; retrying in %.0f s",
                    writer,
                    stream_name,
                    CATCH_UP_RETRY_SECONDS,
                    exc_info=True,
                )
                self._retry_later(self.forget_writer, stream_name, writer)
                return
            key = (stream_name, writer)
            for seen in self._positions_seen.values():
                seen.discard(key)
            self._pending_batches.pop(key, None)
            self.lag.forget(stream_name, writer)
            positions.forget_writer(writer)

        self._enqueue(stream_name, work)
