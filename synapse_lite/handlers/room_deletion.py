"""Deleting a room through the admin API (``DELETE /_synapse/admin/v{1,2}/rooms/
{roomId}``): a long job stored in ``admin_tasks`` (``handlers/admin_jobs.py``),
so that its status is answered from any process and a job a restart
interrupted resumes.

The job's steps, each safe to repeat (a resumed job repeats at most the
step it was in, and the row records what each did):

1. block the room if asked (nobody of this server may join it again);
2. every local member (joined, invited, knocking) leaves, as themself;
3. the room's local aliases are deleted and it leaves the room directory;
4. with ``purge`` (the default), every event of the room is pruned as a
   redaction prunes it, in batches (the row records the last event done),
   and its search index rows are deleted.

Decision (``docs/admin-api.md``): a purge prunes events instead of deleting
their rows. The events stream never loses rows (the audit, ``docs/audit.md``,
reports a missing row as an error), positions stay valid for every reader,
and what an operator deletes a room for, its content, is gone.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, NotFoundError, SynapseError
from synapse_lite.api.identifiers import check_room_id, is_mine_id
from synapse_lite.handlers.admin_jobs import AdminJobRunner
from synapse_lite.handlers.auth import Requester
from synapse_lite.http.fields import get_bool, get_optional_str
from synapse_lite.storage.databases.main.admin_tasks import UNFINISHED, AdminTask

if TYPE_CHECKING:
    from synapse_lite.handlers.room_member import RoomMemberHandler
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

DELETE_ROOM = "delete_room"

#: Events pruned per batch of a purge (one row update after each).
PURGE_BATCH = 100


def shutdown_json(task: AdminTask) -> dict[str, Any]:
    """What a deletion's status shows of its shutdown step (the reference's
    ``shutdown_room``)."""
    return {
        "kicked_users": task.result.get("kicked_users", []),
        "failed_to_kick_users": task.result.get("failed_to_kick_users", []),
        "local_aliases": task.result.get("local_aliases", []),
        "new_room_id": None,
    }


def status_json(task: AdminTask) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "delete_id": task.task_id,
        "room_id": task.resource_id,
        "status": task.status,
        "shutdown_room": shutdown_json(task),
    }
    if task.error is not None:
        answer["error"] = task.error
    return answer


class RoomDeletionHandler(AdminJobRunner):
    """Schedules, runs and resumes room deletions (``handlers/admin_jobs.py``)."""

    action = DELETE_ROOM

    def __init__(
        self, store: GenericWorkerStore, members: RoomMemberHandler, server_name: str
    ) -> None:
        super().__init__(store)
        self._members = members
        self._server_name = server_name

    # Scheduling and status

    async def schedule(self, admin: Requester, room_id: str, body: dict[str, Any]) -> str:
        """Record a deletion of ``room_id`` and start it; its delete id."""
        check_room_id(room_id)
        params = {
            "block": get_bool(body, "block", False),
            "purge": get_bool(body, "purge", True),
            "force_purge": get_bool(body, "force_purge", False),
            "requester": admin.user_id,
        }
        for field in ("new_room_user_id", "room_name", "message"):
            get_optional_str(body, field)
        if body.get("new_room_user_id") is not None:
            # Moving members to a notice room is not done: refused rather
            # than silently skipped.
            raise SynapseError(
                400, "'new_room_user_id' is not supported by this server", Codes.INVALID_PARAM
            )
        if not await self._store.room_exists(room_id):
            raise NotFoundError("Room not found")
        for task in await self._store.get_admin_tasks_for(DELETE_ROOM, room_id):
            if task.status in UNFINISHED:
                raise SynapseError(
                    400, f"The room is being deleted already ({task.task_id})", Codes.INVALID_PARAM
                )
        task_id = uuid.uuid4().hex
        await self._store.insert_admin_task(task_id, DELETE_ROOM, room_id, params)
        logger.info("admin %s scheduled the deletion %s of %s", admin.user_id, task_id, room_id)
        self.launch(task_id)
        return task_id

    async def status_by_id(self, task_id: str) -> dict[str, Any]:
        task = await self._store.get_admin_task(task_id)
        if task is None or task.action != DELETE_ROOM:
            raise NotFoundError("delete id not found")
        return status_json(task)

    async def status_of_room(self, room_id: str) -> dict[str, Any]:
        check_room_id(room_id)
        tasks = await self._store.get_admin_tasks_for(DELETE_ROOM, room_id)
        if not tasks:
            raise NotFoundError("No deletion found for this room")
        return {"results": [status_json(t) for t in tasks]}

    # Running

    async def steps(self, task: AdminTask, result: dict[str, Any]) -> None:
        room_id, params = task.resource_id, task.params
        if params.get("block"):
            await self._store.block_room(room_id, params["requester"])
        kicked = result.setdefault("kicked_users", [])
        failed = result.setdefault("failed_to_kick_users", [])
        for user_id in await self._store.get_members_to_remove(room_id):
            if not is_mine_id(user_id, self._server_name) or user_id in failed:
                continue
            try:
                await self.leave(user_id, room_id)
                if user_id not in kicked:
                    kicked.append(user_id)
            except SynapseError as e:
                logger.warning("%s could not leave %s: %s", user_id, room_id, e.msg)
                failed.append(user_id)
            await self.save(task.task_id, result)
        if "local_aliases" not in result:
            aliases = await self._store.get_aliases_for_room(room_id)
            for alias in aliases:
                await self._store.delete_alias(alias)
            await self._store.set_room_in_directory(room_id, False)
            result["local_aliases"] = aliases
            await self.save(task.task_id, result)
        if params.get("purge") and not result.get("purged"):
            await self._purge(task.task_id, room_id, result)

    async def leave(self, user_id: str, room_id: str) -> None:
        """``user_id`` leaves ``room_id`` (an invite or knock is withdrawn)."""
        await self._members.update_membership(Requester(user_id, "", ""), room_id, "leave")

    async def _purge(self, task_id: str, room_id: str, result: dict[str, Any]) -> None:
        while True:
            batch = await self._store.get_room_event_ids_after(
                room_id, result.get("purged_upto"), PURGE_BATCH
            )
            for _, event_id in batch:
                await self._store.expire_event(event_id)
            if not batch:
                break
            result["purged_upto"] = batch[-1][0]
            await self.save(task_id, result)
        await self._store.delete_room_search_rows(room_id)
        result["purged"] = True
        await self.save(task_id, result)
