"""Creating and upgrading the schema; workers refusing a different version."""

from __future__ import annotations

import os
import shutil
import tempfile

from twisted.trial import unittest

from synapse_lite.storage.database import make_startup_connection
from synapse_lite.storage.databases.main import auth_chains, state_groups
from synapse_lite.storage.databases.main.state_groups import state_of_group_txn
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


def drop_deltas_from(schema_dir: str, version: int) -> None:
    """Make ``schema_dir`` the schema of the release before ``version``:
    remove that delta and every later one."""
    deltas = os.path.join(schema_dir, "deltas")
    for name in os.listdir(deltas):
        if name[:4].isdigit() and int(name[:4]) >= version:
            os.unlink(os.path.join(deltas, name))


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

    def test_python_delta_runs_in_the_upgrade_and_its_failure_rolls_back(self) -> None:
        """A version may be a Python file: its ``run_upgrade`` runs in the
        upgrade's transaction; when it raises, nothing of the upgrade stays
        and the error names the file."""
        schema_dir, deltas = self.schema_copy()
        version = code_schema_version()
        self.prepare(is_main=True)
        with open(os.path.join(deltas, f"{version + 1:04d}_table.sql"), "w") as f:
            f.write("CREATE TABLE from_sql (x INTEGER);\n")
        with open(os.path.join(deltas, f"{version + 2:04d}_rows.py"), "w") as f:
            f.write(
                "def run_upgrade(txn, engine):\n"
                "    txn.execute('INSERT INTO from_sql (x) VALUES (1)')\n"
                "    raise ValueError('no good')\n"
            )
        with self.assertRaises(SchemaFileError) as cm:
            self.prepare(is_main=True, schema_dir=schema_dir)
        self.assertIn(f"{version + 2:04d}_rows.py: run_upgrade failed: no good", str(cm.exception))
        self.assertEqual(self.version(), version)
        with open(os.path.join(deltas, f"{version + 2:04d}_rows.py"), "w") as f:
            f.write("def upgrade(txn, engine):\n    pass\n")
        with self.assertRaises(SchemaFileError) as cm:
            self.prepare(is_main=True, schema_dir=schema_dir)
        self.assertIn("no run_upgrade(txn, engine) to run", str(cm.exception))
        self.assertEqual(self.version(), version)
        # Run, not imported: nothing is written next to the deltas.
        self.assertEqual(sorted(n for n in os.listdir(deltas) if not n[:4].isdigit()), [])
        with open(os.path.join(deltas, f"{version + 2:04d}_rows.py"), "w") as f:
            f.write(
                "def run_upgrade(txn, engine):\n"
                "    txn.execute('INSERT INTO from_sql (x) VALUES (1)')\n"
            )
        self.assertEqual(self.prepare(is_main=True, schema_dir=schema_dir), version + 2)
        conn = make_startup_connection(self.engine)
        try:
            with conn.transaction() as txn:
                txn.execute("SELECT x FROM from_sql")
                self.assertEqual([tuple(r) for r in txn.fetchall()], [(1,)])
        finally:
            conn.close()

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
        drop_deltas_from(old_schema, 80)
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

    def test_upgrade_derives_the_state_at_each_event_of_linear_rooms(self) -> None:
        """Deltas 0081-0082 on a database of the release before state groups
        (its rooms lines): each event gets its state before and after, the
        newest event's state is the room's, with a progress line per page."""
        old_schema = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, old_schema)
        shutil.copytree(SCHEMA_DIR, old_schema, dirs_exist_ok=True)
        drop_deltas_from(old_schema, 81)
        self.assertEqual(self.prepare(is_main=True, schema_dir=old_schema), 80)
        # (stream, room, event id, type, state key), two rooms interleaved.
        rows = [
            (1, "!a", "$a1", "m.room.create", ""),
            (2, "!b", "$b1", "m.room.create", ""),
            (3, "!a", "$a2", "m.room.member", "@u:x"),
            (4, "!a", "$a3", "m.room.message", None),
            (5, "!b", "$b2", "m.room.message", None),
            (6, "!a", "$a4", "m.room.topic", ""),
            (7, "!a", "$a5", "m.room.member", "@u:x"),
            (8, "!a", "$a6", "m.room.message", None),
        ]
        conn = make_startup_connection(self.engine)
        try:
            with conn.transaction() as txn:
                for depth, (stream, room, event_id, type_, key) in enumerate(rows, start=1):
                    txn.execute(
                        "INSERT INTO events (stream_ordering, topological_ordering, event_id,"
                        " room_id, type, state_key, sender, origin_server_ts, content,"
                        " instance_name) VALUES (?, ?, ?, ?, ?, ?, '@u:x', 0, '{}', 'master')",
                        (stream, depth, event_id, room, type_, key),
                    )
        finally:
            conn.close()
        # Pages of 3 events: a room spans pages, each page logs a line.
        self.patch(state_groups, "PROGRESS_EVERY", 3)
        self.patch(state_groups, "MAX_DELTA_CHAIN", 2)
        with self.assertLogs(state_groups.logger, "INFO") as logs:
            self.assertEqual(self.prepare(is_main=True), code_schema_version())
        progress = [r.getMessage() for r in logs.records if "Derived the state" in r.getMessage()]
        self.assertEqual(
            progress,
            [f"Derived the state at {n} of 8 events" for n in (3, 6, 8)],
        )
        conn = make_startup_connection(self.engine)
        try:
            with conn.transaction() as txn:
                txn.execute("SELECT event_id, state_group_before, state_group FROM events")
                groups = {row[0]: (row[1], row[2]) for row in txn.fetchall()}
                states = {
                    event_id: state_of_group_txn(txn, after)
                    for event_id, (_before, after) in groups.items()
                }
                txn.execute("SELECT MAX(chain_length) FROM state_groups")
                longest = txn.fetchone()[0]
        finally:
            conn.close()
        member, topic = ("m.room.member", "@u:x"), ("m.room.topic", "")
        create_a = {("m.room.create", ""): "$a1"}
        self.assertEqual(groups["$a1"][0], None)  # before a create: empty
        self.assertEqual(states["$a1"], create_a)
        self.assertEqual(states["$a3"], {**create_a, member: "$a2"})
        self.assertEqual(groups["$a3"][0], groups["$a3"][1])  # a message: one group
        self.assertEqual(groups["$a4"][0], groups["$a3"][1])
        self.assertEqual(states["$a6"], {**create_a, member: "$a5", topic: "$a4"})
        self.assertEqual(states["$b2"], {("m.room.create", ""): "$b1"})
        self.assertLessEqual(longest, 2)

    def test_upgrade_indexes_the_auth_chains_of_existing_events(self) -> None:
        """Deltas 0142-0143 on a database of the release before the stored
        auth chain index: every state event gets a position, each after its
        auth events even when its stream ordering is lower (a backfilled
        event), and the index answers as walking the auth edges does, with
        a progress line per page."""
        old_schema = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, old_schema)
        shutil.copytree(SCHEMA_DIR, old_schema, dirs_exist_ok=True)
        drop_deltas_from(old_schema, 142)
        self.assertEqual(self.prepare(is_main=True, schema_dir=old_schema), 141)
        # (stream, room, event id, type, state key, auth events): $a0 is from
        # before the graph (no auth edges); $a5 was backfilled (stream -1)
        # and cites $a4; $a6 cites the power levels before the newest.
        create, levels, member = "m.room.create", "m.room.power_levels", "m.room.member"
        rows = [
            (1, "!a", "$a0", "m.room.topic", "", []),
            (2, "!a", "$a1", create, "", []),
            (3, "!a", "$a2", member, "@u:x", ["$a1"]),
            (4, "!a", "$a3", levels, "", ["$a1", "$a2"]),
            (5, "!b", "$b1", create, "", []),
            (6, "!a", "$a4", levels, "", ["$a1", "$a2", "$a3"]),
            (-1, "!a", "$a5", levels, "", ["$a1", "$a2", "$a4"]),
            (7, "!a", "$a6", member, "@v:x", ["$a1", "$a3"]),
            (8, "!a", "$a7", "m.room.message", None, ["$a1", "$a2", "$a5"]),
        ]
        conn = make_startup_connection(self.engine)
        try:
            with conn.transaction() as txn:
                for depth, (stream, room, event_id, type_, key, auth) in enumerate(rows, 1):
                    txn.execute(
                        "INSERT INTO events (stream_ordering, topological_ordering, event_id,"
                        " room_id, type, state_key, sender, origin_server_ts, content,"
                        " instance_name) VALUES (?, ?, ?, ?, ?, ?, '@u:x', 0, '{}', 'master')",
                        (stream, depth, event_id, room, type_, key),
                    )
                    for auth_id in auth:
                        txn.execute(
                            "INSERT INTO event_auth_edges (event_id, auth_id) VALUES (?, ?)",
                            (event_id, auth_id),
                        )
        finally:
            conn.close()
        self.patch(auth_chains, "PROGRESS_EVERY", 3)
        with self.assertLogs(auth_chains.logger, "INFO") as logs:
            self.assertEqual(self.prepare(is_main=True), code_schema_version())
        progress = [r.getMessage() for r in logs.records if "Indexed the auth" in r.getMessage()]
        self.assertEqual(
            progress, [f"Indexed the auth chains of {n} of 8 state events" for n in (3, 6, 8)]
        )
        edges = {e: a for _s, _r, e, _t, _k, a in rows}

        def walked(event_id: str) -> set[str]:
            chain: set[str] = set()
            todo = list(edges[event_id])
            while todo:
                if (auth_id := todo.pop()) not in chain:
                    chain.add(auth_id)
                    todo.extend(edges[auth_id])
            return chain

        conn = make_startup_connection(self.engine)
        try:
            with conn.transaction() as txn:
                txn.execute("SELECT event_id, chain_id, sequence_number FROM event_auth_chains")
                positions = {str(e): (int(c), int(s)) for e, c, s in txn.fetchall()}
                chains = {e: auth_chains.auth_chain_ids_txn(txn, [e]) for e in edges}
        finally:
            conn.close()
        self.assertEqual(sorted(positions), sorted(e for *_, e, _t, k, _a in rows if k is not None))
        # The power levels run is one chain in auth order, started by $a3.
        self.assertEqual([positions[e] for e in ("$a3", "$a4", "$a5")], [(4, 1), (4, 2), (4, 3)])
        self.assertEqual(positions["$a0"], (1, 1))
        self.assertEqual(chains, {e: walked(e) for e in edges})
