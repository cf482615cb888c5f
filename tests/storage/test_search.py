"""The search index's schema delta indexes the events already stored (not
redacted ones, outliers, or bodies that are not strings), on both engines."""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from twisted.trial import unittest

from synapse_lite.storage.database import make_startup_connection
from synapse_lite.storage.prepare_database import SCHEMA_DIR, prepare_database
from tests.harness.databases import create_test_database

SEARCH_DELTA = 52


class SearchDeltaTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.test_db = create_test_database()
        self.addCleanup(self.test_db.drop)
        self.engine = self.test_db.make_engine()

    def run_sql(self, statements: list[tuple[str, tuple[object, ...]]]) -> list[tuple[object, ...]]:
        conn = make_startup_connection(self.engine)
        try:
            with conn.transaction() as txn:
                rows: list[tuple[object, ...]] = []
                for sql, args in statements:
                    txn.execute(sql, args)
                    if txn.raw_cursor.description is not None:
                        rows = [tuple(r) for r in txn.fetchall()]
                return rows
        finally:
            conn.close()

    def prepare(self, schema_dir: str) -> int:
        conn = make_startup_connection(self.engine)
        try:
            return prepare_database(conn, is_main=True, schema_dir=schema_dir)
        finally:
            conn.close()

    def test_events_stored_before_the_delta_are_indexed(self) -> None:
        before = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, before)
        shutil.copytree(SCHEMA_DIR, before, dirs_exist_ok=True)
        deltas = os.path.join(before, "deltas")
        for name in os.listdir(deltas):
            if int(name[:4]) >= SEARCH_DELTA:
                os.unlink(os.path.join(deltas, name))
        self.assertEqual(self.prepare(before), SEARCH_DELTA - 1)

        def event(
            ordering: int, event_type: str, content: object, **extra: object
        ) -> tuple[str, tuple[object, ...]]:
            return (
                "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id,"
                " type, state_key, sender, origin_server_ts, content, redacts, outlier,"
                " instance_name) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, 'main')",
                (
                    ordering,
                    ordering,
                    f"$e{ordering}",
                    "!r:test.local",
                    event_type,
                    extra.get("state_key"),
                    "@a:test.local",
                    json.dumps(content),
                    extra.get("redacts"),
                    extra.get("outlier", False),
                ),
            )

        self.run_sql(
            [
                event(1, "m.room.message", {"body": "kept message"}),
                event(2, "m.room.message", {"body": "redacted message"}),
                event(3, "m.room.redaction", {}, redacts="$e2"),
                event(4, "m.room.message", {"body": 5}),
                event(5, "m.room.name", {"name": "kept name"}, state_key=""),
                event(6, "m.room.topic", {"topic": "kept topic"}, state_key=""),
                event(7, "m.room.message", {"body": "outlier"}, outlier=True),
                event(8, "m.room.member", {"membership": "join"}, state_key="@a:test.local"),
            ]
        )
        self.assertGreaterEqual(self.prepare(SCHEMA_DIR), SEARCH_DELTA)
        rows = self.run_sql([("SELECT event_id, key FROM event_search", ())])
        self.assertEqual(
            sorted(rows),
            [("$e1", "content.body"), ("$e5", "content.name"), ("$e6", "content.topic")],
        )
