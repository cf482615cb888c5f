"""The state at every event, stored as state groups (docs/event-graph.md,
"State at every event").

A *state group* is one room state, shared by all the events that have it:
a full snapshot, or a delta (the keys it changes) against a parent group,
at most :data:`MAX_DELTA_CHAIN` deltas from a snapshot. Each event records
the group of the state before it and after it (``events.state_group_before``,
``events.state_group``); a message shares its parent's group, a state event
adds a one-row delta, and where parents' states differ the resolved state
is a group of its own.

The transaction functions here are the storage's: the events writer calls
them in its persist transaction, the schema upgrade to version 82 to derive
the groups of existing rooms, readers to answer "the state at an event".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.api.room_versions import RoomVersion, StateResolution
from synapse_lite.event_graph.pdu import Pdu, StateKey
from synapse_lite.event_graph.state_resolution import is_power_event, resolve_state, separate
from synapse_lite.storage._base import SQLBaseStore, db_to_json
from synapse_lite.storage.caches import LruCache
from synapse_lite.storage.database import (
    DatabasePool,
    LoggingDatabaseConnection,
    LoggingTransaction,
)
from synapse_lite.storage.databases.main.auth_chains import (
    auth_chain_ids_txn,
    auth_difference_txn,
)
from synapse_lite.storage.engines import BaseDatabaseEngine

if TYPE_CHECKING:
    from synapse_lite.storage._base import StoreContext

logger = logging.getLogger(__name__)

#: Deltas between a group and its snapshot at most. Reading a group reads
#: its whole chain (one indexed query, at most this many groups' rows);
#: every this-many state changes a room writes its whole state again. 50
#: keeps a read under ~50 delta rows beyond the snapshot and costs a
#: 10,000-member room about 200 rows per state event, amortised.
MAX_DELTA_CHAIN = 50
#: Events per progress line (and per page) of the schema upgrade.
PROGRESS_EVERY = 10_000


@attr.s(slots=True, frozen=True, auto_attribs=True)
class GroupRef:
    """A stored state group: its id and how many deltas it is from its
    snapshot (0 for a snapshot)."""

    id: int
    chain_length: int


def group_after_id(stream_ordering: int) -> int:
    """The id of the group a state event makes (the state after it)."""
    return 2 * stream_ordering


def group_before_id(stream_ordering: int) -> int:
    """The id of the group of the resolved state before an event whose
    parents' states differ."""
    return 2 * stream_ordering - 1


@attr.s(slots=True, auto_attribs=True)
class GroupRows:
    """Rows of new state groups, written together by :meth:`write_txn`."""

    groups: list[tuple[int, str, int | None, int]] = attr.Factory(list)
    state: list[tuple[int, str, str, str]] = attr.Factory(list)

    def add(
        self,
        room_id: str,
        group_id: int,
        parent: GroupRef | None,
        changes: Mapping[StateKey, str],
        full_state: Callable[[], Mapping[StateKey, str]],
        removes_keys: bool = False,
    ) -> GroupRef:
        """Group ``group_id``: ``parent``'s state + ``changes``, stored as a
        delta of ``changes`` against ``parent``, or a snapshot of
        ``full_state()`` (that whole new state) when there is no parent, the
        chain would exceed :data:`MAX_DELTA_CHAIN`, or the new state lacks
        keys of the parent's (``removes_keys``: deltas only add or replace)."""
        if parent is None or removes_keys or parent.chain_length + 1 > MAX_DELTA_CHAIN:
            rows = full_state()
            ref = GroupRef(group_id, 0)
            prev_group = None
        else:
            rows = changes
            ref = GroupRef(group_id, parent.chain_length + 1)
            prev_group = parent.id
        self.groups.append((group_id, room_id, prev_group, ref.chain_length))
        self.state.extend((group_id, t, k, e) for (t, k), e in sorted(rows.items()))
        return ref

    def write_txn(self, txn: LoggingTransaction) -> None:
        """Insert the rows added so far (multi-row INSERTs: one per table for
        a state event's group), and forget them."""
        for table, rows in (
            ("state_groups (id, room_id, prev_group, chain_length)", self.groups),
            ("state_group_state (state_group, type, state_key, event_id)", self.state),
        ):
            # 200 rows of 4 values per statement: SQLite's 999-parameter floor.
            for start in range(0, len(rows), 200):
                chunk = rows[start : start + 200]
                txn.execute(
                    f"INSERT INTO {table} VALUES " + ", ".join("(?, ?, ?, ?)" for _ in chunk),
                    [v for row in chunk for v in row],
                )
        self.groups.clear()
        self.state.clear()


