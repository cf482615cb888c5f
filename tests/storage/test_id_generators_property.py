"""Property test of MultiWriterIdGenerator: random interleavings of three writers.

Three writers (``first``, ``second``, ``third``) of one stream share one
database, and a ``reader`` generator (not a writer) learns only through
:meth:`~MultiWriterIdGenerator.advance_writer`. Hypothesis draws a list of operations:

* ``Allocate``: ``get_next``/``get_next_mult(2)`` with the ``async with`` block
  kept open, or ``get_next_txn`` inside a transaction kept open on a database
  thread until the operation that ends it;
* ``Write``: allocate and commit at once, the common case;
* ``Finish``: commit one in-flight allocation (insert its rows, then leave the
  block or commit the transaction);
* ``Fail``: end one with an exception or a rolled-back transaction (a gap);
* ``Cancel``: cancel a ``get_next`` while its id is being fetched;
* ``Restart``: rebuild one writer's generator from a fresh startup connection,
  after committing or failing its in-flight work, or as after a crash (its
  in-flight ids abandoned without rows);
* ``Replicate``: advance other generators (or one) with a writer's (or every
  writer's) ``writer_position``;
* ``Replay``: deliver an earlier announcement again, late (a replication
  message seen twice or out of order must change nothing);
* ``Pause``: let the reactor turn (pending ``stream_positions`` writes run). It
  comes first among the strategies, so shrinking turns irrelevant operations
  into pauses.

Operations name in-flight work by index, modulo what is in flight, so every
list is runnable and shrinks well; an operation the state rules out is skipped.

**Checked after every operation**, on every live generator (writers and reader):

1. persisted-up-to never decreases (for one generator object), and neither
   does ``writer_position`` of any writer;
2. persisted-up-to is below every id allocated and unfinished anywhere;
3. the position of a writer (``known_writer_positions`` and
   ``writer_position``, as seen by any generator) is below every
   id that writer has unfinished; another writer's token is never below the
   generator's persisted-up-to (a writer's token for itself may lag its own
   persisted-up-to until its next write or ``advance_writer``, so that is not
   asserted);
4. a writer's own ``known_writer_positions()[writer]`` is exactly
   ``max(S0, largest id it finished below its smallest unfinished id)``, where
   S0 is the sequence's last value when its generator was built and "finished"
   means committed, failed or cancelled since then.

**At a restart** of writer W (nothing in flight at W): the new generator
reports W at exactly the sequence's last value, and not below the old
generator's ``writer_position(W)``: a restart never moves a
writer's announced position back, whatever other writers have in flight
(including the sequence's last id).

**At the end** of each example everything in flight is committed, every
generator's pending ``stream_positions`` write is flushed, and every writer's
token is replicated to every other generator until nothing changes. Then, with
S the sequence's last value: every generator's persisted-up-to is S and so is
its ``writer_position`` of every writer; each writer's
``known_writer_positions()[writer]`` is ``max(S0, largest id it committed, failed or
cancelled)`` (point 4 with nothing unfinished); the table holds exactly the
committed rows, with their writer's name. Generators built afresh from the
database reproduce the live ones: a writer at S at once, and a reader, once
each live writer has announced its token (as writers do when a process
connects), at the live reader's positions and persisted-up-to S.

The test also counts what the examples exercised (restarts beside work in
flight, crashes, open transactions, cancellations, out-of-order finishes) and
fails if any never happened, so a change to the strategies or the skip rules
cannot quietly turn it into a test of nothing.

**How it runs under trial.** Trial runs the reactor while it waits for a test's
Deferred, and hypothesis' ``@given`` wants to call a synchronous function once
per example. So the test hands the whole hypothesis run to a worker thread
(``deferToThread``); for each example that thread runs the async scenario on
the reactor thread and waits for it (``blockingCallFromThread``, with a
timeout). Shrinking and
reporting work as usual; failures are re-raised in the worker thread. A call
that does not come back within :data:`EXAMPLE_TIMEOUT` fails the example instead
of hanging the run. Shrinking a failure stops after :data:`SHRINK_BUDGET`
seconds: from then on a candidate that has not already failed is reported as
passing without being run, which ends the search, and hypothesis replays the
smallest failure found (already failed, so it runs for real) to report it.

**Database.** One database per test method (``IdGeneratorTestCase.setUp``);
each example starts by deleting the stream's rows and ``stream_positions`` and
recreating the sequence, which is much faster on PostgreSQL than a database per
example.

**Engines.** On PostgreSQL up to three transactions stay open at once. On
SQLite an open write transaction holds the database write lock, so while one is
open only operations that need no write run (failing a ``get_next``,
replicating, ending that transaction); the rest are skipped. Pending
``stream_positions`` writes are flushed before such a transaction opens: they
run in autocommit, outside the engine's in-process write lock, and would wait in
SQLite's busy handler for the transaction to end.
"""

