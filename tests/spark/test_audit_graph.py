"""The audit's event-graph checks (issue 30): no finding on a graph real
servers wrote, and each planted fault found alone.

The real run is the default layout in one test process (main, two
persisters, a synchrotron), rooms on both persisters, members joining, state
and messages sent concurrently through the client API, and a branch merged
(two forward extremities forced, as concurrent events would leave them). The
seeded tests cover what the servers do not write yet: outliers, backfilled
events, recorded backward extremities, rejections and soft failures.
"""

from __future__ import annotations

import argparse
import io
import json
from typing import Any

from twisted.internet import defer
from twisted.trial import unittest

from synapse_lite.app.audit_arguments import add_arguments
from synapse_lite.storage.database import make_startup_connection
from tests.harness.client_api import (
    DEFAULT_LAYOUT_STREAM_WRITERS,
    DEFAULT_LAYOUT_WORKERS,
    ClientApi,
    start_cluster,
)
from tests.harness.databases import sqlite_pass_only
from tests.harness.server import DatabaseTestCase
from tests.spark.fixture import PLANTED, AuditFixture
from tests.spark.session import shared_spark

#: What the audit found, in short: (kind, stream, writer, ids).
Found = list[tuple[str, str, str, list[int]]]


def found(report: dict[str, Any]) -> Found:
    return [(f["kind"], f["stream"], f["writer"], f["ids"]) for f in report["findings"]]


def audit_config(config_path: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    """Run the audit on the shared SparkSession: exit code, JSON report, output."""
    from spark import audit

    report = config_path + ".report.json"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["-c", config_path, "--json", report, "--partitions", "1", *extra])
    out, err = io.StringIO(), io.StringIO()
    code = audit.run(args, spark=shared_spark(), out=out, err=err)
    with open(report, encoding="utf-8") as f:
        return code, json.load(f), out.getvalue() + err.getvalue()


class RealServersGraph:
    """A database the default layout wrote; see the module docstring."""

    def __init__(self, test: DatabaseTestCase) -> None:
        self.test = test
        self.test_db = test.test_db

    async def write(self) -> str:
        """Run the servers, stop them; the config file's path."""
        shared_spark()  # skip early without Java or pyspark
        servers, clients, bus = start_cluster(
            self.test,
            self.test_db,
            workers=DEFAULT_LAYOUT_WORKERS,
            stream_writers=DEFAULT_LAYOUT_STREAM_WRITERS,
        )
        alice = await ClientApi(self.test, clients["main"].base_url).register("alice")
        bob = await ClientApi(self.test, clients["synchrotron1"].base_url).register("bob")
        rooms: list[str] = []
        while len(rooms) < 4 or len(set(self.room_writers().values())) < 2:
            room = await alice.create_room(preset="public_chat", name=f"room {len(rooms)}")
            await bob.ok("POST", f"/rooms/{room}/join", {})
            rooms.append(room)
        await alice.ok("PUT", f"/rooms/{rooms[0]}/state/m.room.topic", {"topic": "graphs"})

        async def chat(room: str) -> None:
            for i in range(5):
                await (alice if i % 2 else bob).send(room, f"message {i}")

        await defer.gatherResults([defer.ensureDeferred(chat(room)) for room in rooms])
        # A branch: the room's first message made an extremity again, as a
        # concurrent event would leave it; the next send merges the two.
        writer = servers[self.room_writers()[rooms[1]]]
        (first,) = self.query(
            "SELECT event_id FROM events WHERE room_id = ? AND type = 'm.room.message'"
            " ORDER BY stream_ordering LIMIT 1",
            rooms[1],
        )
        self.execute(
            "INSERT INTO event_forward_extremities (room_id, event_id) VALUES (?, ?)",
            rooms[1],
            first,
        )
        writer.handlers.events._room_extremities.pop(rooms[1])  # as after a restart
        await bob.send(rooms[1], "merge")
        for endpoint in list(bus.endpoints):
            bus.leave(endpoint)
        for hs in servers.values():
            await hs.service.stopService()  # records the positions
        self.rooms = rooms
        return servers["main"].config.config_files[0]

    def room_writers(self) -> dict[str, str]:
        rows = self.rows("SELECT room_id, event_writer FROM rooms")
        return {room: writer for room, writer in rows}

    def rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        conn = make_startup_connection(self.test_db.make_engine())
        try:
            with conn.transaction("graph_test") as txn:
                txn.execute(sql, args)
                return [] if txn.raw_cursor.description is None else list(txn.fetchall())
        finally:
            conn.close()

    def query(self, sql: str, *args: Any) -> list[Any]:
        """The first column of every row."""
        return [row[0] for row in self.rows(sql, *args)]

    def execute(self, sql: str, *args: Any) -> None:
        self.rows(sql, *args)

    def event(self, room: str, which: str = "newest", kind: str = "m.room.message") -> Any:
        """(event_id, stream_ordering, instance_name) of the room's newest or
        oldest event of type ``kind``."""
        order = "DESC" if which == "newest" else "ASC"
        (row,) = self.rows(
            "SELECT event_id, stream_ordering, instance_name FROM events"
            f" WHERE room_id = ? AND type = ? ORDER BY stream_ordering {order} LIMIT 1",
            room,
            kind,
        )
        return row


