"""The syncing device's end-to-end key counts: ``device_one_time_keys_count``
and ``device_unused_fallback_key_types``."""

from __future__ import annotations

from typing import Protocol

from twisted.internet import defer

from synapse_lite.handlers.sync_sections.request import SyncRequest, SyncResponse


class DeviceKeysStore(Protocol):
    async def count_one_time_keys(self, user_id: str, device_id: str) -> dict[str, int]: ...

    async def get_unused_fallback_key_types(self, user_id: str, device_id: str) -> list[str]: ...


class E2EKeysSection:
    """Always present, never news on its own. Independent: its two reads run
    beside the other sections' (each would otherwise be a round trip a woken
    /sync waits for in turn)."""

    independent = True

    def __init__(self, store: DeviceKeysStore) -> None:
        self._store = store

    async def add_to(self, request: SyncRequest, response: SyncResponse) -> None:
        user_id, device_id = request.user_id, request.requester.device_id
        # Both reads at once; the second is consumed even when the first fails.
        fallback = defer.ensureDeferred(
            self._store.get_unused_fallback_key_types(user_id, device_id)
        )
        try:
            one_time_keys = await self._store.count_one_time_keys(user_id, device_id)
            fallback_types = await fallback
        finally:
            fallback.addErrback(lambda _: None)
        # signed_curve25519 always: clients read a missing count as "unknown".
        response.put(
            "device_one_time_keys_count", {"signed_curve25519": 0, **one_time_keys}, news=False
        )
        response.put("device_unused_fallback_key_types", fallback_types, news=False)
