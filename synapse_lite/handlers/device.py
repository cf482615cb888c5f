"""Devices and their access tokens.

Creating or deleting a device writes the device_lists stream, which only the
main process writes, so other processes forward those requests to it over
internal HTTP. The access token is generated where the client's request
arrived: only its hash travels and is stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import NotFoundError
from synapse_lite.config.homeserver import MAIN_PROCESS
from synapse_lite.handlers.auth import generate_access_token, hash_token
from synapse_lite.handlers.writer_routing import call_writer

if TYPE_CHECKING:
    from synapse_lite.server import HomeServer

REGISTER_DEVICE_ENDPOINT = "register_device"
DELETE_DEVICES_ENDPOINT = "delete_devices"


class DeviceHandler:
    """Logging devices in and out, and listing them."""

    def __init__(self, hs: HomeServer) -> None:
        self._hs = hs
        self._store = hs.datastore

    async def create_device_and_token(
        self, user_id: str, device_id: str, display_name: str | None
    ) -> str:
        """Log ``device_id`` in (creating it if new; its older tokens stop
        working); returns the new access token."""
        token = generate_access_token()
        token_hash = hash_token(token)
        if self._hs.is_main_process:
            await self.store_device_and_token(user_id, device_id, display_name, token_hash)
        else:
            await call_writer(
                self._hs,
                MAIN_PROCESS,
                REGISTER_DEVICE_ENDPOINT,
                {
                    "user_id": user_id,
                    "device_id": device_id,
                    "display_name": display_name,
                    "token_hash": token_hash,
                },
            )
        return token

    async def store_device_and_token(
        self, user_id: str, device_id: str, display_name: str | None, token_hash: str
    ) -> None:
        """On the main process."""
        await self._store.replace_access_tokens(user_id, device_id, token_hash, display_name)

    async def delete_devices(self, user_id: str, device_ids: list[str] | None) -> list[str]:
        """Log devices out (all the user's devices when None); returns the
        hashes of the tokens revoked. Forgotten here at once: a logged-out
        client's next request to this process fails even before the caches
        stream brings the news."""
        if self._hs.is_main_process:
            _, hashes = await self._store.delete_devices(user_id, device_ids)
            return hashes
        answer = await call_writer(
            self._hs,
            MAIN_PROCESS,
            DELETE_DEVICES_ENDPOINT,
            {"user_id": user_id, "device_ids": device_ids},
        )
        hashes = [h for h in answer.get("token_hashes", []) if isinstance(h, str)]
        for token_hash in hashes:
            self._store.get_user_by_access_token.invalidate(token_hash)
        return hashes

    async def get_devices(self, user_id: str) -> list[dict[str, Any]]:
        return [_client_device(d) for d in await self._store.get_devices_by_user(user_id)]

    async def get_device(self, user_id: str, device_id: str) -> dict[str, Any]:
        device = await self._store.get_device(user_id, device_id)
        if device is None:
            raise NotFoundError("No such device")
        return _client_device(device)


def _client_device(device: dict[str, Any]) -> dict[str, Any]:
    return {
        "device_id": device["device_id"],
        "display_name": device["display_name"],
        "last_seen_ip": None,
        "last_seen_ts": None,
    }
