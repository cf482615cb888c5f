"""Sync filters: uploaded (``POST /user/{userId}/filter``) or inline in /sync.

A filter is validated once, when it is uploaded or read, into the frozen
values below; /sync then only asks them questions. Every part of the spec's
``Filter`` is honoured: ``presence``, ``account_data``, and under ``room``
``rooms``/``not_rooms``, ``include_leave`` and the ``timeline``, ``state``,
``ephemeral`` and ``account_data`` event filters (``types``, ``not_types``,
``senders``, ``not_senders``, ``rooms``, ``not_rooms``, ``contains_url``,
``limit``; a ``*`` in a type matches any run of characters), plus how
events are served (:class:`EventFormat`: ``event_format``, ``event_fields``),
which ``/messages`` and ``/context`` also read from their filter.
``lazy_load_members`` and ``include_redundant_members`` are validated
(booleans) and stored.
"""

from __future__ import annotations

import fnmatch
import json
from typing import TYPE_CHECKING, Any, Protocol

import attr

from synapse_lite.api.errors import Codes, NotFoundError, SynapseError
from synapse_lite.http.server import MAX_JSON_DEPTH
from synapse_lite.storage.caches import LruCache

if TYPE_CHECKING:
    pass

DEFAULT_TIMELINE_LIMIT = 10
MAX_TIMELINE_LIMIT = 500
MAX_FILTER_BYTES = 16_384
#: /sync filters kept parsed, by user and ``filter`` parameter.
PARSED_SYNC_FILTERS = 10_000
#: Inline filters longer than this are parsed on every /sync rather than
#: kept: clients' filters are a few hundred bytes, and keeping any size up
#: to ``MAX_FILTER_BYTES`` would let one user hold 160 MB of keys.
KEPT_INLINE_FILTER_BYTES = 2_048
EVENT_FORMATS = ("client", "federation")
#: The keys each part of a filter may hold: anything else is ignored, as the
#: spec asks of unknown keys, but a known key of the wrong type is a 400.
_LIST_KEYS = ("types", "not_types", "senders", "not_senders", "rooms", "not_rooms")
#: The lists of ids, with the sigil each id starts with.
_ID_KEYS = {
    "rooms": ("!", "a room id"),
    "not_rooms": ("!", "a room id"),
    "senders": ("@", "a user id"),
    "not_senders": ("@", "a user id"),
}
_BOOL_KEYS = (
    "contains_url",
    "lazy_load_members",
    "include_redundant_members",
    "unread_thread_notifications",
)


def _bad(message: str) -> SynapseError:
    return SynapseError(400, message, Codes.BAD_JSON)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class EventFilter:
    """Which events of one section to return: the spec's ``EventFilter`` and
    ``RoomEventFilter`` in one (a ``None`` list allows everything; ``limit``
    None means the section's default)."""

    types: tuple[str, ...] | None = None
    not_types: tuple[str, ...] = ()
    senders: tuple[str, ...] | None = None
    not_senders: tuple[str, ...] = ()
    rooms: tuple[str, ...] | None = None
    not_rooms: tuple[str, ...] = ()
    #: True: only events with a string ``content.url``; False: only without.
    contains_url: bool | None = None
    limit: int | None = None
    lazy_load_members: bool = False
    include_redundant_members: bool = False

    @property
    def allows_all(self) -> bool:
        """Whether no event is ever filtered out (a cheap path for /sync)."""
        return (
            self.types is None
            and not self.not_types
            and self.senders is None
            and not self.not_senders
            and self.rooms is None
            and not self.not_rooms
            and self.contains_url is None
        )

    def allows_room(self, room_id: str) -> bool:
        if room_id in self.not_rooms:
            return False
        return self.rooms is None or room_id in self.rooms

    def allows_type(self, event_type: str) -> bool:
        """Whether ``types`` and ``not_types`` let events of this type pass."""
        if any(fnmatch.fnmatchcase(event_type, t) for t in self.not_types):
            return False
        return self.types is None or any(fnmatch.fnmatchcase(event_type, t) for t in self.types)

    def matches(
        self,
        event_type: str,
        sender: str,
        room_id: str | None = None,
        content: Any = None,
    ) -> bool:
        """Whether an event with these fields passes (``room_id`` None: not a
        room event, the room lists do not apply)."""
        if not self.allows_type(event_type):
            return False
        if sender in self.not_senders:
            return False
        if self.senders is not None and sender not in self.senders:
            return False
        if room_id is not None and not self.allows_room(room_id):
            return False
        if self.contains_url is not None:
            has_url = isinstance(content, dict) and isinstance(content.get("url"), str)
            if has_url != self.contains_url:
                return False
        return True

    def allows(self, event: dict[str, Any]) -> bool:
        """Whether an event in its client form passes."""
        room_id = event.get("room_id")
        return self.matches(
            str(event.get("type", "")),
            str(event.get("sender", "")),
            room_id if isinstance(room_id, str) else None,
            event.get("content"),
        )

    @classmethod
    def parse(cls, definition: Any, where: str) -> EventFilter:
        if definition is None:
            return cls()
        if not isinstance(definition, dict):
            raise _bad(f"'{where}' must be an object")
        lists: dict[str, tuple[str, ...] | None] = {}
        for key in _LIST_KEYS:
            value = definition.get(key)
            if value is not None and (
                not isinstance(value, list) or not all(isinstance(v, str) for v in value)
            ):
                raise _bad(f"'{where}.{key}' must be a list of strings")
            if value is not None and key in _ID_KEYS:
                sigil, what = _ID_KEYS[key]
                for item in value:
                    if not item.startswith(sigil) or ":" not in item:
                        raise _bad(f"'{where}.{key}' holds {item[:100]!r}, not {what}")
            lists[key] = None if value is None else tuple(value)
        flags: dict[str, bool | None] = {}
        for key in _BOOL_KEYS:
            value = definition.get(key)
            if value is not None and not isinstance(value, bool):
                raise _bad(f"'{where}.{key}' must be true or false")
            flags[key] = value
        limit = definition.get("limit")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise _bad(f"'{where}.limit' must be an integer")
        if limit is not None and limit < 0:
            raise _bad(f"'{where}.limit' must not be negative")
        return cls(
            types=lists["types"],
            not_types=lists["not_types"] or (),
            senders=lists["senders"],
            not_senders=lists["not_senders"] or (),
            rooms=lists["rooms"],
            not_rooms=lists["not_rooms"] or (),
            contains_url=flags["contains_url"],
            limit=limit,
            lazy_load_members=bool(flags["lazy_load_members"]),
            include_redundant_members=bool(flags["include_redundant_members"]),
        )


