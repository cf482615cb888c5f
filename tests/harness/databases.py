"""A fresh, empty database for each test, on the engine the run is for.

``SYNAPSE_LITE_TEST_DB`` picks the engine: ``sqlite`` (the default) or
``postgres``. CI runs the whole suite on SQLite, then on PostgreSQL the test
modules that asked for the run's engine during the SQLite run
(``SYNAPSE_LITE_ENGINE_USERS``): a module that never asks cannot behave
differently on the other engine.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import sys
import tempfile
import unittest
from types import FrameType
from typing import Any

import attr

from synapse_lite.storage.engines import BaseDatabaseEngine, create_engine
from tests.harness.services import postgres_args, require_postgres, require_python_module

_counter = itertools.count()


#: When set, a file to which every test module that asks for the run's engine
#: appends its dotted name (one per line, repeats allowed): what CI's
#: PostgreSQL pass runs.
ENGINE_USERS_ENV = "SYNAPSE_LITE_ENGINE_USERS"


def test_engine_name() -> str:
    """The engine this test run uses."""
    name = os.environ.get("SYNAPSE_LITE_TEST_DB", "sqlite")
    if name not in ("sqlite", "postgres"):
        raise ValueError(f"SYNAPSE_LITE_TEST_DB must be 'sqlite' or 'postgres', not {name!r}")
    _record_engine_user()
    return name


def sqlite_pass_only(subject: str) -> None:
    """Skip the calling test unless the run's engine is SQLite: for tests
    whose ``subject`` reads the same on either engine once the rows are
    stored (what differs per engine is tested beside them on both), so that
    CI's PostgreSQL pass does not pay for them twice."""
    one_engine_only("sqlite", subject)


#: Why an end-to-end test (our server as separate processes, or a client
#: library or a browser against it) runs on one engine (``one_engine_only``;
#: docs/testing.md, "Decisions").
END_TO_END = "an end-to-end scenario runs on one engine"


def one_engine_only(engine: str, subject: str) -> None:
    """Skip the calling test unless the run's engine is ``engine``.

    For a test whose ``subject`` proves the same on either engine: a scenario
    across our server's processes proves their wiring, replication and
    recovery, and a client library's or a browser's proves what they see of
    the API, while what differs per engine lies below and is tested in
    process on both. Each such test names the engine of
    the layout it is about: SQLite (with TCP replication) for the embedded
    default, PostgreSQL (with Redis where it replicates) for production
    layouts. The module is still recorded as using the engine, so CI's
    PostgreSQL pass runs the tests that chose PostgreSQL."""
    if test_engine_name() != engine:
        raise unittest.SkipTest(f"runs when SYNAPSE_LITE_TEST_DB={engine} ({subject})")


def _record_engine_user() -> None:
    """Append the asking test's module to ``ENGINE_USERS_ENV``'s file, if set.

    The test is the nearest frame whose ``self`` is a test case (its class's
    module, so a harness base class's ``setUp`` counts for the subclass)."""
    path = os.environ.get(ENGINE_USERS_ENV)
    if not path:
        return
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, unittest.TestCase):
            with open(path, "a", encoding="utf-8") as out:
                out.write(type(candidate).__module__ + "\n")
            return
        frame = frame.f_back
    raise RuntimeError(f"{ENGINE_USERS_ENV}: the engine was asked for outside a test case")


@attr.s(slots=True, auto_attribs=True)
class TestDatabase:
    """One throwaway database: its engine name and connection arguments."""

    engine_name: str
    args: dict[str, Any]
    _admin_args: dict[str, Any] | None = None
    #: A PostgreSQL copy of the schema template: emptied and reused by the
    #: next test of this process rather than dropped, when it can be.
    _recyclable: bool = False

    def make_engine(self) -> BaseDatabaseEngine:
        return create_engine(self.engine_name, self.args)

    def config(self) -> dict[str, Any]:
        """The ``database`` section of a homeserver config using this database."""
        return {"engine": self.engine_name, "args": dict(self.args)}

    def drop(self) -> None:
        if self.engine_name == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                try:
                    os.unlink(self.args["path"] + suffix)
                except FileNotFoundError:
                    pass
            return
        if self._recyclable and _recycled.take_back(self.args):
            return
        import psycopg2

        assert self._admin_args is not None
        conn = psycopg2.connect(**self._admin_args)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS {self.args['dbname']} WITH (FORCE)")
        finally:
            conn.close()


