"""The fault tests' check must be able to fail: a lost, duplicated or
reordered message, and typing that never came back, are each counted."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from twisted.trial import unittest

from tests.harness.delivery import check_delivery
from tests.harness.load import Ack, HttpClient, LoadRun, Member

ALICE, BOB = Member("@a:t", "ta"), Member("@b:t", "tb")
ROOM = "!r:t"


class DeliveryCheckTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.db = sqlite3.connect(":memory:")
        self.db.execute(
            "CREATE TABLE events (stream_ordering INTEGER, event_id TEXT, room_id TEXT,"
            " type TEXT, content TEXT)"
        )
        self.run_ = LoadRun(HttpClient(), [ALICE, BOB], [ROOM], [], [], tag="t")
        self.stream = 0
        # The typist's last state reached both members after the repair at t=5.
        self.run_.typing_acked = (True, 6.0)
        for member in (ALICE, BOB):
            self.run_.typing_seen[member.user_id].append((7.0, True))

    def connect(self) -> Any:
        # check_delivery closes what it is given: hand it a throwaway wrapper.
        db = self.db

        class Conn:
            def cursor(self) -> Any:
                return db.cursor()

            def close(self) -> None:
                pass

        return Conn()

    def store(self, event_id: str, body: str) -> None:
        self.stream += 1
        self.db.execute(
            "INSERT INTO events VALUES (?, ?, ?, 'm.room.message', ?)",
            (self.stream, event_id, ROOM, json.dumps({"body": body})),
        )

    def send(self, event_id: str, seq: int, seen_by: tuple[Member, ...] = (ALICE, BOB)) -> None:
        body = f"t s0 n{seq}"
        self.store(event_id, body)
        self.run_.acks[event_id] = Ack(event_id, ROOM, body, float(seq), float(seq))
        for member in seen_by:
            self.run_.received[member.user_id].append((ROOM, event_id, seq + 0.5))

    def counts(self) -> tuple[int, int, int, int]:
        r = check_delivery(self.run_, self.connect, repaired_at=5.0)
        return r.lost, r.duplicated, r.misordered, r.typing_stuck

    def test_clean_run(self) -> None:
        for n in range(3):
            self.send(f"$e{n}", n)
        report = check_delivery(self.run_, self.connect, repaired_at=5.0)
        self.assertTrue(report.ok, report.problems)
        self.assertEqual(report.acknowledged, 3)

    def test_missing_from_one_sync_is_lost(self) -> None:
        self.send("$e0", 0)
        self.send("$e1", 1, seen_by=(ALICE,))
        lost, _, misordered, _ = self.counts()
        self.assertEqual(lost, 1)
        self.assertEqual(misordered, 1)  # bob's timeline differs from the stream

    def test_acknowledged_but_not_stored_is_lost(self) -> None:
        self.send("$e0", 0)
        self.run_.acks["$ghost"] = Ack("$ghost", ROOM, "t s0 n1", 1.0, 1.0)
        self.assertEqual(self.counts()[0], 1)

    def test_retried_transaction_stored_twice_is_a_duplicate(self) -> None:
        self.send("$e0", 0)
        self.store("$e0-again", "t s0 n0")
        self.assertEqual(self.counts()[1], 1)

    def test_returned_twice_by_sync_is_a_duplicate(self) -> None:
        self.send("$e0", 0)
        self.run_.received[BOB.user_id].append((ROOM, "$e0", 9.0))
        self.assertEqual(self.counts()[1], 1)

    def test_sync_order_differs_from_stream(self) -> None:
        self.send("$e0", 0)
        self.send("$e1", 1)
        alice = self.run_.received[ALICE.user_id]
        alice.reverse()
        self.assertEqual(self.counts(), (0, 0, 1, 0))

    def test_sender_order_broken_in_storage(self) -> None:
        self.send("$e1", 1)
        self.send("$e0", 0)
        self.assertEqual(self.counts()[2], 1)

    def test_typing_not_seen_after_repair(self) -> None:
        self.send("$e0", 0)
        self.run_.typing_seen[BOB.user_id] = [(4.0, True)]  # before the repair only
        self.assertEqual(self.counts()[3], 1)
