"""A fresh, empty database for each test, on the engine the run is for.

``SYNAPSE_LITE_TEST_DB`` picks the engine: ``sqlite`` (the default) or
``postgres``. CI runs the whole suite on SQLite, then on PostgreSQL the test
modules that asked for the run's engine during the SQLite run
(``SYNAPSE_LITE_ENGINE_USERS``): a module that never asks cannot behave
differently on the other engine.
"""

from __future__ import annotations

import itertools
import os
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
