"""Which events of a room a user may see.

A user sees an event when they were joined at it, when it is their own
membership event, or (``shared`` history, the default of every preset) when
they joined the room at some point after it; ``invited`` history also shows
events while invited, ``world_readable`` shows everything. So nobody reads a
room they were never in, and nobody sees what happened after they left.

The history visibility used is the room's current one (not the one in force
at each event): a documented simplification.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import TYPE_CHECKING

import attr

from synapse_lite.api.errors import AuthError
from synapse_lite.events import Event
from synapse_lite.tokens import RoomStreamToken

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main import GenericWorkerStore


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RoomVisibility:
    """One user's view of one room."""

    user_id: str
    history_visibility: str
    #: ``(stream_ordering, membership)`` of each of the user's membership events.
    history: tuple[tuple[int, str], ...]

    @property
    def ever_member(self) -> bool:
        return bool(self.history)

    @property
    def last_left_position(self) -> int | None:
        """Where the user's view of the room ends (None while joined or invited)."""
        if not self.history or self.history[-1][1] in ("join", "invite"):
            return None
        return self.history[-1][0]

    def upper_bound(self, token: RoomStreamToken) -> RoomStreamToken:
        """``token``, capped at the user's leave if they are no longer in the room."""
        left = self.last_left_position
        if left is None or token.get_max_position() <= left:
            return token
        return RoomStreamToken(left)

    def membership_at(self, position: int) -> str | None:
        index = bisect.bisect_right(self.history, (position, "\uffff")) - 1
        return self.history[index][1] if index >= 0 else None

    def can_see(self, event: Event) -> bool:
        if self.history_visibility == "world_readable":
            return True
        if event.type == "m.room.member" and event.state_key == self.user_id:
            return True
        at = self.membership_at(event.stream_ordering)
        if at == "join":
            return True
        if self.history_visibility == "invited" and at == "invite":
            return True
        if self.history_visibility == "shared":
            return any(m == "join" and pos >= event.stream_ordering for pos, m in self.history)
        return False

    def visible_ranges(self) -> list[tuple[int | None, int | None]]:
        """Where :meth:`can_see` shows the room's events, as half-open ranges
        of stream orderings ``[start, end)`` (None: unbounded), sorted and
        disjoint: the same rule for a query over many events at once (full
        text search). The user's own membership events, which they always
        see, are left out (nothing searched is one).

        Derived from :meth:`can_see` itself, so the two cannot drift apart:
        its answer for an ordinary event can only change at the positions
        where something it reads changes (the user's membership events) or
        just after them, so asking it once per stretch between those
        positions gives every range."""
        cuts = sorted({p + offset for p, _ in self.history for offset in (0, 1)})
        if not cuts:
            return [(None, None)] if self.can_see(_probe(self.user_id, 0)) else []
        stretches: list[tuple[int | None, int | None]] = [(None, cuts[0])]
        stretches += [(cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1)]
        stretches.append((cuts[-1], None))
        ranges = []
        for start, end in stretches:
            probe = start if start is not None else cuts[0] - 1
            if self.can_see(_probe(self.user_id, probe)):
                ranges.append((start, end))
        return _merged(ranges)

    def filter(self, events: Iterable[Event]) -> list[Event]:
        return [e for e in events if self.can_see(e)]

    def check_can_read(self) -> None:
        """403 unless the user was ever in the room (or it is world readable)."""
        if not self.ever_member and self.history_visibility != "world_readable":
            raise AuthError(403, "You are not in this room")


def _probe(user_id: str, position: int) -> Event:
    """An ordinary event (not the user's membership) at ``position``."""
    return Event(
        event_id="$probe",
        room_id="",
        type="m.room.message",
        state_key=None,
        sender=user_id,
        content={},
        origin_server_ts=0,
        stream_ordering=position,
        depth=0,
        instance_name="",
    )


def _merged(ranges: list[tuple[int | None, int | None]]) -> list[tuple[int | None, int | None]]:
    """Touching ranges (given sorted and disjoint) joined."""
    merged: list[tuple[int | None, int | None]] = []
    for start, end in ranges:
        if merged and merged[-1][1] is not None and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


async def get_history_visibility(store: GenericWorkerStore, room_id: str) -> str:
    state_ids = await store.get_current_state_ids(room_id)
    event_id = state_ids.get(("m.room.history_visibility", ""))
    if event_id is None:
        return "shared"
    event = await store.get_event(event_id)
    value = event.content.get("history_visibility") if event else None
    return value if isinstance(value, str) else "shared"


async def load_room_visibility(
    store: GenericWorkerStore, user_id: str, room_id: str
) -> RoomVisibility:
    history = await store.get_membership_history(user_id, room_id)
    return RoomVisibility(user_id, await get_history_visibility(store, room_id), tuple(history))
