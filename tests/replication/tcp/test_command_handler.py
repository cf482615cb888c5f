"""The command handler's rules, in memory on a fake clock: RDATA before its
POSITION, old RDATA, batches, catch-up in pages, retries, streams that reset,
echoes, bad rows, and sending through the bus."""

from __future__ import annotations

from typing import Any, cast

from twisted.internet import task
from twisted.trial import unittest

from synapse_lite.clock import Clock
from synapse_lite.replication.tcp.commands import (
    Command,
    PositionCommand,
    RdataCommand,
    ReplicateCommand,
    UserSyncCommand,
)
from synapse_lite.replication.tcp.handler import (
    CATCH_UP_RETRY_SECONDS,
    CHECK_RETRY_SECONDS,
    ReplicationCommandHandler,
)
from synapse_lite.replication.tcp.receiver import PositionWaiters, ReplicationReceiver
from synapse_lite.streams.catalog import BUILTIN_STREAMS, ReceiptsStreamRow, TypingStreamRow
from synapse_lite.streams.definition import Wake
from tests.replication.tcp.fakes import RecordingConnection, RecordingReceiver, fake_stream


def receipt(n: int) -> ReceiptsStreamRow:
    return ReceiptsStreamRow("!r:x", "m.read", f"@u{n}:x", f"$e{n}", None, {"ts": n})


def wire(row: Any) -> list[Any]:
    return BUILTIN_STREAMS["receipts"].encode_row(row)


class CommandHandlerTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.clock = task.Clock()
        self.receipts, self.positions, self.rows = fake_stream(BUILTIN_STREAMS["receipts"])
        self.typing, self.typing_positions, self.typing_rows = fake_stream(
            BUILTIN_STREAMS["typing"], can_reset=True
        )
        streams = {"receipts": self.receipts, "typing": self.typing}
        self.receiver = RecordingReceiver(streams)
        self.handler = ReplicationCommandHandler(
            instance_name="me",
            clock=Clock(self.clock),
            streams=streams,
            receiver=self.receiver,  # type: ignore[arg-type]
        )
        self.conn = RecordingConnection()
        self.handler.new_connection(self.conn)

    def command(self, cmd: Command) -> None:
        self.handler.on_command(self.conn, cmd)

    def applied(self) -> list[tuple[int, int]]:
        """(token, number of rows) of each batch applied to receipts."""
        return [(t, len(rows)) for s, _, t, rows in self.receiver.applied if s == "receipts"]

    def test_rdata_before_the_writers_position_is_left_to_the_catch_up(self) -> None:
        self.command(RdataCommand("receipts", "w1", 3, wire(receipt(3))))
        self.assertEqual(self.applied(), [])
        self.rows.add("w1", 3, receipt(3))
        self.command(PositionCommand("receipts", "w1", 2, 3))
        # Behind prev=2 (we have 0): the catch-up reads row 3, then the position.
        self.assertEqual(self.applied(), [(3, 1), (3, 0)])
        self.command(RdataCommand("receipts", "w1", 4, wire(receipt(4))))
        self.assertEqual(self.applied()[-1], (4, 1))

    def test_old_rdata_is_dropped(self) -> None:
        self.command(PositionCommand("receipts", "w1", 0, 5))
        before = len(self.receiver.applied)
        self.command(RdataCommand("receipts", "w1", 5, wire(receipt(5))))
        self.command(RdataCommand("receipts", "w1", 2, wire(receipt(2))))
        self.assertEqual(len(self.receiver.applied), before)

    def test_a_position_on_another_connection_does_not_stall_a_writer(self) -> None:
        """Issue 34: a second connection for w1 (an impostor, a worker started
        twice, a reconnection overlapping the old connection) sending one
        POSITION made every later row on w1's own connection be dropped as
        "before its POSITION". Each connection keeps its own bookkeeping."""
        self.command(PositionCommand("receipts", "w1", 0, 3))
        other = RecordingConnection("w1 again")
        self.handler.new_connection(other)
        self.handler.on_command(other, PositionCommand("receipts", "w1", 3, 3))
        self.command(RdataCommand("receipts", "w1", 4, wire(receipt(4))))
        self.assertEqual(self.applied()[-1], (4, 1))
        self.handler.lost_connection(other)
        self.command(RdataCommand("receipts", "w1", 5, wire(receipt(5))))
        self.assertEqual(self.applied()[-1], (5, 1))

    def test_a_batch_waits_for_the_row_with_its_token(self) -> None:
        self.command(PositionCommand("receipts", "w1", 0, 0))
        self.command(RdataCommand("receipts", "w1", None, wire(receipt(1))))
        self.command(RdataCommand("receipts", "w1", None, wire(receipt(2))))
        self.assertEqual(self.applied(), [(0, 0)])
        self.command(RdataCommand("receipts", "w1", 7, wire(receipt(3))))
        self.assertEqual(self.applied()[-1], (7, 3))

    def test_catch_up_reads_in_pages_in_order(self) -> None:
        for n in range(1, 251):
            self.rows.add("w1", n, receipt(n))
        self.command(PositionCommand("receipts", "w1", 250, 250))
        tokens = [t for t, n in self.applied() if n]
        self.assertEqual(tokens, list(range(1, 251)))
        self.assertEqual(
            [(f, u) for _, f, u, _ in self.rows.calls], [(0, 250), (100, 250), (200, 250)]
        )

    def test_a_failed_catch_up_is_retried_later(self) -> None:
        self.rows.add("w1", 1, receipt(1))
        self.rows.failures = 1
        with self.assertLogs("synapse_lite.replication.tcp.handler", "WARNING"):
            self.command(PositionCommand("receipts", "w1", 1, 1))
        self.assertEqual(self.applied(), [])
        self.clock.advance(CATCH_UP_RETRY_SECONDS)
        self.assertEqual(self.applied(), [(1, 1), (1, 0)])

    def test_stop_cancels_the_retries(self) -> None:
        self.rows.failures = 1
        with self.assertLogs("synapse_lite.replication.tcp.handler", "WARNING"):
            self.command(PositionCommand("receipts", "w1", 1, 1))
        self.handler.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_row_whose_claim_cannot_be_checked_waits_until_it_can(self) -> None:
        """Issue 35, the PostgreSQL restart fault over Redis: a row whose
        claim was checked against the sequence while the database was down
        was dropped, and the writer's next row moved the position past it:
        an event lost for good. The check is asked again, the stream's later
        rows waiting behind it."""
        self.command(PositionCommand("receipts", "w1", 0, 0))
        self.positions.allocated = 10
        self.positions.sequence_failures = 2
        with self.assertLogs("synapse_lite.replication.tcp.handler", "WARNING"):
            self.command(RdataCommand("receipts", "w1", 1, wire(receipt(1))))
            self.command(RdataCommand("receipts", "w1", 2, wire(receipt(2))))
            self.assertEqual(self.applied(), [(0, 0)])
            self.clock.advance(CHECK_RETRY_SECONDS)
        self.assertEqual(self.applied(), [(0, 0)])
        self.clock.advance(CHECK_RETRY_SECONDS)
        self.assertEqual(self.applied(), [(0, 0), (1, 1), (2, 1)])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_position_whose_claim_cannot_be_checked_is_checked_again(self) -> None:
        self.rows.add("w1", 3, receipt(3))
        self.positions.allocated = 10
        self.positions.sequence_failures = 1
        with self.assertLogs("synapse_lite.replication.tcp.handler", "WARNING"):
            self.command(PositionCommand("receipts", "w1", 3, 3))
        self.assertEqual(self.applied(), [])
        self.clock.advance(CHECK_RETRY_SECONDS)
        self.assertEqual(self.applied(), [(3, 1), (3, 0)])

    def test_a_check_is_not_retried_for_a_connection_gone_or_a_process_stopped(self) -> None:
        self.command(PositionCommand("receipts", "w1", 0, 0))
        self.positions.allocated = 10
        self.positions.sequence_failures = 3
        with self.assertLogs("synapse_lite.replication.tcp.handler", "WARNING"):
            self.command(RdataCommand("receipts", "w1", 1, wire(receipt(1))))
        # The connection comes back: its POSITION will catch the row up.
        self.handler.lost_connection(self.conn)
        self.handler.new_connection(self.conn)
        self.clock.advance(CHECK_RETRY_SECONDS)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.applied(), [(0, 0)])
        with self.assertLogs("synapse_lite.replication.tcp.handler", "WARNING"):
            self.command(PositionCommand("receipts", "w1", 0, 5))
        self.handler.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_position_we_have_changes_nothing(self) -> None:
        self.command(PositionCommand("receipts", "w1", 0, 5))
        calls = len(self.positions.calls)
        self.command(PositionCommand("receipts", "w1", 3, 5))
        self.assertEqual(len(self.positions.calls), calls)

    def test_a_stream_that_resets_is_read_again_from_the_writer(self) -> None:
        self.command(PositionCommand("typing", "tw", 0, 0))
        self.typing_positions.received["tw"] = 40
        # The writer restarted: its counter is below ours. Outside [prev, new]:
        # everything it has now is read again.
        self.typing_rows.add("tw", 2, TypingStreamRow("!r:x", ["@a:x"]))
        self.command(PositionCommand("typing", "tw", 2, 2))
        typing = [(t, len(r)) for s, _, t, r in self.receiver.applied if s == "typing"]
        self.assertEqual(typing[-2:], [(2, 1), (2, 0)])
        self.assertEqual(self.typing_rows.calls[-1][1:3], (40, 2))

    def test_a_writer_at_the_start_of_a_new_run_is_not_read(self) -> None:
        self.command(PositionCommand("typing", "tw", 0, 0))
        self.typing_positions.received["tw"] = 40
        # A new run at 200 with nothing done yet: the follower resets (its
        # row hook sees the new run) without asking the writer for rows.
        self.command(PositionCommand("typing", "tw", 200, 200))
        typing = [(t, len(r)) for s, _, t, r in self.receiver.applied if s == "typing"]
        self.assertEqual(typing[-1], (200, 0))
        self.assertEqual(self.typing_rows.calls, [])
        # Once the run has done something, a follower outside it reads it.
        self.typing_positions.received["tw"] = 40
        self.typing_rows.add("tw", 201, TypingStreamRow("!r:x", ["@a:x"]))
        self.command(PositionCommand("typing", "tw", 201, 201))
        self.assertEqual(self.typing_rows.calls[-1][1:3], (40, 201))

    def test_own_echoes_unknown_streams_and_bad_rows(self) -> None:
        self.command(PositionCommand("receipts", "me", 0, 9))
        self.command(RdataCommand("receipts", "me", 9, wire(receipt(9))))
        with self.assertLogs("synapse_lite.replication", "WARNING") as logs:
            self.command(PositionCommand("nosuch", "w1", 0, 1))
            self.command(PositionCommand("receipts", "w1", 0, 0))
            self.command(RdataCommand("receipts", "w1", 1, ["too", "short"]))
        self.assertEqual(self.applied(), [(0, 0)])
        output = "\n".join(logs.output)
        self.assertIn("(unknown_stream): POSITION nosuch w1 0 1", output)
        self.assertIn("has 6 fields, not 2", output)

    def test_new_connections_are_greeted_and_announced_to(self) -> None:
        announced: list[int] = []
        sync = UserSyncCommand("run1", "@u:x", "DEV", True, 5)
        self.handler.add_connection_greeting(lambda: [sync])
        self.handler.on_new_connection(lambda: announced.append(1))
        other = RecordingConnection("other")
        self.handler.new_connection(other)
        self.assertEqual(other.sent, [sync])
        self.assertEqual(announced, [1])
        self.command(ReplicateCommand())
        self.assertEqual(announced, [1, 1])

    def test_commands_go_through_the_bus_once(self) -> None:
        bus = RecordingConnection("bus")
        second = RecordingConnection("second")
        self.handler.new_connection(second)
        position = PositionCommand("receipts", "me", 1, 2)
        self.handler.send_command(position)
        self.assertEqual((self.conn.sent, second.sent), ([position], [position]))
        self.handler.set_bus(cast(Any, bus))
        self.handler.send_command(position)
        self.assertEqual(bus.sent, [position])
        self.assertEqual(len(self.conn.sent) + len(second.sent), 2)
        for connection in (self.conn, second):
            self.handler.lost_connection(connection)
        self.handler.send_command(position)  # nobody to tell: dropped
        self.assertEqual(bus.sent, [position])


