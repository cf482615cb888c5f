"""Database engines: what differs between SQLite and PostgreSQL, and nothing else.

The rest of the code writes one SQL dialect (``?`` placeholders, ``ON CONFLICT``
upserts, ``RETURNING``); an engine converts placeholders, opens and configures
connections, classifies errors and implements sequences.
"""

from synapse_lite.storage.engines.base import BaseDatabaseEngine, IncorrectDatabaseSetup
from synapse_lite.storage.engines.postgres import PostgresEngine
from synapse_lite.storage.engines.sqlite import Sqlite3Engine

__all__ = [
    "BaseDatabaseEngine",
    "IncorrectDatabaseSetup",
    "PostgresEngine",
    "Sqlite3Engine",
    "create_engine",
]


def create_engine(name: str, args: dict) -> BaseDatabaseEngine:
    """Build the engine named in the config (``sqlite`` or ``postgres``)."""
    if name == "sqlite":
        return Sqlite3Engine(args)
    if name == "postgres":
        return PostgresEngine(args)
    raise ValueError(f"unknown database engine {name!r}: use 'sqlite' or 'postgres'")
