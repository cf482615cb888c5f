"""Revoked access tokens stop working on every process before the revoking
request answers.

Each process keeps a token's owner in its ``get_user_by_access_token`` cache
and forgets it when the caches stream brings the invalidation. A revocation
(logout, ``/logout/all``, device deletion, password change with logout,
deactivation: all delete devices on the user's device_lists writer) is
therefore made to wait: after its transaction commits at this process's
caches position P, the writer asks every other configured process, over
internal HTTP, to answer once it has applied this process's caches rows up
to P (:data:`CACHES_APPLIED`), and the revocation answers once all have.

The wait is bounded. A process that does not confirm in time (down,
unreachable, or its replication behind by more than the bound) is named in a
warning and counted; the revocation answers anyway, and that process stops
accepting the tokens when the invalidation reaches it. See
docs/reliability.md, "Revocation".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import attr
from twisted.internet import defer

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.clock import Clock
from synapse_lite.codec.kinds import Int, Str, wire
from synapse_lite.metrics import REVOCATIONS_UNCONFIRMED
from synapse_lite.replication.http.calls import EmptyBody, InternalCall, InternalCalls
from synapse_lite.replication.streams import StreamPositions
from synapse_lite.replication.tcp.receiver import PositionWaiters

logger = logging.getLogger(__name__)

#: How long a process waits for the caches rows a revocation names before
#: telling the revoking writer it could not confirm.
APPLY_WAIT_SECONDS = 2.0
#: How long a revocation waits for every process's confirmation in all
#: (includes reaching them: a refused connection is retried twice).
CONFIRM_WAIT_SECONDS = 3.0


@attr.s(slots=True, frozen=True, auto_attribs=True)
class CachesPosition:
    """``writer``'s caches rows up to ``position``."""

    writer: str = attr.ib(metadata=wire(Str(max_length=255)))
    position: int = attr.ib(metadata=wire(Int()))


#: Served by every process; the caller names it. Answers once the serving
#: process has applied the named caches rows (504 after APPLY_WAIT_SECONDS).
CACHES_APPLIED = InternalCall("caches_applied", CachesPosition, EmptyBody, idempotent=True)


class RevocationBarrier:
    """Waits until every other process has applied this process's caches
    rows written so far (the revoking side), and answers such waits (every
    process)."""

    def __init__(
        self,
        *,
        me: str,
        clock: Clock,
        calls: InternalCalls,
        waiters: PositionWaiters,
        caches: StreamPositions,
        processes: Callable[[], Sequence[str]],
    ) -> None:
        """``processes``: every process that may validate access tokens."""
        self._me = me
        self._clock = clock
        self._calls = calls
        self._waiters = waiters
        self._caches = caches
        self._processes = processes

    async def applied_everywhere(self) -> list[str]:
        """Return once every other process has applied this process's caches
        rows written so far, or after :data:`CONFIRM_WAIT_SECONDS`; returns
        the processes that did not confirm (logged and counted)."""
        request = CachesPosition(self._me, self._caches.newest_local_write())
        others = [name for name in self._processes() if name != self._me]
        confirmed: set[str] = set()

        async def confirm(name: str) -> None:
            try:
                await self._calls.call(CACHES_APPLIED, request, instance=name)
            except SynapseError as e:
                logger.warning("%s did not confirm caches %d: %s", name, request.position, e.msg)
            else:
                confirmed.add(name)

        waits = defer.DeferredList(
            [defer.ensureDeferred(confirm(name)) for name in others], consumeErrors=True
        )
        try:
            await self._clock.timeout(waits, CONFIRM_WAIT_SECONDS)
        except defer.TimeoutError:
            pass
        missing = [name for name in others if name not in confirmed]
        for name in missing:
            REVOCATIONS_UNCONFIRMED.labels(name).inc()
        if missing:
            logger.warning(
                "Revocation answered before %s confirmed it (caches of %s at %d): they accept"
                " the revoked tokens until the invalidation reaches them",
                ", ".join(missing),
                self._me,
                request.position,
            )
        return missing

    async def apply_here(self, request: CachesPosition) -> EmptyBody:
        """Serves :data:`CACHES_APPLIED`."""
        try:
            await self._waiters.wait_for_stream_position(
                request.writer, "caches", request.position, APPLY_WAIT_SECONDS
            )
        except defer.TimeoutError:
            raise SynapseError(
                504,
                f"caches of {request.writer} not applied up to {request.position} here",
                Codes.UNKNOWN,
            ) from None
        return EmptyBody()
