"""Group commit: writes that queue for the database's one writer share a
transaction.

SQLite lets one transaction write at a time (``Sqlite3Engine`` queues a
process's writers on its write lock), and each transaction pays a ``BEGIN
IMMEDIATE``, a savepoint, a ``COMMIT`` and the WAL frames of every page it
changed, whether it stores one event or ten. Sends to different rooms reach
the events writer at the same time, each holding only its own room's lock,
and used to wait for the write lock one behind the other. :class:`GroupCommit`
runs the writes that queued while the previous transaction ran in one
transaction instead: the pages they all change (the events table's tail, the
search index, the sequences row) are written once per group
(docs/scaling.md, issue 30). A group is taken from the queue once its
transaction holds the write lock, so the writes that queued while it waited
for another process's turn (the default layout's two events writers share
one SQLite file) are in it too.

Each write keeps what it had alone: its own result (its own stream ids, taken
in queue order), its after-commit callbacks, and its own failure. A group
that fails rolls back whole (its ids are burnt, as those of any failed
transaction) and its writes are run again one by one, each in its own
transaction, so a write that fails alone fails only its caller.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from twisted.internet import defer
from twisted.python.failure import Failure

from synapse_lite.metrics import GROUP_COMMIT_FALLBACKS, GROUP_COMMIT_SIZE
from synapse_lite.storage.database import DatabasePool, LoggingTransaction

logger = logging.getLogger(__name__)

R = TypeVar("R")

#: Writes in one transaction at most: bounds a group's transaction (its
#: savepoint journal is in memory) and the wait of its first caller.
MAX_GROUP = 32


class _Taken(Generic[R]):
    """The writes one transaction of a group commit took from the queue:
    ``None`` until its function first runs (a rerun of the transaction, on a
    retryable error, runs the same writes)."""

    __slots__ = ("writes",)

    def __init__(self) -> None:
        self.writes: list[tuple[Callable[[LoggingTransaction], R], defer.Deferred[R]]] | None = None


class GroupCommit(Generic[R]):
    """Runs transaction functions (``func(txn) -> R``) as
    ``db_pool.runInteraction(desc, func, idempotent=...)`` would, except that
    the functions queued until a transaction of this group commit holds the
    database's write lock go together in that transaction, in the order they
    were queued (each sees the writes of those before it). At most one
    transaction of a group commit runs at a time; a function queued while
    none runs starts one at once (a lone write waits for nothing).

    A transaction takes its writes from the queue once it has begun, that
    is once it holds the write lock, not when it is asked for: the writes
    that queue while it waits for another process's transaction (two events
    writers on one SQLite file take turns) or for this process's other
    writers go in it too, instead of waiting for the next turn.

    The next group's transaction starts as soon as the previous one ends,
    before the previous group's callers are answered: their next writes
    (a room's next send, prepared while the database works) then queue
    for the transaction after, rather than every room waiting for the
    slowest to be ready.

    Contract for the functions: the same as for ``runInteraction`` (they may
    be run more than once, their after-commit callbacks run once the
    transaction commits, on the reactor thread, before any caller of the
    group is answered); and a function that raises leaves nothing a rerun
    must undo besides its writes (rolled back). ``run`` is for the reactor
    thread only."""

    def __init__(self, db_pool: DatabasePool, desc: str, idempotent: bool = False) -> None:
        self._db_pool = db_pool
        self._desc = desc
        self._idempotent = idempotent
        # Appended on the reactor, taken by the running transaction's thread.
        self._queue: list[tuple[Callable[[LoggingTransaction], R], defer.Deferred[R]]] = []
        self._queue_lock = threading.Lock()
        self._in_flight = False

    async def run(self, func: Callable[[LoggingTransaction], R]) -> R:
        """``func``'s result once the transaction it ran in committed; its
        exception if it failed when run alone."""
        done: defer.Deferred[R] = defer.Deferred()
        with self._queue_lock:
            self._queue.append((func, done))
        if not self._in_flight:
            self._start_group()
        return await done

    def _start_group(self) -> None:
        self._in_flight = True
        defer.ensureDeferred(self._run_group())

    def _take(
        self, taken: _Taken[R]
    ) -> list[tuple[Callable[[LoggingTransaction], R], defer.Deferred[R]]]:
        """The writes of ``taken``'s transaction: the first ``MAX_GROUP``
        queued, taken once."""
        if taken.writes is None:
            with self._queue_lock:
                taken.writes = self._queue[:MAX_GROUP]
                del self._queue[:MAX_GROUP]
        return taken.writes

    async def _run_group(self) -> None:
        taken: _Taken[R] = _Taken()
        try:
            answers = await self._commit(taken)
        except Exception:  # pragma: no cover - _commit answers every function
            logger.exception("group commit %s failed", self._desc)
            answers = [Failure()] * len(self._take(taken))
        finally:
            self._in_flight = False
            with self._queue_lock:
                more = bool(self._queue)
            if more:
                self._start_group()
        for (_, done), answer in zip(self._take(taken), answers, strict=True):
            # A caller that gave up (cancelled) has its answer already.
            if done.called:
                continue
            if isinstance(answer, Failure):
                done.errback(answer)
            else:
                done.callback(answer)

    def _run_taken(self, txn: LoggingTransaction, taken: _Taken[R]) -> list[R]:
        return [func(txn) for func, _ in self._take(taken)]

    async def _commit(self, taken: _Taken[R]) -> list[R | Failure]:
        """Each taken function's result, or its failure when run alone."""
        try:
            results: list[R | Failure] = list(
                await self._db_pool.runInteraction(
                    self._desc, self._run_taken, taken, idempotent=self._idempotent
                )
            )
            GROUP_COMMIT_SIZE.labels(self._desc).observe(len(results))
            return results
        except Exception as e:
            ran = taken.writes is not None
            writes = self._take(taken)
            GROUP_COMMIT_SIZE.labels(self._desc).observe(len(writes))
            if ran and len(writes) == 1:
                # It failed alone.
                return [Failure()]
            if len(writes) > 1:
                GROUP_COMMIT_FALLBACKS.labels(self._desc).inc()
                logger.info(
                    "group commit %s of %d writes failed (%s); running them one by one",
                    self._desc,
                    len(writes),
                    e,
                )
        answers: list[R | Failure] = []
        for func, _ in writes:
            try:
                answers.append(
                    await self._db_pool.runInteraction(
                        self._desc, func, idempotent=self._idempotent
                    )
                )
            except Exception:
                answers.append(Failure())
        return answers
