"""Push rules (one document per user, on the push_rules stream) and the push
actions written with events, read for unread counts and /notifications."""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.push.rules import UserPushRules
from synapse_lite.storage._base import SQLBaseStore, db_to_json, json_encoder, page_of_updates
from synapse_lite.storage.caches import LruCache, cached
from synapse_lite.storage.change_tracker import PositionChangeTracker, StreamChangeTracker
from synapse_lite.storage.database import (
    DatabasePool,
    LoggingDatabaseConnection,
    LoggingTransaction,
)
from synapse_lite.streams.catalog import PushRulesStreamRow
from synapse_lite.tokens import RoomStreamToken

if TYPE_CHECKING:
    from synapse_lite.storage._base import StoreContext

#: A user's notifications: (event_id, room_id, stream_ordering, actions, highlight, ts).
NotificationRow = tuple[str, str, int, list[Any], bool, int]

#: Rooms per statement (at most four parameters each: within SQLite's limit).
_UNREAD_ROOMS_PER_STATEMENT = 500


@attr.s(slots=True, frozen=True, auto_attribs=True)
class UnreadBasis:
    """What a user's unread count in a room counts from: the events after
    ``max(joined_at, read_at)`` (only those after ``read_at`` for the user's
    own outcomes). ``joined_at``: the stream ordering of their current join,
    None when not joined; ``read_at``: of their newest m.read (or private)
    receipt's event, 0 when none."""

    joined_at: int | None
    read_at: int
    #: The events token (memberships) and the receipts stream position it
    #: was read at: it still holds while the change trackers have no
    #: membership of the user and no receipt in the room after them. None:
    #: read it again every time (the user has a receipt of an event this
    #: server does not have, whose arrival would move it with no new receipt).
    read_at_positions: tuple[RoomStreamToken, int] | None


@attr.s(slots=True, frozen=True, auto_attribs=True)
class CountedUnread:
    """A user's unread counts in one room, counted from ``basis`` up to
    stream ordering ``upto``."""

    basis: UnreadBasis
    upto: int
    notifications: int
    highlights: int


class UnreadCountMemo:
    """The unread counts already made, per (user, room), so that the next
    count of a room reads only the events after them (a woken /sync counts
    one new event, not the room's history since the user's last receipt),
    and none when the room has no new event and the basis still holds.

    Per process, bounded (the least recently used are forgotten: their next
    count starts again from the basis). Needs no invalidation: a count is
    only carried over when its basis holds (re-read, or unchanged by the
    change trackers' word), and rows at or below a count's ``upto`` never
    change (events, their push actions, rejected and soft-failed flags are
    written once, with the event, and every writer has committed up to it;
    purges prune content, not these)."""

    #: About 300 bytes each: 7.5 MB when full.
    MAX_ENTRIES = 25_000

    def __init__(self) -> None:
        self._counted: LruCache[CountedUnread] = LruCache(self.MAX_ENTRIES)

    def get(self, user_id: str, room_id: str) -> CountedUnread | None:
        return self._counted.get((user_id, room_id))[1]

    def keep(self, user_id: str, room_id: str, counted: CountedUnread) -> None:
        self._counted.set((user_id, room_id), counted)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PushOutcome:
    """What one persisted event counts in unread counts: the columns
    ``_count_unread_txn`` reads, for an event that notifies anyone.
    ``default_highlight``: whether its default outcome highlights (None: by
    default it notifies nobody); ``own``: user -> (notifies, highlights),
    their ``event_push_actions`` rows."""

    stream_ordering: int
    sender: str
    default_highlight: bool | None
    own: Mapping[str, tuple[bool, bool]]

    def counts_for(self, user_id: str, after_default: int, after_own: int) -> tuple[int, int]:
        """(notifications, highlights) it adds to ``user_id``'s count, with
        the floors of ``_count_unread_txn`` (the same rule, over one event)."""
        own = self.own.get(user_id)
        if own is not None:
            notifies, highlights = own
            if notifies and self.stream_ordering > after_own:
                return 1, int(highlights)
            return 0, 0
        if (
            self.default_highlight is not None
            and self.stream_ordering > after_default
            and self.sender != user_id
        ):
            return 1, int(self.default_highlight)
        return 0, 0


def _stream_ordering(outcome: PushOutcome) -> int:
    return outcome.stream_ordering


