"""Creating and upgrading the schema; workers refusing a different version."""

from __future__ import annotations

import os
import shutil
import tempfile

from twisted.trial import unittest

from synapse_lite.storage.database import make_startup_connection
from synapse_lite.storage.prepare_database import (
    SCHEMA_DIR,
    SchemaFileError,
    SchemaVersionError,
    code_schema_version,
    get_schema_version,
    list_deltas,
    prepare_database,
    split_statements,
)
from tests.harness.databases import create_test_database


class PrepareDatabaseTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.test_db = create_test_database()
        self.addCleanup(self.test_db.drop)
        self.engine = self.test_db.make_engine()

    def version(self) -> int | None:
        conn = make_startup_connection(self.engine)
        try:
            with conn.transaction() as txn:
                return get_schema_version(txn, self.engine)
        finally:
            conn.close()

    def prepare(self, is_main: bool, schema_dir: str = SCHEMA_DIR) -> int:
        conn = make_startup_connection(self.engine)
        try:
            return prepare_database(conn, is_main=is_main, schema_dir=schema_dir)
        finally:
            conn.close()

    def test_fresh_database_gets_every_delta(self) -> None:
        self.assertEqual(self.prepare(is_main=True), code_schema_version())
        self.assertEqual(self.version(), code_schema_version())
        # A second start changes nothing.
        self.assertEqual(self.prepare(is_main=True), code_schema_version())

    def test_worker_refuses_an_empty_database(self) -> None:
        with self.assertRaises(SchemaVersionError) as cm:
            self.prepare(is_main=False)
        self.assertIn("Start the main process first", str(cm.exception))

    def test_worker_accepts_the_current_schema(self) -> None:
        self.prepare(is_main=True)
        self.assertEqual(self.prepare(is_main=False), code_schema_version())

    def test_upgrade_applies_only_new_deltas_in_one_transaction(self) -> None:
        self.prepare(is_main=True)
        schema_dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, schema_dir)
        shutil.copytree(SCHEMA_DIR, schema_dir, dirs_exist_ok=True)
        version = code_schema_version()
        deltas = os.path.join(schema_dir, "deltas")
        with open(os.path.join(deltas, f"{version + 1:04d}_add_a.sql"), "w") as f:
            f.write("CREATE TABLE added_a (x INTEGER);\n")
        with open(os.path.join(deltas, f"{version + 2:04d}_broken.sql"), "w") as f:
            f.write("CREATE TABLE added_b (x INTEGER);\nTHIS IS NOT SQL;\n")
        with self.assertRaises(SchemaFileError) as cm:
            self.prepare(is_main=True, schema_dir=schema_dir)
        self.assertIn("_broken.sql: 'THIS IS NOT SQL' failed", str(cm.exception))
        # Nothing of the failed upgrade stayed: still the old version, no added_a.
        self.assertEqual(self.version(), version)
        os.unlink(os.path.join(deltas, f"{version + 2:04d}_broken.sql"))
        self.assertEqual(self.prepare(is_main=True, schema_dir=schema_dir), version + 1)
        # A worker of the older code now refuses, and says what to do.
        with self.assertRaises(SchemaVersionError) as cm:
            self.prepare(is_main=False)
        self.assertIn("newer than this synapse_lite", str(cm.exception))

    def test_split_statements(self) -> None:
        sql = "CREATE TABLE a (x INT); -- comment; here\nCREATE INDEX b\n ON a (x);\n\n"
        self.assertEqual(
            list(split_statements(sql)), ["CREATE TABLE a (x INT)", "CREATE INDEX b ON a (x)"]
        )

    def schema_copy(self) -> tuple[str, str]:
        schema_dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, schema_dir)
        shutil.copytree(SCHEMA_DIR, schema_dir, dirs_exist_ok=True)
        return schema_dir, os.path.join(schema_dir, "deltas")

    def test_engine_specific_pair(self) -> None:
        """A version may be a pair of files, one per engine; each engine runs
        its own."""
        schema_dir, deltas = self.schema_copy()
        version = code_schema_version() + 1
        for engine in ("sqlite", "postgres"):
            with open(os.path.join(deltas, f"{version:04d}_pair.{engine}.sql"), "w") as f:
                f.write(f"CREATE TABLE pair_{engine} (x INTEGER);\n")
        self.assertEqual(self.prepare(is_main=True, schema_dir=schema_dir), version)
        conn = make_startup_connection(self.engine)
        try:
            with conn.transaction() as txn:
                txn.execute(f"SELECT COUNT(*) FROM pair_{self.engine.name}")
                self.assertEqual(txn.fetchone()[0], 0)
        finally:
            conn.close()
        self.assertTrue(list_deltas(schema_dir, "sqlite")[-1].path.endswith(".sqlite.sql"))
        self.assertTrue(list_deltas(schema_dir, "postgres")[-1].path.endswith(".postgres.sql"))

    def test_half_a_pair_or_a_pair_and_a_plain_file_is_refused(self) -> None:
        version = code_schema_version() + 1
        for names in (
            [f"{version:04d}_half.sqlite.sql"],
            [f"{version:04d}_both.sql", f"{version:04d}_both.postgres.sql"],
        ):
            schema_dir, deltas = self.schema_copy()
            for name in names:
                with open(os.path.join(deltas, name), "w") as f:
                    f.write("CREATE TABLE x (x INTEGER);\n")
            with self.assertRaises(SchemaVersionError) as cm:
                list_deltas(schema_dir)
            self.assertIn(str(version), str(cm.exception))

    def test_upgrade_to_the_event_graph_turns_linear_rooms_into_graphs(self) -> None:
        """Delta 0080 on a database of the previous release: each event's
        parent is the room's event before it, the newest its extremity."""
        old_schema = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, old_schema)
        shutil.copytree(SCHEMA_DIR, old_schema, dirs_exist_ok=True)
        # The previous release had no 0080, nor any delta after it.
        for name in os.listdir(os.path.join(old_schema, "deltas")):
            if int(name[:4]) >= 80:
                os.unlink(os.path.join(old_schema, "deltas", name))
        # The version is the highest delta left: whatever came before 0080.
        before = max(int(name[:4]) for name in os.listdir(os.path.join(old_schema, "deltas")))
        self.assertLess(before, 80)
        self.assertEqual(self.prepare(is_main=True, schema_dir=old_schema), before)
        # Two rooms written interleaved, as the previous release did.
        rows = [(1, "!a", "$a1"), (2, "!b", "$b1"), (3, "!a", "$a2"), (4, "!a", "$a3")]
        conn = make_startup_connection(self.engine)
        try:
            with conn.transaction() as txn:
                for depth, (stream, room, event_id) in enumerate(rows, start=1):
                    txn.execute(
                        "INSERT INTO events (stream_ordering, topological_ordering, event_id,"
                        " room_id, type, sender, origin_server_ts, content, instance_name)"
                        " VALUES (?, ?, ?, ?, 'm.room.message', '@u:x', 0, '{}', 'master')",
                        (stream, depth, event_id, room),
                    )
        finally:
            conn.close()
        self.assertEqual(self.prepare(is_main=True), code_schema_version())
        conn = make_startup_connection(self.engine)
        try:
            with conn.transaction() as txn:
                txn.execute("SELECT event_id, prev_event_id FROM event_edges")
                edges = sorted(txn.fetchall())
                txn.execute("SELECT room_id, event_id FROM event_forward_extremities")
                extremities = sorted(txn.fetchall())
                txn.execute("SELECT COUNT(*) FROM event_auth_edges")
                auth_edges = txn.fetchone()
        finally:
            conn.close()
        self.assertEqual([tuple(e) for e in edges], [("$a2", "$a1"), ("$a3", "$a2")])
        self.assertEqual([tuple(e) for e in extremities], [("!a", "$a3"), ("!b", "$b1")])
        self.assertEqual(auth_edges[0], 0)
