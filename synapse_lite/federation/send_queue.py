"""The federation stream, owned by the main process when a worker sends.

``FederationRemoteSendQueue`` keeps, in memory and under its own counter, one
item per destination with queued EDUs: ``(token, destination, stream id)``. Its
counter is the stream's ``current_token``, so the token is always one it handed
out. A newer item for a destination replaces the older one (an item only says
"read the outbox up to here"), so memory is bounded by the number of
destinations. The sender worker reads the stream (RDATA, or over internal HTTP
after a POSITION), and its ``FEDERATION_ACK <instance> <token>`` drops every
item up to ``token``.

The counter starts at the clock's milliseconds, not at zero, so a restarted
main process hands out tokens above any of its previous run: a sender worker
that saw the old run catches up on every new item rather than mistaking them
for ones it has (were the clock to go back, the worker sees the token fall and
rescans). At startup the queue takes one item per destination with EDUs in the
outbox, so wake-ups lost with the previous run are made again. Nothing is lost
if this memory is: the outbox table is the truth.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from twisted.internet import defer

from synapse_lite.federation.outbox import OutboxConsumer
from synapse_lite.replication.streams import MemoryPositions
from synapse_lite.replication.tcp.commands import FederationAckCommand
from synapse_lite.streams.catalog import FederationStreamRow
from synapse_lite.streams.definition import Updates

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.replication.notifier import ReplicationNotifier
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: The row type of an item: data ``{"destination", "stream_id"}``.
DEVICE_MESSAGES = "device_messages"
#: How long a sender's last acknowledgement holds items back (see
#: :meth:`FederationRemoteSendQueue.federation_ack`).
ACK_MEMORY_SECONDS = 600.0


class FederationRemoteSendQueue(OutboxConsumer):
    """The main process's side of the federation stream (see module docstring)."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        positions: MemoryPositions,
        replication_notifier: ReplicationNotifier,
    ) -> None:
        """``positions``: the stream's counter, from :meth:`positions`."""
        super().__init__(store.get_to_device_stream_token, replication_notifier)
        self._store = store
        self._replication_notifier = replication_notifier
        self._positions = positions
        #: destination -> (token, to_device stream id)
        self._items: dict[str, tuple[int, int]] = {}
        self._clock = clock
        #: sender instance -> (token it acknowledged, when)
        self._acks: dict[str, tuple[int, float]] = {}

    def start(self) -> None:
        """Take one item per destination with EDUs in the outbox."""

        async def scan() -> None:
            pending = await self._store.get_destinations_with_pending_edus()
            for destination, upto in pending.items():
                self.send_device_messages(destination, upto)

        defer.ensureDeferred(scan()).addErrback(
            lambda f: logger.warning("Reading the outbox at startup failed: %s", f.value)
        )

    def stop(self) -> None:
        pass

    @staticmethod
    def positions(clock: Clock) -> MemoryPositions:
        """The stream's counter, starting at the clock's milliseconds (see
        the module docstring)."""
        return MemoryPositions(clock.time_msec())

    def get_current_token(self) -> int:
        return self._positions.current

    def send_device_messages(self, destination: str, upto_stream_id: int) -> None:
        previous = self._items.get(destination)
        upto = max(upto_stream_id, previous[1]) if previous else upto_stream_id
        self._positions.current += 1
        self._items[destination] = (self._positions.current, upto)
        self._replication_notifier.notify_replication()

    def federation_ack(self, cmd: FederationAckCommand) -> None:
        """A sender has taken every item up to ``cmd.token``. With several
        senders an item is dropped once every sender that acknowledged in
        the last :data:`ACK_MEMORY_SECONDS` has taken it: each reads every
        item (it skips the destinations it does not own), and one catching
        up after a reconnection reads them from here. A sender not heard
        from in that time (removed by a reload) holds nothing back; a new or
        late one loses nothing either way, since it rescans the outbox."""
        if cmd.token > self._positions.current:
            # An ack from before this process restarted: it says nothing
            # about this run's items.
            return
        now = self._clock.time()
        self._acks[cmd.instance_name] = (cmd.token, now)
        for name, (_, when) in list(self._acks.items()):
            if now - when > ACK_MEMORY_SECONDS:
                del self._acks[name]
        upto = min(token for token, _ in self._acks.values())
        for destination, (token, _) in list(self._items.items()):
            if token <= upto:
                del self._items[destination]

    def pending_items(self) -> int:
        return len(self._items)

    async def get_replication_rows(
        self, instance_name: str, from_token: int, upto_token: int, limit: int
    ) -> tuple[Updates, int, bool]:
        """The stream's update function: items in ``(from_token, upto_token]``."""
        if from_token > self._positions.current:
            from_token = 0  # the asker saw a previous run of this process
        items = sorted(
            (token, destination, stream_id)
            for destination, (token, stream_id) in self._items.items()
            if from_token < token <= upto_token
        )
        limited = len(items) > limit
        if limited:
            items = items[:limit]
        updates: Updates = [
            (
                token,
                FederationStreamRow(
                    DEVICE_MESSAGES, {"destination": destination, "stream_id": stream_id}
                ),
            )
            for token, destination, stream_id in items
        ]
        return updates, items[-1][0] if limited else upto_token, limited
