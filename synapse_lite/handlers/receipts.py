"""Read receipts, written by the receipts writer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import AuthError, Codes, NotFoundError, SynapseError
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.writer_routing import write_on_stream_writer

if TYPE_CHECKING:
    from synapse_lite.server import HomeServer

RECEIPT_TYPES = ("m.read", "m.read.private")
SEND_RECEIPT_ENDPOINT = "send_receipt"


class ReceiptsHandler:
    """``POST /rooms/{roomId}/receipt/{type}/{eventId}``."""

    def __init__(self, hs: HomeServer) -> None:
        self._hs = hs
        self._store = hs.datastore

    async def send_receipt(
        self,
        requester: Requester,
        room_id: str,
        receipt_type: str,
        event_id: str,
        thread_id: str | None,
    ) -> None:
        """Checked here (reads are local); written by the receipts writer."""
        if receipt_type not in RECEIPT_TYPES:
            raise SynapseError(400, "Unsupported receipt type", Codes.INVALID_PARAM)
        user_id = requester.user_id
        if user_id not in await self._store.get_users_in_room(room_id):
            raise AuthError(403, "You are not in this room")
        event = await self._store.get_event(event_id)
        if event is None or event.room_id != room_id:
            raise NotFoundError("Unknown event")
        data = {"ts": self._hs.clock.time_msec()}
        if thread_id is not None:
            data["thread_id"] = thread_id  # type: ignore[assignment]
        body = {
            "room_id": room_id,
            "receipt_type": receipt_type,
            "user_id": user_id,
            "event_id": event_id,
            "thread_id": thread_id,
            "data": data,
        }
        await write_on_stream_writer(
            self._hs,
            "receipts",
            lambda: self.write_receipt(body),
            SEND_RECEIPT_ENDPOINT,
            body,
        )

    async def write_receipt(self, body: dict[str, Any]) -> int:
        """On the receipts writer: store a checked receipt and wake the room."""
        stream_id = await self._store.insert_receipt(
            body["room_id"],
            body["receipt_type"],
            body["user_id"],
            body["event_id"],
            body["data"],
            body["thread_id"],
        )
        self._hs.notifier.notify(rooms=[body["room_id"]])
        return stream_id
