"""A fresh, empty database for each test, on the engine the run is for.

``SYNAPSE_LITE_TEST_DB`` picks the engine: ``sqlite`` (the default) or
``postgres``. CI runs the whole suite once with each.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from typing import Any

import attr

from synapse_lite.storage.engines import BaseDatabaseEngine, create_engine
from tests.harness.services import postgres_args, require_postgres, require_python_module

_counter = itertools.count()


def test_engine_name() -> str:
    """The engine this test run uses."""
    name = os.environ.get("SYNAPSE_LITE_TEST_DB", "sqlite")
    if name not in ("sqlite", "postgres"):
        raise ValueError(f"SYNAPSE_LITE_TEST_DB must be 'sqlite' or 'postgres', not {name!r}")
    return name


@attr.s(slots=True, auto_attribs=True)
class TestDatabase:
    """One throwaway database: its engine name and connection arguments."""

    engine_name: str
    args: dict[str, Any]
    _admin_args: dict[str, Any] | None = None

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
        import psycopg2

        assert self._admin_args is not None
        conn = psycopg2.connect(**self._admin_args)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS {self.args['dbname']} WITH (FORCE)")
        finally:
            conn.close()


def create_test_database(engine_name: str | None = None) -> TestDatabase:
    """Create an empty database; the caller drops it (use ``addCleanup``)."""
    engine_name = engine_name or test_engine_name()
    if engine_name == "sqlite":
        directory = tempfile.mkdtemp(prefix="synapse_lite_test_")
        return TestDatabase("sqlite", {"path": os.path.join(directory, "homeserver.db")})
    require_python_module("psycopg2", "postgres")
    require_postgres()
    import psycopg2

    admin = dict(postgres_args(), dbname="postgres")
    name = f"synapse_lite_test_{os.getpid()}_{next(_counter)}"
    conn = psycopg2.connect(**admin)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            cur.execute(f"CREATE DATABASE {name} TEMPLATE template0")
    finally:
        conn.close()
    return TestDatabase("postgres", dict(postgres_args(), dbname=name), admin)
