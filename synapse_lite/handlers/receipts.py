"""Read receipts, written by the receipts writer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from synapse_lite.api.content import RECEIPT_TYPES
from synapse_lite.api.errors import AuthError, Codes, NotFoundError, SynapseError
from synapse_lite.handlers.auth import Requester
from synapse_lite.replication.http.writes import SEND_RECEIPT, ReceiptWrite, StreamWritten

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.events import Event
    from synapse_lite.notifier import Notifier
    from synapse_lite.replication.http.calls import InternalCalls


class ReceiptsHandlerStore(Protocol):
    """The store reads of :class:`ReceiptsHandler`."""

    async def get_event(self, event_id: str) -> Event | None: ...

    async def get_users_in_room(self, room_id: str) -> frozenset[str]: ...

    async def insert_receipt(
        self,
        room_id: str,
        receipt_type: str,
        user_id: str,
        event_id: str,
        data: dict[str, Any],
        thread_id: str | None = None,
    ) -> int | None: ...


class ReceiptsHandler:
    """``POST /rooms/{roomId}/receipt/{type}/{eventId}``."""

    def __init__(
        self,
        store: ReceiptsHandlerStore,
        clock: Clock,
        notifier: Notifier,
        calls: InternalCalls,
    ) -> None:
        self._store = store
        self._clock = clock
        self._notifier = notifier
        self._calls = calls

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
        data: dict[str, object] = {"ts": self._clock.time_msec()}
        if thread_id is not None:
            data["thread_id"] = thread_id
        await self._calls.call(
            SEND_RECEIPT, ReceiptWrite(room_id, receipt_type, user_id, event_id, thread_id, data)
        )

    async def write_receipt(self, receipt: ReceiptWrite) -> StreamWritten:
        """Serves :data:`SEND_RECEIPT`: store a checked receipt and wake the
        room (a receipt that would move backwards is not stored: position 0,
        nothing to wait for)."""
        stream_id = await self._store.insert_receipt(
            receipt.room_id,
            receipt.receipt_type,
            receipt.user_id,
            receipt.event_id,
            receipt.data,
            receipt.thread_id,
        )
        if stream_id is None:
            return StreamWritten(0)
        self._notifier.notify(rooms=[receipt.room_id])
        return StreamWritten(stream_id)