class SubscriptionHandlerTestCase(unittest.TestCase):
    """A process acts on nothing of a stream it does not read."""

    def setUp(self) -> None:
        self.receipts, self.positions, self.rows = fake_stream(BUILTIN_STREAMS["receipts"])
        streams = {"receipts": self.receipts}
        self.receiver = RecordingReceiver(streams)
        self.handler = ReplicationCommandHandler(
            instance_name="media1",
            clock=Clock(task.Clock()),
            streams=streams,
            receiver=self.receiver,  # type: ignore[arg-type]
            followed_streams=["caches"],
        )
        self.conn = RecordingConnection()
        self.handler.new_connection(self.conn)

    def test_claims_of_a_stream_not_read_are_dropped_unread(self) -> None:
        self.rows.add("w1", 3, receipt(3))
        self.handler.on_command(self.conn, PositionCommand("receipts", "w1", 3, 3))
        self.handler.on_command(self.conn, RdataCommand("receipts", "w1", 4, wire(receipt(4))))
        self.assertEqual(self.receiver.applied, [])
        self.assertEqual(self.rows.calls, [])
        self.assertEqual(self.positions.received_position("w1"), 0)

    def test_a_retired_writer_is_forgotten_without_reading_its_rows(self) -> None:
        self.positions.received["w1"] = 2
        self.rows.add("w1", 3, receipt(3))

        async def stopped_at(writer: str) -> int:
            return 3  # beyond what we received: a reader of the stream reads row 3

        self.positions.read_stopped_writer_position = stopped_at  # type: ignore[method-assign]
        self.handler.forget_writer("receipts", "w1")
        self.assertEqual(self.rows.calls, [])
        self.assertEqual(self.receiver.applied, [])
        self.assertNotIn("w1", self.positions.received)


