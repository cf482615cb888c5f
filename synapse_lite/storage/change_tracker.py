"""Which rooms (or users) changed after a token, answered from memory.

A /sync wakes for every event in any of its user's rooms; asking the database
"did anything change in these rooms since the token?" on every wake costs a
query each time. A :class:`StreamChangeTracker` remembers, for each entity,
the latest events-stream position (writer and id) at which this process saw it
change, from the moment it started: a token at or after that start can be
answered without the database. A :class:`PositionChangeTracker` does the same
for a stream whose /sync tokens carry one integer (receipts, account data,
to-device, push rules): ``store.stream_changes`` holds one per such stream.
A :class:`RecentRoomEvents` goes one step further on a room's events writer:
which events are new in a room, so a woken /sync reads none.

All are bounded: past their limits they forget everything and start again
from the current position (their horizon); below the horizon a tracker says
"may have changed" (:class:`RecentRoomEvents`: "not known"), and the caller
asks the database.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from synapse_lite.tokens import RoomStreamToken

if TYPE_CHECKING:
    from synapse_lite.storage.database import LoggingTransaction

#: Entities remembered before the tracker starts afresh.
MAX_ENTITIES = 100_000


class StreamChangeTracker:
    """The latest position at which each entity changed, as this process saw it.

    ``record`` must be called before the position it records becomes visible
    to readers (before the writer's position advances), so a reader never sees
    a position without the change that lies at it.
    """

    def __init__(self, current_token: Callable[[], RoomStreamToken]) -> None:
        self._current_token = current_token
        self._floor = current_token()
        self._latest: dict[str, tuple[str, int]] = {}

    def record(self, entity: str, instance_name: str, stream_id: int) -> None:
        if len(self._latest) >= MAX_ENTITIES and entity not in self._latest:
            # Forget everything. Changes recorded but not yet visible (the
            # rest of a batch, a writer's unfinished ids) may lie above the
            # current token: the new floor covers them.
            recorded = max(stream_id for _, stream_id in self._latest.values())
            newest = max(self._current_token().get_max_position(), recorded)
            self._latest.clear()
            self._floor = RoomStreamToken(newest)
        previous = self._latest.get(entity)
        if previous is None or previous[1] <= stream_id:
            self._latest[entity] = (instance_name, stream_id)

    def may_have_changed(self, entity: str, since: RoomStreamToken) -> bool:
        """False only when ``entity`` certainly has no change after ``since``."""
        if not self._floor.is_before_or_eq(since):
            return True
        latest = self._latest.get(entity)
        return latest is not None and not since.contains(*latest)

    def __len__(self) -> int:
        """How many entities are remembered (what :meth:`changed_after` walks)."""
        return len(self._latest)

    def changed_after(self, stream_id: int) -> set[str] | None:
        """The entities whose latest change lies after ``stream_id`` (on any
        writer): every entity changed after it is among them. None when the
        tracker started after ``stream_id`` (changes before its start are
        unknown). Walks every remembered entity: check :func:`len` first."""
        if self._floor.get_max_position() > stream_id:
            return None
        return {entity for entity, (_, changed) in self._latest.items() if changed > stream_id}

    def changed_among(self, since_of: Mapping[str, RoomStreamToken]) -> set[str]:
        """The entities of ``since_of`` that may have changed after their
        token: :meth:`may_have_changed` of each, for many at once (a
        sliding sync's room list: all the user's rooms on every request),
        the tracker's start compared once a distinct token."""
        covered: dict[int, bool] = {}
        latest_of = self._latest.get
        changed: set[str] = set()
        for entity, since in since_of.items():
            # The tokens are alive in ``since_of``: their ids are distinct.
            known = covered.get(id(since))
            if known is None:
                known = covered[id(since)] = self._floor.is_before_or_eq(since)
            if not known:
                changed.add(entity)
                continue
            latest = latest_of(entity)
            if latest is not None and not since.contains(*latest):
                changed.add(entity)
        return changed


class PositionChangeTracker:
    """The latest position at which each entity changed, for a stream whose
    tokens are one integer (its persisted-up-to position).

    Every change at a position above the horizon must be recorded before
    that position becomes visible to readers: the stream's writer records in
    the transaction's commit callbacks ahead of the id generator's finish
    (:meth:`record_after_commit`), followers as rows arrive, before the
    stream's position advances (``ReplicationReceiver.on_rows``). A change
    recorded that never commits only costs a database read."""

    def __init__(self, current_position: Callable[[], int]) -> None:
        """``current_position``: the stream's persisted-up-to position here."""
        self._current_position = current_position
        self._horizon = current_position()
        self._latest: dict[str, int] = {}

    @property
    def horizon(self) -> int:
        """Changes after this position are all known."""
        return self._horizon

    def record(self, entity: str, stream_id: int) -> None:
        if len(self._latest) >= MAX_ENTITIES and entity not in self._latest:
            # Forget everything. Ids recorded but not yet finished may lie
            # above the persisted-up-to position: the new horizon covers them.
            self._horizon = max(self._current_position(), *self._latest.values())
            self._latest.clear()
        if stream_id > self._latest.get(entity, stream_id - 1):
            self._latest[entity] = stream_id

    def record_after_commit(self, txn: LoggingTransaction, entity: str, stream_id: int) -> None:
        """Record ``entity`` changed at ``stream_id`` once ``txn`` commits,
        before the id generator's finish makes ``stream_id`` visible."""
        txn.call_first_after(self.record, entity, stream_id)

    def may_have_changed(self, entity: str, since: int) -> bool:
        """False only when ``entity`` certainly has no change after ``since``."""
        if since < self._horizon:
            return True
        return self._latest.get(entity, since) > since

    def changed_among(self, entities: Iterable[str], since: int) -> list[str]:
        """Those of ``entities`` that may have changed after ``since``, in
        their order."""
        if since < self._horizon:
            return list(entities)
        latest = self._latest.get
        return [e for e in entities if latest(e, since) > since]


#: Served events each room keeps (its newest), rooms kept, and events kept
#: in all, in :class:`RecentRoomEvents` (about 100 bytes an event: 5 MB at
#: most, some minutes of a busy server's events). A /sync timeline asks for
#: 10-30 events of a room, a woken one for the few since its token.
RECENT_EVENTS_PER_ROOM = 32
RECENT_EVENTS_ROOMS = 10_000
RECENT_EVENTS = 50_000


class _HeldRoom:
    __slots__ = ("events", "unheld_upto")

    def __init__(self) -> None:
        #: (stream id, writer, event id), by stream id.
        self.events: list[tuple[int, str, str]] = []
        #: The newest stream id of an event of the room that may be served
        #: and is not held (dropped for room, or not known to be served).
        self.unheld_upto = 0


class RecentRoomEvents:
    """The newest served events of each room, by position, as this process
    persisted them (the events writer of the room: every event of a room
    with one writer, its own in its event cache); another writer's rows make
    the room :meth:`unknown` up to their position. An incremental /sync on
    the room's writer then finds the room's new events, and the events,
    without the database.

    Like :class:`StreamChangeTracker`, an event must be recorded (or noted
    :meth:`unknown`) before its position becomes visible to readers.
    Complete after its horizon (where it started, or last forgot every room)
    and, in each room, after the newest position it dropped or could not say
    is served: :meth:`between` answers None below those, and the caller reads
    the database. Served means what the database's ``SERVED`` means (not an
    outlier, not rejected, not soft-failed), with a positive position."""

    def __init__(
        self,
        current_token: Callable[[], RoomStreamToken],
        per_room: int = RECENT_EVENTS_PER_ROOM,
        max_rooms: int = RECENT_EVENTS_ROOMS,
        max_events: int = RECENT_EVENTS,
    ) -> None:
        self._current_token = current_token
        self._horizon = current_token()
        self._per_room = per_room
        self._max_rooms = max_rooms
        self._max_events = max_events
        self._rooms: dict[str, _HeldRoom] = {}
        #: Events held in all rooms.
        self._held = 0
        #: The newest stream id recorded or noted: a new horizon covers it.
        self._newest = 0

    def record(self, room_id: str, instance_name: str, stream_id: int, event_id: str) -> None:
        """A served event of ``room_id`` at (``instance_name``, ``stream_id``)."""
        if self._held >= self._max_events:
            self.forget_all()
        held = self._room(room_id, stream_id)
        events = held.events
        if not events or events[-1][0] < stream_id:
            events.append((stream_id, instance_name, event_id))
        else:
            # Another writer's event overtaken by a newer one: in its place.
            bisect.insort(events, (stream_id, instance_name, event_id))
        self._held += 1
        if len(events) > self._per_room:
            dropped = events.pop(0)
            self._held -= 1
            held.unheld_upto = max(held.unheld_upto, dropped[0])

    def unknown(self, room_id: str, stream_id: int) -> None:
        """An event of ``room_id`` at or before ``stream_id`` that may be
        served but is not held (another writer's: its batch's rows carry the
        batch's last id): the room is not answered below it."""
        held = self._room(room_id, stream_id)
        held.unheld_upto = max(held.unheld_upto, stream_id)

    def _room(self, room_id: str, stream_id: int) -> _HeldRoom:
        held = self._rooms.get(room_id)
        if held is None:
            if len(self._rooms) >= self._max_rooms:
                # Ids recorded but not yet visible may lie above the current
                # token: the new horizon covers them.
                self.forget_all()
            held = self._rooms[room_id] = _HeldRoom()
        self._newest = max(self._newest, stream_id)
        return held

    def forget_all(self) -> None:
        """Hold nothing from here on: only later events are answered."""
        self._horizon = RoomStreamToken(max(self._current_token().get_max_position(), self._newest))
        self._rooms.clear()
        self._held = 0

    def between(
        self,
        room_ids: Iterable[str],
        since: RoomStreamToken,
        upper: RoomStreamToken,
        limit: int,
        newest_first: bool = True,
    ) -> list[str] | None:
        """The ids of the served events of ``room_ids`` after ``since`` and
        at or before ``upper``, at most ``limit`` (the newest, newest first;
        else the oldest, oldest first), as the database would answer; None
        when not all are known here (below the horizon, or ``upper`` past
        what this process has seen)."""
        if not self._horizon.is_before_or_eq(since):
            return None
        if not upper.is_before_or_eq(self._current_token()):
            return None
        base = since.stream
        found: list[tuple[int, str]] = []
        for room_id in room_ids:
            held = self._rooms.get(room_id)
            if held is None:
                continue
            if held.unheld_upto > base:
                return None
            for stream_id, instance_name, event_id in reversed(held.events):
                if stream_id <= base:
                    # At or before every writer's position in ``since``.
                    break
                if upper.contains(instance_name, stream_id) and not since.contains(
                    instance_name, stream_id
                ):
                    found.append((stream_id, event_id))
        found.sort(reverse=newest_first)
        return [event_id for _, event_id in found[:limit]]

    def newest(self, room_id: str, upper: RoomStreamToken, limit: int) -> list[str] | None:
        """The ids of the newest ``limit`` served events of ``room_id`` at or
        before ``upper``, newest first, with no lower bound (a room's whole
        timeline, cut to ``limit``), as the database would answer; None
        unless ``limit`` of them are held and the oldest of those is newer
        than every event not held (before the horizon, dropped or unknown)."""
        if limit <= 0 or not upper.is_before_or_eq(self._current_token()):
            return None
        held = self._rooms.get(room_id)
        if held is None:
            return None
        found: list[tuple[int, str]] = []
        for stream_id, instance_name, event_id in reversed(held.events):
            if upper.contains(instance_name, stream_id):
                found.append((stream_id, event_id))
                if len(found) == limit:
                    break
        if len(found) < limit:
            return None
        unheld = max(self._horizon.get_max_position(), held.unheld_upto)
        if found[-1][0] <= unheld:
            return None
        return [event_id for _, event_id in found]
