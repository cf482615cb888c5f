"""The admin API's rooms: listing, one room's details, members and state
(``docs/admin-api.md``). The callers have checked the requester is a server
admin.

A room's summary is read from its current state (cached per room), so the
listing reads every room's: O(rooms) per request, which a homeserver of this
size affords; filtering and sorting happen here, in Python, the same on both
engines.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import NotFoundError
from synapse_lite.api.identifiers import check_room_alias, check_room_id
from synapse_lite.handlers.filtering import CLIENT_FORMAT

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.handlers.auth import Requester
    from synapse_lite.handlers.client_events import ClientEventFormatter
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: The state a summary reads: ``(type, state_key)`` -> (summary field, content key).
_SUMMARY_STATE = {
    ("m.room.name", ""): ("name", "name"),
    ("m.room.canonical_alias", ""): ("canonical_alias", "alias"),
    ("m.room.join_rules", ""): ("join_rules", "join_rule"),
    ("m.room.guest_access", ""): ("guest_access", "guest_access"),
    ("m.room.history_visibility", ""): ("history_visibility", "history_visibility"),
    ("m.room.encryption", ""): ("encryption", "algorithm"),
    ("m.room.topic", ""): ("topic", "topic"),
    ("m.room.avatar", ""): ("avatar", "url"),
}

#: ``order_by`` of ``GET /v1/rooms`` (the summary field each sorts by).
ROOM_ORDERINGS = (
    "name",
    "canonical_alias",
    "joined_members",
    "joined_local_members",
    "version",
    "creator",
    "encryption",
    "federatable",
    "public",
    "join_rules",
    "guest_access",
    "history_visibility",
    "state_events",
)


async def room_id_of(store: GenericWorkerStore, room: str) -> str:
    """The room a room id or a local alias names (404 for an unknown
    alias, 400 for neither)."""
    if not room.startswith("#"):
        return check_room_id(room)
    found = await store.get_alias(check_room_alias(room))
    if found is None:
        raise NotFoundError("Room alias not found")
    return found[0]


def _sort_key(value: Any) -> tuple[int, Any]:
    # Unset values (null) sort first, ascending; numbers and text apart.
    if value is None:
        return (0, "")
    if isinstance(value, (bool, int)):
        return (1, int(value))
    return (2, str(value).lower())


class AdminRoomsHandler:
    """``/_synapse/admin/v1/rooms[/{roomId}[/members|/state]]``."""

    def __init__(
        self,
        store: GenericWorkerStore,
        clock: Clock,
        server_name: str,
        formatter: ClientEventFormatter,
    ) -> None:
        self._store = store
        self._clock = clock
        self._server_name = server_name
        self._formatter = formatter

    async def summary(self, room_id: str) -> dict[str, Any] | None:
        room = await self._store.get_room(room_id)
        if room is None:
            return None
        state_ids = await self._store.get_current_state_ids(room_id)
        wanted = [state_ids[key] for key in _SUMMARY_STATE if key in state_ids]
        create_id = state_ids.get(("m.room.create", ""))
        events = await self._store.get_events([*wanted, *([create_id] if create_id else [])])
        summary: dict[str, Any] = {"room_id": room_id}
        for key, (field, content_key) in _SUMMARY_STATE.items():
            event = events.get(state_ids.get(key, ""))
            value = event.content.get(content_key) if event is not None else None
            summary[field] = value if isinstance(value, str) else None
        create = events.get(create_id or "")
        create_content = create.content if create is not None else {}
        joined = await self._store.get_users_in_room(room_id)
        local_suffix = ":" + self._server_name
        in_directory = await self._store.is_room_in_directory(room_id)
        summary.update(
            joined_members=len(joined),
            joined_local_members=sum(1 for u in joined if u.endswith(local_suffix)),
            version=room["room_version"],
            creator=room["creator"],
            federatable=create_content.get("m.federate", True) is not False,
            public=bool(in_directory),
            state_events=len(state_ids),
            room_type=create_content.get("type")
            if isinstance(create_content.get("type"), str)
            else None,
        )
        return summary

    async def _existing_summary(self, room_id: str) -> dict[str, Any]:
        check_room_id(room_id)
        summary = await self.summary(room_id)
        if summary is None:
            raise NotFoundError("Room not found")
        return summary

    async def list_rooms(
        self,
        offset: int,
        limit: int,
        order_by: str,
        descending: bool,
        search_term: str | None,
        public_rooms: bool | None,
        empty_rooms: bool | None,
    ) -> dict[str, Any]:
        summaries = []
        for room_id in await self._store.get_all_room_ids():
            summary = await self.summary(room_id)
            if summary is not None:
                summaries.append(summary)
        if search_term:
            term = search_term.lower()
            summaries = [
                s
                for s in summaries
                if any(term in (s[f] or "").lower() for f in ("name", "canonical_alias", "room_id"))
            ]
        if public_rooms is not None:
            summaries = [s for s in summaries if s["public"] == public_rooms]
        if empty_rooms is not None:
            summaries = [s for s in summaries if (s["joined_members"] == 0) == empty_rooms]
        summaries.sort(key=lambda s: (_sort_key(s[order_by]), s["room_id"]), reverse=descending)
        page = summaries[offset : offset + limit]
        for summary in page:
            del summary["topic"], summary["avatar"]
        result: dict[str, Any] = {
            "rooms": page,
            "offset": offset,
            "total_rooms": len(summaries),
        }
        if offset + len(page) < len(summaries):
            result["next_batch"] = offset + len(page)
        if offset > 0:
            result["prev_batch"] = max(offset - limit, 0)
        return result

    async def get_room(self, room_id: str) -> dict[str, Any]:
        summary = await self._existing_summary(room_id)
        summary["forgotten"] = False
        return summary

    async def get_members(self, room_id: str) -> dict[str, Any]:
        await self._existing_summary(room_id)
        members = sorted(await self._store.get_users_in_room(room_id))
        return {"members": members, "total": len(members)}

    async def get_state(self, room_id: str) -> dict[str, Any]:
        await self._existing_summary(room_id)
        state_ids = await self._store.get_current_state_ids(room_id)
        events = await self._store.get_events(state_ids.values())
        ordered = [events[i] for i in sorted(state_ids.values()) if i in events]
        now = self._clock.time_msec()
        return {"state": await self._formatter.render(ordered, now, CLIENT_FORMAT)}

    async def get_block(self, room_id: str) -> dict[str, Any]:
        """Whether the room is blocked, and by whom (any valid room id: a
        room this server never saw may be blocked ahead)."""
        check_room_id(room_id)
        blocker = await self._store.get_room_blocker(room_id)
        if blocker is None:
            return {"block": False}
        return {"block": True, "user_id": blocker}

    async def set_block(self, admin: Requester, room_id: str, block: bool) -> dict[str, Any]:
        check_room_id(room_id)
        if block:
            await self._store.block_room(room_id, admin.user_id)
        else:
            await self._store.unblock_room(room_id)
        logger.info("admin %s set block=%s on %s", admin.user_id, block, room_id)
        return {"block": block}
