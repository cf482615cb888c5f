"""Purging a room's history through the admin API (``POST
/_synapse/admin/v1/purge_history/{roomId}[/{eventId}]``, status at
``GET /v1/purge_history_status/{purgeId}``): a long job
(``handlers/admin_jobs.py``) that prunes, as a redaction prunes it, every
event of the room before a point, in batches (the row records the last
event done, so a resumed job goes on from there).

Kept, whatever the point: the events of the room's current state (their
content is the room's name, rules, members...), the room's newest event
(new events name it as their parent), and, unless ``delete_local_events``,
the events this server's users sent. Pruning rather than deleting rows, as
room deletion does (``docs/admin-api.md``): the events stream keeps its rows.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, NotFoundError, SynapseError
from synapse_lite.api.identifiers import check_identifier_text, check_room_id, is_mine_id
from synapse_lite.handlers.admin_jobs import AdminJobRunner
from synapse_lite.handlers.auth import Requester
from synapse_lite.http.fields import get_bool
from synapse_lite.storage.databases.main.admin_tasks import UNFINISHED, AdminTask

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

PURGE_HISTORY = "purge_history"

#: Events read per batch (one row update after each).
PURGE_BATCH = 100


class PurgeHistoryHandler(AdminJobRunner):
    action = PURGE_HISTORY

    def __init__(self, store: GenericWorkerStore, server_name: str) -> None:
        super().__init__(store)
        self._server_name = server_name

    async def schedule(
        self, admin: Requester, room_id: str, event_id: str | None, body: dict[str, Any]
    ) -> str:
        """Record a purge of ``room_id``'s history before ``event_id`` (the
        path's, else ``purge_up_to_event_id``) or before
        ``purge_up_to_ts``; start it; its purge id."""
        check_room_id(room_id)
        delete_local = get_bool(body, "delete_local_events", False)
        if event_id is None:
            event_id = body.get("purge_up_to_event_id")
        ts = body.get("purge_up_to_ts")
        if not await self._store.room_exists(room_id):
            raise NotFoundError("Room not found")
        if event_id is not None:
            if not isinstance(event_id, str):
                raise SynapseError(
                    400, "'purge_up_to_event_id' must be an event id", Codes.INVALID_PARAM
                )
            check_identifier_text(event_id, "eventId")
            event = await self._store.get_event(event_id)
            if event is None:
                raise NotFoundError("Event not found")
            if event.room_id != room_id:
                raise SynapseError(400, "The event is in another room", Codes.INVALID_PARAM)
            upto = event.stream_ordering
        elif ts is not None:
            if isinstance(ts, bool) or not isinstance(ts, int):
                raise SynapseError(
                    400, "'purge_up_to_ts' must be a time in ms", Codes.INVALID_PARAM
                )
            last = await self._store.get_last_event_before_ts(room_id, ts)
            if last is None:
                raise NotFoundError("There is no event to purge before that time")
            upto = last + 1
        else:
            raise SynapseError(
                400, "Give 'purge_up_to_event_id' or 'purge_up_to_ts'", Codes.MISSING_PARAM
            )
        for task in await self._store.get_admin_tasks_for(PURGE_HISTORY, room_id):
            if task.status in UNFINISHED:
                raise SynapseError(
                    400, f"The room's history is being purged ({task.task_id})", Codes.INVALID_PARAM
                )
        params = {"upto": upto, "delete_local_events": delete_local, "requester": admin.user_id}
        task_id = uuid.uuid4().hex
        await self._store.insert_admin_task(task_id, PURGE_HISTORY, room_id, params)
        logger.info(
            "admin %s scheduled the purge %s of %s before position %d (local events too: %s)",
            admin.user_id,
            task_id,
            room_id,
            upto,
            delete_local,
        )
        self.launch(task_id)
        return task_id

    async def status(self, task_id: str) -> dict[str, Any]:
        """``status`` (``active`` while scheduled or running, ``complete``,
        ``failed`` with ``error``), as the reference answers."""
        task = await self._store.get_admin_task(task_id)
        if task is None or task.action != PURGE_HISTORY:
            raise NotFoundError("purge id not found")
        answer: dict[str, Any] = {"status": "active" if task.status in UNFINISHED else task.status}
        if task.error is not None:
            answer["error"] = task.error
        return answer

    async def steps(self, task: AdminTask, result: dict[str, Any]) -> None:
        room_id, params = task.resource_id, task.params
        upto = int(params["upto"])
        delete_local = bool(params.get("delete_local_events"))
        kept = set((await self._store.get_current_state_ids(room_id)).values())
        kept.update(await self._store.get_forward_extremities(room_id))
        while True:
            batch = [
                (ordering, event_id)
                for ordering, event_id in await self._store.get_room_event_ids_after(
                    room_id, result.get("purged_upto"), PURGE_BATCH
                )
                if ordering < upto
            ]
            if not batch:
                break
            events = await self._store.get_events(e for _, e in batch if e not in kept)
            pruned = [
                (ordering, event_id)
                for ordering, event_id in batch
                if event_id in events
                and (delete_local or not is_mine_id(events[event_id].sender, self._server_name))
            ]
            for _, event_id in pruned:
                await self._store.expire_event(event_id)
            if pruned:
                await self._store.delete_event_search_rows(pruned)
            result["purged_upto"] = batch[-1][0]
            result["pruned"] = result.get("pruned", 0) + len(pruned)
            await self.save(task.task_id, result)
