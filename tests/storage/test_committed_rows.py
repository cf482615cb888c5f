"""The rows an events writer keeps from commit to send (``CommittedRows``):
what it answers from memory, when it sends the caller to the database (an id
without recorded rows, however it was taken), and that the rows it sends are
those the database holds."""

from __future__ import annotations

from typing import Any

from twisted.trial import unittest

from synapse_lite.events import Event, EventContent, random_event_id
from synapse_lite.replication.tcp.commands import RdataCommand
from synapse_lite.server import HomeServer
from synapse_lite.storage.databases.main import events as events_store
from synapse_lite.storage.databases.main.events import CommittedRows, stream_rows_of
from synapse_lite.storage.databases.main.events_worker import EventsWorkerStore
from synapse_lite.storage.id_generators import generator as id_generators
from synapse_lite.streams.catalog import BUILTIN_STREAMS
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase, LoopbackBus, make_config, make_homeserver


def content(state_key: str | None) -> EventContent:
    """A message, or with ``state_key`` a topic (a state event)."""
    return EventContent(
        event_id=random_event_id("test.local"),
        room_id="!room:test.local",
        type="m.room.topic" if state_key is not None else "m.room.message",
        state_key=state_key,
        sender="@alice:test.local",
        content={"topic": "t"} if state_key is not None else {"body": "b"},
        origin_server_ts=1,
    )


def event(stream_id: int, state_key: str | None = None) -> Event:
    """``content(state_key)`` as persisted with ``stream_id``."""
    c = content(state_key)
    return Event(
        event_id=f"$e{stream_id}", room_id=c.room_id, type=c.type, state_key=c.state_key,
        sender=c.sender, content=c.content, origin_server_ts=c.origin_server_ts,
        stream_ordering=stream_id, depth=stream_id, instance_name="me",
    )  # fmt: skip


class CommittedRowsTestCase(unittest.TestCase):
    def test_rows_of_committed_ids_come_from_memory(self) -> None:
        rows = CommittedRows("x")
        rows.allocated([1, 2])
        rows.committed([event(1), event(2, state_key="")])
        self.assertEqual(
            rows.rows(0, 2),
            [(1, r) for r in stream_rows_of(event(1), "x")]
            + [(2, r) for r in stream_rows_of(event(2, ""), "x")],
        )
        # An event and its current-state row, in that order.
        self.assertEqual(len(stream_rows_of(event(2, ""), "x")), 2)

    def test_an_id_without_rows_sends_the_caller_to_the_database(self) -> None:
        rows = CommittedRows("x")
        rows.allocated([1])
        rows.allocated([2])  # its transaction failed: never committed
        rows.committed([event(1)])
        self.assertIsNone(rows.rows(0, 2))
        self.assertEqual(rows.rows(0, 1), [(1, r) for r in stream_rows_of(event(1), "x")])
        # Once the streamer is past id 2 it is forgotten.
        rows.allocated([3])
        rows.committed([event(3)])
        self.assertEqual(rows.rows(2, 3), [(3, r) for r in stream_rows_of(event(3), "x")])

    def test_a_range_before_what_was_forgotten_is_not_answered(self) -> None:
        rows = CommittedRows("x")
        rows.allocated([1, 2])
        rows.committed([event(1), event(2)])
        self.assertIsNotNone(rows.rows(1, 2))  # id 1 sent: forgotten
        self.assertIsNone(rows.rows(0, 2))

    def test_too_many_unsent_ids_are_forgotten(self) -> None:
        rows = CommittedRows("x")
        ids = list(range(1, events_store.MAX_COMMITTED_IDS + 2))
        rows.allocated(ids)
        rows.committed([event(i) for i in ids])
        self.assertIsNone(rows.rows(0, ids[-1]))
        rows.allocated([ids[-1] + 1])
        rows.committed([event(ids[-1] + 1)])
        self.assertEqual(len(rows.rows(ids[-1], ids[-1] + 1) or []), 1)


class SentRowsTestCase(DatabaseTestCase):
    async def start(self) -> tuple[HomeServer, HomeServer, LoopbackBus]:
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)
        config = make_config(
            self.test_db, workers=["persister1"], stream_writers={"events": ["persister1"]}
        )
        main = make_homeserver(self, config, "main")
        p1 = make_homeserver(self, config, "persister1")
        bus = LoopbackBus()
        bus.join(main)
        bus.join(p1)
        await eventually(lambda: main.replication.connected and p1.replication.connected)
        return main, p1, bus

    async def test_an_id_taken_outside_persist_events_is_read_from_the_database(self) -> None:
        main, p1, bus = await self.start()
        allocation = p1.store._stream_id_gen.get_next()
        stream_id = await allocation.__aenter__()
        await p1.store.db_pool.execute(
            "insert_by_hand",
            "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id, type,"
            " sender, origin_server_ts, content, instance_name)"
            " VALUES (?, 1, '$by-hand', '!room:test.local', 'm.room.message', '@a:test.local',"
            " 1, '{}', 'persister1')",
            stream_id,
        )
        await allocation.__aexit__(None, None, None)
        [persisted] = await p1.store.persist_events([content(None)])
        await main.waiters.wait_for_stream_position(
            "persister1", "events", persisted.stream_ordering, timeout=5
        )
        sent = [
            BUILTIN_STREAMS["events"].parse_row(c.row).event_id
            for _, c in bus.published
            if isinstance(c, RdataCommand) and c.stream_name == "events"
        ]
        self.assertEqual(sent, ["$by-hand", persisted.event_id])

    async def test_the_writer_sends_what_the_database_holds_without_reading_it(self) -> None:
        main, p1, bus = await self.start()
        reads: list[str] = []
        real = p1.store.db_pool.runInteraction

        async def counting(desc: str, *args: Any, **kwargs: Any) -> Any:
            reads.append(desc)
            return await real(desc, *args, **kwargs)

        self.patch(p1.store.db_pool, "runInteraction", counting)

        persisted = await p1.store.persist_events([content(None), content(""), content(None)])
        last = persisted[-1].stream_ordering
        await main.waiters.wait_for_stream_position("persister1", "events", last, timeout=5)
        definition = BUILTIN_STREAMS["events"]
        sent = [
            (c.token, definition.parse_row(c.row))
            for _, c in bus.published
            if isinstance(c, RdataCommand) and c.stream_name == "events"
        ]
        stored, _, _ = await EventsWorkerStore.get_events_stream_updates(
            p1.store, "persister1", 0, last, 100
        )
        # The rows committed in one reactor turn go as one batch: only the
        # last line carries the token, the batch's highest id
        # (docs/architecture.md, "Batches").
        self.assertEqual([row for _, row in sent], [row for _, row in stored])
        tokens = [t for t, _ in sent if t is not None]
        self.assertEqual(tokens, [persisted[-1].stream_ordering])
        self.assertNotIn("get_events_stream_updates", reads[:-1])