def write_state_group_txn(
    txn: LoggingTransaction,
    room_id: str,
    group_id: int,
    parent: GroupRef | None,
    changes: Mapping[StateKey, str],
    full_state: Callable[[], Mapping[StateKey, str]],
    removes_keys: bool = False,
) -> GroupRef:
    """Store one group now (see :meth:`GroupRows.add`)."""
    rows = GroupRows()
    ref = rows.add(room_id, group_id, parent, changes, full_state, removes_keys)
    rows.write_txn(txn)
    return ref


def state_of_group_txn(txn: LoggingTransaction, group_id: int) -> dict[StateKey, str]:
    """The state of a group: the rows of its chain, the newest per key
    (one query walking ``prev_group`` up to the snapshot)."""
    txn.execute(
        "WITH RECURSIVE chain (id, prev_group, chain_length) AS ("
        " SELECT id, prev_group, chain_length FROM state_groups WHERE id = ?"
        " UNION ALL SELECT g.id, g.prev_group, g.chain_length FROM state_groups AS g"
        " JOIN chain AS c ON g.id = c.prev_group)"
        " SELECT c.chain_length, s.type, s.state_key, s.event_id FROM chain AS c"
        " JOIN state_group_state AS s ON s.state_group = c.id ORDER BY c.chain_length",
        (group_id,),
    )
    state: dict[StateKey, str] = {}
    for _length, type_, state_key, event_id in txn.fetchall():
        state[(type_, state_key)] = event_id
    return state


def groups_of_events_txn(txn: LoggingTransaction, event_ids: Sequence[str]) -> dict[str, GroupRef]:
    """The group after each of ``event_ids`` that has one."""
    found: dict[str, GroupRef] = {}
    for start in range(0, len(event_ids), 500):
        chunk = list(event_ids[start : start + 500])
        marks = ", ".join("?" for _ in chunk)
        txn.execute(
            "SELECT e.event_id, g.id, g.chain_length FROM events AS e"
            f" JOIN state_groups AS g ON g.id = e.state_group WHERE e.event_id IN ({marks})",
            chunk,
        )
        for event_id, group_id, chain_length in txn.fetchall():
            found[event_id] = GroupRef(int(group_id), int(chain_length))
    return found


class TxnEvents(Mapping[str, Pdu]):
    """The events of a room as state resolution reads them, loaded from
    the database on first use inside one transaction (resolution touches
    the conflicted events and their auth chains, not the whole state)."""

    def __init__(self, txn: LoggingTransaction) -> None:
        self._txn = txn
        self._loaded: dict[str, Pdu | None] = {}

    def prefetch(self, event_ids: Iterable[str]) -> None:
        """Load ``event_ids`` (those not loaded yet) in one query per 500."""
        wanted = sorted(set(event_ids) - self._loaded.keys())
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            marks = ", ".join("?" for _ in chunk)
            edges: dict[str, tuple[list[str], list[str]]] = {e: ([], []) for e in chunk}
            for table, column, side in (
                ("event_edges", "prev_event_id", 0),
                ("event_auth_edges", "auth_id", 1),
            ):
                self._txn.execute(
                    f"SELECT event_id, {column} FROM {table} WHERE event_id IN ({marks})", chunk
                )
                for event_id, other in self._txn.fetchall():
                    edges[event_id][side].append(other)
            self._txn.execute(
                "SELECT event_id, room_id, type, state_key, sender, content,"
                " topological_ordering, origin_server_ts, redacts"
                f" FROM events WHERE event_id IN ({marks})",
                chunk,
            )
            for event_id in chunk:
                self._loaded[event_id] = None
            for row in self._txn.fetchall():
                prevs, auths = edges[row[0]]
                content = db_to_json(row[5])
                self._loaded[row[0]] = Pdu(
                    event_id=row[0],
                    room_id=row[1],
                    type=row[2],
                    state_key=row[3],
                    sender=row[4],
                    content=content,
                    prev_event_ids=tuple(sorted(prevs)),
                    auth_event_ids=tuple(sorted(auths)),
                    depth=int(row[6]),
                    origin_server_ts=int(row[7]),
                    redacts=row[8] if row[8] is not None else _redacts_in(content),
                )

    def __getitem__(self, event_id: str) -> Pdu:
        if event_id not in self._loaded:
            self.prefetch([event_id])
        pdu = self._loaded[event_id]
        if pdu is None:
            raise KeyError(event_id)
        return pdu

    def __iter__(self) -> Iterator[str]:
        # Only what was loaded: resolution looks events up, never lists them.
        return (e for e, pdu in self._loaded.items() if pdu is not None)

    def __len__(self) -> int:
        return sum(1 for pdu in self._loaded.values() if pdu is not None)