class RecentPushOutcomes:
    """The sole events writer's memory of what its newest events count in
    unread counts, per room, so that a woken /sync counts one new event
    without a read (``get_unread_counts``).

    Kept only by a process that writes the events stream alone (the
    monolith): every event with a stream ordering is then persisted here, so
    a room's outcomes above its floor, up to the persisted-up-to position,
    are all of them. Recorded after the commit, before the event's position
    becomes persisted (``EventsStore._persist_events_txn``). Events that
    notify nobody take no room; a room keeps its newest ``PER_ROOM``
    outcomes (dropping one raises the room's floor to it), and the
    ``ROOMS`` rooms written most recently (dropping a room raises the floor
    of every room not kept to its newest outcome)."""

    ROOMS = 4096
    PER_ROOM = 32

    def __init__(self, floor: int) -> None:
        #: Rooms not kept have no outcome above it that is not here.
        self._floor = floor
        #: room -> (its floor, its outcomes in stream order), least recently
        #: written first.
        self._rooms: OrderedDict[str, tuple[int, list[PushOutcome]]] = OrderedDict()

    def persisted(self, room_id: str, outcome: PushOutcome) -> None:
        kept = self._rooms.pop(room_id, None)
        floor, outcomes = kept if kept is not None else (self._floor, [])
        bisect.insort(outcomes, outcome, key=_stream_ordering)
        while len(outcomes) > self.PER_ROOM:
            floor = max(floor, outcomes.pop(0).stream_ordering)
        self._rooms[room_id] = (floor, outcomes)
        if len(self._rooms) > self.ROOMS:
            _, (_, dropped) = self._rooms.popitem(last=False)
            if dropped:
                self._floor = max(self._floor, dropped[-1].stream_ordering)

    def outcomes_in(self, room_id: str, after: int, upto: int) -> list[PushOutcome] | None:
        """The outcomes of the room's events in ``(after, upto]``, or None
        when some may not be here (``after`` is below the room's floor).
        ``upto`` must be at or below the persisted-up-to position."""
        kept = self._rooms.get(room_id)
        floor, outcomes = kept if kept is not None else (self._floor, [])
        if after < floor:
            return None
        first = bisect.bisect_right(outcomes, after, key=_stream_ordering)
        end = bisect.bisect_right(outcomes, upto, lo=first, key=_stream_ordering)
        return outcomes[first:end]


def _read_unread_bases_txn(
    txn: LoggingTransaction,
    user_id: str,
    room_ids: list[str],
    positions: tuple[RoomStreamToken, int],
) -> dict[str, UnreadBasis]:
    """The basis of ``user_id``'s count in each of ``room_ids``, read after
    ``positions`` (the events token and receipts position of this process
    when the read started)."""
    placeholders = ", ".join("?" for _ in room_ids)
    txn.execute(
        "SELECT room_id, MAX(joined_at), MAX(read_at), MAX(unknown) FROM ("
        " SELECT room_id, event_stream_ordering AS joined_at, NULL AS read_at, 0 AS unknown"
        " FROM local_current_membership WHERE user_id = ? AND membership = 'join'"
        f" AND room_id IN ({placeholders})"
        " UNION ALL"
        " SELECT r.room_id, NULL, e.stream_ordering,"
        "  CASE WHEN e.event_id IS NULL THEN 1 ELSE 0 END FROM receipts_linearized AS r"
        " LEFT JOIN events AS e ON e.event_id = r.event_id"
        f" WHERE r.user_id = ? AND r.room_id IN ({placeholders})"
        " AND r.receipt_type IN ('m.read', 'm.read.private')"
        ") AS bases GROUP BY room_id",
        (user_id, *room_ids, user_id, *room_ids),
    )
    found = {r[0]: r[1:] for r in txn.fetchall()}
    bases: dict[str, UnreadBasis] = {}
    for room_id in room_ids:
        joined_at, read_at, unknown = found.get(room_id, (None, None, 0))
        bases[room_id] = UnreadBasis(
            None if joined_at is None else int(joined_at),
            0 if read_at is None else int(read_at),
            None if unknown else positions,
        )
    return bases


