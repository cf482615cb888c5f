"""End-to-end encryption: device keys (``/keys/...``) and key backup
(``/room_keys/...``). The logic is in ``handlers/e2e_keys.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.http.server import JsonResource, parse_json_object_from_request, query_string
from synapse_lite.rest.client._base import client_path

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
        await auth.get_user_by_req(request)
        return 200, await keys.query_keys(parse_json_object_from_request(request))

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

    async def backup_version(request: Request) -> tuple[int, Any]:
        await auth.get_user_by_req(request)
        # No backup yet (the spec's answer, which clients take as "none").
        raise SynapseError(404, "No current backup version", Codes.NOT_FOUND)

    register = resource.register_paths
    register("POST", client_path("/keys/upload"), upload, "keys_upload")
    register("POST", client_path("/keys/upload/(?P<device_id>[^/]+)"), upload, "keys_upload")
    register("POST", client_path("/keys/query"), query, "keys_query")
    register("POST", client_path("/keys/claim"), claim, "keys_claim")
    register("GET", client_path("/keys/changes"), changes, "keys_changes")
    register("GET", client_path("/room_keys/version"), backup_version, "room_keys")
