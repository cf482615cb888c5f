"""The stored auth chain index (docs/event-graph.md, "The stored auth chain
index"): each state event's chain position in ``event_auth_chains`` and its
links in ``event_auth_chain_links``, written by the events writer in the
transaction that persists the event; auth chains and auth differences read
from them instead of walking ``event_auth_edges`` event by event.

The rules (which chain an event continues, the closure over links, the
difference as per-chain ranges) are the pure core's
(``event_graph/auth_chain_index.py``); this module reads and writes rows.
Only state events have positions: messages are never auth events nor in a
state set. A chain's id is the stream ordering of its first event.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

import attr

from synapse_lite.event_graph.auth_chain_index import (
    Link,
    Position,
    auth_order,
    combine,
    difference_ranges,
    place,
    reach,
)
from synapse_lite.event_graph.pdu import StateKey
from synapse_lite.storage.database import LoggingTransaction, insert_rows_txn
from synapse_lite.storage.engines import BaseDatabaseEngine

logger = logging.getLogger(__name__)

#: Ids per ``IN (...)`` list (SQLite's parameter floor is 999).
_CHUNK = 500
#: State events per progress line of the schema upgrade.
PROGRESS_EVERY = 10_000


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ChainedEvent:
    """What indexing needs of a new event. ``chain_id``: the id of the chain
    it starts if it continues none (its stream ordering)."""

    event_id: str
    room_id: str
    state_key: StateKey | None
    auth_event_ids: Sequence[str]
    chain_id: int


@attr.s(slots=True, frozen=True, auto_attribs=True)
class IndexedEvent:
    """A stored event's position, and whether a new event of its key may
    continue its chain (it is the chain's newest). What the events writer
    keeps in memory of the events it indexed or read, so that a send reads
    no row for its auth events' positions."""

    position: Position
    room_id: str
    state_key: StateKey
    newest: bool


def _chunks(ids: Sequence[str]) -> Iterable[list[str]]:
    for start in range(0, len(ids), _CHUNK):
        yield list(ids[start : start + _CHUNK])


def _indexed_txn(txn: LoggingTransaction, event_ids: Iterable[str]) -> dict[str, IndexedEvent]:
    found: dict[str, IndexedEvent] = {}
    for chunk in _chunks(sorted(set(event_ids))):
        marks = ", ".join("?" for _ in chunk)
        txn.execute(
            "SELECT c.event_id, c.chain_id, c.sequence_number, e.room_id, e.type, e.state_key,"
            " NOT EXISTS (SELECT 1 FROM event_auth_chains AS n WHERE n.chain_id = c.chain_id"
            " AND n.sequence_number = c.sequence_number + 1)"
            " FROM event_auth_chains AS c JOIN events AS e ON e.event_id = c.event_id"
            f" WHERE c.event_id IN ({marks})",
            chunk,
        )
        for event_id, chain, sequence, room_id, type_, state_key, newest in txn.fetchall():
            found[str(event_id)] = IndexedEvent(
                (int(chain), int(sequence)), str(room_id), (str(type_), str(state_key)),
                bool(newest),
            )  # fmt: skip
    return found


def index_auth_chains_txn(
    txn: LoggingTransaction,
    events: Sequence[ChainedEvent],
    cached: Mapping[str, IndexedEvent] | None = None,
) -> dict[str, IndexedEvent]:
    """Give the state events of ``events`` (a batch being persisted) their
    positions and links, each after its auth events of the batch. Auth
    events with no position (not stored, or not state events) are left out:
    the chain stops there, as walking the edges would. ``cached``: auth
    events' entries the caller kept (they must be current: only the room's
    writer extends its chains); the others are read. Returns the entries of
    every event this touched as they are once it commits (new events, and
    auth events read or no longer their chain's newest), for the caller to
    keep. A batch of messages writes nothing; a state event costs at most
    one read and two multi-row INSERTs."""
    state_events = [e for e in events if e.state_key is not None]
    if not state_events:
        return {}
    in_batch = {e.event_id for e in state_events}
    wanted = {a for e in state_events for a in e.auth_event_ids if a not in in_batch}
    known = {a: cached[a] for a in wanted if cached is not None and a in cached}
    if len(known) < len(wanted):
        known.update(_indexed_txn(txn, wanted - known.keys()))
    by_id = {e.event_id: e for e in state_events}
    # Chains this batch extended: chain -> its newest sequence now.
    tops: dict[int, int] = {}
    superseded: list[str] = []
    positions: list[tuple[str, int, int]] = []
    links: list[tuple[int, int, int, int]] = []
    for event_id in auth_order([(e.event_id, e.auth_event_ids) for e in state_events]):
        event = by_id[event_id]
        auth_positions: list[tuple[Position, bool]] = []
        auth_ids = [a for a in event.auth_event_ids if a in known]
        for auth_id in event.auth_event_ids:
            indexed = known.get(auth_id)
            if indexed is None:
                continue
            chain, sequence = indexed.position
            newest = tops[chain] == sequence if chain in tops else indexed.newest
            extends = (
                newest and indexed.state_key == event.state_key
                and indexed.room_id == event.room_id
            )  # fmt: skip
            auth_positions.append((indexed.position, extends))
        position, new_links = place(auth_positions, event.chain_id)
        tops[position[0]] = position[1]
        superseded.extend(
            a for a in auth_ids if known[a].position == (position[0], position[1] - 1)
        )
        assert event.state_key is not None
        known[event_id] = IndexedEvent(position, event.room_id, event.state_key, True)
        positions.append((event_id, *position))
        links.extend((position[0], *link) for link in new_links)
    insert_rows_txn(txn, "event_auth_chains (event_id, chain_id, sequence_number)", positions)
    insert_rows_txn(
        txn,
        "event_auth_chain_links (origin_chain_id, origin_sequence_number,"
        " target_chain_id, target_sequence_number)",
        links,
    )
    for event_id in superseded:
        known[event_id] = attr.evolve(known[event_id], newest=False)
    return known


def positions_txn(txn: LoggingTransaction, event_ids: Iterable[str]) -> dict[str, Position]:
    """The positions of those of ``event_ids`` that have one."""
    found: dict[str, Position] = {}
    for chunk in _chunks(sorted(set(event_ids))):
        marks = ", ".join("?" for _ in chunk)
        txn.execute(
            "SELECT event_id, chain_id, sequence_number FROM event_auth_chains"
            f" WHERE event_id IN ({marks})",
            chunk,
        )
        for event_id, chain, sequence in txn.fetchall():
            found[str(event_id)] = (int(chain), int(sequence))
    return found


def links_txn(txn: LoggingTransaction, chains: Iterable[int]) -> dict[int, list[Link]]:
    """The links out of ``chains`` and out of every chain they link to,
    each chain's in ascending origin sequence (one query per level of
    links and 500 chains)."""
    links: dict[int, list[Link]] = {}
    todo = sorted(set(chains))
    seen = set(todo)
    while todo:
        found: set[int] = set()
        for start in range(0, len(todo), _CHUNK):
            chunk = todo[start : start + _CHUNK]
            marks = ", ".join("?" for _ in chunk)
            txn.execute(
                "SELECT origin_chain_id, origin_sequence_number, target_chain_id,"
                " target_sequence_number FROM event_auth_chain_links"
                f" WHERE origin_chain_id IN ({marks})",
                chunk,
            )
            for origin, origin_sequence, target, target_sequence in txn.fetchall():
                links.setdefault(int(origin), []).append(
                    (int(origin_sequence), int(target), int(target_sequence))
                )
                found.add(int(target))
        todo = sorted(found - seen)
        seen.update(todo)
    for out in links.values():
        out.sort()
    return links


def events_in_ranges_txn(
    txn: LoggingTransaction, ranges: Mapping[int, tuple[int, int]]
) -> set[str]:
    """The events at sequences ``(low, high]`` of each chain of ``ranges``."""
    event_ids: set[str] = set()
    items = sorted(ranges.items())
    # 3 values per range: 200 ranges per statement.
    for start in range(0, len(items), 200):
        chunk = items[start : start + 200]
        txn.execute(
            "SELECT event_id FROM event_auth_chains WHERE "
            + " OR ".join(
                "(chain_id = ? AND sequence_number > ? AND sequence_number <= ?)" for _ in chunk
            ),
            [v for chain, (low, high) in chunk for v in (chain, low, high)],
        )
        event_ids.update(str(row[0]) for row in txn.fetchall())
    return event_ids


def auth_difference_txn(
    txn: LoggingTransaction, state_sets: Sequence[Mapping[StateKey, str]]
) -> set[str] | None:
    """The auth difference of ``state_sets`` (what
    ``state_resolution.auth_difference`` computes by walking) from the
    index, or None when one of their events has no position (the caller
    then walks). The sets' common events are reached once."""
    common = set(state_sets[0].values()).intersection(*(s.values() for s in state_sets[1:]))
    own = [set(s.values()) - common for s in state_sets]
    positions = positions_txn(txn, common.union(*own))
    if len(positions) < len(common.union(*own)):
        return None
    links = links_txn(txn, {chain for chain, _ in positions.values()})
    common_reach = reach((positions[e] for e in common), links)
    reaches = [combine(common_reach, reach((positions[e] for e in ids), links)) for ids in own]
    return events_in_ranges_txn(txn, difference_ranges(reaches))


def auth_chain_ids_txn(txn: LoggingTransaction, event_ids: Sequence[str]) -> set[str]:
    """Every event reachable from ``event_ids`` by auth events (not the
    events themselves unless reachable): their auth events, and what those
    reach in the index. An auth event with no position (only a rejected
    event can cite a message) is in the result, its own auth events not."""
    auth_ids: set[str] = set()
    for chunk in _chunks(sorted(set(event_ids))):
        marks = ", ".join("?" for _ in chunk)
        txn.execute(f"SELECT auth_id FROM event_auth_edges WHERE event_id IN ({marks})", chunk)
        auth_ids.update(str(row[0]) for row in txn.fetchall())
    positions = positions_txn(txn, auth_ids)
    links = links_txn(txn, {chain for chain, _ in positions.values()})
    reached = reach(positions.values(), links)
    return auth_ids | events_in_ranges_txn(txn, {c: (0, s) for c, s in reached.items()})


def index_existing_events_txn(txn: LoggingTransaction, engine: BaseDatabaseEngine) -> None:
    """Schema upgrade to version 143: index every stored state event, room by
    room, each after its auth events (in stream order otherwise), as the
    writer would have; a progress line per :data:`PROGRESS_EVERY` events.
    Events persisted before the graph have no auth edges: each starts a
    chain of its own (their chains stopped there before too)."""
    txn.execute("SELECT room_id, COUNT(*) FROM events WHERE state_key IS NOT NULL GROUP BY room_id")
    rooms = sorted((str(room_id), int(count)) for room_id, count in txn.fetchall())
    total = sum(count for _, count in rooms)
    if total == 0:
        return
    logger.info("Indexing the auth chains of %d state events", total)
    done = 0
    for room_id, _count in rooms:
        txn.execute(
            "SELECT event_id, type, state_key, stream_ordering FROM events"
            " WHERE room_id = ? AND state_key IS NOT NULL ORDER BY stream_ordering",
            (room_id,),
        )
        rows = txn.fetchall()
        txn.execute(
            "SELECT a.event_id, a.auth_id FROM event_auth_edges AS a"
            " JOIN events AS e ON e.event_id = a.event_id"
            " WHERE e.room_id = ? AND e.state_key IS NOT NULL",
            (room_id,),
        )
        auth: dict[str, list[str]] = {}
        for event_id, auth_id in txn.fetchall():
            auth.setdefault(str(event_id), []).append(str(auth_id))
        events = [
            ChainedEvent(
                event_id=str(event_id),
                room_id=room_id,
                state_key=(str(type_), str(state_key)),
                auth_event_ids=sorted(auth.get(str(event_id), ())),
                chain_id=int(stream_ordering),
            )
            for event_id, type_, state_key, stream_ordering in rows
        ]
        # A room at a time, each event after its auth events (a backfilled
        # event's stream ordering is below its auth events'), in pages.
        by_id = {e.event_id: e for e in events}
        events = [by_id[e] for e in auth_order([(e.event_id, e.auth_event_ids) for e in events])]
        for start in range(0, len(events), PROGRESS_EVERY):
            page = events[start : start + PROGRESS_EVERY]
            index_auth_chains_txn(txn, page)
            before = done
            done += len(page)
            if done // PROGRESS_EVERY > before // PROGRESS_EVERY or done == total:
                logger.info("Indexed the auth chains of %d of %d state events", done, total)
