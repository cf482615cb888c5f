"""Who is a server admin, and the client API's admin corner: ``GET
/admin/whois/{userId}`` (also the admin API's ``/_synapse/admin/v1/whois``).

A server admin is a user whose ``users.admin`` is set: by shared-secret
registration with ``admin: true``, or by another admin through the admin API
(``PUT /_synapse/admin/v1/users/{userId}/admin``, ``PUT /v2/users/{userId}``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.errors import AuthError, Codes, NotFoundError, SynapseError
from synapse_lite.handlers.auth import Requester
from synapse_lite.storage.databases.main.federation import RetryState

if TYPE_CHECKING:
    from synapse_lite.handlers.auth import AuthHandler
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)


class AdminHandler:
    """Who is connected from where, for admins and for the users themselves."""

    def __init__(
        self,
        store: GenericWorkerStore,
        auth: AuthHandler,
        announce_server_up: Callable[[str], None] | None = None,
    ) -> None:
        """``announce_server_up(server_name)``: tells the processes sending
        to that server to forget its backoff (``REMOTE_SERVER_UP``)."""
        self._store = store
        self._auth = auth
        self._announce_server_up = announce_server_up

    async def is_server_admin(self, user_id: str) -> bool:
        user = await self._store.get_user(user_id)
        return user is not None and bool(user["admin"])

    async def get_admin_by_req(self, request: Request) -> Requester:
        """The requester of an admin API call: 401 without a valid token, 403
        ``M_FORBIDDEN`` unless a server admin."""
        requester = await self._auth.get_user_by_req(request)
        if not await self.is_server_admin(requester.user_id):
            raise AuthError(403, "You are not a server admin")
        return requester

    async def whois(self, requester: Requester, user_id: str) -> dict[str, Any]:
        """Each device of ``user_id`` with the addresses and user agents it
        was seen with (``user_ips``, recorded by the main process from every
        process's requests; most recent first). One session per device: we
        do not tell a device's successive logins apart."""
        if requester.user_id != user_id and not await self.is_server_admin(requester.user_id):
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

    async def destinations(
        self, offset: int, limit: int, order_by: str, descending: bool, search: str | None
    ) -> dict[str, Any]:
        """``GET /_synapse/admin/v1/federation/destinations``: the remote
        servers this one has delivery state for (``destinations``)."""
        found, total = await self._store.list_destinations(
            offset, limit, order_by, descending, search
        )
        answer: dict[str, Any] = {"destinations": found, "total": total}
        if offset + len(found) < total:
            answer["next_token"] = str(offset + len(found))
        return answer

    async def destination(self, destination: str) -> dict[str, Any]:
        found = await self._store.get_destination(destination)
        if found is None:
            raise NotFoundError("Unknown destination")
        return found

    async def destination_rooms(
        self, destination: str, offset: int, limit: int, descending: bool
    ) -> dict[str, Any]:
        """``GET .../destinations/{destination}/rooms``: the rooms a user of
        ``destination`` is joined to now, each ``room_id`` and
        ``stream_ordering`` (null: no event of ours was sent there over
        federation yet), ``total``, ``next_token``."""
        await self.destination(destination)
        rooms, total = await self._store.list_destination_rooms(
            destination, offset, limit, descending
        )
        answer: dict[str, Any] = {
            "rooms": [{"room_id": room_id, "stream_ordering": None} for room_id in rooms],
            "total": total,
        }
        if offset + len(rooms) < total:
            answer["next_token"] = str(offset + len(rooms))
        return answer

    async def reset_connection(self, admin: Requester, destination: str) -> None:
        """``POST .../destinations/{destination}/reset_connection``: forget
        the backoff towards ``destination`` here and in the process sending
        to it, which tries again now. 400 when it has none."""
        found = await self.destination(destination)
        if not found["retry_last_ts"]:
            raise SynapseError(
                400, "The destination has no retry timing to reset", Codes.INVALID_PARAM
            )
        await self._store.set_retry_state(destination, RetryState())
        if self._announce_server_up is not None:
            self._announce_server_up(destination)
        logger.info("admin %s reset the connection to %s", admin.user_id, destination)

    async def scheduled_tasks(
        self,
        action: str | None,
        resource_id: str | None,
        status: str | None,
        max_timestamp: int | None,
    ) -> dict[str, Any]:
        """``GET /_synapse/admin/v1/scheduled_tasks``: the admin API's long
        jobs (``admin_tasks``: ``delete_room``, ``purge_history``,
        ``redact_user``), newest first: ``id``, ``action``, ``status``,
        ``timestamp_ms`` (when it last changed), ``resource_id``,
        ``result``, ``error``."""
        found = await self._store.list_admin_tasks(action, resource_id, status, max_timestamp)
        return {
            "scheduled_tasks": [
                {
                    "id": task.task_id,
                    "action": task.action,
                    "status": task.status,
                    "timestamp_ms": changed,
                    "resource_id": task.resource_id,
                    "result": task.result,
                    "error": task.error,
                }
                for task, changed in found
            ]
        }

    async def largest_rooms(self) -> dict[str, Any]:
        """``GET /_synapse/admin/v1/statistics/database/rooms``: the 10
        rooms taking the most space, largest first (an estimate from their
        events' sizes)."""
        rooms = await self._store.get_largest_rooms(10)
        return {"rooms": [{"room_id": r, "estimated_size": size} for r, size in rooms]}
