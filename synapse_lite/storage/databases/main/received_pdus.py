"""Events received from other servers, kept in the form they were sent
(``received_pdus``): what we serve of them over federation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from synapse_lite.storage._base import SQLBaseStore, db_to_json, json_encoder


class ReceivedPdusWorkerStore(SQLBaseStore):
    """Any process writes (the one that checked the event) and reads."""

    async def store_received_pdu(
        self, event_id: str, room_id: str, origin: str, pdu: dict[str, Any]
    ) -> None:
        """Keep ``pdu`` (checked: its id is ``event_id``) as received; a
        second copy of the same event changes nothing."""
        await self.db_pool.execute(
            "store_received_pdu",
            "INSERT INTO received_pdus (event_id, room_id, origin, pdu_json) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (event_id) DO NOTHING",
            event_id,
            room_id,
            origin,
            json_encoder(pdu),
        )

    async def delete_received_pdu(self, event_id: str) -> None:
        """Forget a received event that was refused."""
        await self.db_pool.execute(
            "delete_received_pdu", "DELETE FROM received_pdus WHERE event_id = ?", event_id
        )

    async def get_received_pdus(self, event_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The received form of those of ``event_ids`` other servers sent."""
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(event_ids), 500):
            chunk = list(event_ids[start : start + 500])
            marks = ", ".join("?" for _ in chunk)
            rows = await self.db_pool.select(
                "get_received_pdus",
                f"SELECT event_id, pdu_json FROM received_pdus WHERE event_id IN ({marks})",
                *chunk,
            )
            found.update({str(event_id): db_to_json(text) for event_id, text in rows})
        return found

    async def get_received_pdu_origins(self, event_ids: Sequence[str]) -> dict[str, str]:
        """The server each of those of ``event_ids`` other servers sent
        came from."""
        found: dict[str, str] = {}
        for start in range(0, len(event_ids), 500):
            chunk = list(event_ids[start : start + 500])
            marks = ", ".join("?" for _ in chunk)
            rows = await self.db_pool.select(
                "get_received_pdu_origins",
                f"SELECT event_id, origin FROM received_pdus WHERE event_id IN ({marks})",
                *chunk,
            )
            found.update({str(event_id): str(origin) for event_id, origin in rows})
        return found

    async def get_rejection_reason(self, event_id: str) -> str | None:
        """Why a stored event was rejected (the rule it broke), if it was."""
        rows = await self.db_pool.select(
            "get_rejection_reason", "SELECT reason FROM rejections WHERE event_id = ?", event_id
        )
        return str(rows[0][0]) if rows else None
