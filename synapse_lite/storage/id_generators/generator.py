"""Stream id allocation, for one or many writers, over the database.

The arithmetic of positions (a writer's position, persisted-up-to, what a
POSITION or an RDATA row does) is :class:`~.positions.PositionModel`; this
shell feeds it. It loads positions once, synchronously, from the startup
connection (the ``stream_positions`` table, the sequence, and only the rows at
or after the smallest stored position; nothing is loaded lazily afterwards),
allocates ids from the stream's sequence, marks them finished when their
transaction ends, records this writer's position in ``stream_positions``
(outside the data transaction, coalesced), and reports positions as metrics
and to the position log. It holds a lock around the model: allocation and
finishing happen on database threads.

The generator is also the database stream's view for replication
(:class:`~synapse_lite.replication.streams.StreamPositions`): the same verbs,
the same positions. What it takes and answers about positions counts up on
every stream; what goes to or comes from the database (rows' ids,
``stream_positions``, the ids handed to writers for their rows) is a stored
id, converted by the stream's :class:`~synapse_lite.streams.definition.IdSpace`
only (backfill's stored ids count down from -1).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Generic, TypeVar

import attr
from prometheus_client import Gauge
from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall
from twisted.python import threadable
from twisted.python.failure import Failure

from synapse_lite.metrics import STREAM_PERSISTED_UPTO, STREAM_POSITION
from synapse_lite.replication.notifier import ReplicationNotifier
from synapse_lite.storage.database import (
    DatabasePool,
    LoggingDatabaseConnection,
    LoggingTransaction,
)
from synapse_lite.storage.id_generators.positions import PositionModel
from synapse_lite.storage.id_generators.sequence import SequenceGenerator
from synapse_lite.streams.definition import IdSpace

if TYPE_CHECKING:
    from synapse_lite.position_log import PositionLog

logger = logging.getLogger(__name__)

T = TypeVar("T", int, list[int])

#: How long a writer waits after a write before recording its position in
#: ``stream_positions``; writes inside that window share one upsert. A restart
#: still recovers exact positions from the rows themselves.
STREAM_POSITIONS_WRITE_DELAY = 0.1


class MultiWriterIdGenerator:
    """Allocates ids of one stream and tracks every writer's position.

    Args:
        db_conn: the startup connection, used here and only here to load state.
        db: the pool used for allocations and ``stream_positions`` updates.
        notifier: poked (on the reactor thread) whenever ids finish.
        stream_name: the stream's name, as in ``stream_positions``.
        instance_name: the name of this process.
        ids: the sequence the ids come from, the tables whose rows carry them,
            and how stored ids relate to positions.
        writers: the instances allowed to write. Empty means any process may
            write and nothing is kept in ``stream_positions`` (the caches stream).
        prune_removed_writers: delete ``stream_positions`` rows of instances that
            are no longer writers (done by the main process).
        position_log: where finished ids are recorded for the offline audit.
    """

    def __init__(
        self,
        *,
        db_conn: LoggingDatabaseConnection,
        db: DatabasePool,
        notifier: ReplicationNotifier,
        stream_name: str,
        instance_name: str,
        ids: IdSpace,
        writers: Sequence[str],
        prune_removed_writers: bool = True,
        position_log: PositionLog | None = None,
    ) -> None:
        self._db = db
        self._notifier = notifier
        self.stream_name = stream_name
        self._instance_name = instance_name
        self._id_space = ids
        self._writers = list(writers)
        self._position_log = position_log
        self._sequence = SequenceGenerator(db.engine, ids.sequence_name)

        self._lock = threading.Lock()
        #: Guarded by _lock.
        self._model = PositionModel(instance_name)
        # The gauges are read when scraped, not set at every change: a label
        # lookup per row (issue 18), then a set per row and writer (issue 35),
        # were measurable shares of a follower's CPU.
        model = self._model
        STREAM_PERSISTED_UPTO.labels(stream_name).set_function(model.persisted_upto_position)
        #: Writers whose position gauge reads the model. Guarded by _lock.
        self._position_gauges: dict[str, Gauge] = {}
        self._allocation_listeners: list[Callable[[list[int]], None]] = []

        #: Rows read at startup after the stored positions (diagnostics: it must
        #: not grow with the size of the stream's tables).
        self.startup_rows_read = 0
        self._positions_write_call: IDelayedCall | None = None
        self._positions_write_running: defer.Deferred[None] | None = None

        for table in ids.tables:
            self._sequence.check_consistency(
                db_conn, ids, table, stream_name=stream_name if self._writers else None
            )
        self._load_current_ids(db_conn, prune_removed_writers)
        with self._lock:
            self._export_gauges()
        logger.info(
            "Loaded stream %s: persisted up to %d, positions %s (%d rows read)",
            stream_name,
            self.persisted_upto_position(),
            self.known_writer_positions(),
            self.startup_rows_read,
        )

    # Loading

    def _load_current_ids(self, db_conn: LoggingDatabaseConnection, prune: bool) -> None:
        positions: dict[str, int] = {}
        rows: list[tuple[str, int]] = []
        with db_conn.transaction(f"_load_current_ids({self.stream_name})") as txn:
            if self._writers:
                if prune:
                    placeholders = ", ".join("?" for _ in self._writers)
                    txn.execute(
                        "DELETE FROM stream_positions WHERE stream_name = ?"
                        f" AND instance_name NOT IN ({placeholders})",
                        (self.stream_name, *self._writers),
                    )
                    if txn.rowcount:
                        logger.info(
                            "Forgot %d removed writer(s) of stream %s",
                            txn.rowcount,
                            self.stream_name,
                        )
                txn.execute(
                    "SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = ?",
                    (self.stream_name,),
                )
                for instance, stream_id in txn.fetchall():
                    if instance in self._writers:
                        positions[instance] = self._id_space.position(int(stream_id))

                if self._instance_name in self._writers:
                    # A writer starting up has nothing in flight: everything it
                    # ever allocated has committed or rolled back.
                    positions[self._instance_name] = self._sequence.get_max_allocated(txn)

            min_position = min(positions.values(), default=None)
            if min_position is None:
                # No stored positions at all: the only whole-table aggregate,
                # a MAX on the indexed id column.
                persisted_upto = 0
                for table in self._id_space.tables:
                    newest = self._id_space.newest_position_sql(table.id_column)
                    txn.execute(f"SELECT {newest} FROM {table.table}")
                    row = txn.fetchone()
                    if row and row[0] is not None:
                        persisted_upto = max(persisted_upto, int(row[0]))
            else:
                persisted_upto = min_position
                # Rows written after the last stored positions (positions are
                # recorded after the rows, so they may lag).
                for table in self._id_space.tables:
                    txn.execute(
                        f"SELECT {table.instance_column}, {table.id_column} FROM {table.table}"
                        f" WHERE {self._id_space.position_condition(table.id_column, '>=')}",
                        (self._id_space.stored_id(min_position),),
                    )
                    rows.extend((r[0], self._id_space.position(int(r[1]))) for r in txn.fetchall())
                self.startup_rows_read = len(rows)

            with self._lock:
                # A writer unknown to the table, or coming back after being
                # away, has written nothing since: it starts at persisted-up-to.
                self._model.load(
                    positions, persisted_upto, rows, self._writers, any_writer=not self._writers
                )

            if self._instance_name in self._writers:
                # Be in the table before allocating anything: a process starting
                # while we have ids in flight must not take us for a writer that
                # has never written, and put us at its persisted-up-to.
                own = self._model.known_writer_positions()[self._instance_name]
                self._upsert_position_txn(txn, own)

    # Allocation

    @property
    def is_writer(self) -> bool:
        """Whether this process may allocate ids of this stream."""
        return not self._writers or self._instance_name in self._writers

    def _check_writer(self) -> None:
        if not self.is_writer:
            raise RuntimeError(
                f"{self._instance_name} tried to allocate an id of stream {self.stream_name},"
                f" which only {', '.join(self._writers)} may write"
            )

    def _load_next_mult_id_txn(self, txn: LoggingTransaction, n: int) -> list[int]:
        with self._lock:
            marker = self._model.begin_fetch()
        try:
            ids = self._sequence.get_next_mult_txn(txn, n)
            with self._lock:
                self._model.fetched(ids)
        finally:
            with self._lock:
                self._model.end_fetch(marker)
        for listener in self._allocation_listeners:
            listener(ids)
        return ids

    def on_allocation(self, listener: Callable[[list[int]], None]) -> None:
        """Call ``listener(positions)`` with every id this process allocates
        (as positions), on a database thread, before any of them can finish:
        whoever keeps rows by position learns of ids it will not see rows for
        (``CommittedRows``)."""
        self._allocation_listeners.append(listener)

    def get_next(self) -> _IdAllocation[int]:
        """Allocate one id: ``async with id_gen.get_next() as stream_id: ...``.

        The id is a stored id (for the rows' id column). It finishes when the
        block exits; positions move only then.
        """
        self._check_writer()
        return _IdAllocation(self, 1, single=True)

    def get_next_mult(self, n: int) -> _IdAllocation[list[int]]:
        """Allocate ``n`` increasing ids for one ``async with`` block."""
        self._check_writer()
        return _IdAllocation(self, n, single=False)

    def get_next_txn(self, txn: LoggingTransaction) -> int:
        """Allocate one id (a stored id) inside the caller's transaction.

        The id finishes when the transaction commits or fails; the rows using it
        must be written in this same transaction.
        """
        return self.get_next_mult_txn(txn, 1)[0]

    def get_next_mult_txn(self, txn: LoggingTransaction, n: int) -> list[int]:
        """Allocate ``n`` ids inside the caller's transaction."""
        self._check_writer()
        ids = self._load_next_mult_id_txn(txn, n)
        txn.call_after(self._finish, ids, True)
        txn.call_on_exception(self._finish, ids, False)
        return [self._id_space.stored_id(i) for i in ids]

    def _finish(self, ids: list[int], committed: bool) -> None:
        """Mark ids (positions) finished and tell whoever needs to know. Any thread."""
        self._mark_ids_as_finished(ids, committed)
        reactor = self._db.reactor
        if threadable.isInIOThread():
            self._after_finish(committed)
        else:
            reactor.callFromThread(self._after_finish, committed)  # type: ignore[attr-defined]

    def _after_finish(self, committed: bool) -> None:
        self._notifier.notify_replication()
        if committed and self._writers:
            self._schedule_positions_write()

    def _mark_ids_as_finished(self, ids: list[int], committed: bool) -> None:
        if self._position_log is not None:
            # Before any position can cover them, so the audit never sees a
            # position logged ahead of the ids it covers finishing.
            for i in ids:
                self._position_log.id_finished(
                    self.stream_name, self._instance_name, self._id_space.stored_id(i), committed
                )
        with self._lock:
            self._model.finish(ids)
            if self._instance_name not in self._position_gauges:
                self._export_gauges()

    # Reading positions

    #: Positions only grow, in one run for ever (the stream view's contract:
    #: a follower never resets a database stream).
    can_reset = False
    #: A lower POSITION is an old one (a repeat after a reconnection): not
    #: refused, only discarded as nothing new.
    lower_position_is_false = False
    #: Every id comes from the stream's sequence (:meth:`read_max_allocated`).
    has_sequence = True

    def starts_run(self, position: int) -> bool:
        return False

    def persisted_upto_position(self) -> int:
        """Every id up to it, by any writer, has finished: safe as a lower
        bound for readers of the whole stream (what /sync hands out)."""
        with self._lock:
            return self._model.persisted_upto_position()

    def writer_position(self, instance_name: str) -> int:
        """The position of one writer: it has no unseen rows at or below it.

        For this process it may run ahead of its last write (an idle writer
        reports the largest id seen allocated). An unknown or silent writer is
        reported at least at persisted-up-to.
        """
        with self._lock:
            return self._model.writer_position(instance_name)

    def received_position(self, instance_name: str) -> int:
        """How far this process has received a writer's rows (see
        :meth:`PositionModel.received_position`); what a follower asks for
        every row, so without copying every writer's position."""
        with self._lock:
            return self._model.received_position(instance_name)

    def newest_local_write(self) -> int:
        """The largest id this process has finished writing (no idle jump).

        The streamer compares it with what it last sent to know whether there
        are local rows to send. It is not this process's position: ids above
        the position may have finished while a smaller one (or a fetch that
        may return one) is outstanding, and their rows must still be sent
        before a position covering them is announced.
        """
        with self._lock:
            return self._model.newest_local_write()

    def known_writer_positions(self) -> dict[str, int]:
        """The known position of each writer."""
        with self._lock:
            return self._model.known_writer_positions()

    def snapshot(self) -> PositionsSnapshot:
        """Persisted-up-to, every known writer's position and this process's
        unfinished ids, at one instant."""
        with self._lock:
            return PositionsSnapshot(
                self._model.persisted_upto_position(),
                self._model.known_writer_positions(),
                self._model.unfinished_ids(),
                self._id_space,
            )

    # Learning of other writers (replication)

    def advance_writer(self, instance_name: str, position: int) -> None:
        """Record a writer's position learned over replication (POSITION):
        it has no unfinished ids at or below it. Only
        :meth:`advance_past_row` says an id is finished."""
        with self._lock:
            self._model.advance_writer(instance_name, position)
            if instance_name not in self._position_gauges:
                self._export_gauges()

    def advance_past_row(self, instance_name: str, row_id: int) -> None:
        """Rows at position ``row_id`` written by ``instance_name`` arrived
        (RDATA): the writer is at least there, and that id is finished."""
        with self._lock:
            self._model.advance_past_row(instance_name, row_id)
            if instance_name not in self._position_gauges:
                self._export_gauges()

    def forget_writer(self, instance_name: str) -> None:
        """Stop tracking a writer taken off the stream while this process runs,
        so its last position no longer holds persisted-up-to back.

        The caller must already have seen every row the writer wrote (read up to
        :meth:`read_stopped_writer_position`): afterwards the writer counts as
        being at persisted-up-to. A writer that comes back is tracked again by
        :meth:`advance_writer`. The configured writer list is left alone: it
        only says whether *this* process may write.
        """
        with self._lock:
            forgotten = self._model.forget_writer(instance_name)
        if not forgotten:
            return
        with self._lock:
            self._position_gauges.pop(instance_name, None)
        try:
            STREAM_POSITION.remove(self.stream_name, instance_name)
        except KeyError:
            pass
        logger.info(
            "Stopped tracking writer %s of stream %s; persisted up to %d",
            instance_name,
            self.stream_name,
            self.persisted_upto_position(),
        )

    # Reading the database

    async def read_stopped_writer_position(self, instance_name: str) -> int:
        """The position of a writer that has stopped: the larger of its stored
        position and its newest row above that (positions are stored after the
        rows, so after a crash the stored one can lag)."""
        ids = self._id_space

        def txn_func(txn: LoggingTransaction) -> int:
            txn.execute(
                "SELECT stream_id FROM stream_positions"
                " WHERE stream_name = ? AND instance_name = ?",
                (self.stream_name, instance_name),
            )
            row = txn.fetchone()
            # A writer with no stored position has written nothing below
            # persisted-up-to.
            position = ids.position(int(row[0])) if row else self.persisted_upto_position()
            for table in ids.tables:
                txn.execute(
                    f"SELECT {ids.newest_position_sql(table.id_column)} FROM {table.table}"
                    f" WHERE {table.instance_column} = ?"
                    f" AND {ids.position_condition(table.id_column, '>')}",
                    (instance_name, ids.stored_id(position)),
                )
                newest = txn.fetchone()
                if newest and newest[0] is not None:
                    position = max(position, int(newest[0]))
            return position

        return await self._db.runInteraction(
            "read_stopped_writer_position", txn_func, read_only=True
        )

    async def read_max_allocated(self) -> int:
        """The largest position the stream's sequence has handed out to
        anyone, read now. One query; what a follower checks a peer's claimed
        position against."""
        # Every new position a writer claims waits for this read before the
        # main process relays it (issue 20's check), so it is on the
        # replication latency path (issue 18): outside any transaction, and
        # on PostgreSQL without a database thread (issue 35).
        return await self._db.sequence_last_value(
            "read_max_allocated", self._sequence.sequence_name
        )

    def _export_gauges(self) -> None:
        """Give every writer the model knows a position gauge. Holds _lock."""
        for name in self._model.known_writer_positions():
            self._export_gauge(name)

    def _export_gauge(self, name: str) -> None:
        """Holds _lock. The gauge reads the writer's known position when
        scraped (0 once it is no longer known)."""
        if name in self._position_gauges:
            return
        model = self._model
        gauge = self._position_gauges[name] = STREAM_POSITION.labels(self.stream_name, name)
        gauge.set_function(lambda: model.known_position(name))

    # stream_positions

    def _schedule_positions_write(self) -> None:
        if self._positions_write_call is not None:
            return
        self._positions_write_call = self._db.reactor.callLater(  # type: ignore[attr-defined]
            STREAM_POSITIONS_WRITE_DELAY, self._start_positions_write
        )

    def _start_positions_write(self) -> defer.Deferred[None]:
        self._positions_write_call = None
        previous = self._positions_write_running
        if previous is not None:
            # One upsert at a time, in order, so positions only move forward.
            d: defer.Deferred[None] = defer.Deferred()
            previous.addBoth(lambda _: self._start_positions_write().chainDeferred(d))
            return d
        d = defer.ensureDeferred(self._write_position())
        self._positions_write_running = d

        def done(result: None) -> None:
            if self._positions_write_running is d:
                self._positions_write_running = None
            return result

        d.addBoth(done)
        return d

    async def _write_position(self) -> None:
        position = self.writer_position(self._instance_name)
        try:
            await self._db.runInteraction(
                "stream_positions_upsert",
                self._upsert_position_txn,
                position,
                db_autocommit=True,
            )
        except Exception:
            logger.warning(
                "Could not record position %d of stream %s; will retry after the next write",
                position,
                self.stream_name,
                exc_info=True,
            )

    def _upsert_position_txn(self, txn: LoggingTransaction, position: int) -> None:
        # Only ever forwards.
        forwards = self._id_space.position_condition(
            "stream_positions.stream_id", "<", "EXCLUDED.stream_id"
        )
        txn.execute(
            "INSERT INTO stream_positions (stream_name, instance_name, stream_id)"
            " VALUES (?, ?, ?)"
            " ON CONFLICT (stream_name, instance_name) DO UPDATE"
            f" SET stream_id = EXCLUDED.stream_id WHERE {forwards}",
            (self.stream_name, self._instance_name, self._id_space.stored_id(position)),
        )

    async def flush_stream_positions(self) -> None:
        """Record a pending position now and wait until it is stored
        (shutdown, tests). Does nothing when no successful write is pending.
        Returns with none pending: a write that came while it waited (and
        scheduled the next record, left behind as a timer in CI once) is
        recorded too."""
        while True:
            call = self._positions_write_call
            if call is not None:
                call.cancel()
                await self._start_positions_write()
            elif self._positions_write_running is not None:
                await self._positions_write_running
            else:
                return


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PositionsSnapshot:
    """See :meth:`MultiWriterIdGenerator.snapshot`: positions, and the
    stream's ``id_space`` to show them as the database stores them."""

    persisted_upto: int
    positions: dict[str, int]
    unfinished: list[int]
    id_space: IdSpace


class _IdAllocation(Generic[T]):
    """The async context manager behind ``get_next`` and ``get_next_mult``.

    If the caller is cancelled while the ids are being fetched, they are marked
    finished as soon as the fetch completes, so an abandoned allocation never
    wedges a position.
    """

    def __init__(self, id_gen: MultiWriterIdGenerator, n: int, single: bool) -> None:
        self._id_gen = id_gen
        self._n = n
        self._single = single
        self._ids: list[int] = []

    async def __aenter__(self) -> T:
        id_gen = self._id_gen
        fetch = defer.ensureDeferred(
            id_gen._db.runInteraction(
                "_load_next_mult_id",
                id_gen._load_next_mult_id_txn,
                self._n,
                db_autocommit=True,
            )
        )
        abandoned = False

        def on_cancel(_: defer.Deferred[list[int]]) -> None:
            nonlocal abandoned
            abandoned = True

        result: defer.Deferred[list[int]] = defer.Deferred(on_cancel)

        def fetched(ids: list[int]) -> None:
            if abandoned:
                id_gen._finish(ids, False)
            else:
                result.callback(ids)

        def failed(failure: Failure) -> None:
            if not abandoned:
                result.errback(failure)

        fetch.addCallbacks(fetched, failed)
        self._ids = await result
        stored = [id_gen._id_space.stored_id(i) for i in self._ids]
        if self._single:
            return stored[0]  # type: ignore[return-value]
        return stored  # type: ignore[return-value]

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._id_gen._finish(self._ids, exc_type is None)
