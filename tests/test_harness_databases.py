"""The test harness's PostgreSQL copies of the schema template
(tests/harness/databases.py): a copy handed to a second test is
indistinguishable from a fresh one, and a copy a test changed is dropped."""

from __future__ import annotations

from typing import Any

from twisted.trial import unittest

from tests.harness import databases
from tests.harness.databases import TestDatabase, create_test_database
from tests.harness.services import require_postgres, require_python_module


def _query(database: TestDatabase, sql: str) -> list[tuple[Any, ...]]:
    import psycopg2

    conn = psycopg2.connect(**database.args)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()


class RecycledDatabasesTestCase(unittest.TestCase):
    def setUp(self) -> None:
        require_python_module("psycopg2", "postgres")
        require_postgres()
        # A recycler of this test's own, so that the copies other tests of
        # the process left waiting do not interfere.
        self.recycled = databases._RecycledDatabases()
        self.patch(databases, "_recycled", self.recycled)
        self.addCleanup(self.recycled.drop_all)

    def fresh(self) -> TestDatabase:
        database = create_test_database("postgres", with_schema=True)
        self.addCleanup(database.drop)
        return database

    def test_a_reused_copy_is_as_fresh(self) -> None:
        first = self.fresh()
        sequence = "events_stream_seq"
        fresh_rows = _query(first, "SELECT * FROM schema_version")
        (fresh_sequence,) = _query(first, f"SELECT last_value, is_called FROM {sequence}")
        _query(first, "INSERT INTO users (name, creation_ts) VALUES ('@a:t', 1)")
        _query(first, "DELETE FROM schema_version")
        _query(first, f"SELECT nextval('{sequence}')")
        # A connection the test left open (a server's pool) is ended.
        import psycopg2

        left_open = psycopg2.connect(**first.args)
        self.addCleanup(left_open.close)
        first.drop()
        self.assertEqual(self.recycled.free, [first.args["dbname"]])
        self.assertTrue(left_open.closed or _closed_by_server(left_open))

        second = self.fresh()
        self.assertEqual(second.args["dbname"], first.args["dbname"])
        self.assertEqual(_query(second, "SELECT count(*) FROM users"), [(0,)])
        self.assertEqual(_query(second, "SELECT * FROM schema_version"), fresh_rows)
        self.assertEqual(
            _query(second, f"SELECT last_value, is_called FROM {sequence}"), [fresh_sequence]
        )

    def test_a_changed_schema_is_dropped(self) -> None:
        for change in [
            "CREATE TABLE left_behind (x INTEGER)",
            "ALTER TABLE users ADD COLUMN extra TEXT",
            "CREATE SEQUENCE counted",
            "CREATE INDEX users_extra ON users (creation_ts)",
        ]:
            database = self.fresh()
            _query(database, change)
            database.drop()
            self.assertEqual(self.recycled.free, [], change)
            self.assertEqual(
                _query(
                    TestDatabase("postgres", dict(database.args, dbname="postgres")),
                    f"SELECT count(*) FROM pg_database WHERE datname = '{database.args['dbname']}'",
                ),
                [(0,)],
                change,
            )


def _closed_by_server(conn: Any) -> bool:
    import psycopg2

    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
    except psycopg2.Error:
        return True
    return False