def resolve_states_txn(
    txn: LoggingTransaction,
    version: RoomVersion,
    states: Sequence[Mapping[StateKey, str]],
    use_index: bool = True,
) -> dict[StateKey, str]:
    """The core's ``resolve_state`` of stored ``states``, the events it
    reads loaded in ``txn``. v2's auth difference comes from the auth chain
    index (``use_index``; False walks the auth events as before the index,
    for the benchmark): only the difference's events are loaded, and the
    auth chains v2 still walks (the power events'; version 12's conflicted
    subgraph walks the conflicted events') are loaded together by index
    rather than event by event."""
    events = TxnEvents(txn)
    _unconflicted, conflicted = separate(states)
    events.prefetch(e for ids in conflicted.values() for e in ids)
    difference = (
        auth_difference_txn(txn, states)
        if use_index and conflicted and version.state_resolution is not StateResolution.V1
        else None
    )
    if difference is not None:
        full = difference.union(*conflicted.values())
        events.prefetch(full)
        starts = {e for e in full if e in events and is_power_event(events[e])}
        if version.state_resolution is StateResolution.V2_1:
            starts.update(*conflicted.values())
        events.prefetch(auth_chain_ids_txn(txn, sorted(starts)))
    return resolve_state(version, states, events, indexed_auth_difference=difference)


def _redacts_in(content: Mapping[str, Any]) -> str | None:
    redacts = content.get("redacts")
    return redacts if isinstance(redacts, str) else None


def derive_state_groups_txn(txn: LoggingTransaction, engine: BaseDatabaseEngine) -> None:
    """Schema upgrade to version 82: give every event of a database written
    before state groups its state before and after, replaying each room's
    events in stream order (rooms were lines then: an event's state before
    is the state after the room's event before it). A progress line per
    :data:`PROGRESS_EVERY` events. Outliers keep no state."""
    txn.execute("SELECT COUNT(*) FROM events WHERE NOT outlier")
    total = int(txn.fetchone()[0])
    if total == 0:
        return
    logger.info("Deriving the state at each of %d events", total)
    done = 0
    room_id: str | None = None
    state: dict[StateKey, str] = {}
    group: GroupRef | None = None
    last: tuple[str, int] = ("", -(2**62))
    new_groups = GroupRows()
    # Each page's groups go through a scratch table and one UPDATE: a
    # statement per event would cost a round trip each on PostgreSQL.
    txn.execute(
        "CREATE TEMPORARY TABLE derived_state_groups"
        " (event_id TEXT NOT NULL PRIMARY KEY, state_group_before BIGINT, state_group BIGINT)"
    )
    while True:
        txn.execute(
            "SELECT room_id, stream_ordering, event_id, type, state_key FROM events"
            " WHERE (room_id, stream_ordering) > (?, ?) AND NOT outlier"
            " ORDER BY room_id, stream_ordering LIMIT ?",
            (last[0], last[1], PROGRESS_EVERY),
        )
        rows = txn.fetchall()
        if not rows:
            break
        updates: list[tuple[str, int | None, int | None]] = []
        for row_room, stream_ordering, event_id, type_, state_key in rows:
            if row_room != room_id:
                room_id, state, group = row_room, {}, None
            before = group
            if state_key is not None:
                key = (type_, state_key)
                state[key] = event_id
                group = new_groups.add(
                    row_room,
                    group_after_id(int(stream_ordering)),
                    before,
                    {key: event_id},
                    state.copy,
                )
            updates.append((event_id, before.id if before else None, group.id if group else None))
        new_groups.write_txn(txn)
        for start in range(0, len(updates), 300):
            chunk = updates[start : start + 300]
            txn.execute(
                "INSERT INTO derived_state_groups (event_id, state_group_before, state_group)"
                " VALUES " + ", ".join("(?, ?, ?)" for _ in chunk),
                [v for row in chunk for v in row],
            )
        if engine.name == "postgres":
            # A join: the planner knows nothing of the scratch table and runs
            # the correlated form below as a scan per row.
            txn.execute(
                "UPDATE events SET state_group_before = d.state_group_before,"
                " state_group = d.state_group FROM derived_state_groups AS d"
                " WHERE events.event_id = d.event_id"
            )
        else:
            # UPDATE ... FROM needs SQLite 3.33; by primary key this is as fast.
            txn.execute(
                "UPDATE events SET"
                " state_group_before = (SELECT d.state_group_before"
                " FROM derived_state_groups AS d WHERE d.event_id = events.event_id),"
                " state_group = (SELECT d.state_group FROM derived_state_groups AS d"
                " WHERE d.event_id = events.event_id)"
                " WHERE event_id IN (SELECT event_id FROM derived_state_groups)"
            )
        txn.execute("DELETE FROM derived_state_groups")
        done += len(rows)
        last = (str(rows[-1][0]), int(rows[-1][1]))
        logger.info("Derived the state at %d of %d events", done, total)
    txn.execute("DROP TABLE derived_state_groups")