@attr.s(slots=True, frozen=True, auto_attribs=True)
class EventFormat:
    """How room events are served: the spec's ``event_format`` and
    ``event_fields`` (the default: the client format, every field)."""

    #: ``event_format: federation``: the event as federation has it (its PDU).
    federation: bool = False
    #: ``event_fields``: the dot-separated paths to keep (None: all of them).
    fields: tuple[str, ...] | None = None

    @classmethod
    def parse(cls, definition: dict[str, Any]) -> EventFormat:
        """The ``event_format`` and ``event_fields`` of a filter object (or a
        400 ``M_BAD_JSON`` naming the key)."""
        fields = definition.get("event_fields")
        if fields is not None and (
            not isinstance(fields, list) or not all(isinstance(f, str) for f in fields)
        ):
            raise _bad("'event_fields' must be a list of strings")
        event_format = definition.get("event_format", "client")
        if event_format not in EVENT_FORMATS:
            raise _bad("'event_format' must be 'client' or 'federation'")
        return cls(
            federation=event_format == "federation",
            fields=None if fields is None else tuple(fields),
        )


CLIENT_FORMAT = EventFormat()


@attr.s(slots=True, frozen=True, auto_attribs=True)
class SyncFilter:
    """What a filter changes about /sync."""

    timeline: EventFilter = attr.ib(factory=EventFilter)
    state: EventFilter = attr.ib(factory=EventFilter)
    ephemeral: EventFilter = attr.ib(factory=EventFilter)
    room_account_data: EventFilter = attr.ib(factory=EventFilter)
    presence: EventFilter = attr.ib(factory=EventFilter)
    account_data: EventFilter = attr.ib(factory=EventFilter)
    #: ``room.rooms`` / ``room.not_rooms``: which rooms appear at all.
    rooms: EventFilter = attr.ib(factory=EventFilter)
    include_leave: bool = False
    event_format: EventFormat = CLIENT_FORMAT

    @property
    def timeline_limit(self) -> int:
        limit = self.timeline.limit
        return DEFAULT_TIMELINE_LIMIT if limit is None else min(limit, MAX_TIMELINE_LIMIT)

    def allows_room(self, room_id: str) -> bool:
        return self.rooms.allows_room(room_id)


def _depth(value: Any, depth: int = 0) -> int:
    if depth > MAX_JSON_DEPTH:
        return depth
    if isinstance(value, dict):
        return max([depth, *(_depth(v, depth + 1) for v in value.values())])
    if isinstance(value, list):
        return max([depth, *(_depth(v, depth + 1) for v in value)])
    return depth


def parse_filter(definition: Any) -> SyncFilter:
    """Validate a filter definition (or a 400 ``M_BAD_JSON`` naming the key)."""
    if not isinstance(definition, dict):
        raise _bad("A filter must be a JSON object")
    if _depth(definition) > MAX_JSON_DEPTH:
        raise _bad("The filter is nested too deeply")
    room = definition.get("room", {})
    if not isinstance(room, dict):
        raise _bad("'room' must be an object")
    include_leave = room.get("include_leave", False)
    if not isinstance(include_leave, bool):
        raise _bad("'room.include_leave' must be true or false")
    return SyncFilter(
        timeline=EventFilter.parse(room.get("timeline"), "room.timeline"),
        state=EventFilter.parse(room.get("state"), "room.state"),
        ephemeral=EventFilter.parse(room.get("ephemeral"), "room.ephemeral"),
        room_account_data=EventFilter.parse(room.get("account_data"), "room.account_data"),
        presence=EventFilter.parse(definition.get("presence"), "presence"),
        account_data=EventFilter.parse(definition.get("account_data"), "account_data"),
        rooms=EventFilter.parse({k: room[k] for k in ("rooms", "not_rooms") if k in room}, "room"),
        include_leave=include_leave,
        event_format=EventFormat.parse(definition),
    )


