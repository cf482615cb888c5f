"""The sliding sync request body, checked at the edge.

Both shapes clients send are accepted (see docs/sliding-sync.md): the one
Element X and matrix-rust-sdk speak today (``ranges``, ``required_state`` as
``[type, state_key]`` pairs with ``$LAZY``/``$ME``/``*``, ``is_invite``) and the
MSC's current text (``range``, ``required_state`` as ``include``/``exclude``/
``lazy_members``, ``is_invited``, ``pos``/``timeout`` in the body). Anything
else malformed is a 400 naming the key at fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attr

from synapse_lite.api.errors import Codes, SynapseError

#: The MSC's limits on lists and subscriptions per request.
MAX_LISTS = 100
MAX_SUBSCRIPTIONS = 100
#: The largest timeline a room config gets (the /sync filter's cap too).
MAX_TIMELINE_LIMIT = 100
#: The extensions served; others are ignored, as the MSC lets a server do.
EXTENSIONS = ("to_device", "e2ee", "account_data", "receipts", "typing")
PRESENCE_VALUES = ("online", "offline", "unavailable")
#: A state key meaning "the syncing user" / a type or key matching anything.
ME = "$ME"
WILDCARD = "*"
LAZY = "$LAZY"

#: A state pattern: ``(type or None, state_key or None)``; None matches any.
StatePattern = tuple[str | None, str | None]


def _bad(key: str, what: str) -> SynapseError:
    return SynapseError(400, f"'{key}' {what}", Codes.INVALID_PARAM)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RequiredState:
    """What state a room config asks for. ``$ME`` stays as written (it is
    the syncing user, substituted when matching)."""

    include: frozenset[StatePattern] = frozenset()
    exclude: frozenset[StatePattern] = frozenset()
    lazy_members: bool = False

    def combined(self, other: RequiredState) -> RequiredState:
        """The superset of two configs (the MSC's "combining room configs"):
        union of includes; an exclude only where both exclude it; lazy
        members only if one is lazy and neither asks for every member."""
        every_member = any(
            p in (("m.room.member", None), (None, None)) for p in self.include | other.include
        )
        return RequiredState(
            include=self.include | other.include,
            exclude=self.exclude & other.exclude,
            lazy_members=(self.lazy_members or other.lazy_members) and not every_member,
        )

    def as_json(self) -> list[Any]:
        """A canonical, comparable form (kept in the connection state)."""
        return [
            sorted([t or "", k or "", t is None, k is None] for t, k in self.include),
            sorted([t or "", k or "", t is None, k is None] for t, k in self.exclude),
            self.lazy_members,
        ]


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RoomConfig:
    timeline_limit: int
    required_state: RequiredState

    def combined(self, other: RoomConfig) -> RoomConfig:
        return RoomConfig(
            max(self.timeline_limit, other.timeline_limit),
            self.required_state.combined(other.required_state),
        )


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ListFilters:
    """A list's ``filters``; None: not filtered on that."""

    is_dm: bool | None = None
    is_invite: bool | None = None
    is_encrypted: bool | None = None
    #: Entries may be None: rooms without a type.
    room_types: tuple[str | None, ...] | None = None
    not_room_types: tuple[str | None, ...] = ()
    spaces: tuple[str, ...] | None = None
    tags: tuple[str, ...] | None = None
    not_tags: tuple[str, ...] = ()


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ListConfig:
    config: RoomConfig
    #: Inclusive index ranges into the filtered, ordered list; None: all.
    ranges: tuple[tuple[int, int], ...] | None
    filters: ListFilters


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ExtensionConfig:
    """One extension's request: enabled, and its ``lists``/``rooms`` scope
    (None: every list / every subscription, as when given ``["*"]``)."""

    lists: tuple[str, ...] | None = None
    rooms: tuple[str, ...] | None = None
    #: ``to_device`` only: the client's own position in its messages.
    since: int | None = None


@attr.s(slots=True, frozen=True, auto_attribs=True)
class SlidingSyncBody:
    conn_id: str = ""
    pos: str | None = None
    timeout_ms: int = 0
    set_presence: str = "online"
    lists: Mapping[str, ListConfig] = attr.Factory(dict)
    room_subscriptions: Mapping[str, RoomConfig] = attr.Factory(dict)
    extensions: Mapping[str, ExtensionConfig] = attr.Factory(dict)


def _or_empty(value: Any) -> Any:
    """A missing or null object is an empty one."""
    return {} if value is None else value


def _string(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise _bad(key, "must be a string")
    return value


def _bool(value: Any, key: str) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise _bad(key, "must be true or false")
    return value


def _int(value: Any, key: str, maximum: int = 2**53) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise _bad(key, f"must be an integer from 0 to {maximum}")
    return value


def _object(value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(key, "must be a JSON object")
    return value


def _strings(value: Any, key: str, nullable: bool = False) -> tuple[Any, ...]:
    if not isinstance(value, list) or not all(
        isinstance(v, str) or (nullable and v is None) for v in value
    ):
        kind = "strings or nulls" if nullable else "strings"
        raise _bad(key, f"must be a list of {kind}")
    return tuple(value)


def _pattern_value(value: Any, key: str) -> str | None:
    if value is None or value == WILDCARD:
        return None
    return _string(value, key)


def parse_required_state(value: Any, key: str) -> RequiredState:
    """``required_state`` in either shape."""
    if isinstance(value, list):
        include: set[StatePattern] = set()
        lazy = False
        for i, pair in enumerate(value):
            where = f"{key}[{i}]"
            if not isinstance(pair, list) or len(pair) != 2:
                raise _bad(where, "must be a [type, state_key] pair")
            event_type = _string(pair[0], where + "[0]")
            state_key = _string(pair[1], where + "[1]")
            if event_type == "m.room.member" and state_key == LAZY:
                lazy = True
                continue
            include.add(
                (
                    None if event_type == WILDCARD else event_type,
                    None if state_key == WILDCARD else state_key,
                )
            )
        return RequiredState(frozenset(include), frozenset(), lazy)
    body = _object(value, key)
    patterns: dict[str, frozenset[StatePattern]] = {}
    for part in ("include", "exclude"):
        items = body.get(part, [])
        if not isinstance(items, list):
            raise _bad(f"{key}.{part}", "must be a list of objects")
        found: set[StatePattern] = set()
        for i, item in enumerate(items):
            where = f"{key}.{part}[{i}]"
            element = _object(item, where)
            found.add(
                (
                    _pattern_value(element.get("type"), where + ".type"),
                    _pattern_value(element.get("state_key"), where + ".state_key"),
                )
            )
        patterns[part] = frozenset(found)
    lazy_value = _bool(body.get("lazy_members"), f"{key}.lazy_members")
    return RequiredState(patterns["include"], patterns["exclude"], bool(lazy_value))


def parse_room_config(value: dict[str, Any], key: str) -> RoomConfig:
    limit = value.get("timeline_limit", 0)
    return RoomConfig(
        min(_int(limit, f"{key}.timeline_limit"), MAX_TIMELINE_LIMIT),
        parse_required_state(value.get("required_state", []), f"{key}.required_state"),
    )


def _range(value: Any, key: str) -> tuple[int, int]:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        or value[0] > value[1]
    ):
        raise _bad(key, "must be [start, end], integers with 0 <= start <= end")
    return (value[0], value[1])


def parse_filters(value: Any, key: str) -> ListFilters:
    body = _object(value, key)

    def optional_strings(name: str, nullable: bool = False) -> tuple[Any, ...] | None:
        return None if name not in body else _strings(body[name], f"{key}.{name}", nullable)

    is_invite = body.get("is_invited", body.get("is_invite"))
    return ListFilters(
        is_dm=_bool(body.get("is_dm"), f"{key}.is_dm"),
        is_invite=_bool(is_invite, f"{key}.is_invited"),
        is_encrypted=_bool(body.get("is_encrypted"), f"{key}.is_encrypted"),
        room_types=optional_strings("room_types", nullable=True),
        not_room_types=optional_strings("not_room_types", nullable=True) or (),
        spaces=optional_strings("spaces"),
        tags=optional_strings("tags"),
        not_tags=optional_strings("not_tags") or (),
    )


def parse_list(value: Any, key: str) -> ListConfig:
    body = _object(value, key)
    ranges: tuple[tuple[int, int], ...] | None = None
    if "ranges" in body:
        if not isinstance(body["ranges"], list):
            raise _bad(f"{key}.ranges", "must be a list of [start, end] ranges")
        ranges = tuple(_range(r, f"{key}.ranges[{i}]") for i, r in enumerate(body["ranges"]))
    elif "range" in body:
        ranges = (_range(body["range"], f"{key}.range"),)
    return ListConfig(
        parse_room_config(body, key),
        ranges,
        parse_filters(body.get("filters", {}), f"{key}.filters"),
    )


def _scope(value: Any, key: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = _strings(value, key)
    return None if WILDCARD in names else names


def parse_extension(name: str, value: Any) -> ExtensionConfig | None:
    """The config of an enabled extension, or None when it is disabled."""
    key = f"extensions.{name}"
    body = _object(value, key)
    if not _bool(body.get("enabled"), f"{key}.enabled"):
        return None
    since: int | None = None
    if name == "to_device" and body.get("since") is not None:
        raw = _string(body["since"], f"{key}.since")
        if not raw.isdigit() or len(raw) > 18:
            raise _bad(f"{key}.since", "must be a position this server handed out")
        since = int(raw)
    return ExtensionConfig(
        lists=_scope(body.get("lists"), f"{key}.lists"),
        rooms=_scope(body.get("rooms"), f"{key}.rooms"),
        since=since,
    )


def parse_body(
    body: dict[str, Any],
    pos: str | None = None,
    timeout_ms: int | None = None,
    set_presence: str | None = None,
) -> SlidingSyncBody:
    """The request: ``body`` with the query's ``pos``, ``timeout`` and
    ``set_presence`` (where the older clients put them); the body's win."""
    conn_id = body.get("conn_id", "")
    conn_id = "" if conn_id is None else _string(conn_id, "conn_id")
    if len(conn_id) > 255:
        raise _bad("conn_id", "must be at most 255 characters")
    if body.get("pos") is not None:
        pos = _string(body["pos"], "pos")
    if body.get("timeout") is not None:
        timeout_ms = _int(body["timeout"], "timeout")
    if body.get("set_presence") is not None:
        set_presence = _string(body["set_presence"], "set_presence")
    set_presence = set_presence or "online"
    if set_presence not in PRESENCE_VALUES:
        raise _bad("set_presence", f"must be one of {', '.join(PRESENCE_VALUES)}")
    lists_body = _object(_or_empty(body.get("lists")), "lists")
    if len(lists_body) > MAX_LISTS:
        raise _bad("lists", f"may hold at most {MAX_LISTS} lists")
    lists = {name: parse_list(value, f"lists.{name}") for name, value in lists_body.items()}
    subs_body = _object(_or_empty(body.get("room_subscriptions")), "room_subscriptions")
    if len(subs_body) > MAX_SUBSCRIPTIONS:
        raise _bad("room_subscriptions", f"may hold at most {MAX_SUBSCRIPTIONS} rooms")
    subscriptions = {}
    for room_id, value in subs_body.items():
        key = f"room_subscriptions.{room_id}"
        if not room_id.startswith("!"):
            raise _bad(key, "is not a room id")
        subscriptions[room_id] = parse_room_config(_object(value, key), key)
    extensions_body = _object(_or_empty(body.get("extensions")), "extensions")
    extensions = {}
    for name in EXTENSIONS:
        if name in extensions_body:
            config = parse_extension(name, extensions_body[name])
            if config is not None:
                extensions[name] = config
    return SlidingSyncBody(
        conn_id=conn_id,
        pos=pos,
        timeout_ms=timeout_ms or 0,
        set_presence=set_presence,
        lists=lists,
        room_subscriptions=subscriptions,
        extensions=extensions,
    )
