"""Relations between events (``event_relations``, written with each event by
its room's writer): children of an event, thread summaries, edits, references.

A redacted child no longer relates to anything (its ``m.relates_to`` is gone
from what is served), so every read here leaves redacted children out, and
rejected or soft-failed ones (docs/event-graph.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from synapse_lite.storage._base import SQLBaseStore
from synapse_lite.storage.caches import LruCache

#: Leaves out relations whose child event was redacted.
_NOT_REDACTED = (
    "NOT EXISTS (SELECT 1 FROM events AS red WHERE red.redacts = er.event_id"
    " AND red.type = 'm.room.redaction')"
)


#: Leaves out relations whose child event is rejected or soft-failed (none
#: is written for such events; this keeps every read right on its own).
_SERVED_CHILD = (
    "EXISTS (SELECT 1 FROM events AS child WHERE child.event_id = er.event_id"
    " AND NOT child.rejected AND NOT child.soft_failed)"
)


def _marks(values: list[Any]) -> str:
    return ", ".join("?" for _ in values)


#: Events a process remembers as having no aggregated relations.
CHILDLESS_EVENTS = 10_000


class ChildlessEvents:
    """Events this process knows have no ``m.thread``, ``m.replace`` or
    ``m.reference`` child (a /sync's fresh timeline events, usually): their
    bundled aggregations need no read.

    An event is remembered only from a read that found no child and that no
    new relation overtook (:meth:`generation` unchanged across the read); it
    is forgotten when a relation to it is persisted (on its writer) or
    arrives on the events stream (elsewhere), and everything is forgotten
    when backfilled events arrive (their rows do not say what they relate
    to). Redactions only remove children, so they forget nothing."""

    def __init__(self, max_entries: int = CHILDLESS_EVENTS) -> None:
        self._known: LruCache[bool] = LruCache(max_entries)
        #: Events relations were seen to, known or not: a follower may get a
        #: relation before its parent when the room's writer changed.
        self._parents: LruCache[bool] = LruCache(max_entries)
        self.generation = 0

    def unknown(self, event_ids: Iterable[str]) -> list[str]:
        """Those of ``event_ids`` not known to be childless."""
        return [e for e in event_ids if not self._known.get(e)[0]]

    def found_childless(self, event_ids: Iterable[str], generation: int) -> None:
        """A read that started at ``generation`` found no child of these."""
        if generation == self.generation:
            for event_id in event_ids:
                self._known.set(event_id, True)

    def fresh(self, event_ids: Iterable[str]) -> None:
        """New events arrived on the events stream: nobody can relate to an
        event before it exists, and a relation to it is persisted by the
        room's writer after it, so arrives after it, but for one already
        seen (:meth:`related_to`), which this leaves unknown. Not known
        here: a relation another server sent before the event it relates to,
        persisted before this process started or beyond :attr:`_parents`'
        memory; the event's bundle is then missing from /sync timelines
        served here until the event leaves this memory (``/relations`` and
        ``/context`` are unaffected)."""
        for event_id in event_ids:
            if not self._parents.get(event_id)[0]:
                self._known.set(event_id, True)

    def related_to(self, parent_ids: Iterable[str]) -> None:
        """Relations to ``parent_ids`` were persisted."""
        self.generation += 1
        for parent_id in parent_ids:
            self._known.pop(parent_id)
            self._parents.set(parent_id, True)

    def forget_all(self) -> None:
        self.generation += 1
        self._known.clear()


class RelationsWorkerStore(SQLBaseStore):
    #: Set up by the events store (which sees every new relation).
    childless_events: ChildlessEvents

    async def get_relation_children(
        self,
        room_id: str,
        parent_ids: list[str],
        rel_type: str | None,
        event_type: str | None,
        after: int | None,
        upto: int | None,
        limit: int,
        newest_first: bool,
    ) -> list[tuple[str, int]]:
        """``(event_id, stream_ordering)`` of the children of ``parent_ids``
        in ``(after, upto]`` (either bound open when None), at most ``limit``,
        in stream order (newest first when ``newest_first``)."""
        if not parent_ids:
            return []
        sql = (
            "SELECT er.event_id, er.stream_ordering FROM event_relations AS er"
            f" WHERE er.room_id = ? AND er.relates_to_id IN ({_marks(parent_ids)})"
        )
        args: list[Any] = [room_id, *parent_ids]
        for clause, value in (
            (" AND er.relation_type = ?", rel_type),
            (" AND er.type = ?", event_type),
            (" AND er.stream_ordering > ?", after),
            (" AND er.stream_ordering <= ?", upto),
        ):
            if value is not None:
                sql += clause
                args.append(value)
        order = "DESC" if newest_first else "ASC"
        sql += f" AND {_NOT_REDACTED} AND {_SERVED_CHILD}"
        sql += f" ORDER BY er.stream_ordering {order} LIMIT ?"
        rows = await self.db_pool.select("get_relation_children", sql, *args, limit)
        return [(r[0], int(r[1])) for r in rows]

    async def get_aggregated_relations(
        self, parent_ids: list[str]
    ) -> list[tuple[str, str, str, str]]:
        """``(parent id, event id, rel_type, sender)`` of every ``m.thread``,
        ``m.replace`` and ``m.reference`` child of ``parent_ids``, oldest
        first: what bundled aggregations are made of, in one query (none for
        events known to have no such child)."""
        childless = self.childless_events
        generation = childless.generation
        parent_ids = childless.unknown(parent_ids)
        result: list[tuple[str, str, str, str]] = []
        for start in range(0, len(parent_ids), 500):
            chunk = parent_ids[start : start + 500]
            rows = await self.db_pool.select(
                "get_aggregated_relations",
                "SELECT er.relates_to_id, er.event_id, er.relation_type, er.sender"
                " FROM event_relations AS er"
                f" WHERE er.relates_to_id IN ({_marks(chunk)})"
                " AND er.relation_type IN ('m.thread', 'm.replace', 'm.reference')"
                f" AND {_NOT_REDACTED} AND {_SERVED_CHILD} ORDER BY er.stream_ordering ASC",
                *chunk,
            )
            result.extend((r[0], r[1], r[2], r[3]) for r in rows)
        with_children = {r[0] for r in result}
        childless.found_childless((p for p in parent_ids if p not in with_children), generation)
        return result

    async def get_thread_roots(
        self, room_id: str, participant: str | None, before: int | None, limit: int
    ) -> list[tuple[str, int]]:
        """``(root event id, latest reply's stream ordering)`` of a room's
        threads, most recently active first, only those active before
        ``before`` (when given); with ``participant``, only threads that user
        started or replied to."""
        sql = (
            "SELECT er.relates_to_id, MAX(er.stream_ordering) AS latest"
            " FROM event_relations AS er"
            f" WHERE er.room_id = ? AND er.relation_type = 'm.thread' AND {_NOT_REDACTED}"
            f" AND {_SERVED_CHILD}"
        )
        args: list[Any] = [room_id]
        if participant is not None:
            sql += (
                " AND (er.relates_to_id IN (SELECT p.relates_to_id FROM event_relations AS p"
                "  WHERE p.room_id = ? AND p.relation_type = 'm.thread' AND p.sender = ?)"
                " OR er.relates_to_id IN (SELECT e.event_id FROM events AS e"
                "  WHERE e.room_id = ? AND e.sender = ?))"
            )
            args += [room_id, participant, room_id, participant]
        sql += " GROUP BY er.relates_to_id"
        if before is not None:
            sql += " HAVING MAX(er.stream_ordering) < ?"
            args.append(before)
        sql += " ORDER BY latest DESC LIMIT ?"
        rows = await self.db_pool.select("get_thread_roots", sql, *args, limit)
        return [(r[0], int(r[1])) for r in rows]