class AuditGraphRealServersTestCase(DatabaseTestCase):
    async def test_clean_then_planted_faults_found(self) -> None:
        graph = RealServersGraph(self)
        path = await graph.write()
        code, report, output = audit_config(path)
        self.assertEqual((code, found(report)), (0, []), output)
        rows = report["graph"]["rows"]
        self.assertGreater(rows["event_edges"], 40)
        self.assertGreater(rows["event_auth_edges"], 100)
        # Every room has one forward extremity again (the branch merged).
        self.assertEqual(rows["event_forward_extremities"], len(graph.rooms))
        # The schema records rejections (delta 0083): every check runs.
        self.assertEqual(report["graph"]["not_checked"], {})

        # Six faults of the edges at once, each where no other can touch it
        # (one room each, or an event never stored): each is found, and
        # nothing else.
        rooms = graph.rooms
        newest = [graph.event(room) for room in rooms]
        oldest = graph.event(rooms[2], "oldest")
        planted = [
            ("INSERT INTO event_edges VALUES (?, ?)", (newest[0][0], "$nowhere")),
            ("INSERT INTO event_auth_edges VALUES (?, ?)", (newest[1][0], "$gone")),
            ("INSERT INTO event_edges VALUES (?, ?)", ("$ghost", oldest[0])),
            ("INSERT INTO event_auth_edges VALUES (?, ?)", ("$ghost", oldest[0])),
            ("INSERT INTO event_forward_extremities VALUES (?, ?)", (rooms[2], oldest[0])),
            ("DELETE FROM event_forward_extremities WHERE room_id = ?", (rooms[3],)),
            ("INSERT INTO event_forward_extremities VALUES (?, ?)", (rooms[3], "$ghost")),
        ]
        for sql, args in planted:
            graph.execute(sql, *args)
        # And broken state group chains, in the same run: a delta whose
        # parent is gone, a chain one delta over the bound, a cycle of two,
        # an event naming a group that is not stored. (Group ids of real
        # events are twice their stream orderings: small.)
        (delta,) = graph.query(
            "SELECT MAX(id) FROM state_groups WHERE room_id = ? AND prev_group IS NOT NULL",
            rooms[0],
        )
        (delta_parent,) = graph.query("SELECT prev_group FROM state_groups WHERE id = ?", delta)
        graph.execute("UPDATE state_groups SET prev_group = 900005 WHERE id = ?", delta)
        long_chain = [(900100 + n, rooms[1], 900099 + n if n else None, n) for n in range(52)]
        cycle = [(900010, rooms[2], 900011, 1), (900011, rooms[2], 900010, 1)]
        for row in long_chain + cycle:
            graph.execute("INSERT INTO state_groups VALUES (?, ?, ?, ?)", *row)
        (group_of_newest,) = graph.query(
            "SELECT state_group FROM events WHERE event_id = ?", newest[2][0]
        )
        graph.execute("UPDATE events SET state_group = 900007 WHERE event_id = ?", newest[2][0])
        code, report, output = audit_config(path)
        self.assertEqual(code, 1, output)
        self.assertEqual(
            found(report),
            sorted(
                [
                    ("missing_prev_event", "events", newest[0][2], [newest[0][1]]),
                    ("missing_auth_event", "events", newest[1][2], [newest[1][1]]),
                    ("edge_of_unknown_event", "events", "", []),
                    ("extremity_has_child", "events", oldest[2], [oldest[1]]),
                    ("missing_extremity", "events", newest[3][2], [newest[3][1]]),
                    ("extremity_not_in_graph", "events", "", []),
                    ("event_state_group_missing", "events", newest[2][2], [newest[2][1]]),
                    ("state_group_chain_length", "state_groups", "", [900010, 900011]),
                    ("state_group_chain_too_long", "state_groups", "", [900151]),
                    ("state_group_cycle", "state_groups", "", [900010]),
                    ("state_group_missing_parent", "state_groups", "", [delta]),
                ]
            ),
            output,
        )
        self.assertIn("state_group 900007 not stored", output)
        self.assertIn("51 deltas from its snapshot (at most 50)", output)
        self.assertGreater(report["graph"]["rows"]["state_groups"], 54)
        by_kind = {f["kind"]: f for f in report["findings"]}
        self.assertEqual(by_kind["missing_prev_event"]["samples"][0]["parent"], "$nowhere")
        self.assertEqual(
            by_kind["edge_of_unknown_event"]["details"]["tables"],
            ["event_auth_edges", "event_edges"],
        )
        self.assertEqual(by_kind["extremity_not_in_graph"]["samples"][0]["reason"], "not stored")
        self.assertIn(f"$ghost in {rooms[3]} (not stored)", output)
        for sql in (
            "DELETE FROM event_edges WHERE event_id = '$ghost' OR prev_event_id = '$nowhere'",
            "DELETE FROM event_auth_edges WHERE event_id = '$ghost' OR auth_id = '$gone'",
            "DELETE FROM event_forward_extremities WHERE room_id IN (?, ?)",
        ):
            graph.execute(sql, *((rooms[2], rooms[3]) if "?" in sql else ()))
        graph.execute("UPDATE state_groups SET prev_group = ? WHERE id = ?", delta_parent, delta)
        graph.execute("DELETE FROM state_groups WHERE id >= 900000")
        graph.execute(
            "UPDATE events SET state_group = ? WHERE event_id = ?", group_of_newest, newest[2][0]
        )
        for room, event in ((rooms[2], newest[2][0]), (rooms[3], newest[3][0])):
            graph.execute("INSERT INTO event_forward_extremities VALUES (?, ?)", room, event)

        # A rejected event in the current state; and its parent, whose only
        # child is now out of the graph, should have stayed an extremity.
        topic, topic_id, topic_writer = graph.event(rooms[0], kind="m.room.topic")
        (parent,) = graph.query("SELECT prev_event_id FROM event_edges WHERE event_id = ?", topic)
        (parent_id,) = graph.query("SELECT stream_ordering FROM events WHERE event_id = ?", parent)
        graph.execute("UPDATE events SET rejected = TRUE WHERE event_id = ?", topic)
        code, report, output = audit_config(path)
        self.assertEqual(
            (code, found(report)),
            (
                1,
                [
                    ("missing_extremity", "events", topic_writer, [parent_id]),
                    ("rejected_in_state", "events", topic_writer, [topic_id]),
                ],
            ),
            output,
        )
        self.assertEqual(report["graph"]["not_checked"], {})
        sample = report["findings"][1]["samples"][0]
        self.assertEqual((sample["type"], sample["state_key"]), ("m.room.topic", ""))


