"""Schema delta 0061: reports filed before it get ids in the order they
came, and new ones get the next (on both engines)."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile

from twisted.trial import unittest

from synapse_lite.storage.database import make_startup_connection
from synapse_lite.storage.prepare_database import SCHEMA_DIR, prepare_database
from tests.harness.databases import create_test_database

INSERT = (
    "INSERT INTO content_reports (reporter, received_ts, room_id, event_id, reason)"
    " VALUES (?, ?, '!r:hs', '$e', ?)"
)


class ReportIdsTestCase(unittest.TestCase):
    def test_existing_reports_are_numbered(self) -> None:
        test_db = create_test_database()
        self.addCleanup(test_db.drop)
        engine = test_db.make_engine()
        before = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, before)
        shutil.copytree(SCHEMA_DIR, before, dirs_exist_ok=True)
        # The schema as it was before 0061: every later delta goes too (the
        # version is the highest delta applied).
        for path in glob.glob(os.path.join(before, "deltas", "[0-9]*")):
            if int(os.path.basename(path)[:4]) >= 61:
                os.unlink(path)
        conn = make_startup_connection(engine)
        try:
            self.assertEqual(prepare_database(conn, is_main=True, schema_dir=before), 60)
            with conn.transaction() as txn:
                # Filed out of order of insertion: numbered by received_ts.
                txn.execute(INSERT, ("@b:hs", 20, "b"))
                txn.execute(INSERT, ("@a:hs", 10, "a"))
            self.assertGreaterEqual(prepare_database(conn, is_main=True), 61)
            with conn.transaction() as txn:
                txn.execute(INSERT, ("@c:hs", 30, "c"))
                txn.execute("SELECT id, reason FROM content_reports ORDER BY id")
                rows = [tuple(r) for r in txn.fetchall()]
        finally:
            conn.close()
        self.assertEqual(rows, [(1, "a"), (2, "b"), (3, "c")])
