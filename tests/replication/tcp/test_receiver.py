"""Applying other processes' rows, on a fake clock: the order that keeps
readers safe, one position advance per batch, wake-ups from the definition,
and waiters released exactly when their position is reached."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from twisted.internet import defer, task
from twisted.trial import unittest

from synapse_lite.clock import Clock
from synapse_lite.replication.tcp.receiver import PositionWaiters, ReplicationReceiver
from synapse_lite.storage.change_tracker import PositionChangeTracker
from synapse_lite.streams.catalog import (
    BUILTIN_STREAMS,
    EventsStreamCurrentStateRow,
    EventsStreamEventRow,
    ReceiptsStreamRow,
)
from synapse_lite.streams.definition import Wake
from tests.replication.tcp.fakes import fake_stream


class _Store:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.stream_changes = {"receipts": PositionChangeTracker(lambda: 0)}

    def invalidate_for_events_rows(self, writer: str, token: int, rows: Sequence[Any]) -> None:
        self.log.append(f"invalidate {token} ({len(rows)} rows)")


class _Notifier:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def wake(self, wake: Wake) -> None:
        self.log.append(f"wake rooms={sorted(wake.rooms)} users={sorted(wake.users)}")


def member_event(token: int) -> list[Any]:
    return [
        EventsStreamEventRow(
            f"$m{token}",
            "!r:x",
            "m.room.member",
            "@bob:x",
            None,
            None,
            "invite",
            False,
            False,
            True,
        ),
        EventsStreamCurrentStateRow("!r:x", "m.room.member", "@bob:x", f"$m{token}"),
    ]


class ReceiverTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.clock = task.Clock()
        self.log: list[str] = []
        self.store = _Store(self.log)
        self.events, self.positions, _ = fake_stream(BUILTIN_STREAMS["events"])
        self.receipts, _, _ = fake_stream(BUILTIN_STREAMS["receipts"])
        streams = {"events": self.events, "receipts": self.receipts}
        self.waiters = PositionWaiters(
            Clock(self.clock), "me", {name: s.positions for name, s in streams.items()}
        )
        self.receiver = ReplicationReceiver(
            cast(Any, self.store), streams, cast(Any, _Notifier(self.log)), self.waiters
        )
        original = self.positions.advance_past_row

        def logged_advance_past_row(writer: str, position: int) -> None:
            self.log.append(f"advance {position}")
            original(writer, position)

        self.positions.advance_past_row = logged_advance_past_row  # type: ignore[method-assign]
        self.receiver.add_row_hook(
            "events", lambda writer, token, rows: self.log.append(f"hook {token}")
        )

    def test_invalidate_then_handlers_then_advance_then_wake(self) -> None:
        self.receiver.on_rows("events", "p1", 7, member_event(7))
        self.assertEqual(
            self.log,
            [
                "invalidate 7 (2 rows)",
                "hook 7",
                "advance 7",
                "wake rooms=['!r:x'] users=['@bob:x']",
            ],
        )
        self.assertEqual(self.positions.calls, [("row", "p1", 7)])  # advanced once

    def test_a_batch_of_several_ids_is_one_pass_one_advance_one_wake(self) -> None:
        rows = [
            *member_event(5),
            EventsStreamEventRow(
                "$x", "!s:x", "m.room.message", None, None, None, None, False, False, True
            ),
            *member_event(7),
        ]
        self.receiver.on_rows("events", "p1", 7, rows)
        self.assertEqual(
            self.log,
            [
                "invalidate 7 (5 rows)",
                "hook 7",
                "advance 7",
                "wake rooms=['!r:x', '!s:x'] users=['@bob:x']",
            ],
        )
        self.assertEqual(self.positions.calls, [("row", "p1", 7)])

    def test_a_bare_position_invalidates_and_wakes_nothing(self) -> None:
        self.receiver.on_rows("events", "p1", 9, [])
        self.assertEqual(self.log, ["hook 9"])
        self.assertEqual(self.positions.calls, [("position", "p1", 9)])

    def test_a_failing_handler_does_not_stop_the_stream(self) -> None:
        def broken(writer: str, token: int, rows: Sequence[Any]) -> None:
            raise ValueError("bug")

        self.receiver.add_row_hook("events", broken)
        with self.assertLogs("synapse_lite.replication.tcp.receiver", "ERROR"):
            self.receiver.on_rows("events", "p1", 3, member_event(3))
        self.assertIn("advance 3", self.log)

    def test_waiters_are_released_at_their_position_and_not_before(self) -> None:
        first = defer.ensureDeferred(self.waiters.wait_for_stream_position("p1", "events", 5))
        second = defer.ensureDeferred(self.waiters.wait_for_stream_position("p1", "events", 8))
        other = defer.ensureDeferred(self.waiters.wait_for_stream_position("p2", "events", 1))
        self.receiver.on_rows("events", "p1", 4, member_event(4))
        self.assertFalse(first.called)
        self.receiver.on_rows("events", "p1", 6, [])
        self.assertTrue(first.called)
        self.assertFalse(second.called or other.called)
        # A receipt row names another stream: nobody here is released by it.
        self.receiver.on_rows(
            "receipts", "p1", 9, [ReceiptsStreamRow("!r:x", "m.read", "@u:x", "$e", None, {})]
        )
        self.assertFalse(second.called)
        self.receiver.on_rows("events", "p1", 8, [])
        self.assertTrue(second.called)
        self.assertFalse(other.called)

    def test_a_batch_is_recorded_by_its_streams_change_tracker(self) -> None:
        rows = [
            ReceiptsStreamRow(room, "m.read", "@u:x", "$e", None, {}) for room in ("!a:x", "!b:x")
        ]
        self.receiver.on_rows("receipts", "p1", 9, rows)
        tracker = self.store.stream_changes["receipts"]
        self.assertEqual(tracker.changed_among(["!a:x", "!b:x", "!c:x"], 8), ["!a:x", "!b:x"])
        self.assertEqual(tracker.changed_among(["!a:x", "!b:x"], 9), [])

    def test_a_wait_times_out_and_one_already_reached_returns_at_once(self) -> None:
        self.receiver.on_rows("events", "p1", 10, [])
        reached = defer.ensureDeferred(self.waiters.wait_for_stream_position("p1", "events", 3))
        self.assertTrue(reached.called)
        mine = defer.ensureDeferred(self.waiters.wait_for_stream_position("me", "events", 99))
        self.assertTrue(mine.called)
        late = defer.ensureDeferred(
            self.waiters.wait_for_stream_position("p1", "events", 11, timeout=2)
        )
        self.clock.advance(2)
        self.failureResultOf(late, defer.TimeoutError)

    def test_a_wait_on_a_stream_not_read_here_returns_at_once(self) -> None:
        # A media worker forwarding a write waits for nothing it does not read.
        waiters = PositionWaiters(
            Clock(self.clock), "media1", {"events": self.positions}, reads=["caches"]
        )
        unread = defer.ensureDeferred(waiters.wait_for_stream_position("p1", "events", 5))
        self.assertTrue(unread.called)
