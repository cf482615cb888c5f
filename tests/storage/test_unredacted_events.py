"""Events this server made need no redactions read when a /sync serves
them (issue 35), on the process that made them (the monolith) and on a
reader that learns of them from the events stream, and are served redacted
once a redaction of them comes (SQLite and PostgreSQL)."""

from __future__ import annotations

import uuid
from typing import Any

from twisted.trial import unittest

from synapse_lite.storage.database import LoggingTransaction
from synapse_lite.storage.databases.main.events import event_row_of
from synapse_lite.storage.databases.main.events_worker import UnredactedEvents
from synapse_lite.streams.catalog import EventsStreamEventRow
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

    def test_once_forgotten_never_remembered(self) -> None:
        """A redaction that arrived before its target keeps it unknown."""
        unredacted = UnredactedEvents()
        unredacted.forget("$target")
        unredacted.remember(["$target", "$other"])
        self.assertEqual(unredacted.unknown(["$target", "$other"]), ["$target"])

    def test_the_oldest_goes_first_when_full(self) -> None:
        unredacted = UnredactedEvents(max_entries=2)
        unredacted.remember(["$a", "$b", "$c"])
        self.assertEqual(unredacted.unknown(["$a", "$b", "$c"]), ["$a"])
        for event_id in ("$x", "$y", "$z"):
            unredacted.forget(event_id)
        unredacted.remember(["$x", "$z"])
        self.assertEqual(unredacted.unknown(["$x", "$z"]), ["$z"])


class UnredactedEventsTestCase(DatabaseTestCase):
    workers: list[str] = []
    stream_writers: dict[str, Any] | None = None
    entry = "main"

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
        # Made by this server: neither is read for its redactions.
        self.assertFalse([r for r in reads if kept in r or doomed in r])

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
        self.assertFalse([r for r in reads if kept in r])

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


class RowsFromTheEventsStreamTestCase(DatabaseTestCase):
    """A follower remembers the events its rows say this server made,
    unless a redaction of one came first or in the same batch; never
    another server's; and the writer's rows, sent from memory or read back
    from the database, say which are ours."""

    async def test_local_rows_remembered_but_for_redactions_seen(self) -> None:
        servers, _, _ = start_cluster(self, self.test_db, workers=["reader1"])
        store = servers["reader1"].store

        def row(event_id: str, local: bool = True, redacts: str | None = None) -> Any:
            return EventsStreamEventRow(
                event_id, "!r:x", "m.room.message", None, redacts, None, None, False, False, local
            )

        store.invalidate_for_events_rows("main", 1, [row("$early-redaction", redacts="$late")])
        store.invalidate_for_events_rows(
            "main",
            2,
            [
                row("$ours"),
                row("$theirs", local=False),
                row("$late"),
                row("$same-batch"),
                row("$r", redacts="$same-batch"),
            ],
        )
        self.assertEqual(
            store._unredacted_events.unknown(["$ours", "$theirs", "$late", "$same-batch", "$r"]),
            ["$theirs", "$late", "$same-batch"],
        )

    async def test_the_writer_marks_its_users_events_local(self) -> None:
        servers, clients, _ = start_cluster(self, self.test_db, workers=["reader1"])
        alice = await ClientApi(self, clients["main"].base_url).register("alice")
        room = await alice.create_room(preset="public_chat")
        event_id = await alice.send(room, "hello")
        store = servers["main"].store
        position = store.get_room_max_stream_ordering()
        updates, _, _ = await store.get_events_stream_updates("main", 0, position, 1000)
        rows = {r.event_id: r for _, r in updates if isinstance(r, EventsStreamEventRow)}
        self.assertTrue(rows[event_id].local)
        event = await store.get_event(event_id)
        assert event is not None
        self.assertFalse(event_row_of(event, "other.example").local)