class _Notifier:
    """Records each wake-up."""

    def __init__(self) -> None:
        self.wakes: list[Wake] = []

    def wake(self, wake: Wake) -> None:
        self.wakes.append(wake)


class _Store:
    stream_changes: dict[str, Any] = {}


class ReadsTestCase(unittest.TestCase):
    """Rows handed over within one read of a socket (``read_started`` to
    ``read_done``) apply at the end of the read, each writer's as one batch
    through the real receiver: one wake-up, positions exact."""

    def setUp(self) -> None:
        self.clock = task.Clock()
        self.receipts, self.positions, self.rows = fake_stream(BUILTIN_STREAMS["receipts"])
        self.typing, self.typing_positions, _ = fake_stream(
            BUILTIN_STREAMS["typing"], can_reset=True
        )
        streams = {"receipts": self.receipts, "typing": self.typing}
        self.notifier = _Notifier()
        waiters = PositionWaiters(
            Clock(self.clock), "me", {name: s.positions for name, s in streams.items()}
        )
        self.applied: list[tuple[str, int, list[Any]]] = []
        receiver = ReplicationReceiver(
            cast(Any, _Store()),
            streams,
            cast(Any, self.notifier),
            waiters,
            row_hooks=[
                ("receipts", lambda w, t, rows: self.applied.append((w, t, list(rows)))),
                ("typing", lambda w, t, rows: self.applied.append((w, t, list(rows)))),
            ],
        )
        self.handler = ReplicationCommandHandler(
            instance_name="me", clock=Clock(self.clock), streams=streams, receiver=receiver
        )
        # A TCP worker's connection to the main process, which checks claims.
        self.conn = RecordingConnection(vouches_for_claims=True)
        self.handler.new_connection(self.conn)
        for writer in ("w1", "w2"):
            self.command(PositionCommand("receipts", writer, 0, 0))
        self.applied.clear()
        self.positions.calls.clear()

    def command(self, cmd: Command) -> None:
        self.handler.on_command(self.conn, cmd)

    def rdata(self, writer: str, token: int | None, n: int) -> None:
        self.command(RdataCommand("receipts", writer, token, wire(receipt(n))))

    def test_a_reads_rows_make_one_batch_and_one_wake_up(self) -> None:
        self.handler.read_started()
        for n in (1, 2, 3):
            self.rdata("w1", n, n)
        self.rdata("w1", None, 4)
        self.rdata("w1", 5, 5)
        # Nothing moved before the end of the read.
        self.assertEqual((self.applied, self.notifier.wakes), ([], []))
        self.assertEqual(self.positions.received_position("w1"), 0)
        self.handler.read_done()
        self.assertEqual(self.applied, [("w1", 5, [receipt(n) for n in (1, 2, 3, 4, 5)])])
        self.assertEqual(len(self.notifier.wakes), 1)
        self.assertEqual(self.positions.received_position("w1"), 5)
        # The position jumped to the read's last token, never stopping inside.
        self.assertEqual(self.positions.calls, [("row", "w1", 5)])
        self.assertEqual(self.handler.lag.lag_ids(("receipts", "w1")), 0)

    def test_each_writer_is_its_own_batch_and_old_rows_are_dropped(self) -> None:
        self.handler.read_started()
        self.rdata("w1", 2, 2)
        self.rdata("w2", 3, 3)
        self.rdata("w1", 2, 20)  # not above what was held: old
        self.rdata("w1", 4, 4)
        self.handler.read_done()
        self.assertEqual(
            self.applied, [("w1", 4, [receipt(2), receipt(4)]), ("w2", 3, [receipt(3)])]
        )
        self.assertEqual(len(self.notifier.wakes), 2)

    def test_a_position_in_the_read_applies_the_held_rows_first(self) -> None:
        self.handler.read_started()
        self.rdata("w1", 1, 1)
        self.rdata("w1", 2, 2)
        # prev 2 is what the held rows reach: nothing to read from the database.
        self.command(PositionCommand("receipts", "w1", 2, 6))
        self.assertEqual(self.applied, [("w1", 2, [receipt(1), receipt(2)]), ("w1", 6, [])])
        self.rdata("w1", 7, 7)
        self.handler.read_done()
        self.assertEqual(self.rows.calls, [])
        self.assertEqual(self.applied[-1], ("w1", 7, [receipt(7)]))
        self.assertEqual(self.positions.received_position("w1"), 7)

    def test_reads_nest_and_a_stream_that_resets_applies_each_row(self) -> None:
        self.command(PositionCommand("typing", "w1", 0, 0))
        self.applied.clear()
        self.handler.read_started()
        self.handler.read_started()
        self.command(RdataCommand("typing", "w1", 1, ["!r:x", ["@a:x"]]))
        self.rdata("w1", 1, 1)
        self.assertEqual(self.applied, [("w1", 1, [TypingStreamRow("!r:x", ["@a:x"])])])
        self.handler.read_done()
        self.assertEqual(len(self.applied), 1)
        self.handler.read_done()
        self.assertEqual(self.applied[-1], ("w1", 1, [receipt(1)]))

    def test_without_a_read_rows_apply_at_once(self) -> None:
        self.rdata("w1", 1, 1)
        self.rdata("w1", 2, 2)
        self.assertEqual(self.applied, [("w1", 1, [receipt(1)]), ("w1", 2, [receipt(2)])])

    def test_rows_behind_a_claim_check_join_the_read_in_order(self) -> None:
        """A connection that does not vouch (Redis): a row above what the
        sequence was read at waits for the check, behind the held rows."""
        other = RecordingConnection("redis")
        self.handler.new_connection(other)
        self.handler.on_command(other, PositionCommand("receipts", "w2", 0, 0))
        self.applied.clear()
        self.positions.allocated = 9
        self.handler.read_started()
        self.rdata("w1", 1, 1)
        for n in (2, 3):
            self.handler.on_command(other, RdataCommand("receipts", "w2", n, wire(receipt(n))))
        self.rdata("w1", 4, 4)
        self.handler.read_done()
        self.assertEqual(
            self.applied,
            [("w1", 4, [receipt(1), receipt(4)]), ("w2", 3, [receipt(2), receipt(3)])],
        )
        self.assertEqual(self.positions.sequence_reads, 1)
