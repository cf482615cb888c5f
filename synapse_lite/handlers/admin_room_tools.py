"""The admin API's room tools: ``POST /v1/rooms/{roomIdOrAlias}/make_room_admin``,
``GET/DELETE /v1/rooms/{roomId}/forward_extremities``, ``GET
/v1/rooms/{roomId}/timestamp_to_event`` and ``GET /v1/fetch_event/{eventId}``. (``/messages`` and
``/context`` are the client API's, read as an admin who sees every event:
``PaginationHandler`` with ``as_admin``.) The callers have checked the
requester is a server admin."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, NotFoundError, SynapseError
from synapse_lite.api.identifiers import check_identifier_text, check_user_id, is_mine_id
from synapse_lite.config.homeserver import RateLimitConfig
from synapse_lite.handlers.admin_rooms import room_id_of
from synapse_lite.handlers.auth import Requester

if TYPE_CHECKING:
    from synapse_lite.handlers.message import EventCreationHandler
    from synapse_lite.handlers.room_member import RoomMemberHandler
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: An admin action taken as a room member is not the member's sending:
#: no rate limit applies to it.
_UNLIMITED = RateLimitConfig(per_second=0.0, burst=0)


def power_level(content: dict[str, Any], user_id: str) -> int:
    """``user_id``'s power level in a power-levels event's ``content``
    (integers, or strings of them as old rooms may hold; else the default)."""
    users = content.get("users")
    value = users.get(user_id) if isinstance(users, dict) else None
    if value is None:
        value = content.get("users_default", 0)
    return _as_int(value, 0)


def _as_int(value: object, default: int) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return default
    return default


def level_to_change_power_levels(content: dict[str, Any]) -> int:
    events = content.get("events")
    needed = events.get("m.room.power_levels") if isinstance(events, dict) else None
    if needed is None:
        needed = content.get("state_default", 50)
    return _as_int(needed, 50)


def as_member(user_id: str) -> Requester:
    """A local member acting on an admin's behalf."""
    return Requester(user_id, "", "", ratelimit_override=_UNLIMITED)


class AdminRoomToolsHandler:
    def __init__(
        self,
        store: GenericWorkerStore,
        server_name: str,
        events: EventCreationHandler,
        members: RoomMemberHandler,
    ) -> None:
        self._store = store
        self._server_name = server_name
        self._events = events
        self._members = members

    async def room_id_of(self, room: str) -> str:
        """The room an id or a local alias names; 404 when unknown."""
        room_id = await room_id_of(self._store, room)
        if not await self._store.room_exists(room_id):
            raise NotFoundError("Room not found")
        return room_id

    async def make_room_admin(self, admin: Requester, room: str, body: dict[str, Any]) -> None:
        """Give ``user_id`` (default: the admin) the highest power level a
        local joined member has, through that member (who must be allowed
        to change the power levels: else a 400); a user not in the room is
        invited too unless the room is public (they join themselves)."""
        room_id = await self.room_id_of(room)
        user_id = body.get("user_id", admin.user_id)
        check_user_id(user_id, "user_id")
        if not is_mine_id(user_id, self._server_name):
            raise SynapseError(400, "Only a local user can be made room admin", Codes.INVALID_PARAM)
        if await self._store.get_user(user_id) is None:
            raise NotFoundError("User not found")
        state_ids = await self._store.get_current_state_ids(room_id)
        levels_id = state_ids.get(("m.room.power_levels", ""))
        levels = await self._store.get_event(levels_id) if levels_id else None
        if levels is None:
            raise SynapseError(400, "The room has no power levels to change", Codes.INVALID_PARAM)
        content = dict(levels.content)
        joined = await self._store.get_users_in_room(room_id)
        local = [u for u in joined if is_mine_id(u, self._server_name)]
        # The most powerful local member; ties broken by id, so the choice
        # is the same on every try.
        acting = min(local, key=lambda u: (-power_level(content, u), u), default=None)
        if acting is None or power_level(content, acting) < level_to_change_power_levels(content):
            raise SynapseError(
                400, "No local member of the room may change its power levels", Codes.INVALID_PARAM
            )
        top = power_level(content, acting)
        if power_level(content, user_id) < top:
            users = content.get("users")
            content["users"] = {**(users if isinstance(users, dict) else {}), user_id: top}
            await self._events.send_client_event(
                as_member(acting), room_id, "m.room.power_levels", content, state_key=""
            )
        if user_id not in joined and not await self._is_public(state_ids):
            membership_id = state_ids.get(("m.room.member", user_id))
            membership = await self._store.get_event(membership_id) if membership_id else None
            if membership is None or membership.content.get("membership") != "invite":
                await self._members.update_membership(as_member(acting), room_id, "invite", user_id)
        logger.info(
            "admin %s made %s room admin of %s (level %d, through %s)",
            admin.user_id,
            user_id,
            room_id,
            top,
            acting,
        )

    async def _is_public(self, state_ids: dict[tuple[str, str], str]) -> bool:
        rules_id = state_ids.get(("m.room.join_rules", ""))
        rules = await self._store.get_event(rules_id) if rules_id else None
        return rules is not None and rules.content.get("join_rule") == "public"

    async def forward_extremities(self, room: str) -> dict[str, Any]:
        """The room's forward extremities: ``count``, ``results`` (each
        ``event_id``, ``state_group`` (null: we keep no state groups),
        ``depth``, ``received_ts`` (the event's ``origin_server_ts``: we
        keep no receipt time))."""
        room_id = await self.room_id_of(room)
        extremities = await self._store.get_forward_extremities(room_id)
        events = await self._store.get_events(extremities)
        results = [
            {
                "event_id": event_id,
                "state_group": None,
                "depth": depth,
                "received_ts": events[event_id].origin_server_ts if event_id in events else None,
            }
            for event_id, depth in sorted(extremities.items())
        ]
        return {"count": len(results), "results": results}

    async def delete_forward_extremities(self, admin: Requester, room: str) -> dict[str, Any]:
        """Delete the room's forward extremities but the newest, on its
        events writer (which holds them in memory): ``{"deleted": n}``."""
        room_id = await self.room_id_of(room)
        deleted = await self._events.delete_forward_extremities(room_id)
        logger.info(
            "admin %s deleted %d forward extremities of %s", admin.user_id, deleted, room_id
        )
        return {"deleted": deleted}

    async def timestamp_to_event(self, room: str, ts: int, forwards: bool) -> dict[str, Any]:
        """The room's event closest to ``ts`` in that direction (at or after
        it, or at or before it): ``event_id``, ``origin_server_ts``; 404
        when there is none."""
        room_id = await self.room_id_of(room)
        found = await self._store.get_event_near_ts(room_id, ts, forwards)
        if found is None:
            raise NotFoundError(
                f"No event {'at or after' if forwards else 'at or before'} {ts} in the room"
            )
        return {"event_id": found[0], "origin_server_ts": found[1]}

    async def fetch_event(self, event_id: str) -> dict[str, Any]:
        """``{"event": ...}``: any event this server has, in the client
        format (an admin reads it whatever room it is in); 404 when
        unknown."""
        check_identifier_text(event_id, "eventId")
        event = await self._store.get_event(event_id)
        if event is None:
            raise NotFoundError("Event not found")
        return {"event": event.to_client_dict(self._store.clock.time_msec())}