from __future__ import annotations

import queue
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

import attr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet import defer, reactor, task, threads
from twisted.python.failure import Failure

from synapse_lite.storage.database import DatabasePool, LoggingTransaction
from synapse_lite.storage.id_generators import MultiWriterIdGenerator
from tests.storage.test_id_generators import IdGeneratorTestCase

WRITERS = ("first", "second", "third")
READER = "reader"
#: How many get_next_txn transactions may be open at once on PostgreSQL.
MAX_OPEN_TRANSACTIONS_POSTGRES = 3
#: Seconds one example may take before it counts as hung.
EXAMPLE_TIMEOUT = 60.0
#: Seconds hypothesis may spend shrinking a failure (see the module docstring).
SHRINK_BUDGET = 30.0

R = TypeVar("R")


# The operations hypothesis draws.


@attr.s(frozen=True, slots=True, auto_attribs=True)
class Pause:
    pass


@attr.s(frozen=True, slots=True, auto_attribs=True)
class Allocate:
    writer: str
    in_txn: bool
    n: int = 1


@attr.s(frozen=True, slots=True, auto_attribs=True)
class Write:
    """Allocate and commit at once: the common case, which moves positions on."""

    writer: str
    in_txn: bool


@attr.s(frozen=True, slots=True, auto_attribs=True)
class Finish:
    index: int


@attr.s(frozen=True, slots=True, auto_attribs=True)
class Fail:
    index: int


@attr.s(frozen=True, slots=True, auto_attribs=True)
class Cancel:
    writer: str


@attr.s(frozen=True, slots=True, auto_attribs=True)
class Restart:
    writer: str
    #: "finish" or "fail" its in-flight work first, or "crash" (abandon it).
    mode: str


@attr.s(frozen=True, slots=True, auto_attribs=True)
class Replicate:
    #: A writer, or "all" for every writer in turn.
    writer: str
    #: A generator name, or "all" for every other generator.
    target: str


@attr.s(frozen=True, slots=True, auto_attribs=True)
class Replay:
    index: int
    target: str


Operation = Pause | Allocate | Write | Finish | Fail | Cancel | Restart | Replicate | Replay

_writer = st.sampled_from(WRITERS)
_index = st.integers(0, 5)
OPERATIONS: st.SearchStrategy[Operation] = st.one_of(
    st.just(Pause()),
    st.builds(Allocate, writer=_writer, in_txn=st.just(False), n=st.sampled_from((1, 1, 2))),
    st.builds(Allocate, writer=_writer, in_txn=st.just(True)),
    st.builds(Write, writer=_writer, in_txn=st.booleans()),
    st.builds(Finish, index=_index),
    st.builds(Finish, index=_index),
    st.builds(Fail, index=_index),
    st.builds(Cancel, writer=_writer),
    st.builds(Restart, writer=_writer, mode=st.sampled_from(("finish", "fail", "crash"))),
    st.builds(Replicate, writer=_writer, target=st.sampled_from((*WRITERS, READER, "all"))),
    # Every writer announces its position to every generator, as writers do
    # periodically.
    st.builds(Replicate, writer=st.just("all"), target=st.just("all")),
    st.builds(Replay, index=_index, target=st.sampled_from((*WRITERS, READER))),
)


class _Rollback(Exception):
    """Raised in an open transaction told to fail."""


