"""``application_services_state``: how far each application service has
been sent the events stream, and the transaction being sent to it. Written
only by the process sending to that service (one per service)."""

from __future__ import annotations

import attr

from synapse_lite.events import Event
from synapse_lite.storage._base import SQLBaseStore, db_to_json, json_encoder
from synapse_lite.storage.database import LoggingTransaction
from synapse_lite.storage.databases.main.events_worker import (
    EVENT_COLUMNS,
    SERVED,
    EventsWorkerStore,
    event_from_row,
)
from synapse_lite.streams.catalog import ReceiptsStreamRow


@attr.s(slots=True, frozen=True, auto_attribs=True)
class AppServiceProgress:
    """Where a service is on the events stream.

    ``position``: every event up to it that concerns the service was
    acknowledged; ``last_txn_id``: the last transaction acknowledged;
    ``pending``: the transaction being sent, or None."""

    position: int
    last_txn_id: int
    pending: PendingTransaction | None = None


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PendingTransaction:
    """A transaction recorded before it is sent: its id, its events, and
    the position reached once it is acknowledged."""

    txn_id: int
    event_ids: tuple[str, ...]
    upto: int


class ApplicationServiceWorkerStore(EventsWorkerStore, SQLBaseStore):
    """Progress of the transactions to application services."""

    async def get_app_service_progress(self, as_id: str, start_at: int) -> AppServiceProgress:
        """The service's progress; a service seen for the first time starts
        at ``start_at`` (the events stream now: no history is replayed)."""

        def txn_func(txn: LoggingTransaction) -> AppServiceProgress:
            txn.execute(
                "INSERT INTO application_services_state (as_id, stream_position, last_txn_id)"
                " VALUES (?, ?, 0) ON CONFLICT (as_id) DO NOTHING",
                (as_id, start_at),
            )
            txn.execute(
                "SELECT stream_position, last_txn_id, pending_txn_id, pending_upto,"
                " pending_event_ids FROM application_services_state WHERE as_id = ?",
                (as_id,),
            )
            row = txn.fetchone()
            assert row is not None
            pending = None
            if row[2] is not None:
                event_ids = tuple(str(e) for e in db_to_json(row[4]))
                pending = PendingTransaction(int(row[2]), event_ids, int(row[3]))
            return AppServiceProgress(int(row[0]), int(row[1]), pending)

        return await self.db_pool.runInteraction("get_app_service_progress", txn_func)

    async def set_app_service_pending(self, as_id: str, pending: PendingTransaction) -> None:
        """Record the transaction about to be sent (before sending it)."""
        await self.db_pool.execute(
            "set_app_service_pending",
            "UPDATE application_services_state SET pending_txn_id = ?, pending_upto = ?,"
            " pending_event_ids = ? WHERE as_id = ?",
            pending.txn_id,
            pending.upto,
            json_encoder(list(pending.event_ids)),
            as_id,
        )

    async def set_app_service_position(self, as_id: str, position: int, last_txn_id: int) -> None:
        """Everything up to ``position`` is done (a transaction acknowledged,
        or events that did not concern the service); no transaction pending."""
        await self.db_pool.execute(
            "set_app_service_position",
            "UPDATE application_services_state SET stream_position = ?, last_txn_id = ?,"
            " pending_txn_id = NULL, pending_upto = NULL, pending_event_ids = NULL"
            " WHERE as_id = ?",
            position,
            last_txn_id,
            as_id,
        )

    async def get_receipts_between(
        self, after: int, upto: int, limit: int
    ) -> list[tuple[int, ReceiptsStreamRow]]:
        """Receipts of every writer with a stream id in ``(after, upto]``,
        oldest first, at most ``limit``."""
        rows = await self.db_pool.select(
            "get_receipts_between",
            "SELECT stream_id, room_id, receipt_type, user_id, event_id, thread_id, data"
            " FROM receipts_linearized WHERE ? < stream_id AND stream_id <= ?"
            " ORDER BY stream_id ASC LIMIT ?",
            after,
            upto,
            limit,
        )
        return [
            (int(r[0]), ReceiptsStreamRow(r[1], r[2], r[3], r[4], r[5], db_to_json(r[6])))
            for r in rows
        ]

    async def get_stream_events_between(self, after: int, upto: int, limit: int) -> list[Event]:
        """Events of the stream (no outliers, no backfill) in ``(after, upto]``,
        oldest first, at most ``limit``; ``upto`` should be persisted-up-to,
        below which no event can still appear."""
        rows = await self.db_pool.select(
            "get_stream_events_between",
            f"SELECT {EVENT_COLUMNS} FROM events WHERE stream_ordering > ?"
            f" AND stream_ordering <= ? AND {SERVED} ORDER BY stream_ordering ASC LIMIT ?",
            max(after, 0),
            upto,
            limit,
        )
        return [event_from_row(r) for r in rows]
