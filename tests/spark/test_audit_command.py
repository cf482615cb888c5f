"""The audit as a command: exit codes, errors, entry points, read-only access,
and the JDBC route."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile

import yaml
from twisted.trial import unittest

from spark.catalog import build_catalog
from synapse_lite.app import audit_command
from synapse_lite.app.audit_arguments import add_arguments
from synapse_lite.config.homeserver import load_config
from synapse_lite.storage.database import make_startup_connection
from tests.spark.fixture import AuditFixture
from tests.spark.session import DEBIAN_JDBC_JAR, jdbc_jar


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def run_command(*argv: str) -> tuple[int, str]:
    """``synapse-lite audit``; the exit code and what it wrote to stderr."""
    err = io.StringIO()
    old, sys.stderr = sys.stderr, err
    try:
        code = audit_command.run(parse(*argv))
    finally:
        sys.stderr = old
    return code, err.getvalue()


class AuditErrorsTestCase(unittest.TestCase):
    """Failures before Spark starts: no SparkSession needed."""

    def setUp(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="synapse_lite_audit_cmd_")

    def config(self, data: dict[str, object]) -> str:
        path = os.path.join(self.directory, "homeserver.yaml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump({"server_name": "test", "data_dir": self.directory, **data}, f)
        return path

    def test_bad_config(self) -> None:
        path = self.config({"database": {"engine": "oracle"}})
        report = os.path.join(self.directory, "report.json")
        code, err = run_command("-c", path, "--json", report)
        self.assertEqual(code, 2)
        self.assertIn("bad config", err)
        self.assertIn("database.engine", err)
        with open(report, encoding="utf-8") as f:
            self.assertEqual(json.load(f)["exit_code"], 2)

    def test_unreachable_postgres(self) -> None:
        path = self.config(
            {"database": {"engine": "postgres", "args": {"host": "127.0.0.1", "port": 1}}}
        )
        code, err = run_command("-c", path)
        self.assertEqual(code, 2)
        self.assertIn("cannot open postgres://postgres@127.0.0.1:1/synapse_lite read-only", err)

    def test_missing_sqlite_file_is_not_created(self) -> None:
        path = self.config({"database": {"engine": "sqlite", "args": {"path": "nothing.db"}}})
        code, err = run_command("-c", path)
        self.assertEqual(code, 2)
        self.assertIn("nothing.db", err)
        self.assertFalse(os.path.exists(os.path.join(self.directory, "nothing.db")))

    def test_missing_spark_directory(self) -> None:
        self.patch(audit_command, "REPO_ROOT", self.directory)
        code, err = run_command("-c", self.config({}))
        self.assertEqual(code, 2)
        self.assertIn("ships with the source tree", err)

    def test_script_entry_point(self) -> None:
        """``python spark/audit.py`` imports from the tree wherever it runs."""
        script = os.path.join(audit_command.REPO_ROOT, "spark", "audit.py")
        help_run = subprocess.run(
            [sys.executable, script, "--help"], capture_output=True, text=True, cwd="/"
        )
        self.assertEqual(help_run.returncode, 0, help_run.stderr)
        self.assertIn("--jdbc-jar", help_run.stdout)
        missing = os.path.join(self.directory, "missing.yaml")
        bad_run = subprocess.run(
            [sys.executable, script, "-c", missing], capture_output=True, text=True, cwd="/"
        )
        self.assertEqual(bad_run.returncode, 2)
        self.assertIn("missing.yaml", bad_run.stderr)


def database_digest(hs: AuditFixture) -> str:
    """A hash of every row of every table and of the sequences."""
    conn = make_startup_connection(hs.engine)
    digest = hashlib.sha256()
    try:
        with conn.transaction("digest") as txn:
            if hs.engine.name == "sqlite":
                txn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            else:
                txn.execute(
                    "SELECT table_name FROM information_schema.tables"
                    " WHERE table_schema = 'public' ORDER BY table_name"
                )
            tables = [row[0] for row in txn.fetchall()]
            for table in tables:
                txn.execute(f"SELECT * FROM {table}")
                digest.update(repr((table, sorted(map(repr, txn.fetchall())))).encode())
            for name in ("events_stream_seq", "receipts_sequence"):
                digest.update(str(hs.engine.sequence_last_value(txn.raw_cursor, name)).encode())
    finally:
        conn.close()
    return digest.hexdigest()


class AuditDatabaseTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.hs = AuditFixture(self)
        self.hs.write("events", "main", [1, 2, 3])
        self.hs.write("events", "ghost", [4])
        self.hs.position("events", "main", 3)
        self.hs.position("receipts", "main", 7)

    def assert_faults_found(self, run: object) -> None:
        found = [(f["kind"], f["writer"], f["ids"]) for f in run.findings()]  # type: ignore[attr-defined]
        self.assertEqual(
            found,
            [
                ("position_ahead_of_sequence", "main", [7]),
                ("unknown_writer", "ghost", [4]),
            ],
        )

    def test_audit_never_writes(self) -> None:
        snapshot = os.path.join(self.hs.directory, "snapshot")
        before = database_digest(self.hs)
        run = self.hs.audit("--snapshot-dir", snapshot)
        self.assertEqual(database_digest(self.hs), before)
        self.assertEqual(run.code, 1, run)
        self.assert_faults_found(run)
        self.assertEqual(run.report["route"], "parquet")
        tables = len(build_catalog(load_config(self.hs.config_path)).tables())
        self.assertIn(f"audit: exported {tables} tables: 4 rows", run.err)
        # A snapshot directory given on the command line is kept (manifest and Parquet).
        self.assertTrue(os.path.exists(os.path.join(snapshot, "manifest.json")))
        self.assertTrue(
            os.path.exists(os.path.join(snapshot, "tables", "events", "part-00000.parquet"))
        )

    def test_jdbc_route(self) -> None:
        if self.hs.engine.name != "postgres":
            raise unittest.SkipTest("the JDBC route reads PostgreSQL")
        jar = jdbc_jar()
        if jar is None:
            raise unittest.SkipTest(
                f"no PostgreSQL JDBC driver at {DEBIAN_JDBC_JAR}:"
                " apt-get install libpostgresql-jdbc-java"
            )
        before = database_digest(self.hs)
        run = self.hs.audit("--jdbc-jar", jar)
        self.assertEqual(database_digest(self.hs), before)
        self.assertEqual(run.code, 1, run)
        self.assertEqual(run.report["route"], "jdbc")
        self.assert_faults_found(run)
        events = run.stream("events")
        self.assertEqual(sum(w["rows"] for w in events["writers"]), 4)
