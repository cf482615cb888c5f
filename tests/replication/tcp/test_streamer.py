"""What a process sends of its own streams, in memory on a fake clock: RDATA
in batches (one per stream and reactor turn), trailing and idle POSITIONs,
announcements on connection, nothing when nobody listens, and no echo of
others' caches."""

from __future__ import annotations

from typing import Any

from twisted.internet import task
from twisted.trial import unittest

from synapse_lite.clock import Clock
from synapse_lite.replication.tcp.commands import Command, PositionCommand, RdataCommand
from synapse_lite.replication.tcp.streamer import ANNOUNCE_INTERVAL_SECONDS, ReplicationStreamer
from synapse_lite.streams.catalog import (
    BUILTIN_STREAMS,
    CachesStreamRow,
    ReceiptsStreamRow,
    TypingStreamRow,
)
from tests.replication.tcp.fakes import fake_stream


class _Handler:
    """The part of the command handler the streamer uses."""

    def __init__(self) -> None:
        self.connected = True
        self.sent: list[Command] = []
        self.announce: Any = None

    def send_command(self, cmd: Command) -> None:
        self.sent.append(cmd)

    def on_new_connection(self, callback: Any) -> None:
        self.announce = callback


def receipt(n: int) -> ReceiptsStreamRow:
    return ReceiptsStreamRow("!r:x", "m.read", f"@u{n}:x", f"$e{n}", None, {"ts": n})


class StreamerTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.clock = task.Clock()
        self.handler = _Handler()
        self.receipts, self.positions, self.rows = fake_stream(BUILTIN_STREAMS["receipts"])
        self.caches, self.cache_positions, self.cache_rows = fake_stream(BUILTIN_STREAMS["caches"])
        self.streamer = ReplicationStreamer(
            instance_name="me",
            clock=Clock(self.clock),
            handler=self.handler,  # type: ignore[arg-type]
            streams=[self.receipts, self.caches],
            position_log=None,
        )
        # The first poke announces every stream's position.
        self.poke()
        self.assertEqual(
            self.handler.sent,
            [PositionCommand("receipts", "me", 0, 0), PositionCommand("caches", "me", 0, 0)],
        )
        self.handler.sent.clear()

    def poke(self) -> None:
        """A poke, then the end of the reactor turn (when the streamer sends)."""
        self.streamer.on_notifier_poke()
        self.clock.advance(0)

    def test_new_rows_go_as_one_batch_carrying_the_last_token(self) -> None:
        for token, n in ((1, 1), (2, 2), (2, 3), (3, 4)):
            self.rows.add("me", token, receipt(n))
        self.positions.local_write = 5  # an id above 3 finished with no row of ours
        self.poke()
        encode = BUILTIN_STREAMS["receipts"].encode_row
        self.assertEqual(
            self.handler.sent,
            [
                RdataCommand("receipts", "me", None, encode(receipt(1))),
                RdataCommand("receipts", "me", None, encode(receipt(2))),
                RdataCommand("receipts", "me", None, encode(receipt(3))),
                RdataCommand("receipts", "me", 3, encode(receipt(4))),
                PositionCommand("receipts", "me", 3, 5),
            ],
        )

    def test_pokes_within_one_reactor_turn_send_one_batch(self) -> None:
        self.rows.add("me", 1, receipt(1))
        self.positions.local_write = 1
        self.streamer.on_notifier_poke()
        self.assertEqual(self.handler.sent, [])  # not before the turn ends
        self.rows.add("me", 2, receipt(2))
        self.positions.local_write = 2
        self.streamer.on_notifier_poke()
        self.clock.advance(0)
        self.assertEqual(
            [(type(c).__name__, getattr(c, "token", None)) for c in self.handler.sent],
            [("RdataCommand", None), ("RdataCommand", 2)],
        )
        self.assertEqual(len(self.rows.calls), 1)

    def test_stop_cancels_a_pending_send(self) -> None:
        self.rows.add("me", 1, receipt(1))
        self.positions.local_write = 1
        self.streamer.on_notifier_poke()
        self.streamer.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_nothing_new_sends_nothing_until_the_idle_announcement(self) -> None:
        self.poke()
        self.assertEqual(self.handler.sent, [])
        self.streamer.start()
        self.addCleanup(self.streamer.stop)
        self.handler.announce()
        self.clock.advance(ANNOUNCE_INTERVAL_SECONDS)
        self.assertEqual(
            self.handler.sent,
            [PositionCommand("receipts", "me", 0, 0), PositionCommand("caches", "me", 0, 0)],
        )

    def test_others_moving_the_caches_stream_is_not_echoed(self) -> None:
        # Another process's invalidations lifted our position: nothing of ours.
        self.cache_positions.received["other"] = 8
        self.cache_positions.local_write = 0
        self.poke()
        self.assertEqual(self.handler.sent, [])
        self.cache_rows.add("me", 9, CachesStreamRow("c", None, 1))
        self.cache_positions.local_write = 9
        self.poke()
        self.assertEqual([type(c).__name__ for c in self.handler.sent], ["RdataCommand"])

    def test_nobody_listening_skips_the_rows(self) -> None:
        self.handler.connected = False
        self.rows.add("me", 1, receipt(1))
        self.positions.local_write = 1
        self.poke()
        self.assertEqual(self.receipts.last_sent_position, 1)
        self.assertEqual(self.rows.calls, [])  # not even read: newcomers read the database
        self.handler.connected = True
        self.poke()
        self.assertEqual(self.handler.sent, [])


class VouchingStreamerTestCase(unittest.TestCase):
    """The main process over Redis vouches for its own claims: one note per
    stream with a sequence and pass of the send loop, at the highest
    position that pass claimed."""

    def test_each_pass_vouches_once_per_stream_for_its_highest_claim(self) -> None:
        clock = task.Clock()
        handler = _Handler()
        receipts, positions, rows = fake_stream(BUILTIN_STREAMS["receipts"])
        positions.allocated = 100  # a stream with a sequence
        typing, typing_positions, typing_rows = fake_stream(
            BUILTIN_STREAMS["typing"], can_reset=True
        )
        vouched: list[tuple[str, int]] = []
        streamer = ReplicationStreamer(
            instance_name="me",
            clock=Clock(clock),
            handler=handler,  # type: ignore[arg-type]
            streams=[receipts, typing],
            position_log=None,
            vouch=lambda stream, position: vouched.append((stream, position)),
        )
        streamer.on_notifier_poke()
        clock.advance(0)
        self.assertEqual(vouched, [])  # announced 0: nothing to vouch for
        for token in (1, 2, 3):
            rows.add("me", token, receipt(token))
        positions.local_write = 5
        # Typing moves too, but has no sequence: nothing to vouch for.
        typing_rows.add("me", 4, TypingStreamRow("!r:x", ["@a:x"]))
        typing_positions.local_write = 4
        streamer.on_notifier_poke()
        clock.advance(0)
        rows_sent = {c.stream_name for c in handler.sent if isinstance(c, RdataCommand)}
        self.assertEqual(rows_sent, {"receipts", "typing"})
        self.assertEqual(vouched, [("receipts", 5)])
        self.assertIn(PositionCommand("receipts", "me", 3, 5), handler.sent)
