"""Events this server made just now need no redactions read when a /sync
of the process that made them (the room's events writer: the monolith
here) serves them (issue 35), and are served redacted once a redaction of
them comes, there and on a reader that learns of both from the events
stream (SQLite and PostgreSQL)."""

from __future__ import annotations

import uuid
from typing import Any

from twisted.trial import unittest

from synapse_lite.storage.database import LoggingTransaction
from synapse_lite.storage.databases.main.events_worker import UnredactedEvents
from tests.harness.client_api import ClientApi, caught_up, start_cluster
from tests.harness.server import DatabaseTestCase


def count_redaction_reads(test: unittest.TestCase) -> list[list[str]]:
    """The event ids of every redactions read run from now on (any process
    of the test: they share the class)."""
    reads: list[list[str]] = []
    execute = LoggingTransaction.execute

    def counting(txn: LoggingTransaction, sql: str, args: Any = ()) -> None:
        if "type = 'm.room.redaction' AND redacts IN" in sql:
            reads.append(list(args))
        execute(txn, sql, args)

    test.patch(LoggingTransaction, "execute", counting)
    return reads


def timeline_event(sync: dict[str, Any], room_id: str, event_id: str) -> dict[str, Any]:
    for event in sync["rooms"]["join"][room_id]["timeline"]["events"]:
        if event["event_id"] == event_id:
            found: dict[str, Any] = event
            return found
    raise AssertionError(f"{event_id} not in the timeline")


class UnredactedEventsTests(unittest.TestCase):
    def test_remembered_until_forgotten(self) -> None:
        unredacted = UnredactedEvents()
        unredacted.remember(["$a", "$b"])
        self.assertEqual(unredacted.unknown(["$a", "$b", "$c"]), ["$c"])
        unredacted.forget("$a")
        self.assertEqual(unredacted.unknown(["$a", "$b"]), ["$a"])
        unredacted.forget_all()
        self.assertEqual(unredacted.unknown(["$b"]), ["$b"])

    def test_the_oldest_goes_first_when_full(self) -> None:
        unredacted = UnredactedEvents(max_entries=2)
        unredacted.remember(["$a", "$b", "$c"])
        self.assertEqual(unredacted.unknown(["$a", "$b", "$c"]), ["$a"])


class UnredactedEventsTestCase(DatabaseTestCase):
    workers: list[str] = []
    stream_writers: dict[str, Any] | None = None
    entry = "main"
    #: Whether the entry made the events (else it reads their redactions).
    made_by_entry = True

    async def test_no_redactions_read_then_the_redaction_shows(self) -> None:
        servers, clients, _ = start_cluster(
            self, self.test_db, workers=self.workers, stream_writers=self.stream_writers
        )
        writer = (self.stream_writers or {}).get("events", ["main"])[0]
        alice = await ClientApi(self, clients[self.entry].base_url).register("alice")
        room = await alice.create_room(preset="public_chat")
        first = await alice.sync()
        kept = await alice.send(room, "kept")
        doomed = await alice.send(room, "doomed")
        await caught_up(servers, writer)
        reads = count_redaction_reads(self)
        second = await alice.sync(since=first["next_batch"])
        self.assertEqual(timeline_event(second, room, doomed)["content"]["body"], "doomed")
        # Made here: neither is read for its redactions.
        self.assertEqual(not [r for r in reads if kept in r or doomed in r], self.made_by_entry)

        await alice.ok(
            "PUT", f"/rooms/{room}/redact/{doomed}/{uuid.uuid4().hex}", {"reason": "oops"}
        )
        await caught_up(servers, writer)
        del reads[:]
        third = await alice.sync(since=first["next_batch"])
        redacted = timeline_event(third, room, doomed)
        self.assertEqual(redacted["content"], {})
        self.assertIn("redacted_because", redacted["unsigned"])
        self.assertEqual(timeline_event(third, room, kept)["content"]["body"], "kept")
        self.assertTrue([r for r in reads if doomed in r])
        self.assertEqual(not [r for r in reads if kept in r], self.made_by_entry)

    async def test_a_drop_while_persisting_remembers_nothing(self) -> None:
        servers, clients, _ = start_cluster(
            self, self.test_db, workers=self.workers, stream_writers=self.stream_writers
        )
        store = servers[(self.stream_writers or {}).get("events", ["main"])[0]].store
        alice = await ClientApi(self, clients[self.entry].base_url).register("alice")
        room = await alice.create_room(preset="public_chat")
        event_id = await alice.send(room, "hello")
        event = await store.get_event(event_id)
        assert event is not None
        store._unredacted_events.forget_all()
        drops = store.event_cache_drops()
        store.invalidate_event_cache("$another")
        store.remember_made_unredacted([event], drops)
        self.assertEqual(store._unredacted_events.unknown([event_id]), [event_id])
        store.remember_made_unredacted([event], store.event_cache_drops())
        self.assertEqual(store._unredacted_events.unknown([event_id]), [])


class UnredactedEventsThroughWorkersTestCase(UnredactedEventsTestCase):
    workers = ["writer1", "reader1"]
    stream_writers = {"events": ["writer1"]}
    entry = "reader1"
    made_by_entry = False
