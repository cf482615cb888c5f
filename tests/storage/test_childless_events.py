"""Bundled aggregations of events known to have no child need no read
(issue 35), and stay right when a child comes later: on the events' writer,
and on a reader that learns of the event and then of the child from the
events stream (SQLite and PostgreSQL)."""

from __future__ import annotations

import uuid
from typing import Any

from twisted.trial import unittest

from synapse_lite.server import HomeServer
from synapse_lite.storage.databases.main.relations import ChildlessEvents
from tests.harness.client_api import ClientApi, caught_up, start_cluster
from tests.harness.server import DatabaseTestCase


def count_reads(test: unittest.TestCase, hs: HomeServer) -> list[list[str]]:
    """The parent ids of every aggregated-relations query ``hs`` runs from now on."""
    reads: list[list[str]] = []
    store = hs.store
    pool_select = store.db_pool.select

    async def select(desc: str, sql: str, *args: Any) -> Any:
        if desc == "get_aggregated_relations":
            reads.append([a for a in args if isinstance(a, str)])
        return await pool_select(desc, sql, *args)

    test.patch(store.db_pool, "select", select)
    return reads


async def reply(client: ClientApi, room_id: str, parent: str, rel_type: str) -> str:
    content: dict[str, Any] = {
        "msgtype": "m.text",
        "body": "reply",
        "m.relates_to": {"rel_type": rel_type, "event_id": parent},
    }
    result = await client.ok(
        "PUT", f"/rooms/{room_id}/send/m.room.message/{uuid.uuid4().hex}", content
    )
    event_id: str = result["event_id"]
    return event_id


def bundle(sync: dict[str, Any], room_id: str, event_id: str) -> Any:
    for event in sync["rooms"]["join"][room_id]["timeline"]["events"]:
        if event["event_id"] == event_id:
            return event.get("unsigned", {}).get("m.relations")
    raise AssertionError(f"{event_id} not in the timeline")


class ChildlessEventsTests(unittest.TestCase):
    def test_fresh_events_are_childless_but_for_relations_seen_first(self) -> None:
        childless = ChildlessEvents()
        childless.related_to(["$early"])  # a relation arrived before its parent
        childless.fresh(["$a", "$early"])
        self.assertEqual(childless.unknown(["$a", "$early"]), ["$early"])
        childless.related_to(["$a"])
        self.assertEqual(childless.unknown(["$a"]), ["$a"])

    def test_a_read_overtaken_by_a_relation_remembers_nothing(self) -> None:
        childless = ChildlessEvents()
        generation = childless.generation
        childless.related_to(["$b"])
        childless.found_childless(["$a", "$b"], generation)
        self.assertEqual(childless.unknown(["$a", "$b"]), ["$a", "$b"])
        childless.found_childless(["$a", "$b"], childless.generation)
        self.assertEqual(childless.unknown(["$a", "$b", "$c"]), ["$c"])
        childless.related_to(["$a"])
        self.assertEqual(childless.unknown(["$a", "$b"]), ["$a"])
        childless.forget_all()
        self.assertEqual(childless.unknown(["$b"]), ["$b"])


class ChildlessEventsTestCase(DatabaseTestCase):
    workers: list[str] = []
    stream_writers: dict[str, Any] | None = None
    entry = "main"

    async def test_bundles_read_once_then_a_child_shows(self) -> None:
        servers, clients, _ = start_cluster(
            self, self.test_db, workers=self.workers, stream_writers=self.stream_writers
        )
        reader = servers[self.entry]
        alice = await ClientApi(self, clients[self.entry].base_url).register("alice")
        room = await alice.create_room(preset="public_chat")
        first = await alice.sync()
        parent = await alice.send(room, "root")
        await caught_up(servers, (self.stream_writers or {}).get("events", ["main"])[0])
        reads = count_reads(self, reader)
        second = await alice.sync(since=first["next_batch"])
        self.assertIsNone(bundle(second, room, parent))
        again = await alice.sync(since=first["next_batch"])
        self.assertIsNone(bundle(again, room, parent))
        # Its writer made it, a reader had it from the events stream: no read.
        self.assertEqual(sum(parent in r for r in reads), 0)
        child = await reply(alice, room, parent, "m.thread")
        await caught_up(servers, (self.stream_writers or {}).get("events", ["main"])[0])
        third = await alice.sync(since=first["next_batch"])
        thread = bundle(third, room, parent)["m.thread"]
        self.assertEqual(thread["latest_event"]["event_id"], child)
        self.assertEqual(thread["count"], 1)


class ChildlessEventsThroughWorkersTestCase(ChildlessEventsTestCase):
    workers = ["writer1", "reader1"]
    stream_writers = {"events": ["writer1"]}
    entry = "reader1"