class AuditGraphSeededTestCase(unittest.TestCase):
    """What the servers do not write yet (the known gaps) and what only
    received events have (rejections, soft failures: delta 0083)."""

    def setUp(self) -> None:
        self.db = AuditFixture(self)

    def event(self, stream_id: int, outlier: bool = False) -> str:
        """An event row of main's (its own extremity, as the fixture writes
        it); an outlier is no extremity."""
        self.db.write("events", "main", [stream_id])
        (event_id,) = self.db.execute(
            "SELECT event_id FROM events WHERE stream_ordering = ?", (stream_id,)
        )[0]
        if outlier:
            self.db.execute("UPDATE events SET outlier = TRUE WHERE event_id = ?", (event_id,))
            self.db.execute("DELETE FROM event_forward_extremities WHERE event_id = ?", (event_id,))
        return str(event_id)

    def edge(self, event_id: str, parent: str) -> None:
        self.db.execute("INSERT INTO event_edges VALUES (?, ?)", (event_id, parent))

    def test_known_gaps_are_not_findings(self) -> None:
        self.edge(self.event(1, outlier=True), "$before_the_outlier")
        self.edge(self.event(-1), "$not_backfilled_yet")
        self.position("backfill", -1)
        self.edge(self.event(2), "$recorded")
        self.edge(self.event(3), "$unexplained")
        self.position("events", 3)
        run = self.db.audit()
        self.assertEqual(
            [(f["kind"], f["ids"]) for f in run.findings()],
            [("missing_prev_event", [2, 3])],
            run,
        )
        # A recorded backward extremity is a known gap.
        self.db.execute("CREATE TABLE event_backward_extremities (event_id TEXT, room_id TEXT)")
        self.db.execute("INSERT INTO event_backward_extremities VALUES ('$recorded', '!r:test')")
        run = self.db.audit()
        (finding,) = run.findings()
        self.assertEqual((finding["kind"], finding["ids"]), ("missing_prev_event", [3]), run)
        self.assertEqual(finding["samples"][0]["parent"], "$unexplained")
        self.assertIn("$unexplained", finding["message"])

    def test_no_event_graph_checks_the_streams_only(self) -> None:
        self.edge(self.event(1), "$unexplained")
        self.db.write("account_data", "main", [1])
        self.db.write("room_account_data", "main", [1])  # the same id twice
        self.position("events", 1)
        self.db.position("account_data", "main", 1)
        run = self.db.audit()
        self.assertEqual(
            sorted(f["kind"] for f in run.findings()),
            ["duplicate_stream_id", "missing_prev_event"],
            run,
        )
        run = self.db.audit("--no-event-graph")
        self.assertEqual([f["kind"] for f in run.findings()], ["duplicate_stream_id"], run)
        self.assertIsNone(run.report["graph"])
        self.assertIn("the event graph's checks are left out (--no-event-graph)", run.err)

    def position(self, stream: str, value: int) -> None:
        self.db.position(stream, "main", value)

    def test_outliers_and_soft_failed_events_are_no_extremities(self) -> None:
        sqlite_pass_only(PLANTED)
        parent = self.event(1)
        child = self.event(2, outlier=True)
        self.edge(child, parent)
        self.position("events", 2)
        # The outlier child leaves its parent an extremity.
        self.assertEqual(self.db.audit().code, 0)
        # An outlier made an extremity is not in the graph.
        self.db.execute("INSERT INTO event_forward_extremities VALUES ('!r:test', ?)", (child,))
        run = self.db.audit()
        (finding,) = run.findings()
        self.assertEqual((finding["kind"], finding["ids"]), ("extremity_not_in_graph", [2]), run)
        self.assertEqual(finding["samples"][0]["reason"], "outlier")
        self.db.execute("DELETE FROM event_forward_extremities WHERE event_id = ?", (child,))

        # A soft-failed event is no extremity and leaves its parent one; a
        # soft-failed extremity is a finding.
        soft = self.event(3)
        self.edge(soft, parent)
        self.db.execute("UPDATE events SET soft_failed = TRUE WHERE event_id = ?", (soft,))
        self.position("events", 3)
        run = self.db.audit()
        (finding,) = run.findings()
        self.assertEqual((finding["kind"], finding["ids"]), ("extremity_not_in_graph", [3]), run)
        self.assertEqual(finding["samples"][0]["reason"], "soft-failed")
        self.db.execute("DELETE FROM event_forward_extremities WHERE event_id = ?", (soft,))
        self.assertEqual(self.db.audit().code, 0)

    def test_rejected_column_and_state(self) -> None:
        create = self.event(1)
        self.db.execute(
            "UPDATE events SET type = 'm.room.create', state_key = '' WHERE event_id = ?",
            (create,),
        )
        self.db.execute(
            "INSERT INTO current_state_events (room_id, type, state_key, event_id)"
            " VALUES ('!r:test', 'm.room.create', '', ?)",
            (create,),
        )
        self.position("events", 1)
        run = self.db.audit()
        self.assertEqual(run.code, 0, run)
        self.assertEqual(run.report["graph"]["not_checked"], {}, run)
        self.db.execute("UPDATE events SET rejected = TRUE WHERE event_id = ?", (create,))
        run = self.db.audit()
        self.assertEqual(
            [(f["kind"], f["ids"]) for f in run.findings()],
            [("extremity_not_in_graph", [1]), ("rejected_in_state", [1])],
            run,
        )
        sample = run.findings("rejected_in_state")[0]["samples"][0]
        self.assertEqual((sample["type"], sample["state_key"]), ("m.room.create", ""))
