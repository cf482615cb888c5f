"""Creating and upgrading the schema at startup.

The main process applies the full schema to an empty database, then every delta
file newer than the recorded version, all in one transaction, and records the
version in ``schema_version``. Workers only check: a worker that finds another
version refuses to start and says which process to start or upgrade.

Delta files live in ``schema/deltas`` and are named ``NNNN_description.sql``;
``NNNN`` is the schema version the file brings the database to. Where the
engines need different SQL (full-text search: SQLite's FTS5, PostgreSQL's
tsvector), a version is a pair of files instead, ``NNNN_description.sqlite.sql``
and ``NNNN_description.postgres.sql``, and each engine runs its own. A
version whose change is not plain SQL (derived rows, with progress lines) is
a Python file instead, ``NNNN_description.py``, whose ``run_upgrade(txn,
engine)`` runs in the same transaction as the rest of the upgrade.

A database records one version, not the set of deltas it ran, so a delta
numbered at or below a version that has already shipped is never run on a
database of that version. Parallel branches take numbers from agreed ranges
so that they do not collide; a branch merged after a release whose deltas
fall below that release's version gets them renumbered above it at merge.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from synapse_lite.storage.database import LoggingDatabaseConnection, LoggingTransaction
from synapse_lite.storage.engines import BaseDatabaseEngine

logger = logging.getLogger(__name__)

SCHEMA_DIR = os.path.join(os.path.dirname(__file__), "schema")
#: The version ``full.sql`` creates.
FULL_SCHEMA_VERSION = 1

_DELTA_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+(?:(?:\.(sqlite|postgres))?\.sql|\.py)$")
#: The engines a version's pair of engine-specific files is for.
_ENGINES = ("sqlite", "postgres")
_CREATE_SEQUENCE = re.compile(r"^CREATE\s+SEQUENCE\s+([a-z_][a-z0-9_]*)$", re.IGNORECASE)


class SchemaVersionError(RuntimeError):
    """This process cannot run against the database's schema version."""


class SchemaFileError(RuntimeError):
    """A statement of a schema file failed; nothing of the upgrade was kept."""


@dataclass(frozen=True)
class DeltaFile:
    """One ordered schema change."""

    version: int
    path: str


def list_deltas(schema_dir: str = SCHEMA_DIR, engine: str = "sqlite") -> list[DeltaFile]:
    """The delta files ``engine`` runs, in version order: each version's one
    file, or its file for ``engine`` when it is a pair. Two files for one
    version (other than a pair), or half a pair, is an error."""
    delta_dir = os.path.join(schema_dir, "deltas")
    found: dict[int, dict[str | None, str]] = {}
    if os.path.isdir(delta_dir):
        for name in sorted(os.listdir(delta_dir)):
            match = _DELTA_NAME.match(name)
            if not match:
                continue
            version, variant = int(match.group(1)), match.group(2)
            files = found.setdefault(version, {})
            if variant in files or (files and (variant is None) != (None in files)):
                raise SchemaVersionError(
                    f"two schema deltas for version {version}: "
                    f"{next(iter(files.values()))} and {os.path.join(delta_dir, name)}"
                )
            files[variant] = os.path.join(delta_dir, name)
    deltas = []
    for version in sorted(found):
        files = found[version]
        if None not in files and set(files) != set(_ENGINES):
            raise SchemaVersionError(
                f"schema delta {version} has a file for {', '.join(sorted(map(str, files)))}"
                f" only: an engine-specific version needs one for each of {', '.join(_ENGINES)}"
            )
        deltas.append(DeltaFile(version, files.get(None) or files[engine]))
    return deltas


def code_schema_version(schema_dir: str = SCHEMA_DIR) -> int:
    """The schema version this code expects."""
    deltas = list_deltas(schema_dir)
    return max([FULL_SCHEMA_VERSION] + [d.version for d in deltas])


def split_statements(sql: str) -> Iterator[str]:
    """Split a schema file into statements (``--`` comments removed)."""
    lines = [line.split("--", 1)[0] for line in sql.splitlines()]
    for statement in "\n".join(lines).split(";"):
        statement = " ".join(statement.split())
        if statement:
            yield statement


