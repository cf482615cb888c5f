"""The admin API's event reports: the reports users file with ``POST
/rooms/{roomId}/report/{eventId}`` (``handlers/reports.py``), listed, read
and deleted. The callers have checked the requester is a server admin."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import NotFoundError
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.filtering import CLIENT_FORMAT

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.handlers.admin_rooms import AdminRoomsHandler
    from synapse_lite.handlers.client_events import ClientEventFormatter
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)


class AdminReportsHandler:
    """``/_synapse/admin/v1/event_reports[/{reportId}]``."""

    def __init__(
        self,
        store: GenericWorkerStore,
        clock: Clock,
        rooms: AdminRoomsHandler,
        formatter: ClientEventFormatter,
    ) -> None:
        self._store = store
        self._clock = clock
        self._rooms = rooms
        self._formatter = formatter

    async def _report_json(self, row: tuple[Any, ...]) -> dict[str, Any]:
        report_id, received_ts, room_id, event_id, reporter, reason = row
        event = await self._store.get_event(event_id)
        summary = await self._rooms.summary(room_id) or {}
        return {
            "id": int(report_id),
            "received_ts": int(received_ts),
            "room_id": room_id,
            "name": summary.get("name"),
            "canonical_alias": summary.get("canonical_alias"),
            "event_id": event_id,
            "user_id": reporter,
            "sender": event.sender if event is not None else None,
            "reason": reason,
            # Not stored: the spec dropped it (v1.18).
            "score": None,
        }

    async def list_reports(
        self,
        offset: int,
        limit: int,
        descending: bool,
        reporter: str | None,
        room_id: str | None,
    ) -> dict[str, Any]:
        rows, total = await self._store.list_event_reports(
            offset, limit, descending, reporter, room_id
        )
        result: dict[str, Any] = {
            "event_reports": [await self._report_json(r) for r in rows],
            "total": total,
        }
        if offset + len(rows) < total:
            result["next_token"] = offset + len(rows)
        return result

    async def get_report(self, report_id: int) -> dict[str, Any]:
        row = await self._store.get_event_report(report_id)
        if row is None:
            raise NotFoundError("Event report not found")
        answer = await self._report_json(row)
        event = await self._store.get_event(row[3])
        answer["event_json"] = (
            (await self._formatter.render([event], self._clock.time_msec(), CLIENT_FORMAT))[0]
            if event is not None
            else None
        )
        return answer

    async def delete_report(self, admin: Requester, report_id: int) -> None:
        if not await self._store.delete_event_report(report_id):
            raise NotFoundError("Event report not found")
        logger.info("admin %s deleted the event report %d", admin.user_id, report_id)
