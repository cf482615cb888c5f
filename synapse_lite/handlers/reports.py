"""Reporting rooms, events and users to the server's admins.

A report is a row of ``content_reports`` for the admins to read; nothing is
forwarded. Reporting an event needs the reporter joined to its room; a room
or user report does not. What does not exist is a 404, as the spec allows
(the spec also allows hiding that with a 200: we prefer telling a client its
report went nowhere).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, NotFoundError, SynapseError
from synapse_lite.api.identifiers import is_mine_id
from synapse_lite.handlers.auth import Requester
from synapse_lite.http.fields import get_optional_str

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: Longest reason kept (characters).
MAX_REASON_LENGTH = 4096


def _reason(body: dict[str, Any], required: bool) -> str | None:
    if required and "reason" not in body:
        raise SynapseError(400, "Missing 'reason'", Codes.MISSING_PARAM)
    reason = get_optional_str(body, "reason", max_length=MAX_REASON_LENGTH)
    # ``score`` was removed from the spec in v1.18; older clients still send it.
    score = body.get("score")
    if score is not None and (
        not isinstance(score, int) or isinstance(score, bool) or not -100 <= score <= 0
    ):
        raise SynapseError(400, "'score' must be an integer from -100 to 0", Codes.INVALID_PARAM)
    return reason


class ReportsHandler:
    """``POST /rooms/{roomId}/report[/{eventId}]`` and ``/users/{userId}/report``."""

    def __init__(self, store: GenericWorkerStore, server_name: str) -> None:
        self._store = store
        self._server_name = server_name

    async def report_event(
        self, requester: Requester, room_id: str, event_id: str, body: dict[str, Any]
    ) -> None:
        reason = _reason(body, required=False)
        membership = await self._store.get_membership_in_room(requester.user_id, room_id)
        event = await self._store.get_event(event_id)
        if (
            membership is None
            or membership[0] != "join"
            or event is None
            or (event.room_id != room_id)
        ):
            raise NotFoundError("The event was not found or you are not joined to the room.")
        await self._store.add_content_report(requester.user_id, room_id, event_id, None, reason)
        logger.info("%s reported %s in %s", requester.user_id, event_id, room_id)

    async def report_room(self, requester: Requester, room_id: str, body: dict[str, Any]) -> None:
        reason = _reason(body, required=True)
        if not await self._store.room_exists(room_id):
            raise NotFoundError("The room was not found.")
        await self._store.add_content_report(requester.user_id, room_id, None, None, reason)
        logger.info("%s reported %s", requester.user_id, room_id)

    async def report_user(self, requester: Requester, user_id: str, body: dict[str, Any]) -> None:
        reason = _reason(body, required=True)
        if is_mine_id(user_id, self._server_name) and await self._store.get_user(user_id) is None:
            raise NotFoundError("The user was not found.")
        await self._store.add_content_report(requester.user_id, None, None, user_id, reason)
        logger.info("%s reported %s", requester.user_id, user_id)
