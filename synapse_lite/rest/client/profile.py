"""``GET /profile/{userId}``, ``GET/PUT /profile/{userId}/{displayname|avatar_url}``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.errors import Codes, NotFoundError, SynapseError
from synapse_lite.api.identifiers import check_user_id
from synapse_lite.handlers.profile import PROFILE_FIELDS, check_profile_value
from synapse_lite.handlers.suspension import refuse_if_suspended
from synapse_lite.http.server import JsonResource, parse_json_object_from_request
from synapse_lite.rest.client._base import client_path

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    auth = handlers.auth

    def check_field(field: str) -> None:
        if field not in PROFILE_FIELDS:
            raise SynapseError(
                400, "Only displayname and avatar_url are supported", Codes.INVALID_PARAM
            )

    # Reads need no access token: a profile is public (as the spec allows).
    async def get_profile(request: Request, user_id: str) -> tuple[int, Any]:
        check_user_id(user_id)
        profile = await handlers.profiles.get_profile(user_id)
        return 200, {k: v for k, v in profile.items() if v is not None}

    async def get_field(request: Request, user_id: str, field: str) -> tuple[int, Any]:
        check_user_id(user_id)
        check_field(field)
        value = (await handlers.profiles.get_profile(user_id)).get(field)
        if value is None:
            raise NotFoundError(f"No {field} set")
        return 200, {field: value}

    async def put_field(request: Request, user_id: str, field: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        refuse_if_suspended(requester, "change your profile")
        check_user_id(user_id)
        check_field(field)
        body = parse_json_object_from_request(request)
        if field not in body:
            raise SynapseError(400, f"Missing '{field}'", Codes.MISSING_PARAM)
        value = check_profile_value(field, body[field])
        await handlers.profiles.set_field(requester, user_id, field, value)
        return 200, {}

    register = resource.register_paths
    profile = client_path("/profile/(?P<user_id>[^/]+)")
    register("GET", profile, get_profile, "profile")
    register("GET", profile + "/(?P<field>[^/]+)", get_field, "profile")
    register("PUT", profile + "/(?P<field>[^/]+)", put_field, "profile_update")