#: Whether an event ``s`` counts as a notification of the user (the
#: parameter), with their own outcome ``x`` when they have one (the whole
#: history's count is ``full_count`` in tests/storage/test_unread_counts.py).
_NOTIFIES = (
    "CASE WHEN x.user_id IS NOT NULL THEN"
    " CASE WHEN x.notif AND s.stream_ordering > f.after_own THEN 1 ELSE 0 END"
    " WHEN s.stream_ordering > f.after_default AND s.push_actions IS NOT NULL"
    " AND NOT s.rejected AND NOT s.soft_failed AND s.sender != ? THEN 1 ELSE 0 END"
)
#: ... and as a highlight.
_HIGHLIGHTS = (
    "CASE WHEN x.user_id IS NOT NULL THEN"
    " CASE WHEN x.notif AND x.highlight AND s.stream_ordering > f.after_own THEN 1 ELSE 0 END"
    " WHEN s.stream_ordering > f.after_default AND s.push_actions IS NOT NULL"
    " AND s.push_highlight AND NOT s.rejected AND NOT s.soft_failed AND s.sender != ?"
    " THEN 1 ELSE 0 END"
)


def _unread_floors(start: CountedUnread, upto: int) -> tuple[int, int]:
    """(after_default, after_own): what counts after ``start``, up to
    ``upto``, is an event's default outcome above the first and the user's
    own outcome above the second."""
    basis = start.basis
    after_own = max(basis.read_at, start.upto)
    # Not joined: no default outcome counts (nothing is after ``upto``).
    after_default = upto if basis.joined_at is None else max(basis.joined_at, after_own)
    return after_default, after_own


def _count_unread_txn(
    txn: LoggingTransaction,
    user_id: str,
    starts: dict[str, CountedUnread],
    upto: int,
    horizon: int,
) -> dict[str, tuple[int, int, int, int]]:
    """``user_id``'s unread notifications in each room of ``starts`` after
    its count's ``upto`` (and after its basis), up to ``upto``: room_id ->
    (notifications, highlights, those up to ``horizon``: notifications,
    highlights); rooms with none are left out."""
    floors: list[Any] = []
    for room_id, start in starts.items():
        after_default, after_own = _unread_floors(start, upto)
        floors.extend((room_id, min(after_default, after_own), after_default, after_own))
    values = ", ".join("(?, ?, ?, ?)" for _ in starts)
    txn.execute(
        f"WITH floors (room_id, after, after_default, after_own) AS (VALUES {values})"
        f" SELECT f.room_id, SUM({_NOTIFIES}), SUM({_HIGHLIGHTS}),"
        f" SUM(CASE WHEN s.stream_ordering <= ? THEN {_NOTIFIES} ELSE 0 END),"
        f" SUM(CASE WHEN s.stream_ordering <= ? THEN {_HIGHLIGHTS} ELSE 0 END)"
        " FROM floors AS f JOIN events AS s ON s.room_id = f.room_id"
        "  AND s.stream_ordering > f.after AND s.stream_ordering <= ?"
        " LEFT JOIN event_push_actions AS x ON x.event_id = s.event_id AND x.user_id = ?"
        " GROUP BY f.room_id",
        (*floors, user_id, user_id, horizon, user_id, horizon, user_id, upto, user_id),
    )
    return {r[0]: (int(r[1] or 0), int(r[2] or 0), int(r[3] or 0), int(r[4] or 0)) for r in txn}


