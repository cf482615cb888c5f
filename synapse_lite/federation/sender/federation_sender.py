"""The federation sender: runs on each of ``federation_sender_instances``,
sending to the destinations it owns (``federation/senders.py``).

It learns of queued EDUs from one of two places:

* on the main process: from its own to_device writes and from to_device rows
  replicated from the writer (``OutboxConsumer``);
* on a sender worker: from the ``federation`` stream, which the main process's
  ``FederationRemoteSendQueue`` owns. The worker's token for that stream is
  the last one it processed (so it is always a token the queue handed out);
  a token below it means the main process restarted with its clock behind:
  the worker starts again from it and rescans the outbox. After each
  transaction it sends
  ``FEDERATION_ACK <instance> <token>`` so the queue can drop what it took.

Room events (PDUs) come from :class:`~synapse_lite.federation.sender.room_events.RoomEventsFeed`,
which follows the events stream on this process and calls :meth:`send_pdus`;
when it starts, :meth:`catch_up` for the destinations this sender owns that
are behind (``pdu_queue.py``: how far each destination got is in the
database, so a restarted sender or a new owner resumes where the old one
stopped).

In both cases it also rescans the outbox at start and every
:data:`RESCAN_INTERVAL_SECONDS`, so a wake-up lost with a crashed process only
delays a message, never loses it. ``REMOTE_SERVER_UP`` resets a destination's
backoff and sends at once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet import defer

from synapse_lite.federation.outbox import OutboxConsumer
from synapse_lite.federation.send_queue import DEVICE_MESSAGES
from synapse_lite.federation.sender.destination import DestinationQueue
from synapse_lite.federation.sender.pdu_queue import FeedProgress
from synapse_lite.replication.streams import MemoryPositions
from synapse_lite.replication.tcp.commands import Command, FederationAckCommand

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.config.federation import FederationConfig
    from synapse_lite.federation.client import FederationClient
    from synapse_lite.replication.notifier import ReplicationNotifier
    from synapse_lite.storage.databases.main import GenericWorkerStore
    from synapse_lite.storage.databases.main.destination_rooms import QueuedPdu

logger = logging.getLogger(__name__)

RESCAN_INTERVAL_SECONDS = 30.0


class FederationSender(OutboxConsumer):
    """Per-destination queues and the federation stream's follower side."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        server_name: str,
        instance_name: str,
        client: FederationClient,
        config: FederationConfig,
        send_command: Callable[[Command], None] | None,
        positions: MemoryPositions,
        replication_notifier: ReplicationNotifier,
        render_pdus: Callable[[Sequence[str]], Awaitable[list[dict[str, Any]]]] | None = None,
        owns: Callable[[str], bool] = lambda destination: True,
        feed: FeedProgress | None = None,
    ) -> None:
        """``send_command``: replication's way out, on a sender worker (for
        FEDERATION_ACK); None on the main process, which needs no acks.
        ``positions``: the federation stream's position here, which a sender
        worker moves as it takes the main process's rows. ``owns(destination)``:
        whether this sender sends to it (one of several senders owns each
        destination: ``federation/senders.py``); the others are ignored.
        ``feed``: where the room events feed is (None: no PDUs sent)."""
        super().__init__(store.get_to_device_stream_token, replication_notifier)
        self._store = store
        self._clock = clock
        self._server_name = server_name
        self._instance_name = instance_name
        self._client = client
        self._config = config
        self._send_command = send_command
        self._queues: dict[str, DestinationQueue] = {}
        self._positions = positions
        self._acked = 0
        self._rescan_loop: Any = None
        self._render_pdus = render_pdus
        self._feed = feed
        #: Destinations in ``destinations`` this sender owns (at the last rescan).
        self._owned_count = 0
        #: Stopping: no queue is woken or made any more.
        self._stopped = False
        self.owns = owns

    def start(self) -> None:
        self._rescan_loop = self._clock.looping_call(self.rescan, RESCAN_INTERVAL_SECONDS)
        self.rescan()

    def stop(self) -> defer.Deferred[None]:
        """Stop sending; fires when the transactions in flight have ended."""
        self._stopped = True
        if self._rescan_loop is not None and self._rescan_loop.running:
            self._rescan_loop.stop()
        running = [d for q in self._queues.values() if (d := q.stop()) is not None]
        return defer.DeferredList(running, consumeErrors=True).addCallback(lambda _: None)

    def queue(self, destination: str) -> DestinationQueue:
        queue = self._queues.get(destination)
        if queue is None:
            queue = self._queues[destination] = DestinationQueue(
                destination,
                store=self._store,
                clock=self._clock,
                client=self._client,
                server_name=self._server_name,
                retry=self._config.retry,
                on_sent=self.on_transaction_sent,
                render_pdus=self._render_pdus,
                feed=self._feed,
            )
        return queue

    @property
    def queues(self) -> dict[str, DestinationQueue]:
        """Every destination this sender has had work for in this run."""
        return self._queues

    def health(self) -> dict[str, Any]:
        """What ``/health`` says of this sender: how many destinations it
        owns (those it knows of in ``destinations``, counted at each
        rescan) and the stalled ones: failing to take transactions (a
        stalled destination is not an unhealthy process: the status stays
        "ok")."""
        stalled = []
        for destination, queue in sorted(self._queues.items()):
            since = queue.failing_since_ms
            if since is None:
                continue
            stalled.append(
                {
                    "destination": destination,
                    "failing_since_ms": since,
                    "retry_interval_ms": queue.retry_interval_ms,
                    "pending_pdus": queue.pending_pdus,
                    "catching_up": queue.pdus.catching_up,
                }
            )
        return {
            "federation_sender": {
                "destinations": self._owned_count,
                "active": len(self._queues),
                "stalled": stalled,
            }
        }

    # Wake-ups

    def send_device_messages(self, destination: str, upto_stream_id: int) -> None:
        if destination == self._server_name or self._stopped or not self.owns(destination):
            return
        self.queue(destination).wake(upto_stream_id)

    def send_pdus(self, destination: str, pdus: Sequence[QueuedPdu]) -> None:
        """Room events for ``destination``, in stream order."""
        if destination == self._server_name or not pdus or self._stopped:
            return
        if not self.owns(destination):
            return
        self.queue(destination).add_pdus(pdus)

    def catch_up(self, destinations: Collection[str]) -> None:
        """The feed started: these destinations may be behind (those we own
        are looked at now)."""
        for destination in destinations:
            if destination != self._server_name and not self._stopped and self.owns(destination):
                self.queue(destination).wake()

    def feed_filled(self) -> None:
        """The feed has written ``destination_rooms`` up to where memory
        starts: a destination catching up may finish now."""
        for queue in self._queues.values():
            if queue.pdus.catching_up:
                queue.wake()

    def send_edus(self, destination: str, edus: Sequence[dict[str, Any]]) -> None:
        """Ephemeral EDUs (``sender/edus.py``) for ``destination``, in order."""
        if destination == self._server_name or not edus or self._stopped:
            return
        if not self.owns(destination):
            return
        self.queue(destination).add_edus(edus)

    def on_remote_server_up(self, server_name: str) -> None:
        # Only destinations we have something for: one with nothing queued
        # keeps its recorded backoff until it has (and the next request from
        # it announces it again), so no name can make us keep a queue.
        queue = self._queues.get(server_name)
        if queue is not None:
            queue.reset_backoff()

    def rescan(self) -> defer.Deferred[None]:
        """Wake every destination with EDUs in the outbox."""

        async def scan() -> None:
            pending = await self._store.get_destinations_with_pending_edus()
            for destination, upto in pending.items():
                self.send_device_messages(destination, upto)
            known = await self._store.get_destination_names()
            self._owned_count = sum(1 for d in known if self.owns(d))

        d = defer.ensureDeferred(scan())
        d.addErrback(lambda f: logger.warning("Scanning the outbox failed: %s", f.value))
        return d

    # The federation stream (sender worker)

    def get_current_token(self) -> int:
        return self._positions.current

    def process_federation_rows(self, instance_name: str, token: int, rows: Sequence[Any]) -> None:
        """Take the queue's rows (or bare position) before the stream advances."""
        if token < self._positions.current:
            logger.info(
                "The federation stream went back from %d to %d (the main process restarted"
                " with its clock behind): rescanning the outbox",
                self._positions.current,
                token,
            )
            self._acked = 0
            self.rescan()
        for row in rows:
            data = row.data
            if (
                row.type == DEVICE_MESSAGES
                and isinstance(data, dict)
                and isinstance(data.get("destination"), str)
                and isinstance(data.get("stream_id"), int)
            ):
                self.send_device_messages(data["destination"], data["stream_id"])
            else:
                logger.warning("Ignoring a federation stream row %r", row)
        self._positions.current = token

    def on_transaction_sent(self, destination: str) -> None:
        """Tell the main process's queue it may drop what we have taken."""
        position = self._positions.current
        if self._send_command is None or position <= self._acked:
            return
        self._acked = position
        self._send_command(FederationAckCommand(self._instance_name, position))