def create_test_database(
    engine_name: str | None = None, *, with_schema: bool = False
) -> TestDatabase:
    """Create a database; the caller drops it (use ``addCleanup``).

    Empty, or with ``with_schema`` holding the current schema as the main
    process's first start leaves it (``prepare_database``), copied from a
    template this process prepared once: a fresh schema per test costs a
    second or more on PostgreSQL (most of CI's PostgreSQL pass), a copy a
    fraction of it. A homeserver started on it finds the schema current."""
    engine_name = engine_name or test_engine_name()
    if engine_name == "sqlite":
        directory = tempfile.mkdtemp(prefix="synapse_lite_test_")
        path = os.path.join(directory, "homeserver.db")
        if with_schema:
            shutil.copyfile(_sqlite_template(), path)
        return TestDatabase("sqlite", {"path": path})
    require_python_module("psycopg2", "postgres")
    require_postgres()
    import psycopg2

    admin = dict(postgres_args(), dbname="postgres")
    if with_schema:
        reused = _recycled.take()
        if reused is not None:
            return TestDatabase("postgres", dict(postgres_args(), dbname=reused), admin, True)
    name = f"synapse_lite_test_{os.getpid()}_{next(_counter)}"
    template = _postgres_template() if with_schema else "template0"
    conn = psycopg2.connect(**admin)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            cur.execute(f"CREATE DATABASE {name} TEMPLATE {template}")
            # A commit need not wait for its WAL to reach the disk: what the
            # tests kill is our processes, never PostgreSQL, and a commit is
            # visible to every session at once either way.
            cur.execute(f"ALTER DATABASE {name} SET synchronous_commit = off")
    finally:
        conn.close()
    database = TestDatabase("postgres", dict(postgres_args(), dbname=name), admin, with_schema)
    if with_schema:
        _recycled.learn(database.args)
    return database


class _RecycledDatabases:
    """This process's PostgreSQL copies of the schema template, emptied
    after their test for the next one.

    Copying the template and dropping the copy costs about 0.3 s of CPU
    (the server copies every page through its write-ahead log), once per
    test on PostgreSQL; emptying a copy costs a few milliseconds. A copy is
    reused only when it is indistinguishable from a fresh one: the same
    relations, columns, constraints, functions, triggers, types and database
    settings as the first fresh copy (a test that changed any of them gets
    its copy dropped), its connections ended, every table emptied, the
    template's own rows written back and every sequence set back where the
    template left it."""

    def __init__(self) -> None:
        self.free: list[str] = []
        #: Learnt from the first fresh copy: its fingerprint, its tables,
        #: the rows it holds (``INSERT`` statements) and its sequences' state.
        self.fingerprint: str | None = None
        self.reset_sql = ""
        self.dropped_at_exit = False

    def take(self) -> str | None:
        return self.free.pop() if self.free else None

    def learn(self, args: dict[str, Any]) -> None:
        """Record what a fresh copy looks like, once."""
        if self.fingerprint is not None:
            return
        import psycopg2

        conn = psycopg2.connect(**args)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                self.fingerprint = _schema_fingerprint(cur)
                cur.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
                    " ORDER BY tablename"
                )
                tables = [table for (table,) in cur.fetchall()]
                statements = [f"DELETE FROM {table}" for table in tables]
                for table in tables:
                    cur.execute(f"SELECT * FROM {table}")
                    for row in cur.fetchall():
                        values = b", ".join(cur.mogrify("%s", (value,)) for value in row)
                        statements.append(f"INSERT INTO {table} VALUES ({values.decode()})")
                cur.execute(
                    "SELECT sequencename FROM pg_sequences WHERE schemaname = current_schema()"
                )
                for (sequence,) in cur.fetchall():
                    cur.execute(f"SELECT last_value, is_called FROM {sequence}")
                    last_value, is_called = cur.fetchone()
                    statements.append(
                        f"SELECT setval('{sequence}', {int(last_value)}, {bool(is_called)})"
                    )
                self.reset_sql = ";\n".join(statements)
        finally:
            conn.close()

    def take_back(self, args: dict[str, Any]) -> bool:
        """Empty a copy for the next test: false (drop it instead) when it
        no longer looks like a fresh copy or cannot be emptied."""
        if self.fingerprint is None:
            return False
        import psycopg2

        try:
            conn = psycopg2.connect(**args)
        except psycopg2.Error:
            return False
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                # Whatever the test left connected (a server's pool, Spark's
                # JDBC reader) is ended first: nothing writes into the next
                # test's database.
                cur.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                if _schema_fingerprint(cur) != self.fingerprint:
                    return False
            conn.autocommit = False
            with conn.cursor() as cur:
                cur.execute(self.reset_sql)
            conn.commit()
        except psycopg2.Error:
            return False
        finally:
            conn.close()
        if not self.dropped_at_exit:
            atexit.register(self.drop_all)
            self.dropped_at_exit = True
        self.free.append(args["dbname"])
        return True

    def drop_all(self) -> None:
        """Drop the copies waiting for a test (at exit)."""
        import psycopg2

        conn = psycopg2.connect(**dict(postgres_args(), dbname="postgres"))
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                while self.free:
                    cur.execute(f"DROP DATABASE IF EXISTS {self.free.pop()} WITH (FORCE)")
        finally:
            conn.close()


