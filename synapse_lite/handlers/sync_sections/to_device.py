"""``to_device``: the messages sent to the syncing device."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from synapse_lite.handlers.sync_sections.request import SyncRequest, SyncResponse

if TYPE_CHECKING:
    from synapse_lite.storage.change_tracker import PositionChangeTracker

#: To-device messages per sync (more wait for the next one).
TO_DEVICE_LIMIT = 100


class ToDeviceStore(Protocol):
    @property
    def to_device_changes(self) -> PositionChangeTracker: ...

    async def get_messages_for_device(
        self, user_id: str, device_id: str, from_id: int, to_id: int, limit: int
    ) -> tuple[list[dict[str, Any]], int]: ...


class ToDeviceSection:
    """Up to :data:`TO_DEVICE_LIMIT` messages after the client's position; the
    token handed out moves only as far as the messages sent (the rest come
    with the next sync). Deleting the acknowledged ones is the sync
    handler's, before the sections run."""

    independent = False

    def __init__(self, store: ToDeviceStore) -> None:
        self._store = store

    async def add_to(self, request: SyncRequest, response: SyncResponse) -> None:
        since, now = request.since, response.now
        from_key = 0 if since is None else since.get("to_device")
        messages: list[dict[str, Any]] = []
        upto = now.get("to_device")
        requester = request.requester
        if since is None or (
            from_key < upto
            and self._store.to_device_changes.may_have_changed(requester.user_id, from_key)
        ):
            messages, upto = await self._store.get_messages_for_device(
                requester.user_id, requester.device_id, from_key, upto, TO_DEVICE_LIMIT
            )
        response.now = now.with_positions(to_device=upto)
        response.put("to_device", {"events": messages}, news=bool(messages))