def execute_schema_file(txn: LoggingTransaction, engine: BaseDatabaseEngine, path: str) -> None:
    """Run every statement of one schema file."""
    with open(path, encoding="utf-8") as f:
        sql = f.read()
    for statement in split_statements(sql):
        match = _CREATE_SEQUENCE.match(statement)
        try:
            if match:
                for engine_statement in engine.create_sequence_sql(match.group(1)):
                    txn.execute(engine_statement)
            else:
                txn.execute(statement)
        except Exception as e:
            raise SchemaFileError(
                f"{path}: {statement[:200]!r} failed: {e}. The upgrade was rolled back;"
                " the database is unchanged."
            ) from e


def run_python_delta(txn: LoggingTransaction, engine: BaseDatabaseEngine, path: str) -> None:
    """Run the ``run_upgrade(txn, engine)`` of one Python delta file."""
    # Compiled and run by hand, not imported: no __pycache__ is written
    # next to the deltas (where it would read as a delta of its own).
    with open(path, encoding="utf-8") as f:
        source = f.read()
    namespace: dict[str, Any] = {"__name__": "synapse_lite_schema_delta", "__file__": path}
    try:
        exec(compile(source, path, "exec"), namespace)
        run_upgrade = namespace["run_upgrade"]
    except Exception as e:
        raise SchemaFileError(f"{path}: no run_upgrade(txn, engine) to run: {e}") from e
    try:
        run_upgrade(txn, engine)
    except Exception as e:
        raise SchemaFileError(
            f"{path}: run_upgrade failed: {e}. The upgrade was rolled back;"
            " the database is unchanged."
        ) from e


def _table_exists(txn: LoggingTransaction, engine: BaseDatabaseEngine, table: str) -> bool:
    if engine.name == "sqlite":
        txn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,))
    else:
        txn.execute(
            "SELECT 1 FROM information_schema.tables"
            " WHERE table_schema = current_schema() AND table_name = ?",
            (table,),
        )
    return txn.fetchone() is not None


def get_schema_version(txn: LoggingTransaction, engine: BaseDatabaseEngine) -> int | None:
    """The recorded schema version, or None for an empty database."""
    if not _table_exists(txn, engine, "schema_version"):
        return None
    txn.execute("SELECT version FROM schema_version")
    row = txn.fetchone()
    return int(row[0]) if row else None


def prepare_database(
    db_conn: LoggingDatabaseConnection, *, is_main: bool, schema_dir: str = SCHEMA_DIR
) -> int:
    """Bring the schema up to date (main process) or check it (workers).

    Returns the schema version the database is at.
    """
    engine = db_conn.engine
    expected = code_schema_version(schema_dir)
    start = time.monotonic()
    with db_conn.transaction("prepare_database") as txn:
        current = get_schema_version(txn, engine)
        if current is not None and current > expected:
            raise SchemaVersionError(
                f"The database ({engine.describe()}) is at schema version {current}, newer than"
                f" this synapse_lite, which knows version {expected}. Upgrade synapse_lite on"
                " this machine before starting this process."
            )
        if not is_main:
            if current != expected:
                found = "an empty database" if current is None else f"schema version {current}"
                raise SchemaVersionError(
                    f"This worker expects schema version {expected} but found {found}"
                    f" ({engine.describe()}). Start the main process first: it creates and"
                    " upgrades the schema; then start the workers."
                )
            return current
        if current is None:
            logger.info(
                "Creating the schema (version %d) in %s", FULL_SCHEMA_VERSION, engine.describe()
            )
            execute_schema_file(txn, engine, os.path.join(schema_dir, "full.sql"))
            txn.execute(
                "INSERT INTO schema_version (version, upgraded_ts) VALUES (?, ?)",
                (FULL_SCHEMA_VERSION, int(time.time() * 1000)),
            )
            current = FULL_SCHEMA_VERSION
        recorded = current
        for delta in list_deltas(schema_dir, engine.name):
            if delta.version <= current:
                continue
            logger.info("Applying schema delta %s", os.path.basename(delta.path))
            if delta.path.endswith(".py"):
                run_python_delta(txn, engine, delta.path)
            else:
                execute_schema_file(txn, engine, delta.path)
            current = delta.version
        if current != recorded:
            txn.execute(
                "UPDATE schema_version SET version = ?, upgraded_ts = ?",
                (current, int(time.time() * 1000)),
            )
    logger.info("Schema at version %d (checked in %.3f s)", current, time.monotonic() - start)
    return current
