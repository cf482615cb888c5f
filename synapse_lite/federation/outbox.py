"""Hearing of EDUs queued in the to-device outbox.

The outbox rows are the durable truth (written with their to_device stream
row). The process that must act on them (the federation sender, or the main
process's queue feeding a sender worker) is told ``(destination, stream id)``
where every to_device id at or below the stream id has finished, so reading
the outbox up to it never skips a row committed later below it:

* rows written by another process arrive as to_device RDATA whose entity is a
  server name (the single writer's token covers every id below it);
* rows written here are held until this process's to_device position reaches
  their id.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from synapse_lite.replication.notifier import ReplicationNotifier

logger = logging.getLogger(__name__)


class OutboxConsumer:
    """Base of the components told about queued EDUs."""

    def __init__(
        self, to_device_position: Callable[[], int], local_writes: ReplicationNotifier
    ) -> None:
        """``to_device_position()``: this process's position on to_device;
        ``local_writes``: poked whenever this process's ids finish (then
        :meth:`release_held` runs)."""
        self._to_device_position = to_device_position
        self._held: list[tuple[int, str]] = []
        local_writes.add_replication_callback(self.release_held)

    def send_device_messages(self, destination: str, upto_stream_id: int) -> None:
        """EDUs for ``destination`` are queued up to ``upto_stream_id``."""
        raise NotImplementedError

    def on_remote_server_up(self, server_name: str) -> None:
        """``server_name`` is reachable again (only the sender cares)."""

    def notify_outbox_write(self, destinations: list[str], stream_id: int) -> None:
        """This process just queued EDUs for ``destinations`` at ``stream_id``."""
        for destination in destinations:
            heapq.heappush(self._held, (stream_id, destination))
        self.release_held()

    def release_held(self) -> None:
        """Pass on what this process queued, once its position covers it."""
        if not self._held:
            return
        position = self._to_device_position()
        while self._held and self._held[0][0] <= position:
            stream_id, destination = heapq.heappop(self._held)
            self.send_device_messages(destination, stream_id)

    def on_to_device_rows(self, instance_name: str, token: int, rows: Sequence[Any]) -> None:
        """A to_device row hook: entities that are server names are outbox rows."""
        for row in rows:
            if not row.entity.startswith("@"):
                self.send_device_messages(row.entity, token)
