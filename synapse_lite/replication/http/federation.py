"""Federation work forwarded between processes: to-device messages received
from another server, stored by the to_device writer."""

from __future__ import annotations

from typing import Any

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import check_identifier_text, is_valid_user_id
from synapse_lite.handlers.devicemessage import RECEIVE_REMOTE_TO_DEVICE_ENDPOINT
from synapse_lite.http.fields import get_dict, get_str
from synapse_lite.replication.http._base import ReplicationEndpoint


class ReceiveRemoteToDeviceEndpoint(ReplicationEndpoint):
    """``{origin, sender, type, message_id, messages: {local user: {device: content}}}``
    on the to_device writer -> ``{stream_id}``."""

    NAME = RECEIVE_REMOTE_TO_DEVICE_ENDPOINT

    async def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        sender = get_str(body, "sender")
        if not is_valid_user_id(sender) or self.hs.is_mine_id(sender):
            raise SynapseError(400, "'sender' must be a remote user id", Codes.BAD_JSON)
        messages = get_dict(body, "messages")
        for user_id, devices in messages.items():
            if not is_valid_user_id(user_id) or not self.hs.is_mine_id(user_id):
                raise SynapseError(400, "recipients must be local users", Codes.BAD_JSON)
            if not isinstance(devices, dict) or not all(
                isinstance(c, dict) for c in devices.values()
            ):
                raise SynapseError(400, "each message must be an object", Codes.BAD_JSON)
            for device_id in devices:
                check_identifier_text(device_id, "device_id")
        message = {
            "origin": check_identifier_text(body.get("origin"), "origin"),
            "sender": sender,
            "type": check_identifier_text(body.get("type"), "type"),
            "message_id": check_identifier_text(body.get("message_id"), "message_id"),
            "messages": messages,
        }
        stream_id = await self.hs.device_message_handler.write_remote_messages(message)
        return {"stream_id": stream_id}
