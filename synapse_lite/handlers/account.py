"""Changing one's password and deactivating one's account, both behind
user-interactive auth with the current password (``handlers/ui_auth.py``).

Each step goes where its data is written: the ``users`` row from here (no
stream owns it), devices and tokens through the main process (device_lists),
leaving rooms through each room's events writer.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.handlers.auth import MAX_PASSWORD_LENGTH, Requester, hash_password
from synapse_lite.http.fields import get_bool, get_optional_str, get_str

if TYPE_CHECKING:
    from synapse_lite.handlers.device import DeviceHandler
    from synapse_lite.handlers.identity import IdentityHandler
    from synapse_lite.handlers.room_member import RoomMemberHandler
    from synapse_lite.handlers.ui_auth import InteractiveAuthHandler
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: Memberships deactivation ends (a leave by the user themself is allowed
#: from each of them by the auth rules).
_MEMBERSHIPS_LEFT = ("join", "invite", "knock")


class AccountHandler:
    """``POST /account/password`` and ``POST /account/deactivate``."""

    def __init__(
        self,
        store: GenericWorkerStore,
        ui_auth: InteractiveAuthHandler,
        devices: DeviceHandler,
        members: RoomMemberHandler,
        identity: IdentityHandler,
    ) -> None:
        self._store = store
        self._ui_auth = ui_auth
        self._devices = devices
        self._members = members
        self._identity = identity

    async def change_password(self, requester: Requester, body: dict[str, Any]) -> None:
        """Set ``new_password``; every other device is logged out unless
        ``logout_devices`` is false (the requester's own stays logged in)."""
        new_password = get_str(body, "new_password", max_length=MAX_PASSWORD_LENGTH)
        if not new_password:
            raise SynapseError(400, "'new_password' must not be empty", Codes.INVALID_PARAM)
        logout_devices = get_bool(body, "logout_devices", True)
        user_id = requester.user_id
        await self._ui_auth.check_password(user_id, body, "change password")
        await self._store.set_password_hash(user_id, await hash_password(new_password))
        logger.info("%s changed their password", user_id)
        if logout_devices:
            others = [
                d for d in await self._store.get_device_ids(user_id) if d != requester.device_id
            ]
            if others:
                await self._devices.delete_devices(user_id, others)

    async def deactivate(self, requester: Requester, body: dict[str, Any]) -> dict[str, Any]:
        """Leave every room, then mark the user deactivated (their name is
        never free again; with ``erase``, erased) and delete all their
        devices and tokens. Rooms are
        left first so a writer that cannot be reached fails the request while
        the user can still retry it."""
        id_server = get_optional_str(body, "id_server", max_length=255)
        erase = get_bool(body, "erase", False)
        user_id = requester.user_id
        # An application service acting for a user of its namespace (its
        # as_token already proves that) manages the account without UIA:
        # its users have no password to give.
        if requester.app_service is None:
            await self._ui_auth.check_password(user_id, body, "deactivate account")
        unbound = await self.deactivate_account(user_id, erase, id_server)
        logger.info("%s deactivated their account", user_id)
        return {"id_server_unbind_result": unbound}

    async def deactivate_account(self, user_id: str, erase: bool, id_server: str | None) -> str:
        """Deactivate ``user_id`` (see :meth:`deactivate`; the admin API's
        deactivation too); returns the identity servers' unbind result."""
        as_user = Requester(user_id, "", "")
        for row in await self._store.get_local_memberships_with_positions(user_id):
            room_id, membership = row[0], row[1]
            if membership in _MEMBERSHIPS_LEFT:
                try:
                    await self._members.update_membership(as_user, room_id, "leave")
                except SynapseError as e:
                    # Left meanwhile (kicked, or by an admin's room
                    # deletion): a user may always leave a room they are in.
                    if e.code != 403:
                        raise
                    logger.info("%s had already left %s: %s", user_id, room_id, e.msg)
        # Erased as of now: whoever could see the user's events by now still
        # does; who joins later is served them redacted (client_events.py).
        erased_at = self._store.get_room_max_stream_ordering() if erase else None
        await self._store.deactivate_user(user_id, erased_at)
        await self._devices.delete_devices(user_id, None)
        # After the account is gone: an identity server that cannot be
        # reached makes the result "no-support", never a failure.
        return await self._identity.unbind_all(user_id, id_server)
