"""Persisting events on their room's writer: ``send_events``."""

from __future__ import annotations

from typing import Any

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import check_identifier_text, check_room_id, is_valid_user_id
from synapse_lite.events import EventSpec
from synapse_lite.handlers.message import (
    MAX_EVENTS_PER_REQUEST,
    SEND_EVENTS_ENDPOINT,
    check_content_size,
)
from synapse_lite.http.fields import get_bool, get_dict, get_int, get_list, get_str
from synapse_lite.replication.http._base import ReplicationEndpoint


def send_events_body(room_id: str, specs: list[EventSpec], create_room: bool) -> dict[str, Any]:
    return {
        "room_id": room_id,
        "create_room": create_room,
        "events": [
            {
                "type": s.type,
                "state_key": s.state_key,
                "sender": s.sender,
                "content": s.content,
                "origin_server_ts": s.origin_server_ts,
                "txn": list(s.txn_key) if s.txn_key else None,
            }
            for s in specs
        ],
    }


def _event_spec_from_json(data: Any, is_mine: Any) -> EventSpec:
    if not isinstance(data, dict):
        raise SynapseError(400, "each event must be an object", Codes.BAD_JSON)
    sender = get_str(data, "sender")
    if not is_valid_user_id(sender) or not is_mine(sender):
        raise SynapseError(400, "'sender' must be a local user id", Codes.BAD_JSON)
    state_key = data.get("state_key")
    if state_key is not None:
        check_identifier_text(state_key, "state_key")
    content = get_dict(data, "content")
    check_content_size(content)
    txn = data.get("txn")
    txn_key = None
    if txn is not None:
        if not (isinstance(txn, list) and len(txn) == 3 and all(isinstance(t, str) for t in txn)):
            raise SynapseError(400, "'txn' must be [user, device, txn_id]", Codes.BAD_JSON)
        if txn[0] != sender:
            raise SynapseError(400, "'txn' must be the sender's", Codes.BAD_JSON)
        txn_key = (txn[0], txn[1], txn[2])
    return EventSpec(
        type=check_identifier_text(data.get("type"), "type"),
        state_key=state_key,
        sender=sender,
        content=content,
        origin_server_ts=get_int(data, "origin_server_ts"),
        txn_key=txn_key,
    )


class SendEventsEndpoint(ReplicationEndpoint):
    """``{room_id, create_room, events: [...]}`` on the room's events writer ->
    ``{events: [[event_id, stream_ordering], ...]}``."""

    NAME = SEND_EVENTS_ENDPOINT

    async def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        room_id = check_room_id(get_str(body, "room_id"))
        create_room = get_bool(body, "create_room", False)
        raw_events = get_list(body, "events")
        if not 1 <= len(raw_events) <= MAX_EVENTS_PER_REQUEST:
            raise SynapseError(400, "'events' must hold 1 to 200 events", Codes.BAD_JSON)
        specs = [_event_spec_from_json(e, self.hs.is_mine_id) for e in raw_events]
        events = await self.hs.event_creation_handler.persist_as_writer(
            room_id, specs, create_room=create_room
        )
        return {"events": [[e.event_id, e.stream_ordering] for e in events]}
