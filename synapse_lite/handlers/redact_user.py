"""Redacting a user's events through the admin API (``POST
/_synapse/admin/v1/user/{userId}/redact``, status at ``GET
/v1/user/redact_status/{redactId}``): a long job (``handlers/admin_jobs.py``)
that redacts, room by room, the user's messages (every non-state event but
redactions) and joins, newest first, up to ``limit`` a room.

A redaction is sent as the user themself (a local user, who may always
redact their own events while in the room) or, with ``use_admin`` or for
another server's user, as the admin (who needs the power to redact in the
room). One that is refused (the user left the room, the admin has no power
there) is recorded in ``failed_redactions`` and the job goes on. The row
records each room done; a resumed job repeats at most the room it was in,
whose events already redacted are not redacted twice (the query leaves them
out, and each redaction's transaction id is the job's and the event's).
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, NotFoundError, SynapseError
from synapse_lite.api.identifiers import check_room_id, check_user_id, is_mine_id
from synapse_lite.handlers.admin_jobs import AdminJobRunner
from synapse_lite.handlers.admin_room_tools import as_member
from synapse_lite.handlers.auth import Requester
from synapse_lite.http.fields import get_bool, get_list, get_optional_int, get_optional_str
from synapse_lite.storage.databases.main.admin_tasks import AdminTask

if TYPE_CHECKING:
    from synapse_lite.handlers.message import EventCreationHandler
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

REDACT_USER = "redact_user"

#: Events redacted a room when the admin gives no ``limit`` (the reference's).
DEFAULT_LIMIT = 1000
#: Rooms one job may name.
MAX_ROOMS = 10_000


class RedactUserHandler(AdminJobRunner):
    action = REDACT_USER

    def __init__(
        self, store: GenericWorkerStore, server_name: str, events: EventCreationHandler
    ) -> None:
        super().__init__(store)
        self._server_name = server_name
        self._events = events

    async def schedule(self, admin: Requester, user_id: str, body: dict[str, Any]) -> str:
        """Record a redaction of ``user_id``'s events in ``rooms`` (all the
        rooms they are joined to or banned from now when empty); start it;
        its redact id."""
        check_user_id(user_id)
        if is_mine_id(user_id, self._server_name) and await self._store.get_user(user_id) is None:
            raise NotFoundError("User not found")
        if "rooms" not in body:
            raise SynapseError(400, "Missing 'rooms'", Codes.MISSING_PARAM)
        rooms = get_list(body, "rooms")
        if len(rooms) > MAX_ROOMS or not all(isinstance(r, str) for r in rooms):
            raise SynapseError(
                400, f"'rooms' must be a list of at most {MAX_ROOMS} room ids", Codes.BAD_JSON
            )
        for room_id in rooms:
            check_room_id(room_id)
        limit = get_optional_int(body, "limit", minimum=1)
        rooms = sorted(set(rooms)) or await self._store.get_rooms_to_redact_in(user_id)
        params: dict[str, Any] = {
            "rooms": rooms,
            "reason": get_optional_str(body, "reason", max_length=1024),
            "limit": DEFAULT_LIMIT if limit is None else limit,
            "use_admin": get_bool(body, "use_admin", False),
            "after_ts": get_optional_int(body, "after_ts"),
            "before_ts": get_optional_int(body, "before_ts"),
            "requester": admin.user_id,
        }
        task_id = uuid.uuid4().hex
        await self._store.insert_admin_task(task_id, REDACT_USER, user_id, params)
        logger.info(
            "admin %s scheduled the redaction %s of %s's events in %d rooms",
            admin.user_id,
            task_id,
            user_id,
            len(rooms),
        )
        self.launch(task_id)
        return task_id

    async def status(self, task_id: str) -> dict[str, Any]:
        """``status`` (``scheduled``, ``active``, ``complete``, ``failed``
        with ``error``) and ``failed_redactions`` (event id -> the error)."""
        task = await self._store.get_admin_task(task_id)
        if task is None or task.action != REDACT_USER:
            raise NotFoundError("redact id not found")
        answer: dict[str, Any] = {
            "status": task.status,
            "failed_redactions": dict(task.result.get("failed_redactions", {})),
        }
        if task.error is not None:
            answer["error"] = task.error
        return answer

    async def steps(self, task: AdminTask, result: dict[str, Any]) -> None:
        user_id, params = task.resource_id, task.params
        as_admin = bool(params.get("use_admin")) or not is_mine_id(user_id, self._server_name)
        actor = as_member(params["requester"] if as_admin else user_id)
        reason = params.get("reason")
        content: dict[str, object] = {} if reason is None else {"reason": reason}
        done = set(result.get("rooms_done", []))
        failed: dict[str, str] = result.setdefault("failed_redactions", {})
        for room_id in params["rooms"]:
            if room_id in done:
                continue
            event_ids = await self._store.get_events_to_redact(
                user_id,
                room_id,
                int(params["limit"]),
                params.get("after_ts"),
                params.get("before_ts"),
            )
            for event_id in event_ids:
                if event_id in failed:
                    continue
                try:
                    await self._events.send_client_event(
                        actor,
                        room_id,
                        "m.room.redaction",
                        content,
                        txn_id=f"admin-redact-{task.task_id}-{event_id}",
                        redacts=event_id,
                    )
                except SynapseError as e:
                    logger.info("redacting %s for the job %s failed: %s", event_id, task.task_id, e)
                    failed[event_id] = e.msg
            result["rooms_done"] = sorted(done | {room_id})
            done.add(room_id)
            result["redacted_rooms"] = len(done)
            await self.save(task.task_id, result)
