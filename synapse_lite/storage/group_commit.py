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
(docs/scaling.md, issue 30).

Each write keeps what it had alone: its own result (its own stream ids, taken
in queue order), its after-commit callbacks, and its own failure. A group
that fails rolls back whole (its ids are burnt, as those of any failed
transaction) and its writes are run again one by one, each in its own
transaction, so a write that fails alone fails only its caller.
"""

from __future__ import annotations

import logging
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


class GroupCommit(Generic[R]):
    """Runs transaction functions (``func(txn) -> R``) as
    ``db_pool.runInteraction(desc, func, idempotent=...)`` would, except that
    the functions queued while a transaction of this group commit is running
    go together in the next transaction, in the order they were queued (each
    sees the writes of those before it). At most one transaction of a group
    commit runs at a time; a function queued while none runs starts one at
    once (a lone write waits for nothing).

    The next group's transaction starts as soon as the previous one ends,
    before the previous group's callers are answered: their next writes
    (a room's next send, prepared while the database works) then queue
    for the transaction after, rather than every room waiting for the
    slowest to be ready.

    Contract for the functions: the same as for ``runInteraction`` (they may
    be run more than once, their after-commit callbacks run once the
    transaction commits, on the reactor thread, before any caller of the
    group is answered); and a function that raises leaves nothing a rerun
    must undo besides its writes (rolled back). For the reactor thread
    only."""

    def __init__(self, db_pool: DatabasePool, desc: str, idempotent: bool = False) -> None:
        self._db_pool = db_pool
        self._desc = desc
        self._idempotent = idempotent
        self._queue: list[tuple[Callable[[LoggingTransaction], R], defer.Deferred[R]]] = []
        self._in_flight = False

    async def run(self, func: Callable[[LoggingTransaction], R]) -> R:
        """``func``'s result once the transaction it ran in committed; its
        exception if it failed when run alone."""
        done: defer.Deferred[R] = defer.Deferred()
        self._queue.append((func, done))
        if not self._in_flight:
            self._start_group()
        return await done

    def _start_group(self) -> None:
        group = self._queue[:MAX_GROUP]
        del self._queue[:MAX_GROUP]
        self._in_flight = True
        defer.ensureDeferred(self._run_group(group))

    async def _run_group(
        self, group: list[tuple[Callable[[LoggingTransaction], R], defer.Deferred[R]]]
    ) -> None:
        try:
            answers = await self._commit([func for func, _ in group])
        except Exception:  # pragma: no cover - _commit answers every function
            logger.exception("group commit %s failed", self._desc)
            answers = [Failure()] * len(group)
        finally:
            self._in_flight = False
            if self._queue:
                self._start_group()
        for (_, done), answer in zip(group, answers, strict=True):
            # A caller that gave up (cancelled) has its answer already.
            if done.called:
                continue
            if isinstance(answer, Failure):
                done.errback(answer)
            else:
                done.callback(answer)

    async def _commit(self, funcs: list[Callable[[LoggingTransaction], R]]) -> list[R | Failure]:
        """Each function's result, or its failure when run alone."""
        GROUP_COMMIT_SIZE.labels(self._desc).observe(len(funcs))
        if len(funcs) > 1:
            try:
                return list(
                    await self._db_pool.runInteraction(
                        self._desc, _run_all, funcs, idempotent=self._idempotent
                    )
                )
            except Exception as e:
                GROUP_COMMIT_FALLBACKS.labels(self._desc).inc()
                logger.info(
                    "group commit %s of %d writes failed (%s); running them one by one",
                    self._desc,
                    len(funcs),
                    e,
                )
        answers: list[R | Failure] = []
        for func in funcs:
            try:
                answers.append(
                    await self._db_pool.runInteraction(
                        self._desc, func, idempotent=self._idempotent
                    )
                )
            except Exception:
                answers.append(Failure())
        return answers


def _run_all(txn: LoggingTransaction, funcs: list[Callable[[LoggingTransaction], R]]) -> list[R]:
    return [func(txn) for func in funcs]
