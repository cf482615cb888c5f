"""Checks on what clients put in events and messages, shared by the client API
and the internal calls that carry the same data to a writer."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import check_identifier_text, is_valid_user_id
from synapse_lite.events import EventSpec
from synapse_lite.federation.crypto import compact_sorted_json

#: The spec's limit on an event's size (the whole event); content, to-device
#: messages and account data are held to it too.
MAX_EVENT_CONTENT_BYTES = 65_536
#: Room for the event id an event is given after it is checked (ids of room
#: versions 4 and later are 44 characters; ours are shorter).
_EVENT_ID_ALLOWANCE = "$" + "x" * 63
#: Recipients (user, device) of one to-device request.
MAX_TO_DEVICE_RECIPIENTS = 1_000
#: Receipt types a client may send.
RECEIPT_TYPES = ("m.read", "m.read.private")


def check_events(room_id: str, specs: Iterable[EventSpec]) -> None:
    """Events about to be sent to ``room_id``: 413 ``M_TOO_LARGE`` when one is larger
    than the spec's 65,536 bytes, measured as canonical JSON of the event as
    it is stored and served (with room for its id; we keep no federation
    fields such as signatures to count). Whether content must be canonical
    JSON depends on the room's version: the auth rules check that
    (``handlers/event_auth.py``)."""
    for spec in specs:
        _check_event(room_id, spec)


def _check_event(room_id: str, spec: EventSpec) -> None:
    event: dict[str, object] = {
        "content": spec.content,
        "event_id": _EVENT_ID_ALLOWANCE,
        "origin_server_ts": spec.origin_server_ts,
        "room_id": room_id,
        "sender": spec.sender,
        "type": spec.type,
    }
    if spec.state_key is not None:
        event["state_key"] = spec.state_key
    encoded = compact_sorted_json(event)
    if len(encoded.encode("utf-8")) > MAX_EVENT_CONTENT_BYTES:
        raise SynapseError(
            413, f"Event is too large: at most {MAX_EVENT_CONTENT_BYTES} bytes", Codes.TOO_LARGE
        )


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
