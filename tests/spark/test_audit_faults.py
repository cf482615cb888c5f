"""Each fault the audit knows, seeded alone into a real database, is caught with
the right stream, writer and ids; a clean database reports nothing."""

from __future__ import annotations

from twisted.trial import unittest

from tests.harness.databases import sqlite_pass_only
from tests.spark.fixture import PLANTED, AuditFixture


class AuditFaultsTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.hs = AuditFixture(self, event_graph=False)

    def seed_clean(self) -> None:
        """Several streams and writers, positions recorded after the rows."""
        hs = self.hs
        hs.write("events", "main", [1, 2, 5])
        hs.write("events", "worker1", [3, 4, 6])
        hs.write("current_state_delta_stream", "main", [2, 2, 5])  # one event, two keys
        hs.write("events", "main", [-1, -2])  # backfill
        hs.write("account_data", "main", [1, 3])
        hs.write("room_account_data", "main", [2])
        hs.write("room_tags_revisions", "main", [4])
        hs.write("device_inbox", "main", [1, 1, 2])
        hs.write("device_federation_outbox", "main", [1])
        hs.write("cache_invalidation_stream_by_instance", "worker1", [1, 2])
        for stream, instance, value in [
            ("events", "main", 6),
            ("events", "worker1", 6),
            ("backfill", "main", -2),
            ("account_data", "main", 4),
            ("to_device", "main", 2),
        ]:
            hs.position(stream, instance, value)

    def test_clean_database_reports_nothing(self) -> None:
        self.seed_clean()
        run = self.hs.audit()
        self.assertEqual(run.code, 0, run)
        self.assertEqual(run.findings(), [])
        self.assertEqual(run.info(), [])
        events = run.stream("events")
        self.assertEqual((events["sequence_last_value"], events["persisted_upto"]), (6, 6))
        rows = {
            w["writer"]: (w["rows"], w["largest_id"], w["stored_position"])
            for w in events["writers"]
        }
        # 3 events + 3 state deltas by main; 3 events by worker1.
        self.assertEqual(rows, {"main": (6, 5, 6), "worker1": (3, 6, 6)})
        self.assertEqual(run.stream("backfill")["writers"][0]["largest_id"], 2)
        self.assertIn("Result: clean (exit 0)", run.out)

    def test_device_lists_ids_in_two_tables(self) -> None:
        """A cross-signing upload's id is on its keys' rows, not on
        device_lists_stream: the audit reads the stream from both tables."""
        sqlite_pass_only(PLANTED)
        self.seed_clean()
        self.hs.write("device_lists_stream", "main", [1, 1, 3])
        self.hs.write("e2e_cross_signing_keys", "main", [2, 2])
        self.hs.position("device_lists", "main", 3)
        run = self.hs.audit()
        self.assertEqual(run.code, 0, run)
        self.assertEqual(run.findings(), [])
        (writer,) = run.stream("device_lists")["writers"]
        self.assertEqual((writer["rows"], writer["largest_id"]), (5, 3))
        # The same id written by another writer: caught across the two tables.
        self.hs.write("e2e_cross_signing_keys", "worker1", [3])
        self.hs.position("device_lists", "worker1", 3)
        run = self.hs.audit()
        (finding,) = run.findings("duplicate_stream_id")
        self.assertEqual((finding["stream"], finding["ids"]), ("device_lists", [3]))

    def test_account_data_id_used_twice(self) -> None:
        """The seed notes' bug: one id in the global and the room table."""
        sqlite_pass_only(PLANTED)
        self.seed_clean()
        self.hs.write("room_account_data", "main", [3])
        run = self.hs.audit()
        self.assertEqual(run.code, 1, run)
        (finding,) = run.findings()
        self.assertEqual(
            (finding["kind"], finding["stream"], finding["writer"], finding["ids"]),
            ("duplicate_stream_id", "account_data", "main", [3]),
        )
        self.assertEqual(finding["details"]["tables"], ["account_data", "room_account_data"])
        self.assertIn("duplicate_stream_id", run.out)

    def test_id_used_by_two_writers(self) -> None:
        """State deltas share their event's id, but never across writers."""
        sqlite_pass_only(PLANTED)
        self.seed_clean()
        self.hs.write("events", "main", [7])
        self.hs.write("current_state_delta_stream", "worker1", [7])
        self.hs.position("events", "main", 7)
        self.hs.position("events", "worker1", 7)
        run = self.hs.audit()
        self.assertEqual(run.code, 1, run)
        (finding,) = run.findings()
        self.assertEqual(
            (finding["kind"], finding["stream"], finding["writer"], finding["ids"]),
            ("duplicate_stream_id", "events", "main,worker1", [7]),
        )

    def test_id_above_sequence(self) -> None:
        """A cache invalidation written around the sequence (no positions kept)."""
        self.seed_clean()
        self.hs.write("cache_invalidation_stream_by_instance", "worker1", [50], False)
        run = self.hs.audit()
        self.assertEqual(run.code, 1, run)
        (finding,) = run.findings()
        self.assertEqual(
            (finding["kind"], finding["stream"], finding["writer"], finding["ids"]),
            ("id_above_sequence", "caches", "worker1", [50]),
        )
        self.assertEqual(finding["details"]["last_value"], 2)

    def test_position_ahead_of_sequence(self) -> None:
        self.seed_clean()
        self.hs.position("receipts", "main", 9)
        run = self.hs.audit()
        self.assertEqual(run.code, 1, run)
        (finding,) = run.findings()
        self.assertEqual(
            (finding["kind"], finding["stream"], finding["writer"], finding["ids"]),
            ("position_ahead_of_sequence", "receipts", "main", [9]),
        )
        self.assertEqual(finding["details"]["last_value"], 0)

    def test_position_behind_rows(self) -> None:
        """Stored positions below the writer's rows (backfill counts down)."""
        sqlite_pass_only(PLANTED)
        self.seed_clean()
        self.hs.position("events", "worker1", 3)  # worker1 wrote 3, 4 and 6
        self.hs.execute("UPDATE stream_positions SET stream_id = -1 WHERE stream_name = 'backfill'")
        run = self.hs.audit()
        self.assertEqual(run.code, 1, run)
        found = [(f["kind"], f["stream"], f["writer"], f["ids"]) for f in run.findings()]
        self.assertEqual(
            found,
            [
                ("position_behind_rows", "backfill", "main", [2]),
                ("position_behind_rows", "events", "worker1", [4, 6]),
            ],
        )
        self.assertEqual(run.findings()[1]["details"], {"stored": 3, "largest_id": 6})

        # On running servers positions lag their rows by design.
        live = self.hs.audit("--live")
        self.assertEqual(live.code, 0, live)
        self.assertEqual(len(live.info("position_behind_rows")), 2)

    def test_unknown_writer(self) -> None:
        sqlite_pass_only(PLANTED)
        self.seed_clean()
        self.hs.write("events", "ghost", [7, 8])
        run = self.hs.audit()
        self.assertEqual(run.code, 1, run)
        (finding,) = run.findings()
        self.assertEqual(
            (finding["kind"], finding["stream"], finding["writer"], finding["ids"]),
            ("unknown_writer", "events", "ghost", [7, 8]),
        )
        self.assertEqual(finding["details"]["configured"], ["main", "worker1"])

    def test_gaps_are_information(self) -> None:
        """Ids taken by transactions that rolled back: no rows, no fault."""
        sqlite_pass_only(PLANTED)
        self.seed_clean()
        self.hs.advance_sequence("events_stream_seq", 9)
        self.hs.advance_sequence("account_data_sequence", 6)
        self.hs.delete_event(3)
        run = self.hs.audit()
        self.assertEqual(run.code, 0, run)
        self.assertEqual(run.findings(), [])
        gaps = {g["stream"]: (g["count"], g["samples"]) for g in run.info("gap")}
        self.assertEqual(
            gaps,
            {
                "events": (4, [{"id": 3, "last": 3}, {"id": 7, "last": 9}]),
                "account_data": (2, [{"id": 5, "last": 6}]),
            },
        )
        self.assertIn("Information: 2", run.out)
