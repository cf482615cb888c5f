"""The faults of issue 22 that the audit used to miss, each planted alone into
a database whose clean copy audits with no finding; each is found with its
stream, writer, ids and a message naming them."""

from __future__ import annotations

import json
import os
from typing import Any

from twisted.trial import unittest

from synapse_lite.position_log import STREAM_WIDE, position_log_path
from tests.harness.databases import sqlite_pass_only
from tests.spark.fixture import PLANTED, AuditFixture


class AuditMissesTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.hs = AuditFixture(self, event_graph=False)
        hs = self.hs
        hs.write("events", "main", [1, 2, 5])
        hs.write("events", "worker1", [3, 4, 6])
        hs.write("current_state_delta_stream", "main", [2, 2, 5])
        hs.write("events", "main", [-1, -2])  # backfill
        hs.write("account_data", "main", [1, 3])
        hs.write("room_account_data", "main", [2])
        hs.write("device_inbox", "main", [1, 1, 2])
        for stream, instance, value in [
            ("events", "main", 6),
            ("events", "worker1", 6),
            ("backfill", "main", -2),
            ("account_data", "main", 3),
            ("to_device", "main", 2),
        ]:
            hs.position(stream, instance, value)

    def log(self, process: str, *records: dict[str, Any], raw: str = "") -> None:
        path = position_log_path(self.hs.data_dir, process)
        with open(path, "a", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps({"process": process} | record) + "\n")
            f.write(raw)

    def log_clean_run(self) -> None:
        """Every events id finished (committed) at t=1000, positions at t=2000."""
        for writer, ids in (("main", [1, 2, 5]), ("worker1", [3, 4, 6])):
            self.log(
                writer,
                *(
                    {
                        "kind": "finished",
                        "ts": 1000,
                        "stream": "events",
                        "writer": writer,
                        "id": i,
                        "committed": True,
                    }
                    for i in ids
                ),
                {
                    "kind": "finished",
                    "ts": 1000,
                    "stream": "to_device",
                    "writer": "main",
                    "id": 3,
                    "committed": False,
                },
                {
                    "kind": "position",
                    "ts": 2000,
                    "stream": "events",
                    "writer": STREAM_WIDE,
                    "position": 6,
                    "purpose": "sync",
                },
            )

    def only(self, run: Any, kind: str) -> dict[str, Any]:
        self.assertEqual(run.code, 1, run.out + run.err)
        self.assertEqual([f["kind"] for f in run.findings()], [kind], run.out)
        return run.findings()[0]

    def test_clean_copy_with_logs_reports_nothing(self) -> None:
        self.log_clean_run()
        self.hs.advance_sequence("device_inbox_sequence", 3)
        run = self.hs.audit()
        self.assertEqual(run.code, 0, run.out)
        (gap,) = run.info()
        self.assertEqual((gap["kind"], gap["stream"], gap["ids"]), ("gap", "to_device", [3]))
        # Item 10: the gap says why a to-device id may have no row.
        self.assertIn("device_inbox: rows deleted once the device has received", gap["message"])
        self.assertIn("1 logged as failed, 0 logged as committed", gap["message"])

    def test_committed_row_that_disappeared(self) -> None:
        """Item 1: an event deleted although its writer logged the commit."""
        sqlite_pass_only(PLANTED)
        self.log_clean_run()
        self.hs.delete_event(1)
        run = self.hs.audit()
        finding = self.only(run, "committed_row_missing")
        self.assertEqual(
            (finding["stream"], finding["writer"], finding["ids"]), ("events", "main", [1])
        )
        self.assertEqual(
            finding["message"],
            "1 id(s) of stream events that main logged as committed have no row, though rows"
            " of current_state_delta_stream, events are never removed: 1",
        )
        (gap,) = run.info("gap")
        self.assertIn("(failed transactions)", gap["message"])

    def test_committed_to_device_id_without_row_is_information(self) -> None:
        """Item 1's other half: delivered to-device messages are deleted."""
        sqlite_pass_only(PLANTED)
        self.log_clean_run()
        self.log(
            "main",
            {
                "kind": "finished",
                "ts": 1000,
                "stream": "to_device",
                "writer": "main",
                "id": 2,
                "committed": True,
            },
        )
        self.hs.execute("DELETE FROM device_inbox WHERE stream_id = 2")
        run = self.hs.audit()
        self.assertEqual(run.code, 0, run.out)
        (gap,) = run.info("gap")
        self.assertIn("1 logged as committed", gap["message"])

    def test_backfill_position_with_wrong_sign(self) -> None:
        """Item 2: +2 stored for backfill, which the servers read as -2."""
        sqlite_pass_only(PLANTED)
        self.hs.execute("UPDATE stream_positions SET stream_id = 2 WHERE stream_name = 'backfill'")
        finding = self.only(self.hs.audit(), "position_wrong_sign")
        self.assertEqual(
            (finding["stream"], finding["writer"], finding["ids"]), ("backfill", "main", [2])
        )
        self.assertEqual(
            finding["message"],
            "stream_positions holds 2 for main on stream backfill, whose stored positions are"
            " negative (counting down): the servers read it as position -2",
        )

    def test_rows_whose_id_has_no_stream(self) -> None:
        """Item 3: a receipt with id -3 and an event with stream_ordering 0."""
        sqlite_pass_only(PLANTED)
        self.hs.write("receipts_linearized", "main", [-3], advance_sequence=False)
        self.hs.write("events", "worker1", [0], advance_sequence=False)
        run = self.hs.audit()
        self.assertEqual(run.code, 1, run.out)
        found = {(f["kind"], f["stream"], f["writer"]): f for f in run.findings()}
        self.assertEqual(
            set(found),
            {("id_wrong_sign", "receipts", "main"), ("id_wrong_sign", "events", "worker1")},
        )
        receipt = found[("id_wrong_sign", "receipts", "main")]
        self.assertEqual(receipt["ids"], [-3])
        self.assertEqual(
            receipt["message"],
            "main wrote 1 row(s) in receipts_linearized with ids that belong to no stream:"
            " stream receipts's ids count up from 1, so no reader's `> token` query returns"
            " them: -3",
        )
        self.assertEqual(found[("id_wrong_sign", "events", "worker1")]["ids"], [0])

    def test_handed_out_position_beyond_the_sequence(self) -> None:
        """Item 4: a client given an events token 1,000 above the sequence."""
        self.log_clean_run()
        self.log(
            "worker1",
            {
                "kind": "position",
                "ts": 3000,
                "stream": "events",
                "writer": STREAM_WIDE,
                "position": 1006,
                "purpose": "sync",
            },
        )
        finding = self.only(self.hs.audit(), "logged_position_ahead_of_sequence")
        self.assertEqual(
            (finding["stream"], finding["writer"], finding["ids"]), ("events", "*", [1006])
        )
        self.assertEqual(finding["details"]["process"], "worker1")
        self.assertEqual(
            finding["message"],
            "worker1 handed out stream-wide positions of stream events up to 1006, beyond"
            " anything sequence events_stream_seq produced (6; first at"
            " 1970-01-01T00:00:03.000Z): a reader holding it skips the next 1000 id(s): 1006",
        )

    def test_id_logged_as_failed_has_a_row(self) -> None:
        """Item 5: a lost commit acknowledgement."""
        sqlite_pass_only(PLANTED)
        self.log_clean_run()
        self.log(
            "worker1",
            {
                "kind": "finished",
                "ts": 1000,
                "stream": "events",
                "writer": "worker1",
                "id": 4,
                "committed": False,
            },
        )
        finding = self.only(self.hs.audit(), "failed_id_has_row")
        self.assertEqual(
            (finding["stream"], finding["writer"], finding["ids"]), ("events", "worker1", [4])
        )
        self.assertIn("that worker1 logged as failed have rows in events", finding["message"])

    def test_stream_positions_nobody_should_have(self) -> None:
        """Item 6: an unknown stream, and a process that is not a writer."""
        sqlite_pass_only(PLANTED)
        self.hs.position("evnets", "main", 3)
        self.hs.position("account_data", "worker1", 3)
        run = self.hs.audit()
        self.assertEqual(run.code, 1, run.out)
        found = {(f["stream"], f["writer"]): f for f in run.findings()}
        self.assertEqual(set(found), {("evnets", "main"), ("account_data", "worker1")})
        self.assertEqual({f["kind"] for f in run.findings()}, {"unexpected_stream_position"})
        self.assertEqual(
            found[("evnets", "main")]["message"],
            "stream_positions has a row for main on stream 'evnets' (value 3), but no stream"
            " of that name exists (the servers never read it)",
        )
        self.assertEqual(
            found[("account_data", "worker1")]["message"],
            "stream_positions has a row for worker1 on stream 'account_data' (value 3), but"
            " worker1 is not one of its writers (main)",
        )

    def test_log_line_with_extreme_id_is_malformed(self) -> None:
        """Item 7: valid JSON, but an id Spark cannot negate."""
        sqlite_pass_only(PLANTED)
        self.log_clean_run()
        self.log(
            "main",
            {
                "kind": "finished",
                "ts": 1000,
                "stream": "events",
                "writer": "main",
                "id": -9223372036854775808,
                "committed": True,
            },
        )
        run = self.hs.audit()
        self.assertEqual(run.code, 0, run.out + run.err)
        (malformed,) = run.info("malformed_log_lines")
        self.assertEqual(malformed["count"], 1)
        self.assertTrue(os.path.exists(position_log_path(self.hs.data_dir, "main")))
