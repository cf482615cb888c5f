"""The typing stream: kept in memory by the typing handler, which owns its token."""

from __future__ import annotations

from typing import Any, Protocol

import attr

from synapse_lite.replication.tcp.streams._base import Stream, UpdateFunction

_str = attr.validators.instance_of(str)


def _str_list(instance: object, attribute: attr.Attribute[Any], value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{attribute.name} must be a list of strings")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class TypingStreamRow:
    """Everyone typing in a room now; replaces the previous list."""

    room_id: str = attr.ib(validator=_str)
    user_ids: list[str] = attr.ib(validator=_str_list)


class TypingTokenSource(Protocol):
    """What the typing handler (writer or follower) provides to the stream."""

    def get_current_token(self) -> int: ...


class TypingStream(Stream):
    """Its token is the typing handler's serial: always a valid token because
    the handler that owns the data owns the number. When the writer restarts
    its serial starts again from 0 and followers reset."""

    NAME = "typing"
    ROW_TYPE = TypingStreamRow

    def __init__(
        self, local_instance_name: str, handler: TypingTokenSource, update_function: UpdateFunction
    ) -> None:
        self._handler = handler
        super().__init__(local_instance_name, update_function)

    def current_token(self, instance_name: str) -> int:
        return self._handler.get_current_token()
