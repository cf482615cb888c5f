"""The client API's admin corner: ``GET /admin/whois/{userId}``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import AuthError, NotFoundError
from synapse_lite.handlers.auth import Requester

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main import GenericWorkerStore


class AdminHandler:
    """Who is connected from where, for admins and for the users themselves."""

    def __init__(self, store: GenericWorkerStore) -> None:
        self._store = store

    async def whois(self, requester: Requester, user_id: str) -> dict[str, Any]:
        """Each device of ``user_id`` with the addresses and user agents it
        was seen with (``user_ips``, recorded by the main process from every
        process's requests; most recent first). One session per device: we
        do not tell a device's successive logins apart."""
        if requester.user_id != user_id:
            me = await self._store.get_user(requester.user_id)
            if me is None or not me["admin"]:
                raise AuthError(403, "You are not a server admin")
        if await self._store.get_user(user_id) is None:
            raise NotFoundError("Unknown user")
        connections: dict[str, list[dict[str, Any]]] = {
            device_id: [] for device_id in await self._store.get_device_ids(user_id)
        }
        for device_id, ip, user_agent, last_seen in await self._store.get_user_ips(user_id):
            connections.setdefault(device_id, []).append(
                {"ip": ip, "last_seen": last_seen, "user_agent": user_agent}
            )
        return {
            "user_id": user_id,
            "devices": {
                device_id: {"sessions": [{"connections": found}]}
                for device_id, found in connections.items()
            },
        }
