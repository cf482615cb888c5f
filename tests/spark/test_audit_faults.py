"""Each fault the audit knows, seeded alone into a real database, is caught with
the right stream, writer and ids; a clean database reports nothing."""

from __future__ import annotations

from twisted.trial import unittest

from tests.spark.fixture import AuditFixture


class AuditFaultsTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.hs = AuditFixture(self)

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

    def test_account_data_id_used_twice(self) -> None:
        """The seed notes' bug: one id in the global and the room table."""
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
