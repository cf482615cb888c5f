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

from synapse_lite.app.audit_command import add_arguments
from synapse_lite.app.composition import build_homeserver
from synapse_lite.server import HomeServer
from synapse_lite.storage.database import make_startup_connection
from synapse_lite.storage.id_generators import generator as id_generators
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase, LoopbackBus, make_config
from tests.replication.test_handler import message
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

    async def test_clean_run_then_a_committed_event_deleted(self) -> None:
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
        path = config.config_files[0]
        logs = [f for f in os.listdir(config.data_dir) if f.startswith("positions-")]
        self.assertEqual(sorted(logs), ["positions-main.jsonl", "positions-persister1.jsonl"])

        code, report, output = self.audit(path)
        self.assertEqual((code, report["findings"]), (0, []), output)
        self.assertGreater(report["position_logs"]["records"], 60)
        events = next(s for s in report["streams"] if s["stream"] == "events")
        self.assertEqual(events["rows"], 120)

        victim = sorted(written["persister1"])[len(written["persister1"]) // 2]
        conn = make_startup_connection(self.test_db.make_engine())
        try:
            with conn.transaction("plant") as txn:
                txn.execute("DELETE FROM events WHERE stream_ordering = ?", (victim,))
        finally:
            conn.close()
        code, report, output = self.audit(path)
        self.assertEqual(code, 1, output)
        (finding,) = report["findings"]
        self.assertEqual(
            (finding["kind"], finding["stream"], finding["writer"], finding["ids"]),
            ("committed_row_missing", "events", "persister1", [victim]),
        )
        self.assertIn("logged as committed have no row", finding["message"])
