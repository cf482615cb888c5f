"""The admin API's media quarantine and protection:
``POST /v1/media/quarantine|unquarantine/{serverName}/{mediaId}``,
``POST /v1/media/protect|unprotect/{mediaId}``,
``POST /v1/room/{roomId}/media/quarantine``, ``GET /v1/room/{roomId}/media``,
``POST /v1/user/{userId}/media/quarantine``; deleting media:
``DELETE /v1/media/{serverName}/{mediaId}`` and ``POST /v1/media/delete``
(``DELETE /v1/users/{userId}/media`` is with the user's list, ``users.py``);
``POST /v1/purge_media_cache`` (other servers' media cached by the media instance)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.http.server import JsonResource, query_bool, query_int
from synapse_lite.rest.admin._base import admin_path

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers

logger = logging.getLogger(__name__)

MEDIA = "/(?P<server_name>[^/]+)/(?P<media_id>[^/]+)"


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    admin = handlers.admin
    media = handlers.admin_media

    def quarantine_one(quarantine: bool) -> Any:
        async def servlet(request: Request, server_name: str, media_id: str) -> tuple[int, Any]:
            requester = await admin.get_admin_by_req(request)
            await media.quarantine_one(requester, server_name, media_id, quarantine)
            return 200, {}

        return servlet

    def protect(protected: bool) -> Any:
        async def servlet(request: Request, media_id: str) -> tuple[int, Any]:
            requester = await admin.get_admin_by_req(request)
            await media.protect(requester, media_id, protected)
            return 200, {}

        return servlet

    async def room_media(request: Request, room_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await media.room_media(room_id)

    async def quarantine_room(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        return 200, {"num_quarantined": await media.quarantine_room(requester, room_id)}

    async def quarantine_user(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        return 200, {"num_quarantined": await media.quarantine_user(requester, user_id)}

    async def delete_one(request: Request, server_name: str, media_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        return 200, await media.delete_one(requester, server_name, media_id)

    async def delete_older(request: Request, server_name: str | None = None) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        before_ts = query_int(request, "before_ts")
        if before_ts is None:
            raise SynapseError(400, "Missing 'before_ts'", Codes.MISSING_PARAM)
        size_gt = query_int(request, "size_gt", 0)
        assert size_gt is not None
        keep_profiles = bool(query_bool(request, "keep_profiles", True))
        if server_name is not None and server_name != handlers.server_name:
            raise SynapseError(400, "Only local media can be deleted", Codes.INVALID_PARAM)
        return 200, await media.delete_older(requester, before_ts, size_gt, keep_profiles)

    async def purge_media_cache(request: Request) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        before_ts = query_int(request, "before_ts")
        if before_ts is None:
            raise SynapseError(400, "Missing 'before_ts'", Codes.MISSING_PARAM)
        return 200, await media.purge_cache(requester, before_ts)

    register = resource.register_paths
    register("POST", admin_path("v1", "/purge_media_cache"), purge_media_cache, "admin_media_cache")
    register("DELETE", admin_path("v1", "/media" + MEDIA), delete_one, "admin_media_delete")
    register("POST", admin_path("v1", "/media/delete"), delete_older, "admin_media_delete_older")
    register(
        "POST",
        admin_path("v1", "/media/(?P<server_name>[^/]+)/delete"),
        delete_older,
        "admin_media_delete_older",
    )
    for action, value in (("quarantine", True), ("unquarantine", False)):
        path = admin_path("v1", f"/media/{action}{MEDIA}")
        register("POST", path, quarantine_one(value), "admin_media_quarantine")
    for action, value in (("protect", True), ("unprotect", False)):
        path = admin_path("v1", f"/media/{action}/(?P<media_id>[^/]+)")
        register("POST", path, protect(value), "admin_media_protect")
    room = "/room/(?P<room_id>[^/]+)/media"
    register("GET", admin_path("v1", room), room_media, "admin_room_media")
    register("POST", admin_path("v1", room + "/quarantine"), quarantine_room, "admin_room_media")
    register(
        "POST",
        admin_path("v1", "/user/(?P<user_id>[^/]+)/media/quarantine"),
        quarantine_user,
        "admin_user_media_quarantine",
    )
