"""Typing notifications: a stream kept in the typing writer's memory.

The writer owns the data and the stream's token: its counter (the stream's
:class:`~synapse_lite.replication.streams.MemoryPositions`, which it is built
with) goes up by one per change, so the stream's position is always a token
it handed out. Other processes follow the writer's rows, moving their copy's
counter as the rows arrive.

A restart of the writer forgets everything, so a position must say which run
of the writer it belongs to: each start takes the next run number from the
database (``stream_runs``) and counts from ``run * RUN_SPAN``, so
:func:`typing_run` of any position names its run. Each run begins above every
position of the runs before it, so positions only grow: a follower told of a
higher run resets; one told of a lower position (of its run or an older one)
refuses it as a false claim (``went_backwards``; a restart never goes back).
A /sync token of another run (or of no run: tokens handed out before runs
existed hold small serials, run 0) is answered with the whole current state,
every room the client is in included, so typing the restart forgot is cleared
too.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import AuthError, Codes, SynapseError
from synapse_lite.replication.http.calls import EmptyBody
from synapse_lite.replication.http.writes import SET_TYPING, TypingChange
from synapse_lite.replication.streams import MemoryPositions
from synapse_lite.streams.catalog import TypingStreamRow
from synapse_lite.streams.definition import Updates
from synapse_lite.tokens import MAX_TOKEN_POSITION

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.notifier import Notifier
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.replication.notifier import ReplicationNotifier
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: Longest a client may ask to be shown typing without renewing.
MAX_TYPING_TIMEOUT_MS = 120_000
DEFAULT_TYPING_TIMEOUT_MS = 30_000

#: Positions each run of the typing writer may use: ``[run * RUN_SPAN,
#: (run + 1) * RUN_SPAN)``. A million runs fit in a token's 18 digits
#: (:data:`~synapse_lite.tokens.MAX_TOKEN_POSITION`), and a run may make a
#: trillion changes (a thousand a second for 31 years).
RUN_SPAN = 10**12


def typing_run(position: int) -> int:
    """The run of the typing writer a typing position belongs to."""
    return position // RUN_SPAN


def starts_typing_run(position: int) -> bool:
    """Whether a run of the typing writer begins at ``position``."""
    return position % RUN_SPAN == 0


class TypingHandlerBase:
    """Who is typing where, as of which serial (``positions.current``, the
    typing stream's position, moved here alone)."""

    def __init__(self, positions: MemoryPositions) -> None:
        self._positions = positions
        self._room_serials: dict[str, int] = {}
        self._room_typing: dict[str, set[str]] = {}

    def get_current_token(self) -> int:
        return self._positions.current

    def rooms_seen(self) -> list[str]:
        """Every room whose typing changed since this process started
        following (what :meth:`get_typing_for_rooms` can say anything of)."""
        return list(self._room_serials)

    def get_typing_for_rooms(
        self, room_ids: list[str], since_token: int | None
    ) -> tuple[dict[str, list[str]], int]:
        """Typing users of rooms that changed after ``since_token``, and the
        token to resume from. When it is None: every room anyone typed in.
        When it is of another run of the writer than ours (or ahead of us):
        every room in ``room_ids``, those nobody types in now as empty lists,
        since the client may still show typing the writer's restart forgot."""
        current = self._positions.current
        if since_token is None:
            return {
                room_id: sorted(self._room_typing.get(room_id, ()))
                for room_id in room_ids
                if room_id in self._room_serials
            }, current
        if since_token > current or typing_run(since_token) != typing_run(current):
            return {
                room_id: sorted(self._room_typing.get(room_id, ())) for room_id in room_ids
            }, current
        result = {}
        for room_id in room_ids:
            serial = self._room_serials.get(room_id)
            if serial is not None and serial > since_token:
                result[room_id] = sorted(self._room_typing.get(room_id, ()))
        return result, current

    async def set_typing(
        self, requester: str, target_user: str, room_id: str, typing: bool, timeout_ms: int | None
    ) -> None:
        """Ask the typing writer to record a change (here, when this is it)."""
        raise NotImplementedError

    def _reset(self) -> None:
        self._room_serials.clear()
        self._room_typing.clear()


class TypingWriterHandler(TypingHandlerBase):
    """The process that writes the typing stream (serves :data:`SET_TYPING`),
    counting in ``positions``, made by :meth:`positions` for this start's
    run (see the module docstring)."""

    @staticmethod
    def positions(run: int) -> MemoryPositions:
        """The typing stream's position on the writer: from the start of
        ``run`` (this start's run number)."""
        if not 0 < run < MAX_TOKEN_POSITION // RUN_SPAN:
            raise ValueError(f"typing writer run {run} does not fit in a token")
        return MemoryPositions(run * RUN_SPAN, starts_typing_run, lower_position_is_false=True)

    def __init__(
        self,
        *,
        positions: MemoryPositions,
        store: GenericWorkerStore,
        clock: Clock,
        notifier: Notifier,
        replication_notifier: ReplicationNotifier,
    ) -> None:
        super().__init__(positions)
        self._run_end = (typing_run(positions.current) + 1) * RUN_SPAN - 1
        self._store = store
        self._clock = clock
        self._notifier = notifier
        self._replication_notifier = replication_notifier
        self._expiry: dict[tuple[str, str], int] = {}
        self._expiry_loop: Any = None

    def start(self) -> None:
        self._expiry_loop = self._clock.looping_call(self._expire, 1.0)

    def stop(self) -> None:
        if self._expiry_loop is not None and self._expiry_loop.running:
            self._expiry_loop.stop()

    async def set_typing(
        self, requester: str, target_user: str, room_id: str, typing: bool, timeout_ms: int | None
    ) -> None:
        # The writer applies its own changes (what SET_TYPING does here).
        await self.apply_typing(TypingChange(requester, target_user, room_id, typing, timeout_ms))

    async def apply_typing(self, change: TypingChange) -> EmptyBody:
        """Mark a user typing (for ``timeout_ms``) or not, in a room they are in."""
        if change.requester != change.user_id:
            raise AuthError(403, "Cannot set another user's typing state")
        room_id, user_id = change.room_id, change.user_id
        if user_id not in await self._store.get_users_in_room(room_id):
            raise AuthError(403, "You are not in this room", Codes.FORBIDDEN)
        key = (room_id, user_id)
        if change.typing:
            timeout = DEFAULT_TYPING_TIMEOUT_MS if change.timeout_ms is None else change.timeout_ms
            timeout = max(0, min(timeout, MAX_TYPING_TIMEOUT_MS))
            self._expiry[key] = self._clock.time_msec() + timeout
            if user_id in self._room_typing.get(room_id, ()):
                return EmptyBody()  # still typing: only the timeout moved
            self._room_typing.setdefault(room_id, set()).add(user_id)
        else:
            self._expiry.pop(key, None)
            if user_id not in self._room_typing.get(room_id, ()):
                return EmptyBody()
            self._room_typing[room_id].discard(user_id)
        self._changed(room_id)
        return EmptyBody()

    def _expire(self) -> None:
        now = self._clock.time_msec()
        for key, until in list(self._expiry.items()):
            if until <= now:
                room_id, user_id = key
                del self._expiry[key]
                if user_id in self._room_typing.get(room_id, ()):
                    self._room_typing[room_id].discard(user_id)
                    self._changed(room_id)

    def _changed(self, room_id: str) -> None:
        positions = self._positions
        if positions.current >= self._run_end:
            # A trillion changes in one run: restarting the writer starts a new run.
            raise RuntimeError("the typing writer's run is full; restart it")
        positions.current += 1
        self._room_serials[room_id] = positions.current
        self._notifier.notify(rooms=[room_id])
        self._replication_notifier.notify_replication()

    async def get_all_typing_updates(
        self, instance_name: str, last_id: int, current_id: int, limit: int
    ) -> tuple[Updates, int, bool]:
        """The typing stream's update function. A ``last_id`` of another run
        (or ahead of us) means the asker saw a previous run: it gets every
        room's current state."""
        current = self._positions.current
        if last_id > current or typing_run(last_id) != typing_run(current):
            last_id = 0
        changed = sorted(
            (serial, room_id)
            for room_id, serial in self._room_serials.items()
            if last_id < serial <= current_id
        )
        limited = len(changed) > limit
        if limited:
            changed = changed[:limit]
        updates: Updates = [
            (serial, TypingStreamRow(room_id, sorted(self._room_typing.get(room_id, ()))))
            for serial, room_id in changed
        ]
        upto = changed[-1][0] if limited else current_id
        return updates, upto, limited


class TypingFollowerHandler(TypingHandlerBase):
    """Any other process: mirrors the writer's rows and forwards changes to it."""

    @staticmethod
    def positions() -> MemoryPositions:
        """A follower's copy of the writer's position (0 until rows arrive)."""
        return MemoryPositions(0, starts_typing_run, lower_position_is_false=True)

    def __init__(self, positions: MemoryPositions, calls: InternalCalls) -> None:
        super().__init__(positions)
        self._calls = calls

    def on_rows(self, writer: str, token: int, rows: Sequence[TypingStreamRow]) -> None:
        """Take the writer's rows (or bare position) before the stream advances.

        Positions only grow (each run starts above the last): a higher run
        is the writer's restart, and resets what we keep; a lower position,
        of this run or an older one, is a false claim (the command handler
        refuses those before they get here) and moves nothing."""
        latest = self._positions.current
        if token < latest:
            logger.warning(
                "Ignoring typing position %d of %s: below ours, %d (runs only grow)",
                token,
                writer,
                latest,
            )
            return
        if typing_run(token) != typing_run(latest):
            logger.info(
                "The typing writer restarted (position %d, run %d; ours %d, run %d): resetting",
                token,
                typing_run(token),
                latest,
                typing_run(latest),
            )
            self._reset()
        for row in rows:
            self._room_typing[row.room_id] = set(row.user_ids)
            self._room_serials[row.room_id] = token
        self._positions.current = token

    async def set_typing(
        self, requester: str, target_user: str, room_id: str, typing: bool, timeout_ms: int | None
    ) -> None:
        await self._calls.call(
            SET_TYPING, TypingChange(requester, target_user, room_id, typing, timeout_ms)
        )


def check_typing_request(body: dict[str, Any]) -> tuple[bool, int | None]:
    """Validate a typing request body: ``(typing, timeout_ms)``."""
    typing = body.get("typing")
    if not isinstance(typing, bool):
        raise SynapseError(400, "'typing' must be true or false", Codes.BAD_JSON)
    timeout = body.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0
    ):
        raise SynapseError(400, "'timeout' must be a non-negative integer", Codes.BAD_JSON)
    return typing, timeout
