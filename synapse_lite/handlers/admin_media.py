"""The admin API's media quarantine and protection: one media, a room's,
a user's; and which media a room's events name. The callers have checked
the requester is a server admin.

A quarantined media is answered as unknown (404) by every download and
thumbnail (``media/repository.py``), on the media instance as soon as the
caches stream brings the change. Its file stays: unquarantining serves it
again. Quarantining another server's media id is accepted and changes
nothing (its cached copy, if any, is still served: purge_media_cache
removes it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, NotFoundError, SynapseError
from synapse_lite.api.identifiers import check_identifier_text, check_room_id
from synapse_lite.handlers.auth import Requester
from synapse_lite.replication.http.media import (
    DELETE_MEDIA,
    PURGE_MEDIA_CACHE,
    MediaCacheToPurge,
    MediaToDelete,
)

if TYPE_CHECKING:
    from synapse_lite.handlers.admin_users import AdminUsersHandler
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: Media ids per call to the media instance.
_DELETE_BATCH = 100

#: Events read per query while looking for a room's media.
_ROOM_SCAN_BATCH = 500


def mxc_uris(value: Any) -> set[str]:
    """Every ``mxc://`` URI in an event's content, wherever it is (``url``,
    ``info.thumbnail_url``, avatars, ``file.url`` of encrypted files...)."""
    found: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if item.startswith("mxc://"):
                found.add(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def split_mxc(uri: str) -> tuple[str, str] | None:
    """``(server_name, media_id)`` of a well-formed ``mxc://`` URI."""
    server, _, media_id = uri[len("mxc://") :].partition("/")
    if not server or not media_id or "/" in media_id:
        return None
    return server, media_id


class AdminMediaHandler:
    def __init__(
        self,
        store: GenericWorkerStore,
        server_name: str,
        users: AdminUsersHandler,
        calls: InternalCalls,
        media_instance: str,
    ) -> None:
        self._store = store
        self._server_name = server_name
        self._users = users
        self._calls = calls
        self._media_instance = media_instance

    async def _local_media(self, media_id: str) -> None:
        check_identifier_text(media_id, "mediaId")
        if not await self._store.get_existing_media_ids([media_id]):
            raise NotFoundError("Unknown media")

    async def quarantine_one(
        self, admin: Requester, server_name: str, media_id: str, quarantine: bool
    ) -> None:
        """Quarantine (or release) one media, protected or not."""
        if server_name != self._server_name:
            return
        await self._local_media(media_id)
        await self._store.quarantine_media(
            [media_id], admin.user_id if quarantine else None, spare_protected=False
        )
        logger.info("admin %s set quarantine=%s on %s", admin.user_id, quarantine, media_id)

    async def protect(self, admin: Requester, media_id: str, protected: bool) -> None:
        await self._local_media(media_id)
        await self._store.set_media_protected(media_id, protected)
        logger.info("admin %s set protected=%s on %s", admin.user_id, protected, media_id)

    async def room_media(self, room_id: str) -> dict[str, Any]:
        """``local`` and ``remote``: the mxc URIs the room's events name
        (sorted; local ones only if this server has them), and ``total``."""
        check_room_id(room_id)
        if not await self._store.room_exists(room_id):
            raise NotFoundError("Room not found")
        uris: set[str] = set()
        after = None
        while True:
            batch = await self._store.get_room_event_ids_after(room_id, after, _ROOM_SCAN_BATCH)
            if not batch:
                break
            events = await self._store.get_events(e for _, e in batch)
            for event in events.values():
                uris |= mxc_uris(event.content)
            after = batch[-1][0]
        local: list[str] = []
        remote: list[str] = []
        for uri in sorted(uris):
            parts = split_mxc(uri)
            if parts is None:
                continue
            (local if parts[0] == self._server_name else remote).append(uri)
        held = set(await self._store.get_existing_media_ids([u.rsplit("/", 1)[1] for u in local]))
        local = [u for u in local if u.rsplit("/", 1)[1] in held]
        # ``total`` is not the reference's: the admin UI reads it.
        return {"local": local, "remote": remote, "total": len(local) + len(remote)}

    async def quarantine_room(self, admin: Requester, room_id: str) -> int:
        """Quarantine the local media the room's events name, but the
        protected; how many were quarantined now."""
        local = (await self.room_media(room_id))["local"]
        count = await self._store.quarantine_media(
            [u.rsplit("/", 1)[1] for u in local], admin.user_id, spare_protected=True
        )
        logger.info("admin %s quarantined %d media of %s", admin.user_id, count, room_id)
        return count

    async def quarantine_user(self, admin: Requester, user_id: str) -> int:
        """Quarantine the media ``user_id`` uploaded, but the protected."""
        await self._users.get_user(user_id)  # a local user who exists, or 400/404
        media_ids = await self._store.get_media_ids_of_user(user_id)
        count = await self._store.quarantine_media(media_ids, admin.user_id, spare_protected=True)
        logger.info("admin %s quarantined %d media of %s", admin.user_id, count, user_id)
        return count

    # Deletion: the media instance, which holds the files, deletes them.

    async def _delete(self, admin: Requester, media_ids: list[str], what: str) -> dict[str, Any]:
        deleted: list[str] = []
        for start in range(0, len(media_ids), _DELETE_BATCH):
            answer = await self._calls.call(
                DELETE_MEDIA,
                MediaToDelete(media_ids[start : start + _DELETE_BATCH]),
                instance=self._media_instance,
            )
            deleted.extend(answer.deleted)
        logger.info("admin %s deleted %d media (%s)", admin.user_id, len(deleted), what)
        return {"deleted_media": deleted, "total": len(deleted)}

    async def purge_cache(self, admin: Requester, before_ts: int) -> dict[str, Any]:
        """``POST /v1/purge_media_cache``: other servers' media cached here
        and last downloaded before ``before_ts`` (local uploads untouched)."""
        answer = await self._calls.call(
            PURGE_MEDIA_CACHE, MediaCacheToPurge(before_ts), instance=self._media_instance
        )
        logger.info(
            "admin %s purged %d cached remote media used before %d",
            admin.user_id,
            answer.deleted,
            before_ts,
        )
        return {"deleted": answer.deleted}

    async def delete_one(self, admin: Requester, server_name: str, media_id: str) -> dict[str, Any]:
        if server_name != self._server_name:
            raise SynapseError(400, "Only local media can be deleted", Codes.INVALID_PARAM)
        await self._local_media(media_id)
        return await self._delete(admin, [media_id], media_id)

    async def delete_older(
        self, admin: Requester, before_ts: int, size_gt: int, keep_profiles: bool
    ) -> dict[str, Any]:
        """``POST /v1/media/delete``: uploads made before ``before_ts``,
        larger than ``size_gt``, but the protected ones and (``keep_profiles``)
        users' avatars."""
        media_ids = await self._store.find_media_to_delete(
            before_ts, size_gt, keep_profiles, self._server_name
        )
        return await self._delete(admin, media_ids, f"before {before_ts}, over {size_gt} bytes")

    async def delete_user_media(
        self,
        admin: Requester,
        user_id: str,
        offset: int,
        limit: int,
        order_by: str,
        descending: bool,
    ) -> dict[str, Any]:
        """``DELETE /v1/users/{userId}/media``: the page of the user's media
        the same parameters list."""
        await self._users.get_user(user_id)
        rows, _ = await self._store.list_user_media(user_id, offset, limit, order_by, descending)
        return await self._delete(admin, [str(r[0]) for r in rows], f"of {user_id}")
