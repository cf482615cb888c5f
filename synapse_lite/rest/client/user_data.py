"""Per-user data: account data, presence, devices and to-device messages."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.content import check_content_size
from synapse_lite.api.errors import AuthError, Codes, SynapseError
from synapse_lite.api.identifiers import check_identifier_text, check_room_id, check_user_id
from synapse_lite.handlers.ignored_users import IGNORED_USER_LIST, check_ignored_user_list
from synapse_lite.handlers.presence import check_presence_state
from synapse_lite.http.server import JsonResource, parse_json_object_from_request
from synapse_lite.replication.http.devices import MAX_DEVICES_PER_DELETE
from synapse_lite.replication.http.writes import check_tag_content, check_tag_name
from synapse_lite.rest.client._base import client_path

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers

#: Account data types the server manages itself (the spec refuses them here).
SERVER_MANAGED_TYPES = ("m.fully_read", "m.push_rules")


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    auth = handlers.auth

    async def own(request: Request, user_id: str) -> str:
        requester = await auth.get_user_by_req(request)
        if user_id != requester.user_id:
            raise AuthError(403, "Cannot access other users' data")
        return requester.user_id

    def check_type(data_type: str) -> None:
        check_identifier_text(data_type, "type")
        if data_type in SERVER_MANAGED_TYPES:
            raise SynapseError(405, f"Cannot set {data_type} through this API", Codes.BAD_JSON)

    async def put_account_data(
        request: Request, user_id: str, data_type: str, room_id: str | None = None
    ) -> tuple[int, Any]:
        await own(request, user_id)
        if room_id is not None:
            check_room_id(room_id)
        check_type(data_type)
        content = parse_json_object_from_request(request)
        check_content_size(content)
        if room_id is None and data_type == IGNORED_USER_LIST:
            check_ignored_user_list(user_id, content)
        await handlers.account_data.set_account_data(user_id, room_id, data_type, content)
        return 200, {}

    async def get_account_data(
        request: Request, user_id: str, data_type: str, room_id: str | None = None
    ) -> tuple[int, Any]:
        await own(request, user_id)
        if room_id is not None:
            check_room_id(room_id)
        return 200, await handlers.account_data.get_account_data(user_id, room_id, data_type)

    async def get_tags(request: Request, user_id: str, room_id: str) -> tuple[int, Any]:
        await own(request, user_id)
        check_room_id(room_id)
        return 200, {"tags": await handlers.account_data.get_tags(user_id, room_id)}

    async def put_tag(request: Request, user_id: str, room_id: str, tag: str) -> tuple[int, Any]:
        await own(request, user_id)
        check_room_id(room_id)
        check_tag_name(tag)
        content = parse_json_object_from_request(request)
        check_tag_content(content)
        await handlers.account_data.set_tag(user_id, room_id, tag, content)
        return 200, {}

    async def delete_tag(request: Request, user_id: str, room_id: str, tag: str) -> tuple[int, Any]:
        await own(request, user_id)
        check_room_id(room_id)
        check_tag_name(tag)
        await handlers.account_data.set_tag(user_id, room_id, tag, None)
        return 200, {}

    async def get_presence(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_user_id(user_id)
        if user_id != requester.user_id:
            if not await handlers.members.share_a_room(requester.user_id, user_id):
                raise AuthError(403, "You do not share a room with this user")
        state = await handlers.presence.get_state(user_id)
        return 200, state.to_client_content(handlers.clock.time_msec())

    async def put_presence(request: Request, user_id: str) -> tuple[int, Any]:
        await own(request, user_id)
        body = parse_json_object_from_request(request)
        presence, status_msg = body.get("presence"), body.get("status_msg")
        check_presence_state(presence, status_msg)
        await handlers.presence.set_state(user_id, str(presence), status_msg)
        return 200, {}

    async def get_devices(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        return 200, {"devices": await handlers.devices.get_devices(requester.user_id)}

    async def get_device(request: Request, device_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        return 200, await handlers.devices.get_device(requester.user_id, device_id)

    async def put_device(request: Request, device_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        body = parse_json_object_from_request(request)
        display_name = body.get("display_name")
        if display_name is not None and (
            not isinstance(display_name, str) or len(display_name) > 512
        ):
            raise SynapseError(
                400, "'display_name' must be a string of at most 512 characters", Codes.BAD_JSON
            )
        if requester.app_service is not None:
            check_identifier_text(device_id, "deviceId")
            if not await handlers.devices.has_device(requester.user_id, device_id):
                # A service manages its users' devices without logging in
                # (spec v1.17): the device is made, with a token nobody holds.
                await handlers.devices.create_device_and_token(
                    requester.user_id, device_id, display_name
                )
                return 201, {}
        await handlers.devices.rename_device(requester.user_id, device_id, display_name)
        return 200, {}

    async def delete_device(request: Request, device_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        body = parse_json_object_from_request(request, allow_empty=True)
        await handlers.devices.get_device(requester.user_id, device_id)  # 404 first
        if requester.app_service is None:  # services delete without interactive auth
            await handlers.ui_auth.check_password(
                requester.user_id, body, f"delete device {device_id}"
            )
        await handlers.devices.delete_devices(requester.user_id, [device_id])
        return 200, {}

    async def delete_devices(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        body = parse_json_object_from_request(request)
        device_ids = body.get("devices")
        if (
            not isinstance(device_ids, list)
            or len(device_ids) > MAX_DEVICES_PER_DELETE
            or not all(isinstance(d, str) for d in device_ids)
        ):
            raise SynapseError(
                400,
                f"'devices' must be a list of at most {MAX_DEVICES_PER_DELETE} device ids",
                Codes.BAD_JSON,
            )
        for device_id in device_ids:
            check_identifier_text(device_id, "devices")
        if requester.app_service is None:  # services delete without interactive auth
            await handlers.ui_auth.check_password(
                requester.user_id, body, f"delete devices {json.dumps(sorted(set(device_ids)))}"
            )
        await handlers.devices.delete_devices(requester.user_id, device_ids)
        return 200, {}

    async def send_to_device(request: Request, event_type: str, txn_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_identifier_text(event_type, "eventType")
        check_identifier_text(txn_id, "txnId")
        body = parse_json_object_from_request(request)
        await handlers.device_messages.send_to_device(
            requester,
            event_type,
            txn_id,
            body.get("messages"),  # type: ignore[arg-type]
        )
        return 200, {}

    register = resource.register_paths
    user = "/user/(?P<user_id>[^/]+)"
    global_data = client_path(user + "/account_data/(?P<data_type>[^/]+)")
    room_data = client_path(user + "/rooms/(?P<room_id>[^/]+)/account_data/(?P<data_type>[^/]+)")
    register("PUT", global_data, put_account_data, "account_data")
    register("GET", global_data, get_account_data, "account_data")
    register("PUT", room_data, put_account_data, "room_account_data")
    register("GET", room_data, get_account_data, "room_account_data")
    tags = user + "/rooms/(?P<room_id>[^/]+)/tags"
    register("GET", client_path(tags), get_tags, "room_tags")
    register("PUT", client_path(tags + "/(?P<tag>[^/]+)"), put_tag, "room_tags")
    register("DELETE", client_path(tags + "/(?P<tag>[^/]+)"), delete_tag, "room_tags")
    presence = client_path("/presence/(?P<user_id>[^/]+)/status")
    register("GET", presence, get_presence, "presence")
    register("PUT", presence, put_presence, "presence")
    register("GET", client_path("/devices"), get_devices, "devices")
    device = client_path("/devices/(?P<device_id>[^/]+)")
    register("GET", device, get_device, "devices")
    register("PUT", device, put_device, "devices")
    register("DELETE", device, delete_device, "devices")
    register("POST", client_path("/delete_devices"), delete_devices, "devices")
    register(
        "PUT",
        client_path("/sendToDevice/(?P<event_type>[^/]+)/(?P<txn_id>[^/]+)"),
        send_to_device,
        "send_to_device",
    )
