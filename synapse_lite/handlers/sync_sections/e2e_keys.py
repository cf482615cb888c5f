"""The syncing device's end-to-end key counts: ``device_one_time_keys_count``
and ``device_unused_fallback_key_types``."""

from __future__ import annotations

from typing import Protocol

from synapse_lite.handlers.sync_sections.request import SyncRequest, SyncResponse


class DeviceKeysStore(Protocol):
    async def get_device_key_counts(
        self, user_id: str, device_id: str
    ) -> tuple[dict[str, int], tuple[str, ...]]: ...


class E2EKeysSection:
    """Always present, never news on its own. Independent: its read runs
    beside the other sections' (it would otherwise be a round trip a woken
    /sync waits for in turn); both counts come from one interaction."""

    independent = True

    def __init__(self, store: DeviceKeysStore) -> None:
        self._store = store

    async def add_to(self, request: SyncRequest, response: SyncResponse) -> None:
        user_id, device_id = request.user_id, request.requester.device_id
        one_time_keys, fallback_types = await self._store.get_device_key_counts(user_id, device_id)
        # signed_curve25519 always: clients read a missing count as "unknown".
        response.put(
            "device_one_time_keys_count", {"signed_curve25519": 0, **one_time_keys}, news=False
        )
        response.put("device_unused_fallback_key_types", list(fallback_types), news=False)
