"""The durable inbound queue (``inbound_pdu_queue``): PDUs of received
transactions, checked by the process that answered ``/send`` and waiting
for their room's writer (docs/federation.md, "Inbound: the durable queue").

A PDU leaves the queue in one of two ways: the writer persists it, and the
same transaction moves its row to ``received_pdus``
(:meth:`EventsStore.persist_events`, ``from_inbound_queue``), or the writer
refuses it without storing it (:meth:`remove_inbound_pdu`). So a process
killed at any point leaves each PDU either queued or stored, never neither
nor both."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attr

from synapse_lite.storage._base import SQLBaseStore, db_to_json, json_encoder
from synapse_lite.storage.database import LoggingTransaction


@attr.s(slots=True, frozen=True, auto_attribs=True)
class QueuedPdu:
    """One queued PDU: ``pdu`` as checked (server-server JSON) from
    ``origin``; ``attempts``: the writer's failed tries so far."""

    queue_id: int
    event_id: str
    room_id: str
    origin: str
    pdu: dict[str, Any] = attr.ib(hash=False)
    attempts: int = 0


class InboundPduQueueWorkerStore(SQLBaseStore):
    """Any process with the federation API enqueues; the room's events
    writer reads and removes."""

    async def enqueue_inbound_pdus(
        self, pdus: Iterable[tuple[str, str, str, dict[str, Any]]]
    ) -> None:
        """Queue ``(event_id, room_id, origin, pdu)`` in this order, in one
        transaction (all or none). A PDU already queued keeps its place."""
        now = self.clock.time_msec()
        rows = [
            (event_id, room_id, origin, json_encoder(pdu), now)
            for event_id, room_id, origin, pdu in pdus
        ]
        if not rows:
            return

        def txn_func(txn: LoggingTransaction) -> None:
            # One row at a time: the ids follow the order given.
            for row in rows:
                txn.execute(
                    "INSERT INTO inbound_pdu_queue"
                    " (event_id, room_id, origin, pdu_json, received_ts)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (event_id) DO NOTHING",
                    row,
                )

        # Run twice after a COMMIT of unknown outcome, it queues nothing twice.
        await self.db_pool.runInteraction("enqueue_inbound_pdus", txn_func, idempotent=True)

    async def get_queued_inbound_event_ids(self, event_ids: Sequence[str]) -> set[str]:
        """Those of ``event_ids`` queued now."""
        found: set[str] = set()
        for start in range(0, len(event_ids), 500):
            chunk = list(event_ids[start : start + 500])
            marks = ", ".join("?" for _ in chunk)
            rows = await self.db_pool.select(
                "get_queued_inbound_event_ids",
                f"SELECT event_id FROM inbound_pdu_queue WHERE event_id IN ({marks})",
                *chunk,
            )
            found.update(str(r[0]) for r in rows)
        return found

    async def get_inbound_queue_rooms(self) -> list[str]:
        """The rooms with queued PDUs, the one waiting longest first."""
        rows = await self.db_pool.select(
            "get_inbound_queue_rooms",
            "SELECT room_id, MIN(queue_id) AS first FROM inbound_pdu_queue"
            " GROUP BY room_id ORDER BY first",
        )
        return [str(r[0]) for r in rows]

    async def get_inbound_queue(self, room_id: str, limit: int) -> list[QueuedPdu]:
        """The first ``limit`` queued PDUs of ``room_id``, in queue order."""
        rows = await self.db_pool.select(
            "get_inbound_queue",
            "SELECT queue_id, event_id, origin, pdu_json, attempts FROM inbound_pdu_queue"
            " WHERE room_id = ? ORDER BY queue_id LIMIT ?",
            room_id,
            limit,
        )
        return [
            QueuedPdu(int(q), str(e), room_id, str(o), db_to_json(p), int(a))
            for q, e, o, p, a in rows
        ]

    async def remove_inbound_pdu(self, event_id: str) -> None:
        """Drop a queued PDU the writer refused (not stored), or one it
        found stored already."""
        await self.db_pool.execute(
            "remove_inbound_pdu", "DELETE FROM inbound_pdu_queue WHERE event_id = ?", event_id
        )

    async def count_inbound_pdu_failure(self, event_id: str) -> int:
        """Record one more failed try at a queued PDU; the tries so far."""

        def txn_func(txn: LoggingTransaction) -> int:
            txn.execute(
                "UPDATE inbound_pdu_queue SET attempts = attempts + 1 WHERE event_id = ?",
                (event_id,),
            )
            txn.execute("SELECT attempts FROM inbound_pdu_queue WHERE event_id = ?", (event_id,))
            row = txn.fetchone()
            return int(row[0]) if row else 0

        return await self.db_pool.runInteraction("count_inbound_pdu_failure", txn_func)


def move_queued_to_received_txn(txn: LoggingTransaction, event_ids: Sequence[str]) -> None:
    """In the transaction persisting ``event_ids``: their queued rows become
    their ``received_pdus`` rows (the form we serve them in)."""
    for event_id in event_ids:
        txn.execute(
            "INSERT INTO received_pdus (event_id, room_id, origin, pdu_json)"
            " SELECT event_id, room_id, origin, pdu_json FROM inbound_pdu_queue"
            " WHERE event_id = ? ON CONFLICT (event_id) DO NOTHING",
            (event_id,),
        )
        txn.execute("DELETE FROM inbound_pdu_queue WHERE event_id = ?", (event_id,))
