"""Server notices (``POST /_synapse/admin/v1/send_server_notice[/{txnId}]``):
messages from the server to a user, sent by a system user
(``server_notices.system_mxid_localpart``, registered without a password
on first use) in a room of its own with that user. The room is made on the
first notice (private, named ``server_notices.room_name``, the user invited
and unable to send, tagged ``m.server_notice`` for them) and made anew when
the user has left it. The callers have checked the requester is an admin."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, NotFoundError, SynapseError
from synapse_lite.api.identifiers import check_identifier_text, check_user_id, is_mine_id
from synapse_lite.handlers.admin_room_tools import as_member
from synapse_lite.handlers.auth import Requester

if TYPE_CHECKING:
    from synapse_lite.config.homeserver import ServerNoticesConfig
    from synapse_lite.handlers.account_data import AccountDataHandler
    from synapse_lite.handlers.message import EventCreationHandler
    from synapse_lite.handlers.profile import ProfileHandler
    from synapse_lite.handlers.room import RoomCreationHandler
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

SERVER_NOTICE_TAG = "m.server_notice"


class ServerNoticesHandler:
    def __init__(
        self,
        store: GenericWorkerStore,
        server_name: str,
        config: ServerNoticesConfig,
        room_creation: RoomCreationHandler,
        events: EventCreationHandler,
        account_data: AccountDataHandler,
        profiles: ProfileHandler,
    ) -> None:
        self._store = store
        self._server_name = server_name
        self._config = config
        self._room_creation = room_creation
        self._events = events
        self._account_data = account_data
        self._profiles = profiles

    async def send(self, admin: Requester, body: dict[str, Any], txn_id: str | None) -> str:
        """Send ``content`` (of ``type``, default ``m.room.message``, a state
        event with ``state_key``) to the local ``user_id``; the event id.
        With ``txn_id`` a repeat sends nothing new."""
        localpart = self._config.system_mxid_localpart
        if localpart is None:
            raise SynapseError(400, "Server notices are not enabled on this server", Codes.UNKNOWN)
        user_id = body.get("user_id")
        if not isinstance(user_id, str):
            raise SynapseError(400, "'user_id' must be a user id", Codes.MISSING_PARAM)
        check_user_id(user_id, "user_id")
        if not is_mine_id(user_id, self._server_name):
            raise SynapseError(
                400, "Server notices can only be sent to local users", Codes.INVALID_PARAM
            )
        user = await self._store.get_user(user_id)
        if user is None:
            raise NotFoundError("User not found")
        content = body.get("content")
        if not isinstance(content, dict):
            raise SynapseError(400, "'content' must be an object", Codes.BAD_JSON)
        event_type = body.get("type", "m.room.message")
        state_key = body.get("state_key")
        if not isinstance(event_type, str) or not (state_key is None or isinstance(state_key, str)):
            raise SynapseError(400, "'type' and 'state_key' must be strings", Codes.BAD_JSON)
        check_identifier_text(event_type, "type")
        system = f"@{localpart}:{self._server_name}"
        if system == user_id:
            raise SynapseError(400, "The system user gets no notices", Codes.INVALID_PARAM)
        await self._ensure_system_user(system)
        room_id = await self._room_with(system, user_id)
        event_id = await self._events.send_client_event(
            as_member(system),
            room_id,
            event_type,
            content,
            state_key=state_key,
            # Per admin: two admins' transactions never meet.
            txn_id=None if txn_id is None else f"{admin.user_id} {txn_id}",
        )
        logger.info("admin %s sent the server notice %s to %s", admin.user_id, event_id, user_id)
        return event_id

    async def _ensure_system_user(self, system: str) -> None:
        if await self._store.get_user(system) is not None:
            return
        await self._store.register_user(system, None)
        name = self._config.system_mxid_display_name
        if name is not None:
            await self._profiles.set_field(as_member(system), system, "displayname", name)
        logger.info("registered the server notices user %s", system)

    async def _room_with(self, system: str, user_id: str) -> str:
        """The user's notices room, made if they have none they are still in
        (joined or invited)."""
        room_id = await self._store.get_server_notice_room(user_id)
        if room_id is not None and await self._membership(room_id, user_id) in ("join", "invite"):
            return room_id
        room_id = await self._room_creation.create_room(
            as_member(system),
            {
                "preset": "private_chat",
                "name": self._config.room_name,
                "invite": [user_id],
                # The user reads notices; they do not answer them.
                "power_level_content_override": {"users_default": -10},
            },
        )
        await self._store.set_server_notice_room(user_id, room_id)
        await self._account_data.set_tag(user_id, room_id, SERVER_NOTICE_TAG, {})
        return room_id

    async def _membership(self, room_id: str, user_id: str) -> str | None:
        state_ids = await self._store.get_current_state_ids(room_id)
        event_id = state_ids.get(("m.room.member", user_id))
        event = await self._store.get_event(event_id) if event_id else None
        membership = event.content.get("membership") if event is not None else None
        return membership if isinstance(membership, str) else None
