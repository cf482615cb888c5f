"""The ephemeral events of joined rooms in /sync: typing notifications and
read receipts."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any, Protocol

from synapse_lite.handlers.sync_sections.request import SyncRequest, SyncResponse
from synapse_lite.tokens import StreamToken

if TYPE_CHECKING:
    from synapse_lite.handlers.filtering import EventFilter
    from synapse_lite.handlers.typing import TypingHandlerBase
    from synapse_lite.storage.change_tracker import PositionChangeTracker


class ReceiptsStore(Protocol):
    @property
    def receipt_changes(self) -> PositionChangeTracker: ...

    async def get_receipts_for_rooms(
        self, room_ids: list[str], from_id: int | None, to_id: int
    ) -> list[tuple[str, str, str, str, dict[str, Any]]]: ...


def filter_room_events(by_room: dict[str, list[dict[str, Any]]], event_filter: EventFilter) -> None:
    """Drop, in place, the non-timeline room events (ephemeral, account
    data: no sender) that ``event_filter`` refuses."""
    if event_filter.allows_all:
        return
    for room_id, events in by_room.items():
        by_room[room_id] = [
            e for e in events if event_filter.matches(e["type"], "", room_id, e.get("content"))
        ]


class EphemeralSection:
    """``m.typing`` and ``m.receipt`` of the joined rooms, for their entries'
    ``ephemeral`` (the rooms section places them). The typing position
    handed out is the typing writer's, as read with the typing rooms."""

    independent = False

    def __init__(self, store: ReceiptsStore, typing: TypingHandlerBase) -> None:
        self._store = store
        self._typing = typing

    async def add_to(self, request: SyncRequest, response: SyncResponse) -> None:
        since = request.since
        typing, typing_key = self._typing.get_typing_for_rooms(
            request.joined, None if since is None else since.get("typing")
        )
        response.now = response.now.with_positions(typing=typing_key)
        ephemeral: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for room_id, user_ids in typing.items():
            if since is not None or user_ids:
                ephemeral[room_id].append({"type": "m.typing", "content": {"user_ids": user_ids}})
        receipts = await self.receipts(request.user_id, request.joined, since, response.now)
        for room_id, receipt in receipts.items():
            ephemeral[room_id].append(receipt)
        filter_room_events(ephemeral, request.filter.ephemeral)
        for room_id, events in ephemeral.items():
            response.add_room_events(room_id, "ephemeral", events)

    async def receipts(
        self, user_id: str, joined: list[str], since: StreamToken | None, now: StreamToken
    ) -> dict[str, dict[str, Any]]:
        """The ``m.receipt`` event of each room whose receipts changed in
        ``(since, now]`` (every receipt when ``since`` is None)."""
        if not joined or (since is not None and since.get("receipts") >= now.get("receipts")):
            return {}
        if since is not None:
            # Rooms whose receipts cannot have changed have no rows to read.
            joined = self._store.receipt_changes.changed_among(joined, since.get("receipts"))
            if not joined:
                return {}
        rows = await self._store.get_receipts_for_rooms(
            joined, None if since is None else since.get("receipts"), now.get("receipts")
        )
        contents: dict[str, dict[str, Any]] = {}
        for room_id, receipt_type, receipt_user, event_id, data in rows:
            if receipt_type == "m.read.private" and receipt_user != user_id:
                continue
            content = contents.setdefault(room_id, {})
            content.setdefault(event_id, {}).setdefault(receipt_type, {})[receipt_user] = data
        return {r: {"type": "m.receipt", "content": c} for r, c in contents.items()}
