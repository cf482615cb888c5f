"""Which events of a room a user may see: the spec's history visibility,
applied to each event with the setting in force at that event.

For one event, with the room's ``m.room.history_visibility`` as it stood
just before the event (``shared`` when never set, or set to a value not
understood) and the user's membership at it (client-server API, "History
visibility", server behaviour):

1. ``world_readable``: anyone sees it, member or not;
2. a user joined at the event sees it;
3. ``shared``: a user who joined the room at any point after it sees it;
4. ``invited``: a user invited at the event sees it;
5. otherwise it is hidden.

An ``m.room.history_visibility`` event itself is seen when the setting
before it or the one it sets allows it. A user always sees their own
membership events (the spec's "before or after" rule for them, widened to
invites: an invite is addressed to its target whatever the history
setting). So nobody reads a room they were never in unless it is
``world_readable`` now, and nobody sees what happened after they left: reads
stop at the leave (:meth:`RoomVisibility.upper_bound`).

Where each setting was in force: a room's events are persisted in stream
order by its one writer, so the setting at an event is the last
``m.room.history_visibility`` event before it in stream order. The store
reads those few events through a partial index and caches them per room
until the room's state changes (``get_history_visibility_settings``); the
user's membership history is one indexed query. Every read of room events
(/sync, /messages, /context, /event, relations, the deprecated /events and
initial syncs) goes through here.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Protocol

import attr

from synapse_lite.api.errors import AuthError
from synapse_lite.events import Event
from synapse_lite.tokens import RoomStreamToken

#: The values the spec defines; anything else reads as the default.
HISTORY_VISIBILITIES = ("world_readable", "shared", "invited", "joined")
DEFAULT_HISTORY_VISIBILITY = "shared"
#: Settings under which a user joined now sees everything.
_OPEN_TO_MEMBERS = ("world_readable", "shared")


def understood(value: str | None) -> str:
    """A stored setting as the rules read it."""
    if value is not None and value in HISTORY_VISIBILITIES:
        return value
    return DEFAULT_HISTORY_VISIBILITY


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RoomVisibility:
    """One user's view of one room."""

    user_id: str
    #: ``(stream_ordering, history_visibility)`` of each of the room's
    #: ``m.room.history_visibility`` events, oldest first.
    settings: tuple[tuple[int, str | None], ...]
    #: ``(stream_ordering, membership)`` of each of the user's membership events.
    history: tuple[tuple[int, str], ...]

    @classmethod
    def everything(cls, user_id: str) -> RoomVisibility:
        """A view that sees every event of a room: a server admin's
        (``/_synapse/admin/v1/rooms/{roomId}/messages`` and ``/context``),
        as a member since the start of a room always world-readable."""
        return cls(user_id, ((0, "world_readable"),), ((0, "join"),))

    @property
    def history_visibility(self) -> str:
        """The room's setting now."""
        return understood(self.settings[-1][1]) if self.settings else DEFAULT_HISTORY_VISIBILITY

    @property
    def ever_member(self) -> bool:
        return bool(self.history)

    @property
    def may_read(self) -> bool:
        """Whether the user may read anything of the room: they were in it
        once (joined or invited), or anyone may (``world_readable`` now)."""
        return self.ever_member or self.history_visibility == "world_readable"

    @property
    def is_peeking(self) -> bool:
        """Reading a room they were never in (a ``world_readable`` one)."""
        return not self.ever_member

    @property
    def last_left_position(self) -> int | None:
        """Where the user's view of the room ends (None while joined or
        invited, or for someone never in it)."""
        if not self.history or self.history[-1][1] in ("join", "invite"):
            return None
        return self.history[-1][0]

    def upper_bound(self, token: RoomStreamToken) -> RoomStreamToken:
        """``token``, capped at the user's leave if they are no longer in the room."""
        left = self.last_left_position
        if left is None or token.get_max_position() <= left:
            return token
        return RoomStreamToken(left)

    def setting_before(self, position: int) -> str:
        """The setting in force for an event at ``position``."""
        index = bisect.bisect_left(self.settings, (position,)) - 1
        return understood(self.settings[index][1]) if index >= 0 else DEFAULT_HISTORY_VISIBILITY

    def membership_at(self, position: int) -> str | None:
        """The user's membership as of ``position`` (their own membership
        event at it included)."""
        index = bisect.bisect_right(self.history, (position, "\uffff")) - 1
        return self.history[index][1] if index >= 0 else None

    def _allowed(self, setting: str, position: int) -> bool:
        if setting == "world_readable":
            return True
        membership = self.membership_at(position)
        if membership == "join":
            return True
        if setting == "shared":
            return any(m == "join" and pos > position for pos, m in self.history)
        return setting == "invited" and membership == "invite"

    def can_see(self, event: Event) -> bool:
        if event.type == "m.room.member" and event.state_key == self.user_id:
            return True
        position = event.stream_ordering
        if self._allowed(self.setting_before(position), position):
            return True
        if event.type == "m.room.history_visibility" and event.state_key == "":
            value = event.content.get("history_visibility")
            return self._allowed(understood(value if isinstance(value, str) else None), position)
        return False

    def visible_ranges(self) -> list[tuple[int | None, int | None]]:
        """Where :meth:`can_see` shows the room's events, as half-open ranges
        of stream orderings ``[start, end)`` (None: unbounded), sorted and
        disjoint: the same rule for a query over many events at once (full
        text search). The user's own membership events, which they always
        see, are left out (nothing searched is one).

        Derived from :meth:`can_see` itself, so the two cannot drift apart:
        its answer for an ordinary event can only change at the positions
        where something it reads changes (the user's membership events and
        the room's history visibility settings) or just after them, so
        asking it once per stretch between those positions gives every
        range."""
        changes = [p for p, _ in self.history] + [p for p, _ in self.settings]
        cuts = sorted({p + offset for p in changes for offset in (0, 1)})
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
        """403 unless the user may read something of the room (:attr:`may_read`)."""
        if not self.may_read:
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


class VisibilityStore(Protocol):
    """The store reads the visibility rules make."""

    async def get_membership_history(self, user_id: str, room_id: str) -> list[tuple[int, str]]: ...

    async def get_history_visibility_settings(
        self, room_id: str
    ) -> tuple[tuple[int, str | None], ...]: ...

    async def get_rooms_for_user(self, user_id: str) -> frozenset[str]: ...


async def load_room_visibility(
    store: VisibilityStore, user_id: str, room_id: str
) -> RoomVisibility:
    history = await store.get_membership_history(user_id, room_id)
    settings = await store.get_history_visibility_settings(room_id)
    return RoomVisibility(user_id, settings, tuple(history))


async def member_sees_everything(store: VisibilityStore, user_id: str, room_id: str) -> bool:
    """Whether ``user_id``, if joined to the room now, sees every event of it
    up to now: its history was never ``invited`` or ``joined``, so each event
    is ``world_readable`` or ``shared`` with someone who joined after it.
    Cheap (two cached reads): the common case of /sync skips the per-event
    rules with it."""
    settings = await store.get_history_visibility_settings(room_id)
    if not all(understood(value) in _OPEN_TO_MEMBERS for _, value in settings):
        return False
    return room_id in await store.get_rooms_for_user(user_id)
