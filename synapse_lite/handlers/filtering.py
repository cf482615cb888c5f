"""Sync filters: uploaded (``POST /user/{userId}/filter``) or inline in /sync.

What changes what /sync returns: the room timeline limit, and the
``presence`` filter (``types``, ``not_types``, ``senders``, ``not_senders``;
``*`` matches any run of characters in a type). The rest of a filter is
accepted and stored unchanged (documented in docs/client-api.md).
"""

from __future__ import annotations

import fnmatch
import json
from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.api.errors import Codes, NotFoundError, SynapseError
from synapse_lite.http.server import MAX_JSON_DEPTH

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main import GenericWorkerStore

DEFAULT_TIMELINE_LIMIT = 10
MAX_TIMELINE_LIMIT = 500
MAX_FILTER_BYTES = 16_384


@attr.s(slots=True, frozen=True, auto_attribs=True)
class EventFilter:
    """Which events of a section to return (the spec's EventFilter, without
    ``limit``): a ``None`` list allows everything."""

    types: tuple[str, ...] | None = None
    not_types: tuple[str, ...] = ()
    senders: tuple[str, ...] | None = None
    not_senders: tuple[str, ...] = ()

    def allows(self, event: dict[str, Any]) -> bool:
        event_type, sender = str(event.get("type", "")), str(event.get("sender", ""))
        if any(fnmatch.fnmatchcase(event_type, t) for t in self.not_types):
            return False
        if self.types is not None and not any(
            fnmatch.fnmatchcase(event_type, t) for t in self.types
        ):
            return False
        if sender in self.not_senders:
            return False
        return self.senders is None or sender in self.senders

    @classmethod
    def parse(cls, definition: Any, where: str) -> EventFilter:
        if not isinstance(definition, dict):
            raise SynapseError(400, f"'{where}' must be an object", Codes.BAD_JSON)
        lists: dict[str, tuple[str, ...] | None] = {}
        for key in ("types", "not_types", "senders", "not_senders"):
            value = definition.get(key)
            if value is not None and (
                not isinstance(value, list) or not all(isinstance(v, str) for v in value)
            ):
                raise SynapseError(
                    400, f"'{where}.{key}' must be a list of strings", Codes.BAD_JSON
                )
            lists[key] = None if value is None else tuple(value)
        return cls(
            types=lists["types"],
            not_types=lists["not_types"] or (),
            senders=lists["senders"],
            not_senders=lists["not_senders"] or (),
        )


@attr.s(slots=True, frozen=True, auto_attribs=True)
class SyncFilter:
    """What a filter changes about /sync."""

    timeline_limit: int = DEFAULT_TIMELINE_LIMIT
    presence: EventFilter = attr.ib(factory=EventFilter)


def _depth(value: Any, depth: int = 0) -> int:
    if depth > MAX_JSON_DEPTH:
        return depth
    if isinstance(value, dict):
        return max([depth, *(_depth(v, depth + 1) for v in value.values())])
    if isinstance(value, list):
        return max([depth, *(_depth(v, depth + 1) for v in value)])
    return depth


def parse_filter(definition: Any) -> SyncFilter:
    """Validate a filter definition (or a 400 ``M_BAD_JSON``)."""
    if not isinstance(definition, dict):
        raise SynapseError(400, "A filter must be a JSON object", Codes.BAD_JSON)
    if _depth(definition) > MAX_JSON_DEPTH:
        raise SynapseError(400, "The filter is nested too deeply", Codes.BAD_JSON)
    room = definition.get("room", {})
    if not isinstance(room, dict):
        raise SynapseError(400, "'room' must be an object", Codes.BAD_JSON)
    timeline = room.get("timeline", {})
    if not isinstance(timeline, dict):
        raise SynapseError(400, "'room.timeline' must be an object", Codes.BAD_JSON)
    limit = timeline.get("limit", DEFAULT_TIMELINE_LIMIT)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise SynapseError(
            400, "'room.timeline.limit' must be a non-negative integer", Codes.BAD_JSON
        )
    presence = EventFilter.parse(definition.get("presence", {}), "presence")
    return SyncFilter(timeline_limit=min(limit, MAX_TIMELINE_LIMIT), presence=presence)


class FilteringHandler:
    """Storing and reading filters."""

    def __init__(self, store: GenericWorkerStore) -> None:
        self._store = store

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
        """The ``filter`` query parameter of /sync: a filter id or inline JSON."""
        if param is None:
            return SyncFilter()
        if param.lstrip().startswith("{"):
            if len(param) > MAX_FILTER_BYTES:
                raise SynapseError(400, "The filter is too large", Codes.TOO_LARGE)
            try:
                definition = json.loads(param)
            except (ValueError, RecursionError):
                raise SynapseError(400, "The filter is not JSON", Codes.NOT_JSON) from None
            return parse_filter(definition)
        return parse_filter(await self.get_filter(user_id, param))
