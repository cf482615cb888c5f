"""A homeserver config and database to audit, seeded row by row.

Writers: events by ``main`` and ``worker1``; every other stream by ``main``.
Rows are written the way the stores write them (the columns each table
requires, ids from the stream's sequence) so a seeded fault is the only fault.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import tempfile
from collections.abc import Iterable
from typing import Any

import yaml
from twisted.trial import unittest

from synapse_lite.app.audit_arguments import add_arguments
from synapse_lite.storage.database import make_startup_connection
from synapse_lite.streams.catalog import BUILTIN_STREAMS
from tests.harness.databases import create_test_database
from tests.spark.session import shared_spark

_serial = itertools.count(1)

#: An event row written as the store writes an event naming no prev_events
#: is its room's forward extremity too (the graph the audit checks is sound).
EXTREMITY_SQL = "INSERT INTO event_forward_extremities (room_id, event_id) VALUES (?, ?)"


def _columns(table: str, instance: str, stream_id: int) -> dict[str, Any]:
    """A valid row of ``table``; unique where the schema wants it."""
    n = next(_serial)
    user = f"@u{n}:test"
    common = {"stream_id": stream_id, "instance_name": instance}
    rows: dict[str, dict[str, Any]] = {
        "events": {
            "stream_ordering": stream_id,
            "topological_ordering": 1,
            "event_id": f"$ev{n}",
            "room_id": "!r:test",
            "type": "m.room.message",
            "sender": user,
            "origin_server_ts": 0,
            "content": "{}",
            "instance_name": instance,
        },
        "current_state_delta_stream": common
        | {"room_id": "!r:test", "type": "m.room.member", "state_key": user},
        "cache_invalidation_stream_by_instance": common
        | {"cache_func": "get_user", "invalidation_ts": 0},
        "receipts_linearized": common
        | {
            "room_id": "!r:test",
            "receipt_type": "m.read",
            "user_id": user,
            "event_id": "$e",
            "data": "{}",
        },
        "account_data": common | {"user_id": user, "account_data_type": "t", "content": "{}"},
        "room_account_data": common
        | {"user_id": user, "room_id": "!r:test", "account_data_type": "t", "content": "{}"},
        "room_tags_revisions": common | {"user_id": user, "room_id": "!r:test"},
        "device_inbox": common | {"user_id": user, "device_id": "D", "message_json": "{}"},
        "device_federation_outbox": common
        | {"destination": "other.test", "queued_ts": 0, "messages_json": "{}"},
        "presence_stream": common
        | {
            "user_id": user,
            "state": "online",
            "last_active_ts": 0,
            "last_federation_update_ts": 0,
            "last_user_sync_ts": 0,
            "currently_active": False,
        },
        "device_lists_stream": common | {"user_id": user, "device_id": "D"},
        "e2e_cross_signing_keys": common | {"user_id": user, "keytype": "master", "key_json": "{}"},
    }
    return rows[table]


def _sequence_of(table: str, stream_id: int) -> str:
    for definition in BUILTIN_STREAMS.with_ids():
        space = definition.ids
        assert space is not None
        if any(t.table == table for t in space.tables) and (stream_id > 0) == space.positive:
            return space.sequence_name
    raise KeyError(table)


#: Why a planted fault's test runs in the SQLite pass only
#: (:func:`tests.harness.databases.sqlite_pass_only`).
PLANTED = (
    "a planted fault: the checks read the same frames from either engine; each"
    " engine's export, sequences and schema are tested by the clean runs beside it"
)


class AuditFixture:
    """One test's homeserver: config file, data dir and seeded database."""

    def __init__(
        self, test: unittest.TestCase, engine_name: str | None = None, event_graph: bool = True
    ) -> None:
        """``engine_name``: the test run's engine unless given. Without
        ``event_graph`` every audit checks the streams only
        (``--no-event-graph``): for tests of planted stream faults, where the
        graph's job would be half of each audit's time and assert nothing."""
        self.event_graph = event_graph
        # The schema copied from the run's template, not prepared afresh:
        # the same tables, a fraction of the time on PostgreSQL.
        self.test_db = create_test_database(engine_name, with_schema=True)
        test.addCleanup(self.test_db.drop)
        self.engine = self.test_db.make_engine()
        self.directory = tempfile.mkdtemp(prefix="synapse_lite_audit_test_")
        self.data_dir = os.path.join(self.directory, "data")
        os.makedirs(self.data_dir)
        self.config_path = self.write_config(self.test_db.config())

    def write_config(self, database: dict[str, Any], name: str = "homeserver.yaml") -> str:
        config = {
            "server_name": "test",
            "data_dir": self.data_dir,
            "database": database,
            "worker_replication_secret": "secret",
            "listeners": [{"port": 18100, "resources": ["client", "replication"]}],
            "workers": {"worker1": {"listeners": [{"port": 18101, "resources": ["replication"]}]}},
            "stream_writers": {"events": ["main", "worker1"]},
        }
        path = os.path.join(self.directory, name)
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(config, f)
        return path

    def execute(self, sql: str, args: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        conn = make_startup_connection(self.engine)
        try:
            with conn.transaction("fixture") as txn:
                txn.execute(sql, tuple(args))
                return [] if txn.raw_cursor.description is None else list(txn.fetchall())
        finally:
            conn.close()

    def write(
        self, table: str, instance: str, ids: Iterable[int], advance_sequence: bool = True
    ) -> None:
        """Rows with these ids; the sequence is moved up to them as a writer would."""
        conn = make_startup_connection(self.engine)
        try:
            with conn.transaction("fixture_write") as txn:
                for stream_id in ids:
                    row = _columns(table, instance, stream_id)
                    txn.execute(
                        f"INSERT INTO {table} ({', '.join(row)})"
                        f" VALUES ({', '.join('?' for _ in row)})",
                        list(row.values()),
                    )
                    if table == "events":
                        txn.execute(EXTREMITY_SQL, (row["room_id"], row["event_id"]))
                    if advance_sequence:
                        self.engine.sequence_set_at_least(
                            txn.raw_cursor, _sequence_of(table, stream_id), abs(stream_id)
                        )
        finally:
            conn.close()

    def delete_event(self, stream_id: int) -> None:
        """Remove an event row and its extremity: what a transaction that
        rolled back leaves (neither)."""
        self.execute(
            "DELETE FROM event_forward_extremities WHERE event_id IN"
            " (SELECT event_id FROM events WHERE stream_ordering = ?)",
            (stream_id,),
        )
        self.execute("DELETE FROM events WHERE stream_ordering = ?", (stream_id,))

    def advance_sequence(self, sequence: str, value: int) -> None:
        """Ids up to ``value`` handed out (those without rows are gaps)."""
        conn = make_startup_connection(self.engine)
        try:
            with conn.transaction("fixture_sequence") as txn:
                self.engine.sequence_set_at_least(txn.raw_cursor, sequence, value)
        finally:
            conn.close()

    def position(self, stream: str, instance: str, value: int) -> None:
        self.execute(
            "INSERT INTO stream_positions (stream_name, instance_name, stream_id)"
            " VALUES (?, ?, ?) ON CONFLICT (stream_name, instance_name)"
            " DO UPDATE SET stream_id = EXCLUDED.stream_id",
            (stream, instance, value),
        )

    def audit(self, *extra: str) -> AuditRun:
        """Run the audit command on the shared SparkSession."""
        from spark import audit

        report_path = os.path.join(self.directory, f"report-{next(_serial)}.json")
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(
            [
                "-c",
                self.config_path,
                "--json",
                report_path,
                "--partitions",
                "1",
                *([] if self.event_graph else ["--no-event-graph"]),
                *extra,
            ]
        )
        out, err = io.StringIO(), io.StringIO()
        code = audit.run(args, spark=shared_spark(), out=out, err=err)
        with open(report_path, encoding="utf-8") as f:
            report = json.load(f)
        return AuditRun(code, report, out.getvalue(), err.getvalue())


class AuditRun:
    """The outcome of one audit: exit code, JSON report, terminal output."""

    def __init__(self, code: int, report: dict[str, Any], out: str, err: str) -> None:
        self.code = code
        self.report = report
        self.out = out
        self.err = err

    def findings(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [f for f in self.report.get("findings", []) if kind is None or f["kind"] == kind]

    def info(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [f for f in self.report.get("info", []) if kind is None or f["kind"] == kind]

    def stream(self, name: str) -> dict[str, Any]:
        return next(s for s in self.report["streams"] if s["stream"] == name)

    def __repr__(self) -> str:
        return f"AuditRun(code={self.code})\n{self.out}\n{self.err}"