def _inline_filter(param: str) -> Any:
    """A filter given as JSON in a query parameter, decoded (not yet
    validated): 413 when too large, 400 ``M_NOT_JSON`` when not JSON."""
    if len(param) > MAX_FILTER_BYTES:
        raise SynapseError(400, "The filter is too large", Codes.TOO_LARGE)
    try:
        definition = json.loads(param)
    except (ValueError, RecursionError):
        raise SynapseError(400, "The filter is not JSON", Codes.NOT_JSON) from None
    if _depth(definition) > MAX_JSON_DEPTH:
        raise _bad("The filter is nested too deeply")
    return definition


def parse_room_event_filter(param: str | None) -> tuple[EventFilter | None, EventFormat]:
    """The ``filter`` query parameter of ``/messages`` and ``/context``: a
    ``RoomEventFilter`` as JSON (None when there is none), and the
    ``event_format`` and ``event_fields`` it may hold as a ``Filter`` does
    (the spec's ``RoomEventFilter`` has neither; they are honoured rather
    than ignored, as the reference server honours ``event_format``)."""
    if param is None:
        return None, CLIENT_FORMAT
    definition = _inline_filter(param)
    event_filter = EventFilter.parse(definition, "filter")
    return event_filter, EventFormat.parse(definition)


def field_path(field: str) -> list[str]:
    """The keys a dot-separated property path names (the spec's appendix):
    ``\\.`` is a literal dot, ``\\\\`` a literal backslash, and a backslash
    before anything else is itself (``content.m\\.relates_to`` ->
    ``["content", "m.relates_to"]``)."""
    parts: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(field):
        char = field[i]
        if char == "\\" and i + 1 < len(field) and field[i + 1] in ".\\":
            current.append(field[i + 1])
            i += 2
            continue
        if char == ".":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    parts.append("".join(current))
    return parts


def only_fields(event: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """``event`` with only the ``event_fields`` paths that exist in it (a path
    to a missing key, or through a non-object, is skipped)."""
    kept: dict[str, Any] = {}
    for field in fields:
        path = field_path(field)
        source: Any = event
        for key in path:
            if not isinstance(source, dict) or key not in source:
                break
            source = source[key]
        else:
            target = kept
            for key in path[:-1]:
                target = target.setdefault(key, {})
            target[path[-1]] = source
    return kept


class FilterStore(Protocol):
    """The store reads of :class:`FilteringHandler`."""

    async def add_user_filter(self, user_id: str, filter_json: dict[str, Any]) -> int: ...

    async def get_user_filter(self, user_id: str, filter_id: int) -> dict[str, Any] | None: ...


class FilteringHandler:
    """Storing and reading filters."""

    def __init__(self, store: FilterStore) -> None:
        self._store = store
        #: What ``get_sync_filter`` answered, by (user, parameter). Never
        #: stale: a stored filter is never changed or deleted (its id is
        #: never reused), and an inline filter is its own parameter.
        #: Refusals are not kept: a filter id unknown here may be stored
        #: later, by any process.
        self._parsed: LruCache[SyncFilter] = LruCache(PARSED_SYNC_FILTERS)

    async def add_filter(self, user_id: str, definition: dict[str, Any]) -> int:
        parse_filter(definition)
        if len(json.dumps(definition)) > MAX_FILTER_BYTES:
            raise SynapseError(400, "The filter is too large", Codes.TOO_LARGE)
        return await self._store.add_user_filter(user_id, definition)

    async def get_filter(self, user_id: str, filter_id: str) -> dict[str, Any]:
        if not filter_id.isascii() or not filter_id.isdigit() or len(filter_id) > 18:
            raise SynapseError(400, "Invalid filter id", Codes.INVALID_PARAM)
        definition = await self._store.get_user_filter(user_id, int(filter_id))
        if definition is None:
            raise NotFoundError("No such filter")
        return definition

    async def get_sync_filter(self, user_id: str, param: str | None) -> SyncFilter:
        """The ``filter`` query parameter of /sync: a filter id or inline JSON.
        Parsed once per user and parameter: every /sync of a client names the
        same filter, and a filter id would otherwise be a database read per
        /sync."""
        if param is None:
            return SyncFilter()
        found, parsed = self._parsed.get((user_id, param))
        if found:
            assert parsed is not None
            return parsed
        if param.lstrip().startswith("{"):
            parsed = parse_filter(_inline_filter(param))
            if len(param) > KEPT_INLINE_FILTER_BYTES:
                return parsed
        else:
            parsed = parse_filter(await self.get_filter(user_id, param))
        self._parsed.set((user_id, param), parsed)
        return parsed
