"""A database that cannot be reached is a 503 the client can retry, not a 500.

Found by the fault soak (``bench/soak.py``, PostgreSQL restart): while the
server was down, sends and /syncs were answered ``500 M_UNKNOWN`` "Internal
server error", as for a bug.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile

from twisted.internet import reactor
from twisted.trial import unittest

from synapse_lite.api.errors import SynapseError
from synapse_lite.storage.database import MAX_ATTEMPTS, DatabasePool, DatabaseUnavailableError
from synapse_lite.storage.engines import create_engine
from tests.harness.processes import free_port
from tests.harness.services import require_python_module


class DatabaseUnavailableTestCase(unittest.TestCase):
    def pool(self, engine_name: str, args: dict[str, object]) -> DatabasePool:
        db = DatabasePool(reactor, create_engine(engine_name, args), max_connections=1)
        self.addCleanup(db.close)
        return db

    async def test_postgres_refusing_connections_is_503(self) -> None:
        require_python_module("psycopg2", "postgres")
        # Nothing listens on the port: what clients meet while PostgreSQL restarts.
        db = self.pool(
            "postgres",
            {"host": "127.0.0.1", "port": free_port(), "user": "postgres", "dbname": "x"},
        )
        with self.assertRaises(DatabaseUnavailableError) as caught:
            await db.runInteraction("select_one", lambda txn: txn.execute("SELECT 1"))
        self.assertIsInstance(caught.exception, SynapseError)
        self.assertEqual(caught.exception.code, 503)

    async def test_connection_broken_on_every_attempt_is_503(self) -> None:
        path = os.path.join(tempfile.mkdtemp(prefix="synapse_lite_test_"), "db.sqlite")
        db = self.pool("sqlite", {"path": path})
        attempts = 0

        def broken(txn: object) -> None:
            nonlocal attempts
            attempts += 1
            # What sqlite3 raises on a connection that was closed under us.
            raise sqlite3.ProgrammingError("Cannot operate on a closed database.")

        with self.assertRaises(DatabaseUnavailableError) as caught:
            await db.runInteraction("broken", broken)
        self.assertEqual(caught.exception.code, 503)
        # Each attempt got a fresh connection before the pool gave up.
        self.assertEqual(attempts, MAX_ATTEMPTS)

    async def test_other_errors_are_unchanged(self) -> None:
        path = os.path.join(tempfile.mkdtemp(prefix="synapse_lite_test_"), "db.sqlite")
        db = self.pool("sqlite", {"path": path})
        with self.assertRaises(sqlite3.OperationalError):
            await db.runInteraction("bad_sql", lambda txn: txn.execute("SELEC 1"))

    async def test_a_commit_of_unknown_outcome_is_retried_only_when_idempotent(self) -> None:
        """The connection breaks during COMMIT: the write may have happened.
        Not retried (503, the client retries with its transaction id) unless
        the caller says a second run is safe."""
        fd, path = tempfile.mkstemp(suffix=".db")
        os.close(fd)
        self.addCleanup(os.remove, path)
        db = self.pool("sqlite", {"path": path})
        engine = db.engine
        real_commit = engine.commit
        breaks = [0]

        def commit(conn: object, read_only: bool = False) -> None:
            real_commit(conn, read_only)  # type: ignore[arg-type]
            if breaks[0]:
                breaks[0] -= 1
                raise sqlite3.OperationalError("disk I/O error: connection lost")

        self.patch(engine, "commit", commit)
        self.patch(engine, "is_connection_error", lambda exc: "connection lost" in str(exc))
        runs: list[int] = []

        def write(txn: object) -> None:
            runs.append(1)

        breaks[0] = 1
        with self.assertRaises(DatabaseUnavailableError) as cm:
            await db.runInteraction("in_doubt", write)
        self.assertEqual(cm.exception.code, 503)
        self.assertEqual(len(runs), 1)

        breaks[0] = 1
        await db.runInteraction("in_doubt_idempotent", write, idempotent=True)
        self.assertEqual(len(runs), 3)

