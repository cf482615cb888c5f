"""The admin API's users: ``/v2/users`` and ``/v3/users`` (listing),
``/v2/users/{userId}`` (read, create, change), ``/v1/users/{userId}/admin``,
``/v1/deactivate/{userId}``, ``/v1/reset_password/{userId}`` and
``/v1/whois/{userId}``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import check_identifier_text
from synapse_lite.http.fields import bool_value, get_bool, get_list, get_optional_str, str_value
from synapse_lite.http.server import (
    JsonResource,
    parse_json_object_from_request,
    query_bool,
    query_int,
    query_string,
)
from synapse_lite.rest.admin._base import (
    MAX_PAGE,
    admin_path,
    query_choice,
    query_descending,
)
from synapse_lite.storage.databases.main.admin import (
    MEDIA_ORDERINGS,
    STATISTICS_ORDERINGS,
    USER_ORDERINGS,
    UserQuery,
)

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers

USER = "/(?P<user_id>[^/]+)"


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    admin = handlers.admin
    users = handlers.admin_users

    async def list_users(request: Request, flags_as_ints: bool) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        offset = query_int(request, "from", 0)
        limit = query_int(request, "limit", 100, minimum=1, maximum=MAX_PAGE)
        assert offset is not None and limit is not None
        query = UserQuery(
            user_id=query_string(request, "user_id"),
            name=query_string(request, "name"),
            guests=bool(query_bool(request, "guests", True)),
            deactivated=bool(query_bool(request, "deactivated", False)),
            admins=query_bool(request, "admins", None),
            order_by=query_choice(request, "order_by", list(USER_ORDERINGS), "name"),
            descending=query_descending(request),
        )
        return 200, await users.list_users(query, offset, limit, flags_as_ints)

    async def get_user(request: Request, user_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await users.get_user(user_id)

    async def put_user(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request)
        return await users.put_user(requester, user_id, body)

    async def get_admin(request: Request, user_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, {"admin": await users.is_admin(user_id)}

    async def put_admin(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request)
        value = bool_value(body.get("admin"), "admin")
        await users.set_admin(requester, user_id, value)
        return 200, {}

    async def deactivate(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request, allow_empty=True)
        erase = get_bool(body, "erase", False)
        result = await users.deactivate(requester, user_id, erase)
        return 200, {"id_server_unbind_result": result}

    async def reset_password(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request)
        await users.reset_password(requester, user_id, body)
        return 200, {}

    async def whois(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        users.check_local(user_id)
        return 200, await admin.whois(requester, user_id)

    async def shadow_ban(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        banned = request.method == b"POST"
        await users.set_shadow_banned(requester, user_id, banned)
        return 200, {}

    async def suspend(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request)
        if "suspend" not in body:
            raise SynapseError(400, "Missing 'suspend'", Codes.MISSING_PARAM)
        suspended = bool_value(body["suspend"], "suspend")
        await users.set_suspended(requester, user_id, suspended)
        # The reference's answer names the user in its key.
        return 200, {f"user_{user_id}_suspended": suspended}

    redactions = handlers.redact_user

    async def redact(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request)
        return 200, {"redact_id": await redactions.schedule(requester, user_id, body)}

    async def redact_status(request: Request, redact_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await redactions.status(redact_id)

    async def get_override(request: Request, user_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await users.get_ratelimit_override(user_id)

    async def set_override(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request, allow_empty=True)
        return 200, await users.set_ratelimit_override(requester, user_id, body)

    async def delete_override(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        await users.delete_ratelimit_override(requester, user_id)
        return 200, {}

    async def login_as(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request, allow_empty=True)
        return 200, {"access_token": await users.login_as(requester, user_id, body)}

    async def list_users_v2(request: Request) -> tuple[int, Any]:
        return await list_users(request, flags_as_ints=True)

    async def list_users_v3(request: Request) -> tuple[int, Any]:
        return await list_users(request, flags_as_ints=False)

    resource.register_paths("GET", admin_path("v2", "/users"), list_users_v2, "admin_users")
    resource.register_paths("GET", admin_path("v3", "/users"), list_users_v3, "admin_users")
    resource.register_paths("GET", admin_path("v2", "/users" + USER), get_user, "admin_user")
    resource.register_paths("PUT", admin_path("v2", "/users" + USER), put_user, "admin_user")
    user_admin = admin_path("v1", "/users" + USER + "/admin")
    resource.register_paths("GET", user_admin, get_admin, "admin_user_admin")
    resource.register_paths("PUT", user_admin, put_admin, "admin_user_admin")
    resource.register_paths(
        "POST", admin_path("v1", "/deactivate" + USER), deactivate, "admin_deactivate"
    )
    resource.register_paths(
        "POST", admin_path("v1", "/reset_password" + USER), reset_password, "admin_reset_password"
    )
    resource.register_paths("GET", admin_path("v1", "/whois" + USER), whois, "admin_whois_v1")
    resource.register_paths("PUT", admin_path("v1", "/suspend" + USER), suspend, "admin_suspend")
    resource.register_paths(
        "POST", admin_path("v1", "/user" + USER + "/redact"), redact, "admin_redact_user"
    )
    resource.register_paths(
        "GET",
        admin_path("v1", "/user/redact_status/(?P<redact_id>[^/]+)"),
        redact_status,
        "admin_redact_user_status",
    )
    banned = admin_path("v1", "/users" + USER + "/shadow_ban")
    resource.register_paths("POST", banned, shadow_ban, "admin_shadow_ban")
    resource.register_paths("DELETE", banned, shadow_ban, "admin_shadow_ban")
    login_path = admin_path("v1", "/users" + USER + "/login")
    resource.register_paths("POST", login_path, login_as, "admin_login_as")
    override = admin_path("v1", "/users" + USER + "/override_ratelimit")
    resource.register_paths("GET", override, get_override, "admin_override_ratelimit")
    resource.register_paths("POST", override, set_override, "admin_override_ratelimit")
    resource.register_paths("DELETE", override, delete_override, "admin_override_ratelimit")

    async def joined_rooms(request: Request, user_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await users.joined_rooms(user_id)

    async def memberships(request: Request, user_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await users.memberships(user_id)

    async def list_devices(request: Request, user_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await users.devices(user_id)

    async def get_device(request: Request, user_id: str, device_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        check_identifier_text(device_id, "deviceId")
        return 200, await users.device(user_id, device_id)

    async def put_device(request: Request, user_id: str, device_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        check_identifier_text(device_id, "deviceId")
        body = parse_json_object_from_request(request)
        name = get_optional_str(body, "display_name", max_length=256)
        await users.rename_device(requester, user_id, device_id, name)
        return 200, {}

    async def create_device(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request)
        device_id = body.get("device_id")
        if not isinstance(device_id, str):
            raise SynapseError(400, "'device_id' must be a string", Codes.MISSING_PARAM)
        check_identifier_text(device_id, "device_id")
        await users.create_device(requester, user_id, device_id)
        return 201, {}

    async def delete_device(request: Request, user_id: str, device_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        check_identifier_text(device_id, "deviceId")
        await users.delete_devices(requester, user_id, [device_id])
        return 200, {}

    async def delete_devices(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request)
        device_ids = [str_value(d, "devices") for d in get_list(body, "devices")]
        await users.delete_devices(requester, user_id, device_ids)
        return 200, {}

    async def username_available(request: Request) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        username = query_string(request, "username")
        if username is None:
            raise SynapseError(400, "Missing 'username'", Codes.MISSING_PARAM)
        await handlers.registration.check_username(username)
        return 200, {"available": True}

    def from_ts(request: Request) -> int:
        value = query_int(request, "from_ts")
        if value is None:
            raise SynapseError(400, "Missing query parameter 'from_ts'", Codes.MISSING_PARAM)
        return value

    async def sent_invite_count(request: Request, user_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await users.sent_invite_count(user_id, from_ts(request))

    async def joined_room_count(request: Request, user_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await users.cumulative_joined_room_count(user_id, from_ts(request))

    async def account_data(request: Request, user_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await users.account_data(user_id)

    async def get_features(request: Request, user_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        await users.get_user(user_id)
        # No experimental feature can be switched on per user here.
        return 200, {"features": {}}

    async def put_features(request: Request, user_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request)
        features = body.get("features")
        if not isinstance(features, dict):
            raise SynapseError(400, "'features' must be an object", Codes.BAD_JSON)
        if features:
            unknown = ", ".join(sorted(features))[:200]
            raise SynapseError(
                400, f"Unknown experimental features: {unknown}", Codes.INVALID_PARAM
            )
        await users.get_user(user_id)
        return 200, {}

    register = resource.register_paths
    one_user = admin_path("v1", "/users" + USER)
    register("GET", one_user + "/sent_invite_count", sent_invite_count, "admin_user_counts")
    register(
        "GET", one_user + "/cumulative_joined_room_count", joined_room_count, "admin_user_counts"
    )
    register("GET", one_user + "/accountdata", account_data, "admin_user_account_data")
    features = admin_path("v1", "/experimental_features" + USER)
    register("GET", features, get_features, "admin_experimental_features")
    register("PUT", features, put_features, "admin_experimental_features")

    async def pushers(request: Request, user_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await users.pushers(user_id)

    def page(request: Request) -> tuple[int, int]:
        offset = query_int(request, "from", 0)
        limit = query_int(request, "limit", 100, minimum=1, maximum=MAX_PAGE)
        assert offset is not None and limit is not None
        return offset, limit

    async def user_media(request: Request, user_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        offset, limit = page(request)
        order_by = query_choice(request, "order_by", list(MEDIA_ORDERINGS), "created_ts")
        return 200, await users.media(user_id, offset, limit, order_by, query_descending(request))

    async def delete_user_media(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        offset, limit = page(request)
        order_by = query_choice(request, "order_by", list(MEDIA_ORDERINGS), "created_ts")
        return 200, await handlers.admin_media.delete_user_media(
            requester, user_id, offset, limit, order_by, query_descending(request)
        )

    async def media_statistics(request: Request) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        offset, limit = page(request)
        order_by = query_choice(request, "order_by", list(STATISTICS_ORDERINGS), "user_id")
        return 200, await users.media_statistics(
            offset, limit, order_by, query_descending(request), query_string(request, "search_term")
        )

    async def join(request: Request, room: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request)
        return 200, {"room_id": await users.join(requester, room, body)}

    def user_path(version: str, tail: str) -> str:
        return admin_path(version, "/users" + USER + tail)

    device = "/devices/(?P<device_id>[^/]+)"
    register = resource.register_paths
    register("GET", user_path("v1", "/joined_rooms"), joined_rooms, "admin_user_joined_rooms")
    register("GET", user_path("v1", "/memberships"), memberships, "admin_user_memberships")
    register("GET", user_path("v2", "/devices"), list_devices, "admin_user_devices")
    register("POST", user_path("v2", "/devices"), create_device, "admin_user_devices")
    register("GET", user_path("v2", device), get_device, "admin_user_device")
    register("PUT", user_path("v2", device), put_device, "admin_user_device")
    register("DELETE", user_path("v2", device), delete_device, "admin_user_device")
    register("POST", user_path("v2", "/delete_devices"), delete_devices, "admin_delete_devices")
    register("GET", admin_path("v1", "/username_available"), username_available, "admin_username")
    register("GET", user_path("v1", "/pushers"), pushers, "admin_user_pushers")
    register("GET", user_path("v1", "/media"), user_media, "admin_user_media")
    register("DELETE", user_path("v1", "/media"), delete_user_media, "admin_user_media")
    register(
        "GET", admin_path("v1", "/statistics/users/media"), media_statistics, "admin_media_stats"
    )
    register("POST", admin_path("v1", "/join/(?P<room>[^/]+)"), join, "admin_join")
