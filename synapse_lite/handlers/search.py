"""Server-side search (``POST /search``, the spec's ``room_events`` category).

What is searched: every room the user has been in, left ones too (as the
spec's search module says), and in each only the events they may see there
(``RoomVisibility.visible_ranges``: the rule of ``/messages``, applied inside
the query, so counts and pages are exact). The index itself
(``storage/databases/main/search.py``) is filled by the events writers and
read here from the shared database, so any process answers.

Pages: ``recent`` pages continue below the last event returned; ``rank``
pages are offsets into the ranking of the events that existed when the first
page was asked for (events sent since are left out; ranks of the others can
still move a little as the index grows). A page's ``next_batch`` is absent
once nothing is left. A group's ``next_batch`` continues within that group.
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.handlers.client_events import ClientEventFormatter
from synapse_lite.handlers.filtering import EventFilter
from synapse_lite.handlers.ignored_users import get_ignored_users
from synapse_lite.handlers.visibility import RoomVisibility, load_room_visibility
from synapse_lite.storage.databases.main.search import (
    SEARCHED_KEYS,
    SearchHit,
    SearchQuery,
    search_words,
)

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.events import Event
    from synapse_lite.handlers.auth import Requester
    from synapse_lite.handlers.pagination import PaginationHandler
    from synapse_lite.storage.databases.main import GenericWorkerStore

ORDERS = ("rank", "recent")
GROUP_KEYS = ("room_id", "sender")
#: Results per page unless the filter's ``limit`` says otherwise, and at most.
DEFAULT_LIMIT = 10
MAX_LIMIT = 100
#: Events of context on each side unless asked, and at most.
DEFAULT_CONTEXT = 5
MAX_CONTEXT = 100
MAX_TERM_LENGTH = 1_000
_NOT_OUR_TOKEN = "'next_batch' is not a token this server gave"


def _bad(message: str, errcode: str = Codes.BAD_JSON) -> SynapseError:
    return SynapseError(400, message, errcode)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class SearchPosition:
    """Where a page of results starts (a ``next_batch``, encoded opaque):
    below a stream ordering (``recent``) or after ``offset`` results
    (``rank``), among the events up to ``upto``; within one room or one
    sender's results for a group's ``next_batch``."""

    order_by: str
    upto: int
    below: int | None = None
    offset: int = 0
    room_id: str | None = None
    sender: str | None = None

    def encode(self) -> str:
        fields = {k: v for k, v in attr.asdict(self).items() if v is not None}
        raw = json.dumps(fields, separators=(",", ":")).encode("utf-8")
        return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")

    @classmethod
    def decode(cls, token: str) -> SearchPosition:
        """A token this server handed out, or a 400."""
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            fields = json.loads(raw)
            position = cls(
                order_by=fields["order_by"],
                upto=fields["upto"],
                below=fields.get("below"),
                offset=fields.get("offset", 0),
                room_id=fields.get("room_id"),
                sender=fields.get("sender"),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            raise _bad(_NOT_OUR_TOKEN, Codes.INVALID_PARAM) from None
        ints_ok = all(
            isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**63
            for v in (position.upto, position.offset, position.below or 0)
        )
        texts_ok = all(v is None or isinstance(v, str) for v in (position.room_id, position.sender))
        if position.order_by not in ORDERS or not ints_ok or not texts_ok or position.offset < 0:
            raise _bad(_NOT_OUR_TOKEN, Codes.INVALID_PARAM)
        return position


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RoomEventsCriteria:
    """A checked ``room_events`` object."""

    search_term: str
    keys: tuple[str, ...]
    event_filter: EventFilter
    order_by: str
    before_limit: int | None
    after_limit: int | None
    include_profile: bool
    include_state: bool
    group_by: tuple[str, ...]

    @property
    def wants_context(self) -> bool:
        return self.before_limit is not None

    @classmethod
    def parse(cls, body: Any) -> RoomEventsCriteria:
        if not isinstance(body, dict):
            raise _bad("'search_categories.room_events' must be an object")
        term = body.get("search_term")
        if term is None:
            raise _bad("'search_term' is required", Codes.MISSING_PARAM)
        if not isinstance(term, str) or len(term) > MAX_TERM_LENGTH or "\x00" in term:
            raise _bad(f"'search_term' must be a string of at most {MAX_TERM_LENGTH} characters")
        keys = body.get("keys", list(SEARCHED_KEYS.values()))
        if not isinstance(keys, list) or not all(k in SEARCHED_KEYS.values() for k in keys):
            raise _bad(f"'keys' must be a list of {', '.join(SEARCHED_KEYS.values())}")
        order_by = body.get("order_by", "rank")
        if order_by not in ORDERS:
            raise _bad("'order_by' must be 'rank' or 'recent'")
        before = after = None
        include_profile = False
        context = body.get("event_context")
        if context is not None:
            if not isinstance(context, dict):
                raise _bad("'event_context' must be an object")
            before = _context_limit(context, "before_limit")
            after = _context_limit(context, "after_limit")
            include_profile = context.get("include_profile", False)
            if not isinstance(include_profile, bool):
                raise _bad("'event_context.include_profile' must be true or false")
        include_state = body.get("include_state", False)
        if not isinstance(include_state, bool):
            raise _bad("'include_state' must be true or false")
        return cls(
            search_term=term,
            keys=tuple(dict.fromkeys(keys)),
            event_filter=EventFilter.parse(body.get("filter"), "filter"),
            order_by=order_by,
            before_limit=before,
            after_limit=after,
            include_profile=include_profile,
            include_state=include_state,
            group_by=_group_keys(body.get("groupings")),
        )


def _context_limit(context: dict[str, Any], name: str) -> int:
    value = context.get(name, DEFAULT_CONTEXT)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_CONTEXT:
        raise _bad(f"'event_context.{name}' must be an integer from 0 to {MAX_CONTEXT}")
    return value


def _group_keys(groupings: Any) -> tuple[str, ...]:
    if groupings is None:
        return ()
    group_by = groupings.get("group_by", []) if isinstance(groupings, dict) else None
    if not isinstance(group_by, list):
        raise _bad("'groupings' must be an object with a 'group_by' list")
    keys = []
    for group in group_by:
        key = group.get("key") if isinstance(group, dict) else None
        if key not in GROUP_KEYS:
            raise _bad("Each of 'groupings.group_by' is {'key': 'room_id'} or {'key': 'sender'}")
        keys.append(key)
    return tuple(dict.fromkeys(keys))


class SearchHandler:
    """``POST /search`` for one user."""

    def __init__(
        self, store: GenericWorkerStore, clock: Clock, pagination: PaginationHandler
    ) -> None:
        self._store = store
        self._clock = clock
        self._pagination = pagination
        self._formatter = ClientEventFormatter(store)

    async def search(
        self, requester: Requester, body: dict[str, Any], next_batch: str | None
    ) -> dict[str, Any]:
        categories = body.get("search_categories")
        if not isinstance(categories, dict):
            raise _bad("'search_categories' must be an object", Codes.MISSING_PARAM)
        # The spec's one category; others would be ignored as unknown keys.
        if "room_events" not in categories:
            return {"search_categories": {}}
        criteria = RoomEventsCriteria.parse(categories["room_events"])
        position = SearchPosition.decode(next_batch) if next_batch is not None else None
        if position is not None and position.order_by != criteria.order_by:
            raise _bad("'next_batch' is from a search ordered otherwise", Codes.INVALID_PARAM)
        result = await self._room_events(requester, criteria, position)
        return {"search_categories": {"room_events": result}}

    async def _room_events(
        self, requester: Requester, criteria: RoomEventsCriteria, position: SearchPosition | None
    ) -> dict[str, Any]:
        user_id = requester.user_id
        event_filter = criteria.event_filter
        if position is None:
            position = SearchPosition(criteria.order_by, self._store.get_room_max_stream_ordering())
        views = await self._visible_rooms(user_id, event_filter, position.room_id)
        ignored = await get_ignored_users(self._store, user_id)
        senders = event_filter.senders
        if position.sender is not None:
            senders = (position.sender,) if senders is None or position.sender in senders else ()
        query = SearchQuery(
            words=search_words(criteria.search_term),
            keys=criteria.keys,
            ranges=tuple(
                (room_id, start, end)
                for room_id, view in sorted(views.items())
                for start, end in view.visible_ranges()
            ),
            upto=position.upto,
            types=tuple(t for t in SEARCHED_KEYS if event_filter.allows_type(t)),
            senders=senders,
            not_senders=tuple(sorted(set(event_filter.not_senders) | ignored)),
            contains_url=event_filter.contains_url,
        )
        limit = min(event_filter.limit or DEFAULT_LIMIT, MAX_LIMIT)
        hits = await self._store.search_events(
            query, criteria.order_by, limit + 1, below=position.below, offset=position.offset
        )
        more = len(hits) > limit
        hits = hits[:limit]
        events = await self._store.get_events([h.event_id for h in hits])
        # The index is current with the events; a redaction racing this
        # search may still prune one: left out rather than shown redacted.
        shown = [
            (h, events[h.event_id])
            for h in hits
            if h.event_id in events
            and events[h.event_id].redacted_because is None
            and views[h.room_id].can_see(events[h.event_id])
        ]
        now_ms = self._clock.time_msec()
        formatted = await self._formatter.format(requester, [e for _, e in shown], now_ms)
        results = []
        for (hit, event), client_event in zip(shown, formatted, strict=True):
            result: dict[str, Any] = {"rank": hit.rank, "result": client_event}
            if criteria.wants_context:
                result["context"] = await self._context(
                    requester, criteria, views[hit.room_id], event, now_ms
                )
            results.append(result)
        answer: dict[str, Any] = {
            "count": await self._store.count_search_results(query),
            "highlights": sorted({w for h in hits for w in h.matched_words}),
            "results": results,
        }
        following = _following(position, criteria.order_by, hits)
        if more:
            answer["next_batch"] = following.encode()
        if criteria.group_by:
            # A group's next page starts after its results so far: for rank
            # pages, those among everything ranked up to this page's end.
            ranked_so_far = hits
            if more and criteria.order_by == "rank" and position.offset:
                ranked_so_far = await self._store.search_events(
                    query, "rank", position.offset + len(hits)
                )
            answer["groups"] = _groups(
                criteria.group_by, hits, ranked_so_far, following if more else None
            )
        if criteria.include_state:
            answer["state"] = {
                room_id: [
                    e.to_client_dict(now_ms)
                    for e in await self._pagination.get_state(requester, room_id)
                ]
                for room_id in dict.fromkeys(h.room_id for h, _ in shown)
            }
        return answer

    async def _visible_rooms(
        self, user_id: str, event_filter: EventFilter, only_room: str | None
    ) -> dict[str, RoomVisibility]:
        """The user's view of every room they have been in that the filter
        allows (one room for a room group's next page)."""
        views = {}
        for room_id in await self._store.get_rooms_ever_in(user_id):
            if not event_filter.allows_room(room_id):
                continue
            if only_room is not None and room_id != only_room:
                continue
            views[room_id] = await load_room_visibility(self._store, user_id, room_id)
        return views

    async def _context(
        self,
        requester: Requester,
        criteria: RoomEventsCriteria,
        visibility: RoomVisibility,
        event: Event,
        now_ms: int,
    ) -> dict[str, Any]:
        """The spec's ``EventContext`` of one result."""
        assert criteria.before_limit is not None and criteria.after_limit is not None
        before, after, start, end = await self._pagination.events_around(
            visibility, event, criteria.before_limit, criteria.after_limit
        )
        context: dict[str, Any] = {
            "start": await self._store.room_token_to_string(start),
            "end": await self._store.room_token_to_string(end),
            "events_before": await self._formatter.format(requester, before, now_ms),
            "events_after": await self._formatter.format(requester, after, now_ms),
        }
        if criteria.include_profile:
            profiles: dict[str, Any] = {}
            for shown in [event, *before, *after]:
                if shown.sender in profiles:
                    continue
                member = await self._store.get_member_content_at(
                    event.room_id, shown.sender, shown.stream_ordering
                )
                profile = {
                    k: v
                    for k, v in (member or {}).items()
                    if k in ("displayname", "avatar_url") and isinstance(v, str)
                }
                profiles[shown.sender] = profile
            context["profile_info"] = profiles
        return context


def _following(position: SearchPosition, order_by: str, hits: list[SearchHit]) -> SearchPosition:
    """Where the page after ``hits`` starts."""
    if order_by == "recent":
        below = hits[-1].stream_ordering if hits else position.below
        return attr.evolve(position, below=below)
    return attr.evolve(position, offset=position.offset + len(hits))


def _groups(
    group_by: tuple[str, ...],
    hits: list[SearchHit],
    ranked_so_far: list[SearchHit],
    following: SearchPosition | None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """The page's results partitioned by room and/or sender, groups in order
    of first appearance. While the search goes on (``following``), each
    group's ``next_batch`` continues within the group: ``recent``, below the
    page's last result (the group's newer results are all shown by now);
    ``rank``, after the group's results among ``ranked_so_far`` (the ranking
    up to this page's end)."""
    groups: dict[str, dict[str, dict[str, Any]]] = {}
    for key in group_by:
        by_value: dict[str, dict[str, Any]] = {}
        for hit in hits:
            group = by_value.setdefault(
                _group_value(hit, key), {"order": len(by_value) + 1, "results": []}
            )
            group["results"].append(hit.event_id)
        if following is not None:
            for value, group in by_value.items():
                if key == "room_id":
                    within = attr.evolve(following, room_id=value)
                else:
                    within = attr.evolve(following, sender=value)
                if following.order_by == "rank":
                    seen = sum(1 for h in ranked_so_far if _group_value(h, key) == value)
                    within = attr.evolve(within, offset=seen)
                group["next_batch"] = within.encode()
        groups[key] = by_value
    return groups


def _group_value(hit: SearchHit, key: str) -> str:
    return hit.room_id if key == "room_id" else hit.sender