#: State groups whose state a process keeps in memory (groups never change;
#: a large room's state is tens of thousands of entries, hence few).
GROUP_STATE_CACHE_ENTRIES = 100
#: Events whose group (after them) the events writer keeps in memory: the
#: parents of the next events, so a linear send reads no row for its state.
EVENT_GROUP_CACHE_ENTRIES = 10_000


class StateGroupsWorkerStore(SQLBaseStore):
    """Reading the state at events (any process): what federation serves
    as the state at an event, and the auth chain of events."""

    def __init__(
        self, database: DatabasePool, db_conn: LoggingDatabaseConnection, hs: StoreContext
    ) -> None:
        super().__init__(database, db_conn, hs)
        self._group_state: LruCache[Mapping[StateKey, str]] = LruCache(GROUP_STATE_CACHE_ENTRIES)
        self._event_group: LruCache[GroupRef] = LruCache(EVENT_GROUP_CACHE_ENTRIES)

    async def get_state_ids_for_group(self, group_id: int) -> Mapping[StateKey, str]:
        """The state of one group (read-only mapping, cached)."""
        found, state = self._group_state.get(group_id)
        if found and state is not None:
            return state
        state = await self.db_pool.runInteraction(
            "get_state_ids_for_group", state_of_group_txn, group_id, read_only=True
        )
        self._group_state.set(group_id, state)
        return state

    async def get_state_groups_of_events(
        self, event_ids: Sequence[str]
    ) -> dict[str, tuple[int | None, int | None, bool]]:
        """For each stored event of ``event_ids``: its group before, its
        group after, and whether it is a create event (whose state before is
        empty, with no group)."""
        rows: dict[str, tuple[int | None, int | None, bool]] = {}
        for start in range(0, len(event_ids), 500):
            chunk = list(event_ids[start : start + 500])
            marks = ", ".join("?" for _ in chunk)
            for event_id, before, after, type_, state_key in await self.db_pool.select(
                "get_state_groups_of_events",
                "SELECT event_id, state_group_before, state_group, type, state_key FROM events"
                f" WHERE event_id IN ({marks})",
                *chunk,
            ):
                is_create = type_ == "m.room.create" and state_key == ""
                rows[str(event_id)] = (before, after, is_create)
        return rows

    async def get_state_ids_before_event(self, event_id: str) -> Mapping[StateKey, str] | None:
        """The room's state just before ``event_id`` (what the server-server
        API's ``/state_ids`` serves at it); None when the event is unknown or
        its state is not (an outlier)."""
        groups = (await self.get_state_groups_of_events([event_id])).get(event_id)
        if groups is None:
            return None
        before, _after, is_create = groups
        if before is None:
            return {} if is_create else None
        return await self.get_state_ids_for_group(before)

    async def get_state_ids_after_events(
        self, event_ids: Sequence[str]
    ) -> dict[str, Mapping[StateKey, str]]:
        """The room's state just after each of ``event_ids`` whose state is
        known (the state sets resolution takes at these events)."""
        result: dict[str, Mapping[StateKey, str]] = {}
        for event_id, (_before, after, _create) in (
            await self.get_state_groups_of_events(event_ids)
        ).items():
            if after is not None:
                result[event_id] = await self.get_state_ids_for_group(after)
        return result

    async def get_auth_chain_ids(self, event_ids: Sequence[str]) -> set[str]:
        """Every event reachable from ``event_ids`` by ``auth_events`` (not
        the events themselves unless reachable), from the auth chain index
        (``auth_chains.auth_chain_ids_txn``)."""
        return await self.db_pool.runInteraction(
            "get_auth_chain_ids", auth_chain_ids_txn, list(event_ids), read_only=True
        )
