"""The main process's federation queue: one item per destination, its own
counter as the stream token, FEDERATION_ACK trimming."""

from __future__ import annotations

from typing import Any

from twisted.internet import task
from twisted.trial import unittest

from synapse_lite.clock import Clock
from synapse_lite.federation.send_queue import (
    ACK_MEMORY_SECONDS,
    DEVICE_MESSAGES,
    FederationRemoteSendQueue,
)
from synapse_lite.replication.notifier import ReplicationNotifier
from synapse_lite.replication.tcp.commands import FederationAckCommand


def rows(updates: Any) -> list[tuple[int, str, int]]:
    result = []
    for token, row in updates:
        assert row.type == DEVICE_MESSAGES
        result.append((token, row.data["destination"], row.data["stream_id"]))
    return result


class _NoStore:
    """The queue reads the store only when started (not in these tests)."""

    def get_to_device_stream_token(self) -> int:
        return 0


class SendQueueTest(unittest.TestCase):
    def setUp(self) -> None:
        reactor = self.reactor = task.Clock()
        reactor.advance(1000)
        self.replication_notifier = ReplicationNotifier()
        self.pokes = 0
        self.replication_notifier.add_replication_callback(self._poke)
        clock = Clock(reactor)
        self.queue = FederationRemoteSendQueue(
            store=_NoStore(),  # type: ignore[arg-type]
            clock=clock,
            positions=FederationRemoteSendQueue.positions(clock),
            replication_notifier=self.replication_notifier,
        )
        # Tokens start at the clock's milliseconds: above any previous run's.
        self.start = self.queue.get_current_token()
        self.assertEqual(self.start, 1_000_000)

    def _poke(self) -> None:
        self.pokes += 1

    def t(self, n: int) -> int:
        return self.start + n

    async def test_items_tokens_and_supersede(self) -> None:
        q, t = self.queue, self.t
        q.send_device_messages("b.example", 5)
        q.send_device_messages("c.example", 6)
        q.send_device_messages("b.example", 9)
        self.assertEqual(q.get_current_token(), t(3))
        self.assertGreaterEqual(self.pokes, 3)
        updates, upto, limited = await q.get_replication_rows("main", 0, t(3), 100)
        # b's first item (token 1) was replaced by token 3, which covers it.
        self.assertEqual(rows(updates), [(t(2), "c.example", 6), (t(3), "b.example", 9)])
        self.assertEqual((upto, limited), (t(3), False))
        updates, _, _ = await q.get_replication_rows("main", t(2), t(3), 100)
        self.assertEqual(rows(updates), [(t(3), "b.example", 9)])
        self.assertEqual(q.pending_items(), 2)

    async def test_limit(self) -> None:
        for i in range(5):
            self.queue.send_device_messages(f"s{i}.example", 10 + i)
        updates, upto, limited = await self.queue.get_replication_rows("main", 0, self.t(5), 2)
        self.assertEqual([t for t, *_ in rows(updates)], [self.t(1), self.t(2)])
        self.assertEqual((upto, limited), (self.t(2), True))

    def test_several_senders_each_must_have_taken_an_item(self) -> None:
        """Every sender reads every item (skipping the destinations it does
        not own): an item goes once every sender heard from lately has
        acknowledged it; a sender silent for ACK_MEMORY_SECONDS (removed by
        a reload) holds nothing back."""
        q, t = self.queue, self.t
        q.send_device_messages("b.example", 5)
        q.send_device_messages("c.example", 6)
        q.federation_ack(FederationAckCommand("sender1", t(2)))
        self.assertEqual(q.pending_items(), 0)  # the only sender heard of so far
        q.send_device_messages("d.example", 7)
        q.send_device_messages("e.example", 8)
        q.federation_ack(FederationAckCommand("sender2", t(3)))
        q.federation_ack(FederationAckCommand("sender1", t(4)))
        self.assertEqual(q.pending_items(), 1)  # e's item: sender2 has not taken it
        self.reactor.advance(ACK_MEMORY_SECONDS + 1)
        q.federation_ack(FederationAckCommand("sender1", t(4)))
        self.assertEqual(q.pending_items(), 0)  # sender2 went quiet: gone

    async def test_ack_trims(self) -> None:
        q = self.queue
        q.send_device_messages("b.example", 5)
        q.send_device_messages("c.example", 6)
        q.federation_ack(FederationAckCommand("sender1", self.t(1)))
        self.assertEqual(q.pending_items(), 1)
        # An ack above our counter (a run whose clock was ahead) says nothing about this run.
        q.federation_ack(FederationAckCommand("sender1", self.t(99)))
        self.assertEqual(q.pending_items(), 1)
        q.federation_ack(FederationAckCommand("sender1", self.t(2)))
        self.assertEqual(q.pending_items(), 0)

    async def test_asker_from_a_previous_run_gets_everything(self) -> None:
        self.queue.send_device_messages("b.example", 5)
        # An earlier run's token: below ours, so every item is above it.
        updates, upto, _ = await self.queue.get_replication_rows("main", 40, self.t(1), 100)
        self.assertEqual(rows(updates), [(self.t(1), "b.example", 5)])
        # A token above ours (a run whose clock was ahead): everything too.
        updates, upto, _ = await self.queue.get_replication_rows("main", self.t(50), self.t(1), 100)
        self.assertEqual(rows(updates), [(self.t(1), "b.example", 5)])
        self.assertEqual(upto, self.t(1))
