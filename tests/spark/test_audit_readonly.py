"""Reading a SQLite database the auditor may only read (issue 22, item 8): a
stopped server's database is opened ``immutable=1`` and nothing is created
beside it; a live one is read through its write-ahead log. No Spark needed."""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile

from twisted.trial import unittest

from spark.readonly import DatabaseUnavailable, open_read_only, read_stream_positions
from synapse_lite.storage.database import make_startup_connection
from synapse_lite.storage.engines import create_engine
from synapse_lite.storage.prepare_database import prepare_database


class SqliteReadOnlyTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="synapse_lite_audit_ro_")
        self.addCleanup(shutil.rmtree, self.directory, True)
        self.path = os.path.join(self.directory, "homeserver.db")
        self.engine = create_engine("sqlite", {"path": self.path})
        conn = make_startup_connection(self.engine)
        try:
            prepare_database(conn, is_main=True)
            with conn.transaction("seed") as txn:
                txn.execute(
                    "INSERT INTO stream_positions (stream_name, instance_name, stream_id)"
                    " VALUES ('events', 'main', 7)"
                )
        finally:
            conn.close()  # the last connection checkpoints and removes the -wal

    def read_positions(self, live: bool = False) -> list[tuple[str, str, int]]:
        conn = open_read_only(self.engine, live)
        try:
            with conn.transaction("read", read_only=True) as txn:
                return read_stream_positions(txn)
        finally:
            conn.close()

    def test_stopped_server_leaves_no_files_behind(self) -> None:
        before = sorted(os.listdir(self.directory))
        self.assertEqual(before, ["homeserver.db"])
        self.assertEqual(self.read_positions(), [("events", "main", 7)])
        self.assertEqual(sorted(os.listdir(self.directory)), before)

    def test_live_server_is_read_through_its_log(self) -> None:
        """A writer holding commits in its WAL: they are read, not missed."""
        writer = sqlite3.connect(self.path, isolation_level=None)
        self.addCleanup(writer.close)
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("UPDATE stream_positions SET stream_id = 9")
        self.assertGreater(os.path.getsize(self.path + "-wal"), 0)
        self.assertEqual(self.read_positions(), [("events", "main", 9)])
        self.assertEqual(self.read_positions(live=True), [("events", "main", 9)])

    def test_missing_file(self) -> None:
        os.unlink(self.path)
        with self.assertRaises(DatabaseUnavailable) as caught:
            self.read_positions()
        self.assertIn("no such file", str(caught.exception))
        self.assertFalse(os.path.exists(self.path))
