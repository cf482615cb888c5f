"""Peers' position claims are checked before they move anything: unknown
writers, positions the sequence never handed out, positions no token could
carry (the handler over in-memory connections, on a fake clock)."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY
from twisted.internet import defer, task
from twisted.trial import unittest

from synapse_lite.clock import Clock
from synapse_lite.replication.claims import (
    REFUSAL_LOG_INTERVAL_SECONDS,
    WRITER_LOOKUP_INTERVAL_SECONDS,
    PeerClaims,
)
from synapse_lite.replication.tcp.commands import (
    Command,
    PositionCommand,
    RdataCommand,
    ReplicateCommand,
)
from synapse_lite.replication.tcp.handler import ReplicationCommandHandler
from synapse_lite.streams.catalog import BUILTIN_STREAMS, ReceiptsStreamRow
from synapse_lite.tokens import MAX_TOKEN_POSITION
from tests.replication.tcp.fakes import RecordingConnection, RecordingReceiver, fake_stream

LOGGER = "synapse_lite.replication.claims"


def receipt(n: int) -> list[Any]:
    return BUILTIN_STREAMS["receipts"].encode_row(
        ReceiptsStreamRow("!r:x", "m.read", f"@u{n}:x", f"$e{n}", None, {"ts": n})
    )


def refused(stream: str, reason: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "synapse_lite_replication_claims_refused_total", {"stream": stream, "reason": reason}
        )
        or 0.0
    )


class ClaimsTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.clock = task.Clock()
        self.receipts, self.positions, self.rows = fake_stream(BUILTIN_STREAMS["receipts"])
        self.positions.allocated = 10
        self.typing, self.typing_positions, _ = fake_stream(
            BUILTIN_STREAMS["typing"], can_reset=True
        )
        streams = {"receipts": self.receipts, "typing": self.typing}
        self.receiver = RecordingReceiver(streams)
        self.lookups: list[tuple[str, str]] = []
        self.recorded_writers = {"late"}

        async def look_up(stream: str, writer: str) -> bool:
            self.lookups.append((stream, writer))
            return writer in self.recorded_writers

        claims = PeerClaims(
            Clock(self.clock),
            streams,
            lambda stream: {"receipts": ("w1",), "typing": ("tw",)}.get(stream, ()),
            look_up,
        )
        self.handler = ReplicationCommandHandler(
            instance_name="me",
            clock=Clock(self.clock),
            streams=streams,
            receiver=self.receiver,  # type: ignore[arg-type]
            claims=claims,
        )
        self.conn = RecordingConnection("peer")
        self.handler.new_connection(self.conn)

    def command(self, cmd: Command) -> None:
        self.handler.on_command(self.conn, cmd)

    def test_a_position_the_sequence_never_handed_out_is_refused(self) -> None:
        self.command(PositionCommand("receipts", "w1", 0, 4))
        self.assertEqual(self.positions.received, {"w1": 4})
        before = refused("receipts", "not_allocated")
        with self.assertLogs(LOGGER, "WARNING") as logs:
            self.command(PositionCommand("receipts", "w1", 0, 1010))
        self.assertEqual(self.positions.received, {"w1": 4})
        self.assertEqual(refused("receipts", "not_allocated"), before + 1)
        self.assertIn("from peer (not_allocated): POSITION receipts w1 0 1010", logs.output[0])
        self.assertIn("only handed out up to 10", logs.output[0])
        # The writer really gets there: believed once the sequence has.
        self.positions.allocated = 1010
        self.command(PositionCommand("receipts", "w1", 4, 1010))
        self.assertEqual(self.positions.received, {"w1": 1010})

    def test_the_sequence_is_read_only_for_a_position_beyond_the_last_read(self) -> None:
        self.command(PositionCommand("receipts", "w1", 0, 3))
        self.assertEqual(self.positions.sequence_reads, 1)
        for n in range(4, 11):
            self.command(PositionCommand("receipts", "w1", n - 1, n))
        self.assertEqual(self.positions.sequence_reads, 1)
        self.assertEqual(self.positions.received, {"w1": 10})
        with self.assertLogs(LOGGER, "WARNING"):
            self.command(PositionCommand("receipts", "w1", 10, 11))
        self.assertEqual(self.positions.sequence_reads, 2)

    def test_rdata_beyond_the_sequence_is_dropped_with_its_batch(self) -> None:
        self.command(PositionCommand("receipts", "w1", 0, 0))
        self.command(RdataCommand("receipts", "w1", None, receipt(1)))
        with self.assertLogs(LOGGER, "WARNING") as logs:
            self.command(RdataCommand("receipts", "w1", 10**12, receipt(2)))
        self.assertIn("not_allocated", logs.output[0])
        self.assertEqual(self.positions.received, {"w1": 0})
        # The row held for the refused token went with it.
        self.command(RdataCommand("receipts", "w1", 5, receipt(5)))
        self.assertEqual(
            [(t, len(rows)) for _, _, t, rows in self.receiver.applied], [(0, 0), (5, 1)]
        )

    def test_a_writer_that_does_not_write_the_stream_is_refused(self) -> None:
        before = refused("receipts", "unknown_writer")
        with self.assertLogs(LOGGER, "WARNING") as logs:
            self.command(PositionCommand("receipts", "fuzzer", 0, 1))
            self.command(RdataCommand("receipts", "persister9", 2, receipt(2)))
        self.assertEqual(self.positions.received, {})
        self.assertEqual(self.positions.calls, [])
        self.assertEqual(refused("receipts", "unknown_writer"), before + 2)
        self.assertIn("(unknown_writer): POSITION receipts fuzzer 0 1", logs.output[0])
        self.assertEqual(self.lookups, [("receipts", "fuzzer"), ("receipts", "persister9")])

    def test_a_writer_added_at_runtime_is_looked_up_then_believed(self) -> None:
        self.command(PositionCommand("receipts", "late", 0, 3))
        self.assertEqual(self.positions.received, {"late": 3})

    def test_made_up_names_are_looked_up_once_per_interval(self) -> None:
        with self.assertLogs(LOGGER, "WARNING"):
            for n in range(5):
                self.command(PositionCommand("receipts", "phantom", n, n + 1))
        self.assertEqual(self.lookups, [("receipts", "phantom")])
        self.clock.advance(WRITER_LOOKUP_INTERVAL_SECONDS)
        with self.assertLogs(LOGGER, "WARNING"):
            self.command(PositionCommand("receipts", "phantom", 0, 1))
        self.assertEqual(len(self.lookups), 2)

    def test_a_typing_position_below_ours_is_refused_not_taken_for_a_restart(self) -> None:
        """Issue 34: one ``POSITION typing <writer> 0 5`` made every follower
        reset typing and drop its position. Runs begin above each other (here
        at multiples of 100), so a lower position, of an older run or of the
        current one, is refused and counted; a higher run still resets."""
        self.typing_positions.lower_position_is_false = True
        self.command(PositionCommand("typing", "tw", 100, 105))
        self.assertEqual(self.typing_positions.received, {"tw": 105})
        applied = list(self.receiver.applied)
        before = refused("typing", "went_backwards")
        with self.assertLogs(LOGGER, "WARNING") as logs:
            self.command(PositionCommand("typing", "tw", 0, 5))  # an older run
            self.command(PositionCommand("typing", "tw", 100, 102))  # lower, same run
            self.command(PositionCommand("typing", "tw", 100, 100))  # a "restart" at 100
        self.assertEqual(refused("typing", "went_backwards"), before + 3)
        self.assertIn("(went_backwards): POSITION typing tw 0 5: below 105", logs.output[0])
        self.assertEqual(self.receiver.applied, applied)
        self.assertEqual(self.typing_positions.received, {"tw": 105})
        # The same position again is no claim against anything; a new run is.
        self.command(PositionCommand("typing", "tw", 105, 105))
        self.command(PositionCommand("typing", "tw", 200, 200))
        self.assertEqual(self.typing_positions.received, {"tw": 200})
        self.assertEqual(refused("typing", "went_backwards"), before + 3)

    def test_positions_no_token_could_carry_are_refused(self) -> None:
        """Even on a stream with no sequence to check against (typing)."""
        before = refused("typing", "out_of_range")
        with self.assertLogs(LOGGER, "WARNING"):
            self.command(PositionCommand("typing", "tw", 0, MAX_TOKEN_POSITION + 1))
            self.command(PositionCommand("typing", "tw", 0, 2**63 - 1))
            self.command(PositionCommand("typing", "tw", -5, 1))
            self.command(RdataCommand("receipts", "w1", -1, receipt(1)))
        self.assertEqual(refused("typing", "out_of_range"), before + 3)
        self.assertEqual(self.typing_positions.calls, [])
        self.assertEqual(self.positions.calls, [])
        self.assertEqual(self.typing_positions.sequence_reads, 0)
        self.command(PositionCommand("typing", "tw", 0, 7))
        self.assertEqual(self.typing_positions.received, {"tw": 7})

    def test_refusals_are_logged_at_most_once_per_interval(self) -> None:
        with self.assertLogs(LOGGER, "WARNING") as logs:
            for n in range(50):
                self.command(PositionCommand("receipts", "w1", 0, 1000 + n))
            self.clock.advance(REFUSAL_LOG_INTERVAL_SECONDS)
            self.command(PositionCommand("receipts", "w1", 0, 5000))
        self.assertEqual(len(logs.output), 2)
        self.assertIn("49 more refused for this reason", logs.output[1])

    def test_a_300_letter_writer_name_is_shortened_in_the_log(self) -> None:
        name = "x" * 300
        with self.assertLogs(LOGGER, "WARNING") as logs:
            self.command(PositionCommand("receipts", name, 0, 1))
        self.assertNotIn(name, logs.output[0])
        self.assertIn("chars)", logs.output[0])

    def test_a_connection_that_vouches_needs_no_sequence_read(self) -> None:
        """A TCP worker's connection to the main process: the main process
        checked the sequence; the other checks still apply."""
        main = RecordingConnection("main", vouches_for_claims=True)
        self.handler.new_connection(main)
        self.handler.on_command(main, PositionCommand("receipts", "w1", 0, 1010))
        self.handler.on_command(main, RdataCommand("receipts", "w1", 1011, receipt(1011)))
        self.assertEqual(self.positions.received, {"w1": 1011})
        self.assertEqual(self.positions.sequence_reads, 0)
        with self.assertLogs(LOGGER, "WARNING") as logs:
            self.handler.on_command(main, PositionCommand("receipts", "nobody", 0, 3))
            self.clock.advance(REFUSAL_LOG_INTERVAL_SECONDS)
            self.handler.on_command(
                main, PositionCommand("receipts", "w1", 0, MAX_TOKEN_POSITION + 1)
            )
        self.assertIn("unknown_writer", logs.output[0])
        self.assertIn("out_of_range", logs.output[1])
        self.assertEqual(self.positions.received, {"w1": 1011})

    def controlled_sequence_reads(self) -> list[defer.Deferred[int | None]]:
        """Make each sequence read wait for the test: the Deferreds, in order."""
        reads: list[defer.Deferred[int | None]] = []

        async def read_max_allocated() -> int | None:
            read: defer.Deferred[int | None] = defer.Deferred()
            reads.append(read)
            return await read

        self.positions.read_max_allocated = read_max_allocated  # type: ignore[method-assign]
        return reads

    def test_claims_arriving_during_a_sequence_read_share_it(self) -> None:
        reads = self.controlled_sequence_reads()
        first = self.handler.claims.check(PositionCommand("receipts", "w1", 0, 20), "w1")
        second = self.handler.claims.check(PositionCommand("receipts", "w1", 20, 21), "w1")
        third = self.handler.claims.check(PositionCommand("receipts", "w1", 21, 30), "w1")
        assert isinstance(first, defer.Deferred) and isinstance(second, defer.Deferred)
        assert isinstance(third, defer.Deferred)
        self.assertEqual(len(reads), 1)
        reads[0].callback(25)
        self.assertTrue(self.successResultOf(first))
        self.assertTrue(self.successResultOf(second))
        # Beyond what that read saw: read again (and refused if still beyond).
        self.assertEqual(len(reads), 2)
        with self.assertLogs(LOGGER, "WARNING"):
            reads[1].callback(25)
        self.assertFalse(self.successResultOf(third))
        # Believed at once now, without a Deferred.
        self.assertIs(
            self.handler.claims.check(PositionCommand("receipts", "w1", 0, 25), "w1"), True
        )
        self.assertIs(self.handler.claims.check(ReplicateCommand(), "w1"), True)

    def test_a_failed_sequence_read_fails_every_claim_waiting_for_it(self) -> None:
        reads = self.controlled_sequence_reads()
        first = self.handler.claims.check(PositionCommand("receipts", "w1", 0, 20), "w1")
        second = self.handler.claims.check(PositionCommand("receipts", "w1", 0, 21), "w1")
        assert isinstance(first, defer.Deferred) and isinstance(second, defer.Deferred)
        reads[0].errback(RuntimeError("database unreachable"))
        self.failureResultOf(first, RuntimeError)
        # The waiter reads again itself.
        self.assertEqual(len(reads), 2)
        reads[1].callback(21)
        self.assertTrue(self.successResultOf(second))
