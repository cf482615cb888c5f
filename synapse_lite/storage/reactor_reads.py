"""One-statement reads the reactor runs itself, on a connection of their own.

A read through :class:`~synapse_lite.storage.database.DatabasePool` goes to
a database thread and comes back through the reactor's queue of calls from
threads; the way back also waits for the GIL, which the reactor thread holds
while it works. On a busy main process a sequence read that PostgreSQL
answers in about a tenth of a millisecond took 1.0-1.6 ms that way, and
every new position a writer claims waits for that read before the main
process relays it (docs/scaling.md, "the wake-up"). Here the reactor sends
the statement on a non-blocking connection (psycopg2's asynchronous mode)
and reads the answer when the socket is readable, as it reads any other
socket: no thread and no hand-over.

Only for short statements that need no transaction (the connection is in
autocommit): statements run one after another on the one connection, so a
slow one holds those behind it. Used for sequence reads
(:meth:`DatabasePool.sequence_last_value`).

Opening the connection resolves the database's host name in the reactor
thread (libpq does that before it goes asynchronous): free for an address,
a local lookup for ``localhost``, and for a name served by DNS a lookup on
the first read and after each broken connection. ``connect_timeout`` does
not apply in this mode; :data:`READ_TIMEOUT_SECONDS` bounds the opening.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import (
    IDelayedCall,
    IReactorFDSet,
    IReactorTime,
    IReadDescriptor,
    IWriteDescriptor,
)
from twisted.python.failure import Failure
from zope.interface import implementer

from synapse_lite.storage.engines.base import BaseDatabaseEngine

logger = logging.getLogger(__name__)

#: How long a statement (or the connection's opening) may take before the
#: connection is dropped and the read fails: a server that stopped
#: answering must not hold every later claim for ever. The caller retries.
READ_TIMEOUT_SECONDS = 10.0


class ReactorReadTimedOut(Exception):
    """No answer within the timeout; the connection was dropped."""


class ReactorReadsClosed(Exception):
    """The reads were closed (the process is stopping)."""


class ReactorReads:
    """Statements on one connection the reactor drives, for engines with
    ``reads_in_reactor``. Reactor thread only.

    :meth:`fetch_one` gives a statement's first row or raises: the driver's
    error when the server refuses the statement or the connection breaks,
    :class:`ReactorReadTimedOut` after ``timeout`` seconds without an answer,
    :class:`ReactorReadsClosed` once closed. The connection is opened on
    first use and again after it broke or timed out; a statement that fails
    on a connection which had been idle since its last one, with an error
    the engine calls a connection error (the server closed it meanwhile: a
    restart, an idle timeout), is sent once more on a new connection, which
    is safe because these are reads.
    """

    def __init__(
        self,
        reactor: Any,
        engine: BaseDatabaseEngine,
        *,
        timeout: float = READ_TIMEOUT_SECONDS,
    ) -> None:
        if not IReactorFDSet.providedBy(reactor) or not IReactorTime.providedBy(reactor):
            raise TypeError("reads in the reactor need a reactor that watches sockets")
        self._reactor = reactor
        self._engine = engine
        self._timeout = timeout
        self._connection: _PolledConnection | None = None
        self._queue: deque[tuple[str, defer.Deferred[tuple[Any, ...]]]] = deque()
        self._running = False
        self._closed = False

    @property
    def backend_pid(self) -> int | None:
        """The server process of the open connection, if one is open (tests)."""
        return self._connection.backend_pid if self._connection is not None else None

    def fetch_one(self, sql: str) -> defer.Deferred[tuple[Any, ...]]:
        """Run ``sql`` after the statements queued before it; its first row."""
        if self._closed:
            return defer.fail(ReactorReadsClosed())
        waiter: defer.Deferred[tuple[Any, ...]] = defer.Deferred()
        self._queue.append((sql, waiter))
        self._run_next()
        return waiter

    def close(self) -> None:
        """Fail what is queued and close the connection."""
        if self._closed:
            return
        self._closed = True
        queued, self._queue = self._queue, deque()
        for _, waiter in queued:
            waiter.errback(ReactorReadsClosed())
        self._drop()

    def _run_next(self) -> None:
        if self._running or not self._queue:
            return
        sql, waiter = self._queue.popleft()
        self._running = True

        def done(result: tuple[Any, ...] | Failure) -> None:
            self._running = False
            if isinstance(result, Failure):
                waiter.errback(result)
            else:
                waiter.callback(result)
            if not self._closed:
                self._run_next()

        defer.ensureDeferred(self._run(sql)).addBoth(done)

    async def _run(self, sql: str) -> tuple[Any, ...]:
        connection = self._connection
        if connection is not None:
            try:
                return await connection.fetch_one(sql)
            except ReactorReadTimedOut:
                self._drop()
                raise
            except Exception as e:
                self._drop()
                if not self._engine.is_connection_error(e):
                    raise
                logger.info("Reads in the reactor: the connection broke (%s): opening another", e)
        if self._closed:
            raise ReactorReadsClosed()
        connection = await self._connect()
        try:
            return await connection.fetch_one(sql)
        except Exception:
            self._drop()
            raise

    async def _connect(self) -> _PolledConnection:
        connection = _PolledConnection(
            self._reactor, self._engine.connect_nonblocking(), self._timeout
        )
        self._connection = connection
        try:
            await connection.until_done("opening the connection")
        except Exception:
            self._drop()
            raise
        if self._closed:
            self._drop()
            raise ReactorReadsClosed()
        return connection

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()


@implementer(IReadDescriptor, IWriteDescriptor)
class _PolledConnection:
    """A psycopg2 connection in asynchronous mode, polled when its socket is
    ready: one operation (the opening, a statement) at a time."""

    def __init__(self, reactor: Any, conn: Any, timeout: float) -> None:
        self._reactor = reactor
        self._conn = conn
        # The reactor watches a duplicate of the driver's socket: psycopg2
        # closes its own descriptor when the connection fails under poll(),
        # and a descriptor closed while still registered leaves the reactor
        # unable to forget it (or watching a new socket of the same number).
        # The duplicate stays open until close().
        self._fd: int = os.dup(conn.fileno())
        self._timeout = timeout
        self._waiter: defer.Deferred[None] | None = None
        self._timer: IDelayedCall | None = None
        self._watching_read = False
        self._watching_write = False
        self._closed = False

    @property
    def backend_pid(self) -> int:
        return int(self._conn.get_backend_pid())

    async def fetch_one(self, sql: str) -> tuple[Any, ...]:
        cursor = self._conn.cursor()
        try:
            # In asynchronous mode this sends the statement (as far as the
            # socket takes it) and returns; the answer comes through poll().
            cursor.execute(sql)
            await self.until_done("a statement")
            row = cursor.fetchone()
        finally:
            cursor.close()
        if row is None:
            raise ValueError(f"{sql!r} returned no row")
        return tuple(row)

    def until_done(self, what: str) -> defer.Deferred[None]:
        """Fires when the operation under way is done; fails with the
        driver's error, or :class:`ReactorReadTimedOut`."""
        assert self._waiter is None, "one operation at a time"
        waiter: defer.Deferred[None] = defer.Deferred()
        self._waiter = waiter
        self._timer = self._reactor.callLater(self._timeout, self._timed_out, what)
        self._poll()
        return waiter

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._watch(read=False, write=False)
        os.close(self._fd)
        try:
            self._conn.close()
        except Exception:
            pass
        self._finish(ReactorReadsClosed())

    # IReadDescriptor, IWriteDescriptor

    def fileno(self) -> int:
        return self._fd

    def logPrefix(self) -> str:
        return "reactor-reads"

    def doRead(self) -> None:
        self._poll()

    def doWrite(self) -> None:
        self._poll()

    def connectionLost(self, reason: Failure) -> None:
        # The reactor gave up on the descriptor and stopped watching it:
        # the socket failed (a refused connection, a reset) or an exception
        # escaped. The driver says best what went wrong.
        self._watching_read = self._watching_write = False
        error: BaseException = reason.value or ConnectionError("the connection failed")
        try:
            self._conn.poll()
        except Exception as e:
            error = e
        self._finish(error)

    def _poll(self) -> None:
        if self._waiter is None or self._closed:
            # Readable with nothing asked: the server closed the idle
            # connection (or sent a notice). Stop watching; the next
            # statement finds out.
            self._watch(read=False, write=False)
            return
        import psycopg2.extensions

        try:
            state = self._conn.poll()
        except Exception as e:
            self._watch(read=False, write=False)
            self._finish(e)
            return
        if state == psycopg2.extensions.POLL_OK:
            self._watch(read=False, write=False)
            self._finish(None)
        elif state == psycopg2.extensions.POLL_READ:
            self._watch(read=True, write=False)
        elif state == psycopg2.extensions.POLL_WRITE:
            self._watch(read=False, write=True)
        else:
            self._watch(read=False, write=False)
            self._finish(RuntimeError(f"unexpected poll state {state!r}"))

    def _watch(self, *, read: bool, write: bool) -> None:
        if read != self._watching_read:
            (self._reactor.addReader if read else self._reactor.removeReader)(self)
            self._watching_read = read
        if write != self._watching_write:
            (self._reactor.addWriter if write else self._reactor.removeWriter)(self)
            self._watching_write = write

    def _timed_out(self, what: str) -> None:
        self._timer = None
        self._finish(
            ReactorReadTimedOut(f"no answer to {what} within {self._timeout:g} s"), timer_fired=True
        )
        self.close()

    def _finish(self, error: BaseException | None, timer_fired: bool = False) -> None:
        waiter, self._waiter = self._waiter, None
        if self._timer is not None and not timer_fired:
            self._timer.cancel()
        self._timer = None
        if waiter is None:
            return
        if error is None:
            waiter.callback(None)
        else:
            waiter.errback(Failure(error))
