"""End-to-end encryption: device keys (``/keys/...``) and key backup
(``/room_keys/...``). The logic is in ``handlers/e2e_keys.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.http.server import JsonResource, parse_json_object_from_request, query_string
from synapse_lite.rest.client._base import client_path, unstable_client_path

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    auth = handlers.auth
    keys = handlers.e2e_keys

    async def upload(request: Request, device_id: str | None = None) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        if device_id is not None and device_id != requester.device_id:
            # The deprecated form with the device in the path: only one's own.
            raise SynapseError(400, "The device in the path must be your own", Codes.INVALID_PARAM)
        body = parse_json_object_from_request(request)
        return 200, await keys.upload_keys(requester, body)

    async def query(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        body = parse_json_object_from_request(request)
        return 200, await keys.query_keys(body, requester.user_id)

    async def device_signing(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        body = parse_json_object_from_request(request)
        return 200, await keys.upload_cross_signing_keys(requester, body, handlers.ui_auth)

    async def signatures(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        return 200, await keys.upload_signatures(requester, parse_json_object_from_request(request))

    async def claim(request: Request) -> tuple[int, Any]:
        await auth.get_user_by_req(request)
        return 200, await keys.claim_keys(parse_json_object_from_request(request))

    async def changes(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        from_token = query_string(request, "from")
        to_token = query_string(request, "to")
        if from_token is None or to_token is None:
            raise SynapseError(
                400, "'from' and 'to' (sync tokens) are required", Codes.MISSING_PARAM
            )
        changed, left = await handlers.sync.device_list_changes(
            requester.user_id, from_token, to_token
        )
        return 200, {"changed": changed, "left": left}

    backup = handlers.room_keys

    async def current_version(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        return 200, await backup.get_version(requester.user_id, None)

    async def create_version(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        body = parse_json_object_from_request(request)
        return 200, await backup.create_version(requester.user_id, body)

    async def get_version(request: Request, version: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        return 200, await backup.get_version(requester.user_id, version)

    async def put_version(request: Request, version: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        body = parse_json_object_from_request(request)
        await backup.update_version(requester.user_id, version, body)
        return 200, {}

    async def delete_version(request: Request, version: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        await backup.delete_version(requester.user_id, version)
        return 200, {}

    async def put_keys(
        request: Request, room_id: str | None = None, session_id: str | None = None
    ) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        body = parse_json_object_from_request(request)
        return 200, await backup.put_keys(
            requester.user_id, query_string(request, "version"), body, room_id, session_id
        )

    async def get_keys(
        request: Request, room_id: str | None = None, session_id: str | None = None
    ) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        return 200, await backup.get_keys(
            requester.user_id, query_string(request, "version"), room_id, session_id
        )

    async def delete_keys(
        request: Request, room_id: str | None = None, session_id: str | None = None
    ) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        return 200, await backup.delete_keys(
            requester.user_id, query_string(request, "version"), room_id, session_id
        )

    register = resource.register_paths
    register("POST", client_path("/keys/upload"), upload, "keys_upload")
    register("POST", client_path("/keys/upload/(?P<device_id>[^/]+)"), upload, "keys_upload")
    register("POST", client_path("/keys/query"), query, "keys_query")
    register("POST", client_path("/keys/claim"), claim, "keys_claim")
    register("GET", client_path("/keys/changes"), changes, "keys_changes")
    # Cross-signing came into Matrix 1.1 from MSC1756, whose clients (and
    # SyTest) use its unstable paths.
    for prefixed in (client_path, unstable_client_path):
        register("POST", prefixed("/keys/device_signing/upload"), device_signing, "keys_signing")
        register("POST", prefixed("/keys/signatures/upload"), signatures, "keys_signing")
    register("GET", client_path("/room_keys/version"), current_version, "room_keys")
    register("POST", client_path("/room_keys/version"), create_version, "room_keys")
    version_path = client_path("/room_keys/version/(?P<version>[^/]+)")
    register("GET", version_path, get_version, "room_keys")
    register("PUT", version_path, put_version, "room_keys")
    register("DELETE", version_path, delete_version, "room_keys")
    for path in (
        "/room_keys/keys",
        "/room_keys/keys/(?P<room_id>[^/]+)",
        "/room_keys/keys/(?P<room_id>[^/]+)/(?P<session_id>[^/]+)",
    ):
        register("PUT", client_path(path), put_keys, "room_keys")
        register("GET", client_path(path), get_keys, "room_keys")
        register("DELETE", client_path(path), delete_keys, "room_keys")
