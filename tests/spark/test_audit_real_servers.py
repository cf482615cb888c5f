"""The audit on a database and position logs written by real server processes
(issue 22): ``main`` and ``persister1`` both write the events stream, in
interleaved concurrent batches, replicating to each other over the in-memory
bus in the real wire format, each with its position log. The clean copy
audits with no finding; then a persister1 event whose commit its log records
is deleted, and the audit names it (item 1)."""

from __future__ import annotations

import argparse
import io
import json
import os
from typing import Any

from twisted.internet import defer, reactor

from synapse_lite.app.audit_arguments import add_arguments
from synapse_lite.app.composition import build_homeserver
from synapse_lite.server import HomeServer
from synapse_lite.storage.database import make_startup_connection
from synapse_lite.storage.id_generators import generator as id_generators
from tests.harness.databases import sqlite_pass_only
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase, LoopbackBus, make_config
from tests.replication.test_handler import message
from tests.spark.fixture import PLANTED, _columns
from tests.spark.session import shared_spark


class AuditRealServersTestCase(DatabaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)

    def start(self, config: Any, name: str) -> HomeServer:
        hs = build_homeserver(config, name, reactor)
        hs.loops.startService()

        def stop() -> Any:
            return hs.service.stopService() if hs.service.running else None

        self.addCleanup(stop)
        return hs

    def audit(self, config_path: str) -> tuple[int, dict[str, Any], str]:
        from spark import audit

        report = config_path + ".report.json"
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(["-c", config_path, "--json", report, "--partitions", "1"])
        out, err = io.StringIO(), io.StringIO()
        code = audit.run(args, spark=shared_spark(), out=out, err=err)
        with open(report, encoding="utf-8") as f:
            return code, json.load(f), out.getvalue() + err.getvalue()

    async def run_servers(self) -> tuple[Any, dict[str, list[int]]]:
        """The config of the run and the event ids each writer wrote."""
        shared_spark()  # skip early without Java or pyspark
        config = make_config(
            self.test_db, workers=["persister1"], stream_writers={"events": ["main", "persister1"]}
        )
        main, p1 = self.start(config, "main"), self.start(config, "persister1")
        bus = LoopbackBus()
        for hs in (main, p1):
            bus.join(hs)
        await eventually(lambda: main.replication.connected and p1.replication.connected)

        # Concurrent batches from both writers: their ids interleave and
        # finish out of order, as under client load.
        written: dict[str, list[int]] = {"main": [], "persister1": []}
        for _ in range(10):
            batches = [
                defer.ensureDeferred(hs.store.persist_events([message() for _ in range(3)]))
                for hs in (main, p1, main, p1)
            ]
            results = await defer.gatherResults(batches)
            for hs, events in zip((main, p1, main, p1), results, strict=True):
                written[hs.instance_name] += [e.stream_ordering for e in events]
        for writer, other in ((main, p1), (p1, main)):
            await other.waiters.wait_for_stream_position(
                writer.instance_name, "events", max(written[writer.instance_name]), timeout=10
            )
        for hs in (main, p1):
            await hs.service.stopService()  # flushes positions, closes the position log
        logs = [f for f in os.listdir(config.data_dir) if f.startswith("positions-")]
        self.assertEqual(sorted(logs), ["positions-main.jsonl", "positions-persister1.jsonl"])
        return config, written

    def execute(self, sql: str, *args: Any) -> None:
        conn = make_startup_connection(self.test_db.make_engine())
        try:
            with conn.transaction("plant") as txn:
                txn.execute(sql, args)
        finally:
            conn.close()

    def query(self, sql: str) -> list[Any]:
        """The first column of every row."""
        conn = make_startup_connection(self.test_db.make_engine())
        try:
            with conn.transaction("read") as txn:
                txn.execute(sql, ())
                return [row[0] for row in txn.fetchall()]
        finally:
            conn.close()

    def insert_event(self, stream_id: int) -> None:
        row = _columns("events", "persister1", stream_id)
        self.execute(
            f"INSERT INTO events ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})",
            *row.values(),
        )

    async def test_clean_run_then_a_committed_event_deleted(self) -> None:
        config, written = await self.run_servers()
        path = config.config_files[0]
        code, report, output = self.audit(path)
        self.assertEqual((code, report["findings"]), (0, []), output)
        self.assertGreater(report["position_logs"]["records"], 60)
        events = next(s for s in report["streams"] if s["stream"] == "events")
        self.assertEqual(events["rows"], 120)

        victim = sorted(written["persister1"])[len(written["persister1"]) // 2]
        (victim_event,) = self.query(
            f"SELECT event_id FROM events WHERE stream_ordering = {int(victim)}"
        )
        self.execute("DELETE FROM events WHERE stream_ordering = ?", victim)
        code, report, output = self.audit(path)
        self.assertEqual(code, 1, output)
        # The event was its room's forward extremity (it named no parents):
        # the graph's check finds the deletion too.
        finding, extremity = report["findings"]
        self.assertEqual(
            (finding["kind"], finding["stream"], finding["writer"], finding["ids"]),
            ("committed_row_missing", "events", "persister1", [victim]),
        )
        self.assertIn("logged as committed have no row", finding["message"])
        self.assertEqual(
            (extremity["kind"], extremity["samples"][0]["event_id"]),
            ("extremity_not_in_graph", victim_event),
        )

    async def test_each_planted_fault_alone(self) -> None:
        """Items 2-7 planted one at a time into the real run's copy, each
        undone before the next: each is the only finding."""
        sqlite_pass_only(PLANTED)
        config, written = await self.run_servers()
        path = config.config_files[0]
        log = os.path.join(config.data_dir, "positions-persister1.jsonl")
        with open(log, encoding="utf-8") as f:
            clean_log = f.read()
        # Every writer recorded its positions on shutdown, backfill's too.
        (backfill_stored,) = self.query(
            "SELECT stream_id FROM stream_positions"
            " WHERE stream_name = 'backfill' AND instance_name = 'main'"
        )
        self.assertLessEqual(backfill_stored, 0)
        first = min(written["persister1"])
        top = max(written["main"] + written["persister1"])

        def append(record: dict[str, Any] | str) -> None:
            with open(log, "a", encoding="utf-8") as f:
                f.write((record if isinstance(record, str) else json.dumps(record)) + "\n")

        def restore_log() -> None:
            with open(log, "w", encoding="utf-8") as f:
                f.write(clean_log)

        finished = {
            "kind": "finished",
            "ts": 1,
            "process": "persister1",
            "stream": "events",
            "writer": "persister1",
        }
        plants = [
            (
                "position_wrong_sign",
                lambda: self.execute(
                    "UPDATE stream_positions SET stream_id = 5"
                    " WHERE stream_name = 'backfill' AND instance_name = 'main'"
                ),
                lambda: self.execute(
                    "UPDATE stream_positions SET stream_id = ?"
                    " WHERE stream_name = 'backfill' AND instance_name = 'main'",
                    backfill_stored,
                ),
                # Nothing was backfilled: 5 is also beyond the sequence.
                [
                    ("position_ahead_of_sequence", "backfill", "main", [5]),
                    ("position_wrong_sign", "backfill", "main", [5]),
                ],
            ),
            (
                "id_wrong_sign",
                lambda: self.insert_event(0),
                lambda: self.execute("DELETE FROM events WHERE stream_ordering = 0"),
                [("id_wrong_sign", "events", "persister1", [0])],
            ),
            (
                "logged_position_ahead_of_sequence",
                lambda: append(
                    {
                        "kind": "position",
                        "ts": 9_000_000_000_000,  # after every finish: only this fault
                        "process": "persister1",
                        "stream": "events",
                        "writer": "*",
                        "position": top + 1000,
                        "purpose": "sync",
                    }
                ),
                restore_log,
                [("logged_position_ahead_of_sequence", "events", "*", [top + 1000])],
            ),
            (
                "failed_id_has_row",
                lambda: append(finished | {"id": first, "committed": False}),
                restore_log,
                [("failed_id_has_row", "events", "persister1", [first])],
            ),
            (
                "unexpected_stream_position",
                lambda: self.execute(
                    "INSERT INTO stream_positions (stream_name, instance_name, stream_id)"
                    " VALUES ('evnets', 'main', 3)"
                ),
                lambda: self.execute("DELETE FROM stream_positions WHERE stream_name = 'evnets'"),
                [("unexpected_stream_position", "evnets", "main", [])],
            ),
        ]
        for kind, plant, undo, expected in plants:
            plant()
            code, report, output = self.audit(path)
            undo()
            self.assertEqual(code, 1, f"{kind}: {output}")
            found = [(f["kind"], f["stream"], f["writer"], f["ids"]) for f in report["findings"]]
            self.assertEqual(found, expected, output)

        # Item 7: a valid-JSON line with an extreme id is a malformed line.
        append(finished | {"id": -9223372036854775808, "committed": True})
        code, report, output = self.audit(path)
        self.assertEqual(code, 0, output)
        self.assertEqual(
            [i["count"] for i in report["info"] if i["kind"] == "malformed_log_lines"], [1]
        )
