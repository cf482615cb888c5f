"""The federation stream: EDUs queued by the main process for the federation
sender, kept in memory by the queue that owns its token."""

from __future__ import annotations

from typing import Any, Protocol

import attr

from synapse_lite.replication.tcp.streams._base import Stream, UpdateFunction

_str = attr.validators.instance_of(str)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class FederationStreamRow:
    """A queued item for the federation sender: its kind and its data."""

    type: str = attr.ib(validator=_str)
    data: Any


class FederationTokenSource(Protocol):
    def get_current_token(self) -> int: ...


class FederationStream(Stream):
    """Sourced by the main process when a worker sends federation."""

    NAME = "federation"
    ROW_TYPE = FederationStreamRow

    def __init__(
        self,
        local_instance_name: str,
        queue: FederationTokenSource,
        update_function: UpdateFunction,
    ) -> None:
        self._queue = queue
        super().__init__(local_instance_name, update_function)

    def current_token(self, instance_name: str) -> int:
        return self._queue.get_current_token()