_recycled = _RecycledDatabases()


def _schema_fingerprint(cur: Any) -> str:
    """A hash of what a test could change in a database besides its rows."""
    cur.execute(
        """
        SELECT md5(concat_ws('|',
          (SELECT string_agg(c.relname || ':' || c.relkind::text, ',' ORDER BY c.relname)
             FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace),
          (SELECT string_agg(a.attrelid::regclass::text || '.' || a.attname || ':'
                             || a.atttypid::text || ':' || a.attnotnull::text
                             || ':' || a.atthasdef::text,
                             ',' ORDER BY a.attrelid::regclass::text, a.attnum)
             FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
            WHERE c.relnamespace = current_schema()::regnamespace AND a.attnum > 0
              AND NOT a.attisdropped),
          (SELECT string_agg(conname || ':' || contype::text, ',' ORDER BY conname)
             FROM pg_constraint WHERE connamespace = current_schema()::regnamespace),
          (SELECT count(*) FROM pg_proc WHERE pronamespace = current_schema()::regnamespace),
          (SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal),
          (SELECT count(*) FROM pg_type WHERE typnamespace = current_schema()::regnamespace),
          (SELECT count(*) FROM pg_namespace),
          (SELECT string_agg(array_to_string(setconfig, ';'), ',')
             FROM pg_db_role_setting
            WHERE setdatabase = (SELECT oid FROM pg_database
                                  WHERE datname = current_database()))
        ))
        """
    )
    return str(cur.fetchone()[0])


#: This process's prepared templates, by engine name.
_templates: dict[str, str] = {}


def _prepare_schema(database: TestDatabase) -> None:
    from synapse_lite.storage.database import make_startup_connection
    from synapse_lite.storage.prepare_database import prepare_database

    conn = make_startup_connection(database.make_engine())
    try:
        prepare_database(conn, is_main=True)
    finally:
        conn.close()


def _sqlite_template() -> str:
    """A SQLite file with the current schema, made once per process."""
    if "sqlite" not in _templates:
        database = create_test_database("sqlite")
        _prepare_schema(database)
        # Everything in the one file: a copy of it is the whole database.
        import sqlite3

        with sqlite3.connect(database.args["path"]) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        atexit.register(database.drop)
        _templates["sqlite"] = database.args["path"]
    return _templates["sqlite"]


def _postgres_template() -> str:
    """A PostgreSQL database with the current schema, made once per process
    (and dropped at its exit); the templates and kept copies of processes
    that died are dropped first, so they do not pile up."""
    if "postgres" not in _templates:
        import psycopg2

        admin = dict(postgres_args(), dbname="postgres")
        conn = psycopg2.connect(**admin)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                # Templates (synapse_lite_template_<pid>) and the copies a
                # process kept for reuse (synapse_lite_test_<pid>_<n>).
                cur.execute(
                    "SELECT datname FROM pg_database WHERE datname LIKE 'synapse_lite_template_%'"
                    " OR datname LIKE 'synapse_lite_test_%'"
                )
                for (stale,) in cur.fetchall():
                    try:
                        pid = int(stale.split("_")[3])
                    except (IndexError, ValueError):
                        continue
                    if not _pid_alive(pid):
                        cur.execute(f"DROP DATABASE IF EXISTS {stale} WITH (FORCE)")
        finally:
            conn.close()
        database = create_test_database("postgres")
        _prepare_schema(database)
        name = f"synapse_lite_template_{os.getpid()}"
        conn = psycopg2.connect(**admin)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                cur.execute(f"ALTER DATABASE {database.args['dbname']} RENAME TO {name}")
        finally:
            conn.close()
        template = TestDatabase("postgres", dict(database.args, dbname=name), admin)
        atexit.register(template.drop)
        _templates["postgres"] = name
    return _templates["postgres"]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