class PushRulesWorkerStore(SQLBaseStore):
    """Push rules: reads anywhere (cached, forgotten when the stream says a
    user's rules changed), writes on the push_rules writer."""

    if TYPE_CHECKING:
        # Beside this store in the composed one (``GenericWorkerStore``).
        room_changes: StreamChangeTracker
        membership_changes: StreamChangeTracker
        receipt_changes: PositionChangeTracker

        def get_room_max_token(self) -> RoomStreamToken: ...

    def __init__(
        self, database: DatabasePool, db_conn: LoggingDatabaseConnection, hs: StoreContext
    ):
        super().__init__(database, db_conn, hs)
        self._push_rules_id_gen = hs.id_generators.of("push_rules")
        self.push_rules_changes = self.track_stream_changes(
            "push_rules", self._push_rules_id_gen.persisted_upto_position
        )
        #: Called with the user ids whose rules changed (the evaluator's cache).
        self._push_rules_listeners: list[Callable[[list[str]], None]] = []
        self._unread_events_id_gen = hs.id_generators.of("events")
        self._unread_receipts_id_gen = hs.id_generators.of("receipts")
        self._unread_memo = UnreadCountMemo()
        #: Kept by the sole events writer (recorded by ``EventsStore``).
        self.push_outcomes: RecentPushOutcomes | None = (
            RecentPushOutcomes(self._unread_events_id_gen.persisted_upto_position())
            if hs.config.writers.writers("events") == (hs.instance_name,)
            else None
        )

    # Writes

    async def update_push_rules(self, user_id: str, edit: Callable[[UserPushRules], None]) -> int:
        """Apply ``edit`` to the user's rules and store the result under a new
        push_rules stream id, in one transaction; returns the id. When ``edit``
        raises, nothing is stored. The caller serialises edits of one user
        (there is one writer)."""

        def txn_func(txn: LoggingTransaction) -> int:
            txn.execute("SELECT rules FROM push_rules_user WHERE user_id = ?", (user_id,))
            row = txn.fetchone()
            rules = UserPushRules.from_json(db_to_json(row[0]) if row else None)
            edit(rules)
            stream_id = self._push_rules_id_gen.get_next_txn(txn)
            self.push_rules_changes.record_after_commit(txn, user_id, stream_id)
            txn.execute(
                "INSERT INTO push_rules_user (user_id, rules, stream_id, instance_name)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (user_id) DO UPDATE SET"
                " rules = EXCLUDED.rules, stream_id = EXCLUDED.stream_id,"
                " instance_name = EXCLUDED.instance_name",
                (user_id, json_encoder(rules.to_json()), stream_id, self._instance_name),
            )
            return stream_id

        try:
            return await self.db_pool.runInteraction("update_push_rules", txn_func)
        finally:
            self.invalidate_push_rules([user_id])

    # Reads

    @cached()
    async def get_push_rules_doc(self, user_id: str) -> UserPushRules:
        """What the user changed of their rules (treat as read-only: cached)."""
        rows = await self.db_pool.select(
            "get_push_rules_doc", "SELECT rules FROM push_rules_user WHERE user_id = ?", user_id
        )
        return UserPushRules.from_json(db_to_json(rows[0][0]) if rows else None)

    async def push_rules_changed(self, user_id: str, from_id: int, to_id: int) -> bool:
        """Whether the user's rules were last written in ``(from_id, to_id]``."""
        rows = await self.db_pool.select(
            "push_rules_changed",
            "SELECT 1 FROM push_rules_user WHERE user_id = ? AND stream_id > ? AND stream_id <= ?",
            user_id,
            from_id,
            to_id,
        )
        return bool(rows)

    def add_push_rules_listener(self, listener: Callable[[list[str]], None]) -> None:
        self._push_rules_listeners.append(listener)

    def invalidate_push_rules(self, user_ids: list[str]) -> None:
        """Forget cached rules of these users (their rules changed)."""
        for user_id in user_ids:
            self.get_push_rules_doc.invalidate(user_id)
        for listener in self._push_rules_listeners:
            listener(user_ids)

    # The stream's update function

    async def get_push_rules_stream_updates(
        self, instance_name: str, last_id: int, current_id: int, limit: int
    ) -> tuple[list[tuple[int, PushRulesStreamRow]], int, bool]:
        """The push_rules stream's update function: users whose rules were
        last written in ``(last_id, current_id]`` by ``instance_name``."""
        rows = await self.db_pool.select(
            "get_push_rules_stream_updates",
            "SELECT stream_id, user_id FROM push_rules_user WHERE ? < stream_id"
            " AND stream_id <= ? AND instance_name = ? ORDER BY stream_id ASC LIMIT ?",
            last_id,
            current_id,
            instance_name,
            limit,
        )
        updates = [(int(r[0]), PushRulesStreamRow(user_id=r[1])) for r in rows]
        return page_of_updates(updates, limit, current_id)

    # Push actions (written by the events writer with the event, ``events.py``)

    @cached()
    async def get_push_room_members(self, room_id: str) -> tuple[tuple[str, str | None], ...]:
        """The room's joined members and their display names (forgotten with
        the room's state)."""
        rows = await self.db_pool.select(
            "get_push_room_members",
            "SELECT c.state_key, e.content FROM current_state_events AS c"
            " JOIN events AS e ON e.event_id = c.event_id"
            " WHERE c.room_id = ? AND c.type = 'm.room.member' AND c.membership = 'join'",
            room_id,
        )
        members: list[tuple[str, str | None]] = []
        for user_id, content in rows:
            name = db_to_json(content).get("displayname")
            members.append((user_id, name if isinstance(name, str) else None))
        return tuple(members)

    async def get_unread_counts(
        self, user_id: str, room_ids: list[str], upto: int
    ) -> dict[str, tuple[int, int]]:
        """room_id -> (notification_count, highlight_count): the user's
        notifications after their newest m.read (or private) receipt in each
        room, up to stream ordering ``upto``. An event's default outcome
        counts for the user from their current join on (a member who left and
        came back is not counted what was sent before), unless they have an
        outcome of their own. Rooms with none are left out.

        Counts already made are carried over (``UnreadCountMemo``): a room
        with no new event since, whose basis holds, is answered from memory;
        otherwise only the events after the count are read (all since the
        basis when it changed), in one read for every room. A room's events
        that this process has not yet processed may be left out until it
        has (the /sync it answers does not have them either)."""
        if not room_ids:
            return {}
        # Rows at or below it are all committed, by every writer: what is
        # counted up to it never changes, and is what the memo keeps.
        horizon = min(upto, self._unread_events_id_gen.persisted_upto_position())
        # Before the read: a change after these is in the trackers.
        positions = (
            self.get_room_max_token(),
            self._unread_receipts_id_gen.persisted_upto_position(),
        )
        answered: dict[str, CountedUnread] = {}
        carried: dict[str, CountedUnread] = {}
        unknown: list[str] = []
        for room_id in room_ids:
            before = self._unread_memo.get(user_id, room_id)
            if (
                before is None
                or before.upto > horizon
                or not self._unread_basis_holds(user_id, room_id, before.basis)
            ):
                unknown.append(room_id)
            elif not self.room_changes.may_have_changed(room_id, RoomStreamToken(before.upto)):
                answered[room_id] = before
            elif count := self._unread_from_outcomes(user_id, room_id, before, upto, horizon):
                answered[room_id] = count
                self._unread_memo.keep(user_id, room_id, count)
            else:
                carried[room_id] = before
        if carried or unknown:

            def txn_func(
                txn: LoggingTransaction,
            ) -> list[tuple[str, CountedUnread, CountedUnread]]:
                """(room_id, the count up to ``upto``, the count to keep)."""
                starts = dict(carried)
                for i in range(0, len(unknown), _UNREAD_ROOMS_PER_STATEMENT):
                    bases = _read_unread_bases_txn(
                        txn, user_id, unknown[i : i + _UNREAD_ROOMS_PER_STATEMENT], positions
                    )
                    for room_id, basis in bases.items():
                        starts[room_id] = CountedUnread(basis, 0, 0, 0)
                rooms = list(starts)
                counted: list[tuple[str, CountedUnread, CountedUnread]] = []
                for i in range(0, len(rooms), _UNREAD_ROOMS_PER_STATEMENT):
                    part = {r: starts[r] for r in rooms[i : i + _UNREAD_ROOMS_PER_STATEMENT]}
                    found = _count_unread_txn(txn, user_id, part, upto, horizon)
                    for room_id, start in part.items():
                        n, h, kept_n, kept_h = found.get(room_id, (0, 0, 0, 0))
                        basis = start.basis
                        counted.append(
                            (
                                room_id,
                                CountedUnread(
                                    basis, upto, start.notifications + n, start.highlights + h
                                ),
                                CountedUnread(
                                    basis,
                                    horizon,
                                    start.notifications + kept_n,
                                    start.highlights + kept_h,
                                ),
                            )
                        )
                return counted

            for room_id, count, kept in await self.db_pool.runInteraction(
                "get_unread_counts", txn_func, read_only=True, db_autocommit=True
            ):
                answered[room_id] = count
                self._unread_memo.keep(user_id, room_id, kept)
        return {
            room_id: (count.notifications, count.highlights)
            for room_id, count in answered.items()
            if count.notifications or count.highlights
        }

    def _unread_from_outcomes(
        self, user_id: str, room_id: str, before: CountedUnread, upto: int, horizon: int
    ) -> CountedUnread | None:
        """``before`` carried up to ``upto`` from the sole writer's memory of
        the room's new events (``RecentPushOutcomes``); None when it has not
        got them all."""
        if self.push_outcomes is None or upto != horizon:
            return None
        outcomes = self.push_outcomes.outcomes_in(room_id, before.upto, upto)
        if outcomes is None:
            return None
        after_default, after_own = _unread_floors(before, upto)
        notifications, highlights = before.notifications, before.highlights
        for outcome in outcomes:
            n, h = outcome.counts_for(user_id, after_default, after_own)
            notifications += n
            highlights += h
        return CountedUnread(before.basis, upto, notifications, highlights)

    def _unread_basis_holds(self, user_id: str, room_id: str, basis: UnreadBasis) -> bool:
        """Whether no membership of the user and no receipt in the room came
        after ``basis`` was read (this process's change trackers)."""
        if basis.read_at_positions is None:
            return False
        memberships_at, receipts_at = basis.read_at_positions
        return not self.membership_changes.may_have_changed(
            user_id, memberships_at
        ) and not self.receipt_changes.may_have_changed(room_id, receipts_at)

    async def get_notifications(
        self,
        user_id: str,
        before: int | None,
        limit: int,
        only_highlight: bool,
        after: int | None = None,
    ) -> list[NotificationRow]:
        """The user's notifications, newest first, with stream ordering below
        ``before`` (all when None), or with ``after``, oldest first after it:
        the default outcomes of events in rooms they are joined to (since
        their join), and their own outcomes."""
        extra = ""
        extra_args: list[Any] = []
        if before is not None:
            extra += " AND {t}.stream_ordering < ?"
            extra_args.append(before)
        if only_highlight:
            extra += " AND {t}.highlight = ?"
            extra_args.append(True)
        if after is not None:
            extra += " AND {t}.stream_ordering > ?"
            extra_args.append(after)
        # Pages before a point go newest first; deliveries after one, oldest first.
        order = "ASC" if after is not None else "DESC"
        rows = await self.db_pool.select(
            "get_notifications",
            "SELECT event_id, room_id, stream_ordering, actions, highlight, received_ts FROM ("
            " SELECT s.event_id AS event_id, s.room_id AS room_id,"
            "  s.stream_ordering AS stream_ordering, s.push_actions AS actions,"
            "  s.push_highlight AS highlight, s.origin_server_ts AS received_ts"
            " FROM events AS s JOIN local_current_membership AS m"
            "  ON m.room_id = s.room_id AND m.user_id = ? AND m.membership = 'join'"
            " WHERE s.stream_ordering > m.event_stream_ordering AND s.sender != ?"
            "  AND s.push_actions IS NOT NULL AND NOT s.rejected AND NOT s.soft_failed"
            + extra.format(t="s").replace("s.highlight", "s.push_highlight")
            + "  AND NOT EXISTS (SELECT 1 FROM event_push_actions AS x"
            "   WHERE x.event_id = s.event_id AND x.user_id = ?)"
            " UNION ALL"
            " SELECT a.event_id, a.room_id, a.stream_ordering, a.actions, a.highlight,"
            "  a.received_ts FROM event_push_actions AS a WHERE a.user_id = ? AND a.notif = ?"
            + extra.format(t="a")
            + f") AS notifications ORDER BY stream_ordering {order} LIMIT ?",
            user_id,
            user_id,
            *extra_args,
            user_id,
            user_id,
            True,
            *extra_args,
            limit,
        )
        return [(r[0], r[1], int(r[2]), db_to_json(r[3]), bool(r[4]), int(r[5])) for r in rows]

    async def get_read_positions(self, user_id: str, room_ids: list[str]) -> dict[str, int]:
        """room_id -> stream ordering of the user's newest m.read (or private)
        receipt there; rooms without one are left out."""
        if not room_ids:
            return {}
        placeholders = ", ".join("?" for _ in room_ids)
        rows = await self.db_pool.select(
            "get_read_positions",
            "SELECT r.room_id, MAX(e.stream_ordering) FROM receipts_linearized AS r"
            " JOIN events AS e ON e.event_id = r.event_id"
            f" WHERE r.user_id = ? AND r.room_id IN ({placeholders})"
            " AND r.receipt_type IN ('m.read', 'm.read.private') GROUP BY r.room_id",
            user_id,
            *room_ids,
        )
        return {r[0]: int(r[1]) for r in rows if r[1] is not None}
