"""Checks on what clients put in events and messages, shared by the client API
and the internal calls that carry the same data to a writer."""

from __future__ import annotations

import json
from typing import Any

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import check_identifier_text, is_valid_user_id

#: The spec's limit on an event's size; content is most of it.
MAX_EVENT_CONTENT_BYTES = 65_536
#: Recipients (user, device) of one to-device request.
MAX_TO_DEVICE_RECIPIENTS = 1_000
#: Receipt types a client may send.
RECEIPT_TYPES = ("m.read", "m.read.private")


def check_content_size(content: dict[str, object]) -> None:
    size = len(json.dumps(content, ensure_ascii=False).encode("utf-8"))
    if size > MAX_EVENT_CONTENT_BYTES:
        raise SynapseError(413, "Event is too large", Codes.TOO_LARGE)


def check_to_device_messages(messages: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """``{user_id: {device_id or "*": content}}``, or a 400."""
    if not isinstance(messages, dict):
        raise SynapseError(400, "'messages' must be an object", Codes.BAD_JSON)
    count = 0
    for user_id, devices in messages.items():
        if not is_valid_user_id(user_id):
            raise SynapseError(400, "'messages' keys must be user ids", Codes.BAD_JSON)
        if not isinstance(devices, dict):
            raise SynapseError(400, "'messages' values must be objects", Codes.BAD_JSON)
        for device_id, content in devices.items():
            check_identifier_text(device_id, "device_id")
            if not isinstance(content, dict):
                raise SynapseError(400, "each message must be an object", Codes.BAD_JSON)
            check_content_size(content)
            count += 1
    if count > MAX_TO_DEVICE_RECIPIENTS:
        raise SynapseError(400, "Too many recipients", Codes.INVALID_PARAM)
    return messages