class _OpenTransaction:
    """A transaction that took ids with ``get_next_txn`` and stays open on a
    database thread until :meth:`end` says whether to commit its rows."""

    def __init__(self, db: DatabasePool, id_gen: MultiWriterIdGenerator, writer: str) -> None:
        self._id_gen = id_gen
        self._writer = writer
        self._decision: queue.Queue[bool] = queue.Queue()
        #: Fires with the ids once they are allocated.
        self.allocated: defer.Deferred[list[int]] = defer.Deferred()
        self.done = defer.ensureDeferred(db.runInteraction("open_txn", self._txn))
        self.done.addErrback(self._failed_early)

    def _txn(self, txn: LoggingTransaction) -> None:
        ids = [self._id_gen.get_next_txn(txn)]
        reactor.callFromThread(self.allocated.callback, ids)  # type: ignore[attr-defined]
        # A timeout rather than a hang if the test forgets to end us.
        if not self._decision.get(timeout=60):
            raise _Rollback()
        _insert_rows_txn(txn, ids, self._writer)

    def _failed_early(self, failure: Any) -> Any:
        if not self.allocated.called:
            self.allocated.errback(failure)
            return None
        return failure

    async def end(self, commit: bool) -> None:
        self._decision.put(commit)
        try:
            await self.done
        except _Rollback:
            if commit:
                raise


def _insert_rows_txn(txn: LoggingTransaction, ids: Iterable[int], writer: str) -> None:
    for stream_id in ids:
        txn.execute(
            "INSERT INTO foobar (stream_id, instance_name) VALUES (?, ?)", (stream_id, writer)
        )


@attr.s(slots=True, auto_attribs=True)
class _InFlight:
    """Ids allocated and not finished, and how to finish them."""

    writer: str
    ids: list[int]
    block: Any = None  # the open ``async with`` allocation
    txn: _OpenTransaction | None = None


