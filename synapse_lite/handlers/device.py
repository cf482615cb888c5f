"""Devices and their access tokens.

Creating, renaming or deleting a device writes the device_lists stream, so
those requests go to the user's device_lists writer
(``config.writers.writer_for``) over internal HTTP. The access token is
generated where the client's request arrived: only its hash travels and is
stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from synapse_lite.api.access_tokens import generate_access_token
from synapse_lite.api.errors import NotFoundError
from synapse_lite.handlers.auth import hash_token
from synapse_lite.replication.http.calls import EmptyBody
from synapse_lite.replication.http.devices import (
    DELETE_DEVICES,
    REGISTER_DEVICE,
    REMOVE_DEVICE_PUSHERS,
    RENAME_DEVICE,
    DeviceLogin,
    DeviceRename,
    DevicesLogout,
    TokensRevoked,
)
from synapse_lite.replication.http.writes import StreamWritten

if TYPE_CHECKING:
    from synapse_lite.config.homeserver import HomeServerConfig
    from synapse_lite.handlers.revocation import RevocationBarrier
    from synapse_lite.notifier import Notifier
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.storage.databases.main import GenericWorkerStore


async def wake_for_device_change(
    store: GenericWorkerStore, notifier: Notifier, user_id: str
) -> None:
    """Wake this process's /sync requests that a change of ``user_id``'s
    devices concerns: the user's and those of users sharing a room. (Other
    processes are woken when the stream's rows reach them; the writer wrote
    them itself, so its own waiters are woken here.)"""
    rooms = await store.get_rooms_for_user(user_id)
    notifier.notify(users=[user_id], rooms=rooms)


class DeviceHandler:
    """Logging devices in and out, and listing them."""

    def __init__(
        self,
        store: GenericWorkerStore,
        calls: InternalCalls,
        config: HomeServerConfig,
        notifier: Notifier,
        revocations: RevocationBarrier,
    ) -> None:
        self._store = store
        self._calls = calls
        self._config = config
        self._notifier = notifier
        self._revocations = revocations

    def writer_for(self, user_id: str) -> str:
        """The device_lists writer of ``user_id``'s device changes."""
        return self._config.writers.writer_for("device_lists", user_id)

    async def create_device_and_token(
        self, user_id: str, device_id: str, display_name: str | None
    ) -> str:
        """Log ``device_id`` in (creating it if new; its older tokens stop
        working); returns the new access token."""
        token = generate_access_token(user_id)
        await self._calls.call(
            REGISTER_DEVICE,
            DeviceLogin(user_id, device_id, display_name, hash_token(token)),
            instance=self.writer_for(user_id),
        )
        return token

    async def store_device_and_token(self, login: DeviceLogin) -> EmptyBody:
        """Serves :data:`REGISTER_DEVICE` (on the user's device_lists writer)."""
        if await self._store.get_user(login.user_id) is None:
            raise NotFoundError("Unknown user")
        if await self._store.replace_access_tokens(
            login.user_id, login.device_id, login.token_hash, login.display_name
        ):
            await wake_for_device_change(self._store, self._notifier, login.user_id)
        return EmptyBody()

    async def delete_devices(self, user_id: str, device_ids: list[str] | None) -> list[str]:
        """Log devices out (all the user's devices when None) and remove the
        pushers their tokens set; returns the hashes of the tokens revoked.
        Forgotten here at once: a logged-out client's next request to this
        process fails even before the caches stream brings the news."""
        # Pushers first: if the devices' deletion then fails, the client's
        # retry (its token still works) deletes them; the other way round a
        # failure would leave pushers of a device nobody can log out again.
        await self._calls.call(REMOVE_DEVICE_PUSHERS, DevicesLogout(user_id, device_ids))
        answer = await self._calls.call(
            DELETE_DEVICES, DevicesLogout(user_id, device_ids), instance=self.writer_for(user_id)
        )
        for token_hash in answer.token_hashes:
            self._store.get_user_by_access_token.invalidate(token_hash)
        return answer.token_hashes

    async def logout_devices(self, logout: DevicesLogout) -> TokensRevoked:
        """Serves :data:`DELETE_DEVICES` (on the user's device_lists writer).
        Answers once every process has forgotten the revoked tokens, or one
        that could not confirm it in time was logged (``handlers/revocation.py``)."""
        deleted, hashes = await self._store.delete_devices(logout.user_id, logout.device_ids)
        if hashes:
            await self._revocations.applied_everywhere()
        if deleted:
            await wake_for_device_change(self._store, self._notifier, logout.user_id)
        return TokensRevoked(hashes)

    async def rename_device(self, user_id: str, device_id: str, display_name: str | None) -> None:
        """``PUT /devices/{deviceId}``: 404 for a device the user does not have."""
        await self._calls.call(
            RENAME_DEVICE,
            DeviceRename(user_id, device_id, display_name),
            instance=self.writer_for(user_id),
        )

    async def rename_device_here(self, rename: DeviceRename) -> StreamWritten:
        """Serves :data:`RENAME_DEVICE` (on the user's device_lists writer)."""
        written = await self._store.set_device_display_name(
            rename.user_id, rename.device_id, rename.display_name
        )
        if written is None:
            raise NotFoundError("No such device")
        await wake_for_device_change(self._store, self._notifier, rename.user_id)
        return StreamWritten(written)

    async def get_devices(self, user_id: str) -> list[dict[str, Any]]:
        return [_client_device(d) for d in await self._store.get_devices_by_user(user_id)]

    async def has_device(self, user_id: str, device_id: str) -> bool:
        """Whether ``user_id`` has a device ``device_id`` now."""
        return await self._store.get_device(user_id, device_id) is not None

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
