"""Full-text search of room events: the ``event_search`` index and its queries.

The index holds one row per searchable event: an ``m.room.message``'s
``content.body``, an ``m.room.name``'s ``content.name``, an ``m.room.topic``'s
``content.topic`` (when a string). The room's events writer fills it in the
transaction that persists the event (:func:`index_events_txn`), and a
redaction takes its target out in its own, so every process reads a current
index from the shared database. The engines differ (schema delta ``0052``):

* SQLite: an FTS5 table whose rowid is the event's stream ordering, the
  ``porter`` tokenizer, ranks from ``bm25`` and matches marked by
  ``highlight``;
* PostgreSQL: a ``tsvector`` column (``english``: stemmed, stop words dropped)
  behind a GIN index, ranks from ``ts_rank_cd`` and matches marked by
  ``ts_headline``.

Words of a search term are all required and each matches as a prefix
("garde" finds "gardening"), on both engines.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import attr

from synapse_lite.events import Event
from synapse_lite.storage._base import SQLBaseStore
from synapse_lite.storage.database import LoggingTransaction

#: The content key searched in each event type (the spec's search ``keys``).
SEARCHED_KEYS = {
    "m.room.message": "content.body",
    "m.room.name": "content.name",
    "m.room.topic": "content.topic",
}
#: PostgreSQL's text search configuration (SQLite's porter tokenizer stems alike).
TEXT_SEARCH_CONFIG = "english"
#: Around each matched word in a highlighted value (private-use characters,
#: which no message is expected to hold).
_MARK_START, _MARK_END = "\ue000", "\ue001"
_MARKED = re.compile(f"{_MARK_START}(.*?){_MARK_END}", re.DOTALL)
#: What a word of a search term is: letters and digits (no quotes, operators
#: or underscores reach either engine's query syntax).
_WORD = re.compile(r"[^\W_]+")
#: Words of a term used at most, and their length.
MAX_WORDS = 20
MAX_WORD_LENGTH = 100


def search_words(term: str) -> tuple[str, ...]:
    """The words of a search term, lower-cased, in order, without repeats."""
    words: list[str] = []
    for word in _WORD.findall(term.lower()):
        if word not in words and len(word) <= MAX_WORD_LENGTH:
            words.append(word)
    return tuple(words[:MAX_WORDS])


def searchable_value(event: Event) -> tuple[str, str] | None:
    """``(key, text)`` of an event the index holds, or None."""
    key = SEARCHED_KEYS.get(event.type)
    # A message is not a state event; a name or topic is the room's (state key "").
    expected_state_key = None if event.type == "m.room.message" else ""
    if key is None or event.outlier or event.state_key != expected_state_key:
        return None
    value = event.content.get(key.split(".", 1)[1])
    if not isinstance(value, str) or not value:
        return None
    return key, value


def index_events_txn(txn: LoggingTransaction, events: Iterable[Event]) -> None:
    """Add the searchable ones of ``events`` to the index and take out the
    targets of redactions among them. For the events writer's persisting
    transaction, after the events' rows are written."""
    postgres = txn.database_engine.name == "postgres"
    rows = []
    for event in events:
        entry = searchable_value(event)
        if entry is None:
            continue
        key, value = entry
        contains_url = isinstance(event.content.get("url"), str)
        rows.append(
            (
                event.stream_ordering,
                event.event_id,
                event.room_id,
                event.sender,
                event.type,
                key,
                value,
                contains_url,
            )
        )
    # Sent with the transaction's next statement (no result is read).
    if rows and postgres:
        txn.execute_later(
            "INSERT INTO event_search (stream_ordering, event_id, room_id, sender, type, key,"
            " value, contains_url, vector) VALUES (?, ?, ?, ?, ?, ?, ?, ?,"
            f" to_tsvector('{TEXT_SEARCH_CONFIG}', ?)) ON CONFLICT (event_id) DO NOTHING",
            [(*row, row[6]) for row in rows],
        )
    elif rows:
        txn.execute_later(
            "INSERT INTO event_search (rowid, event_id, room_id, sender, type, key, value,"
            " contains_url) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
    redacted = [
        (event.redacts,)
        for event in events
        if event.type == "m.room.redaction" and event.redacts is not None
    ]
    if postgres:
        txn.execute_later("DELETE FROM event_search WHERE event_id = ?", redacted)
    else:
        txn.execute_later(
            "DELETE FROM event_search WHERE rowid ="
            " (SELECT stream_ordering FROM events WHERE event_id = ?)",
            redacted,
        )


@attr.s(slots=True, frozen=True, auto_attribs=True)
class SearchQuery:
    """What to look for and where (checked by the caller).

    ``ranges`` are, per room, the stream orderings the searching user may see
    (``RoomVisibility.visible_ranges``: half-open, None unbounded); only
    events in one of them are found. ``upto``: the newest stream ordering
    considered (pages of one search look at the same events)."""

    words: tuple[str, ...]
    keys: tuple[str, ...]
    ranges: tuple[tuple[str, int | None, int | None], ...]
    upto: int
    types: tuple[str, ...] | None = None
    senders: tuple[str, ...] | None = None
    not_senders: tuple[str, ...] = ()
    contains_url: bool | None = None


@attr.s(slots=True, frozen=True, auto_attribs=True)
class SearchHit:
    """One event found: where it is, how well it matched, and the words of
    it that matched (as written in the event)."""

    event_id: str
    room_id: str
    sender: str
    stream_ordering: int
    rank: float
    matched_words: tuple[str, ...]


class SearchWorkerStore(SQLBaseStore):
    """The queries of ``POST /search`` (any process: the index is in the
    shared database)."""

    def _where(self, query: SearchQuery) -> tuple[str, list[Any]]:
        """The conditions besides the text match, and their arguments."""
        position = self._position_column()
        clauses: list[str] = []
        args: list[Any] = []
        room_clauses = []
        for room_id, start, end in query.ranges:
            parts = ["room_id = ?"]
            args.append(room_id)
            if start is not None:
                parts.append(f"{position} >= ?")
                args.append(start)
            if end is not None:
                parts.append(f"{position} < ?")
                args.append(end)
            room_clauses.append("(" + " AND ".join(parts) + ")")
        clauses.append("(" + " OR ".join(room_clauses) + ")")
        clauses.append(f"{position} <= ?")
        args.append(query.upto)
        for column, values, negate in (
            ("key", query.keys, False),
            ("type", query.types, False),
            ("sender", query.senders, False),
            ("sender", query.not_senders, True),
        ):
            if values is None or (negate and not values):
                continue
            marks = ", ".join("?" for _ in values) or "NULL"
            clauses.append(f"{column} {'NOT IN' if negate else 'IN'} ({marks})")
            args += list(values)
        if query.contains_url is not None:
            clauses.append("contains_url = ?")
            args.append(query.contains_url)
        return " AND ".join(clauses), args

    def _position_column(self) -> str:
        return "stream_ordering" if self.database_engine.name == "postgres" else "rowid"

    def _match(self, query: SearchQuery) -> tuple[str, str]:
        """``(FROM and match clause, the engine's query text)``."""
        if self.database_engine.name == "postgres":
            text = " & ".join(f"{word}:*" for word in query.words)
            return (
                f"event_search, to_tsquery('{TEXT_SEARCH_CONFIG}', ?) AS q WHERE vector @@ q",
                text,
            )
        text = " ".join(f'"{word}"*' for word in query.words)
        return "event_search WHERE event_search MATCH ?", text

    async def count_search_results(self, query: SearchQuery) -> int:
        """How many events the query finds."""
        if not query.words or not query.ranges:
            return 0
        match, text = self._match(query)
        where, args = self._where(query)
        rows = await self.db_pool.select(
            "count_search_results", f"SELECT COUNT(*) FROM {match} AND {where}", text, *args
        )
        return int(rows[0][0])

    async def search_events(
        self,
        query: SearchQuery,
        order_by: str,
        limit: int,
        *,
        below: int | None = None,
        offset: int = 0,
    ) -> list[SearchHit]:
        """At most ``limit`` events the query finds: by ``rank`` (best first,
        skipping ``offset``) or most ``recent`` first (below stream ordering
        ``below``)."""
        if not query.words or not query.ranges or limit <= 0:
            return []
        match, text = self._match(query)
        where, args = self._where(query)
        position = self._position_column()
        if self.database_engine.name == "postgres":
            rank = "ts_rank_cd(vector, q)"
            marked = f"ts_headline('{TEXT_SEARCH_CONFIG}', value, q, ?)"
            marked_args = [f"StartSel={_MARK_START}, StopSel={_MARK_END}, HighlightAll=TRUE"]
        else:
            rank = "-bm25(event_search)"
            marked = f"highlight(event_search, 0, '{_MARK_START}', '{_MARK_END}')"
            marked_args = []
        if order_by == "recent":
            if below is not None:
                where += f" AND {position} < ?"
                args.append(below)
            ordering = f"{position} DESC"
        else:
            ordering = f"{rank} DESC, {position} DESC"
        rows = await self.db_pool.select(
            "search_events",
            f"SELECT event_id, room_id, sender, {position}, {rank}, {marked}"
            f" FROM {match} AND {where} ORDER BY {ordering} LIMIT ? OFFSET ?",
            *marked_args,
            text,
            *args,
            limit,
            offset,
        )
        hits = []
        for event_id, room_id, sender, stream_ordering, score, value in rows:
            words = tuple(dict.fromkeys(w.strip() for w in _MARKED.findall(value or "")))
            hits.append(
                SearchHit(event_id, room_id, sender, int(stream_ordering), float(score), words)
            )
        return hits