class _Scenario:
    """One example: the live generators, what is in flight, and the model the
    generators are checked against."""

    def __init__(self, case: IdGeneratorPropertyTest) -> None:
        self.case = case
        self.is_sqlite = case.engine.name == "sqlite"
        self.gens: dict[str, MultiWriterIdGenerator] = {}
        self.in_flight: list[_InFlight] = []
        #: Every generator built in this example, for the final flush.
        self.all_gens: list[MultiWriterIdGenerator] = []
        #: Last persisted-up-to and tokens seen, per generator object.
        self.last_seen: dict[tuple[int, str], int] = {}
        #: The sequence's last value when each writer's generator was built.
        self.built_at: dict[str, int] = {}
        #: Ids each writer finished (any way) since its generator was built.
        self.finished: dict[str, set[int]] = {}
        #: Every (writer, token) replicated so far, for Replay.
        self.announcements: list[tuple[str, int]] = []
        #: (id, writer) of every committed row.
        self.committed: set[tuple[int, str]] = set()
        self.log: list[str] = []
        #: What this example exercised (see the module docstring).
        self.coverage: Counter[str] = Counter()

    # Building generators

    def build(self, name: str) -> MultiWriterIdGenerator:
        id_gen = self.case.make_id_gen(name, writers=list(WRITERS))
        self.all_gens.append(id_gen)
        return id_gen

    def install(self, name: str, id_gen: MultiWriterIdGenerator, sequence_value: int) -> None:
        self.gens[name] = id_gen
        if name != READER:
            self.built_at[name] = sequence_value
            self.finished[name] = set()

    async def start(self) -> None:
        for name in (*WRITERS, READER):
            self.install(name, self.build(name), await self.case.sequence_value())

    # Operations

    def open_transactions(self) -> list[_InFlight]:
        return [item for item in self.in_flight if item.txn is not None]

    def may_write(self) -> bool:
        """False while an open transaction holds SQLite's write lock."""
        return not (self.is_sqlite and self.open_transactions())

    async def apply(self, op: Operation) -> None:
        if isinstance(op, Pause):
            await task.deferLater(reactor, 0)
        elif isinstance(op, Allocate):
            await self.allocate(op)
        elif isinstance(op, Write):
            item = await self.allocate(Allocate(op.writer, op.in_txn))
            if item is not None:
                await self.end(item, commit=True)
        elif isinstance(op, Finish):
            # On SQLite only the open transaction can commit while it is open.
            candidates = self.open_transactions() if self.is_sqlite else []
            candidates = candidates or self.in_flight
            if candidates:
                await self.end(candidates[op.index % len(candidates)], commit=True)
        elif isinstance(op, Fail):
            if self.in_flight:
                await self.end(self.in_flight[op.index % len(self.in_flight)], commit=False)
        elif isinstance(op, Cancel):
            if self.may_write():
                await self.cancel(op.writer)
        elif isinstance(op, Restart):
            if await self.restart_is_supported(op.writer):
                await self.restart(op.writer, op.mode)
        elif isinstance(op, Replay):
            if self.announcements:
                writer, token = self.announcements[-1 - op.index % len(self.announcements)]
                if writer != op.target:
                    self.gens[op.target].advance_writer(writer, token)
                    self.log.append(f"replay {writer}@{token} -> {op.target}")
        else:
            for writer in WRITERS if op.writer == "all" else (op.writer,):
                self.replicate(writer, op.target)

    async def allocate(self, op: Allocate) -> _InFlight | None:
        """Allocate and keep the ids in flight; None if the state rules it out."""
        id_gen = self.gens[op.writer]
        if op.in_txn:
            limit = 1 if self.is_sqlite else MAX_OPEN_TRANSACTIONS_POSTGRES
            if not self.may_write() or len(self.open_transactions()) >= limit:
                return None
            if self.is_sqlite:
                for each in self.all_gens:
                    await each.flush_stream_positions()
            txn = _OpenTransaction(self.case.txn_db, id_gen, op.writer)
            ids = await txn.allocated
            item = _InFlight(op.writer, ids, txn=txn)
            self.coverage["open transaction"] += 1
        else:
            if not self.may_write():
                return None
            block: Any = id_gen.get_next() if op.n == 1 else id_gen.get_next_mult(op.n)
            got = await block.__aenter__()
            ids = [got] if op.n == 1 else list(got)
            item = _InFlight(op.writer, ids, block=block)
        self.in_flight.append(item)
        self.log.append(f"{op!r} -> {ids}")
        return item

    async def end(self, item: _InFlight, commit: bool) -> None:
        if any(i < min(item.ids) for i in self.unfinished(item.writer)):
            self.coverage["out-of-order finish"] += 1
        self.in_flight.remove(item)
        if item.txn is not None:
            await item.txn.end(commit)
        elif commit:
            await self.case.db.runInteraction("insert", _insert_rows_txn, item.ids, item.writer)
            await item.block.__aexit__(None, None, None)
        else:
            error = ValueError("write failed")
            await item.block.__aexit__(ValueError, error, None)
        self.finished[item.writer].update(item.ids)
        if commit:
            self.committed.update((i, item.writer) for i in item.ids)
        self.log.append(f"{'commit' if commit else 'fail'} {item.writer} {item.ids}")

    async def cancel(self, writer: str) -> None:
        async def allocate() -> None:
            async with self.gens[writer].get_next():
                raise AssertionError("a cancelled allocation ran its block")

        attempt = defer.ensureDeferred(allocate())
        attempt.cancel()  # the fetch is on the database thread by now
        try:
            await attempt
        except defer.CancelledError:
            pass
        # The pool has one thread: once this runs, the fetch has completed and
        # the abandoned id has been finished. Nothing else allocates meanwhile,
        # so the sequence's last value is that id.
        await self.case.db.runInteraction("barrier", lambda txn: None, read_only=True)
        stream_id = await self.case.sequence_value()
        self.finished[writer].add(stream_id)
        self.log.append(f"cancel {writer} -> {stream_id}")
        self.coverage["cancel"] += 1

    async def restart_is_supported(self, writer: str) -> bool:
        others_open = [t for t in self.open_transactions() if t.writer != writer]
        if self.is_sqlite and others_open:
            return False
        others_unfinished = {
            item.writer: item.ids for item in self.in_flight if item.writer != writer
        }
        if others_unfinished:
            # Including with the sequence head in flight elsewhere, and beside
            # writers that have not written yet (RestartBesideWorkInFlightTestCase).
            self.coverage["restart beside work in flight"] += 1
        return True

    async def restart(self, writer: str, mode: str) -> None:
        mine = [item for item in self.in_flight if item.writer == writer]
        # Transactions first: on SQLite one may hold the write lock.
        mine.sort(key=lambda item: item.txn is None)
        for item in mine:
            if mode != "crash":
                await self.end(item, commit=mode == "finish")
                continue
            # The process dies: its open transaction rolls back, its blocks
            # never exit, and nobody ever writes those ids.
            self.in_flight.remove(item)
            if item.txn is not None:
                await item.txn.end(False)
            self.coverage["crash with work in flight"] += 1

        old = self.gens[writer]
        old_token = old.writer_position(writer)
        # Whatever position write the old process had scheduled may land.
        await old.flush_stream_positions()
        new = self.build(writer)
        sequence_value = await self.case.sequence_value()
        self.log.append(f"restart {writer} ({mode}) at {sequence_value}")
        self.case.assertEqual(new.known_writer_positions()[writer], sequence_value, self.describe())
        self.case.assertEqual(new.writer_position(writer), sequence_value, self.describe())
        self.case.assertGreaterEqual(sequence_value, old_token, self.describe())
        self.install(writer, new, sequence_value)

    def replicate(self, writer: str, target: str) -> None:
        token = self.gens[writer].writer_position(writer)
        self.announcements.append((writer, token))
        for name, id_gen in self.gens.items():
            if name != writer and target in (name, "all"):
                id_gen.advance_writer(writer, token)
        self.log.append(f"replicate {writer}@{token} -> {target}")

    # Checks

    def describe(self) -> str:
        views = {
            name: (g.persisted_upto_position(), g.known_writer_positions())
            for name, g in self.gens.items()
        }
        in_flight = [(item.writer, item.ids) for item in self.in_flight]
        return "\n".join(
            ["", *self.log, f"in flight: {in_flight}", f"(persisted, positions): {views}"]
        )

    def unfinished(self, writer: str | None = None) -> list[int]:
        return [i for item in self.in_flight if writer in (None, item.writer) for i in item.ids]

    def check_invariants(self) -> None:
        assert_ = self.case
        first_unfinished = min(self.unfinished(), default=None)
        for name, id_gen in self.gens.items():
            persisted = id_gen.persisted_upto_position()
            self.never_back(id_gen, name, "persisted-up-to", persisted)
            if first_unfinished is not None:
                assert_.assertLess(
                    persisted,
                    first_unfinished,
                    f"{name}'s persisted-up-to passed an unfinished id" + self.describe(),
                )
            positions = id_gen.known_writer_positions()
            for writer in WRITERS:
                token = id_gen.writer_position(writer)
                self.never_back(id_gen, name, f"token for {writer}", token)
                if writer != name:
                    assert_.assertGreaterEqual(token, persisted, self.describe())
                own_unfinished = min(self.unfinished(writer), default=None)
                if own_unfinished is None:
                    continue
                assert_.assertLess(
                    token,
                    own_unfinished,
                    f"{name}'s token for {writer} passed its unfinished id" + self.describe(),
                )
                if writer in positions:
                    assert_.assertLess(positions[writer], own_unfinished, self.describe())
        for writer in WRITERS:
            assert_.assertEqual(
                self.gens[writer].known_writer_positions()[writer],
                self.expected_own_position(writer),
                f"{writer}'s own position" + self.describe(),
            )

    def never_back(self, id_gen: MultiWriterIdGenerator, name: str, what: str, value: int) -> None:
        # Old generators stay in all_gens, so id() is not reused in an example.
        key = (id(id_gen), what)
        previous = self.last_seen.get(key, value)
        self.case.assertGreaterEqual(
            value, previous, f"{name}'s {what} went back" + self.describe()
        )
        self.last_seen[key] = value

    def expected_own_position(self, writer: str) -> int:
        below = min(self.unfinished(writer), default=None)
        done = [i for i in self.finished[writer] if below is None or i < below]
        return max([self.built_at[writer], *done])

    async def quiesce_and_check(self) -> None:
        """Finish everything, replicate until nothing changes, then check the
        end state and that fresh generators reproduce it."""
        assert_ = self.case
        for item in sorted(self.in_flight, key=lambda item: item.txn is None):
            await self.end(item, commit=True)
        for id_gen in self.gens.values():
            await id_gen.flush_stream_positions()
        for _ in range(10):
            before = {name: g.known_writer_positions() for name, g in self.gens.items()}
            for writer in WRITERS:
                self.replicate(writer, "all")
            if before == {name: g.known_writer_positions() for name, g in self.gens.items()}:
                break
        self.check_invariants()

        top = await self.case.sequence_value()
        for name, id_gen in self.gens.items():
            assert_.assertEqual(id_gen.persisted_upto_position(), top, name + self.describe())
            for writer in WRITERS:
                assert_.assertEqual(id_gen.writer_position(writer), top, name + self.describe())
        for writer in WRITERS:
            assert_.assertEqual(
                self.gens[writer].known_writer_positions()[writer],
                max([self.built_at[writer], *self.finished[writer]]),
                writer + self.describe(),
            )
        assert_.assertEqual(await self.case.table_rows(), self.committed, self.describe())

        # Every write has flushed its position: fresh generators match.
        for writer in WRITERS:
            fresh = self.build(writer)
            assert_.assertEqual(fresh.known_writer_positions()[writer], top, self.describe())
            assert_.assertEqual(fresh.writer_position(writer), top, self.describe())
        reader = self.build(READER)
        assert_.assertLessEqual(reader.persisted_upto_position(), top)
        for writer in WRITERS:
            reader.advance_writer(writer, self.gens[writer].writer_position(writer))
        assert_.assertEqual(reader.persisted_upto_position(), top, self.describe())
        assert_.assertEqual(
            reader.known_writer_positions(), self.gens[READER].known_writer_positions()
        )

    async def close(self) -> None:
        """Leave the database idle for the next example, whatever happened."""
        for item in self.in_flight:
            if item.txn is not None:
                try:
                    await item.txn.end(False)
                except Exception:
                    pass
        self.in_flight.clear()
        for id_gen in self.all_gens:
            await id_gen.flush_stream_positions()


