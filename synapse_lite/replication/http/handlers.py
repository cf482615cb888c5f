"""Endpoints that forward a client's change to the writer of its stream:
typing (to the typing writer) and presence (to the presence writer)."""

from __future__ import annotations

from typing import Any

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.replication.http._base import ReplicationEndpoint


def _str_field(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise SynapseError(400, f"'{name}' must be a string", Codes.BAD_JSON)
    return value


class SetTypingEndpoint(ReplicationEndpoint):
    """``{requester, user_id, room_id, typing, timeout}`` on the typing writer."""

    NAME = "set_typing"

    async def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        typing = body.get("typing")
        timeout = body.get("timeout")
        if not isinstance(typing, bool) or not (timeout is None or isinstance(timeout, int)):
            raise SynapseError(400, "bad typing request", Codes.BAD_JSON)
        await self.hs.typing_handler.set_typing(
            _str_field(body, "requester"),
            _str_field(body, "user_id"),
            _str_field(body, "room_id"),
            typing,
            timeout,
        )
        return {}


class SetPresenceEndpoint(ReplicationEndpoint):
    """``{user_id, presence, status_msg}`` on the presence writer."""

    NAME = "set_presence"

    async def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        await self.hs.presence_handler.set_state(
            _str_field(body, "user_id"), body.get("presence"), body.get("status_msg")
        )
        return {}