class IdGeneratorPropertyTest(IdGeneratorTestCase):
    def setUp(self) -> None:
        super().setUp()
        # Open get_next_txn transactions each hold a thread of their own.
        self.txn_db = DatabasePool(
            reactor,
            self.engine,
            name="open_txns",
            max_connections=1 if self.engine.name == "sqlite" else MAX_OPEN_TRANSACTIONS_POSTGRES,
        )
        self.addCleanup(self.txn_db.close)
        #: What the examples exercised, summed (see the module docstring).
        self.coverage: Counter[str] = Counter()

    async def sequence_value(self) -> int:
        def read(txn: LoggingTransaction) -> int:
            return self.engine.sequence_last_value(txn.raw_cursor, "foobar_seq")

        # Read-only: on SQLite it runs beside an open write transaction.
        return await self.db.runInteraction("sequence_value", read, read_only=True)

    async def stored_positions_read_only(self) -> dict[str, int]:
        """Like ``stored_positions``, beside an open SQLite write transaction."""

        def read(txn: LoggingTransaction) -> dict[str, int]:
            txn.execute(
                "SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = ?",
                ("test_stream",),
            )
            return {name: int(pos) for name, pos in txn.fetchall()}

        return await self.db.runInteraction("stored_positions", read, read_only=True)

    async def table_rows(self) -> set[tuple[int, str]]:
        rows = await self.db.execute("rows", "SELECT stream_id, instance_name FROM foobar")
        return {(int(stream_id), name) for stream_id, name in rows}

    async def reset_database(self) -> None:
        def reset(txn: LoggingTransaction) -> None:
            txn.execute("DELETE FROM foobar")
            txn.execute("DELETE FROM stream_positions")
            if self.engine.name == "sqlite":
                txn.execute("DELETE FROM sequences WHERE name = 'foobar_seq'")
            else:
                txn.execute("DROP SEQUENCE foobar_seq")
            for statement in self.engine.create_sequence_sql("foobar_seq"):
                txn.execute(statement)

        await self.db.runInteraction("reset", reset)

    async def run_example(self, operations: list[Operation]) -> None:
        await self.reset_database()
        scenario = _Scenario(self)
        try:
            await scenario.start()
            scenario.check_invariants()
            for op in operations:
                await scenario.apply(op)
                scenario.check_invariants()
            await scenario.quiesce_and_check()
            self.coverage.update(scenario.coverage)
        finally:
            await scenario.close()

    def call_on_reactor(self, make: Callable[[], Coroutine[Any, Any, R]]) -> R:
        """From the hypothesis thread: run a coroutine on the reactor thread
        and wait for its result (``blockingCallFromThread`` with a timeout)."""
        results: queue.Queue[Any] = queue.Queue()

        def run() -> None:
            defer.ensureDeferred(make()).addBoth(results.put)

        reactor.callFromThread(run)  # type: ignore[attr-defined]
        try:
            result = results.get(timeout=EXAMPLE_TIMEOUT)
        except queue.Empty:
            raise AssertionError(f"an example took over {EXAMPLE_TIMEOUT} s: hung?") from None
        if isinstance(result, Failure):
            result.raiseException()
        return result

    def test_random_interleavings(self) -> defer.Deferred[None]:
        failed: set[tuple[Operation, ...]] = set()
        first_failure: list[float] = []

        @settings(
            max_examples=60,
            deadline=None,
            derandomize=True,
            database=None,
            report_multiple_bugs=False,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(operations=st.lists(OPERATIONS, min_size=20, max_size=80))
        def check(operations: list[Operation]) -> None:
            key = tuple(operations)
            if (
                first_failure
                and time.monotonic() - first_failure[0] > SHRINK_BUDGET
                and key not in failed
            ):
                return  # Out of shrinking time: a pass ends the search.
            try:
                self.call_on_reactor(lambda: self.run_example(operations))
            except BaseException:
                failed.add(key)
                first_failure[:1] = first_failure[:1] or [time.monotonic()]
                raise

        def check_coverage(_: None) -> None:
            for what in (
                "restart beside work in flight",
                "crash with work in flight",
                "open transaction",
                "cancel",
                "out-of-order finish",
            ):
                self.assertGreater(self.coverage[what], 0, f"no example had a {what}")

        # Hypothesis runs in a thread of its own: see the module docstring.
        return threads.deferToThread(check).addCallback(check_coverage)


class RestartBesideWorkInFlightTestCase(IdGeneratorTestCase):
    """Restarts beside another writer's work in flight (two bugs the property
    test found, now fixed)."""

    async def test_restart_beside_writer_without_stored_position(self) -> None:
        """first holds id 1; second restarts. first recorded its position when
        it started, so second does not take it for a writer that never wrote
        (which would put it, and persisted-up-to, at the sequence head, 1)."""
        writers = ["first", "second"]
        first = self.make_id_gen("first", writers=writers)
        self.make_id_gen("second", writers=writers)
        block = first.get_next()
        self.assertEqual(await block.__aenter__(), 1)
        try:
            second = self.make_id_gen("second", writers=writers)
            self.assertEqual(second.persisted_upto_position(), 0)
            self.assertEqual(second.writer_position("first"), 0)
        finally:
            await block.__aexit__(None, None, None)

    async def test_restarted_writer_announces_an_id_in_flight(self) -> None:
        """first commits 1 and then holds 2; second restarts and announces the
        sequence head, 2. A reader that learns first's position (1), then
        second's (2), must not take 2 for a finished id: persisted-up-to stays
        at 1 until first finishes 2."""
        writers = ["first", "second"]
        first = self.make_id_gen("first", writers=writers)
        self.make_id_gen("second", writers=writers)
        reader = self.make_id_gen("reader", writers=writers)
        self.assertEqual(await self.write_row_with(first, "first"), 1)
        await first.flush_stream_positions()
        block = first.get_next()
        self.assertEqual(await block.__aenter__(), 2)
        try:
            second = self.make_id_gen("second", writers=writers)
            # first's row 1 arrives (RDATA), then second's position (POSITION).
            reader.advance_past_row("first", 1)
            self.assertEqual(reader.persisted_upto_position(), 1)
            self.assertEqual(second.writer_position("second"), 2)
            reader.advance_writer("second", second.writer_position("second"))
            self.assertEqual(reader.persisted_upto_position(), 1)
        finally:
            await block.__aexit__(None, None, None)
