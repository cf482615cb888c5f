"""Replication between processes sharing one database, over an in-memory bus
that uses the real wire format: RDATA, POSITION, catch-up, echoes, idle writers."""

from __future__ import annotations

import itertools
from typing import Any

from twisted.internet import defer, reactor, task

from synapse_lite.events import EventContent, random_event_id
from synapse_lite.replication.tcp.commands import PositionCommand, RdataCommand
from synapse_lite.server import HomeServer
from synapse_lite.storage.id_generators import generator as id_generators
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase, LoopbackBus, make_config, make_homeserver

_counter = itertools.count()


def message(room_id: str = "!room:test.local", body: str = "hi") -> EventContent:
    return EventContent(
        event_id=random_event_id("test.local"),
        room_id=room_id,
        type="m.room.message",
        state_key=None,
        sender="@alice:test.local",
        content={"msgtype": "m.text", "body": f"{body} {next(_counter)}"},
        origin_server_ts=1,
    )


class ReplicationHandlerTestCase(DatabaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)

    def start(
        self, workers: list[str], events: list[str], echo: bool = False
    ) -> dict[str, HomeServer]:
        config = make_config(self.test_db, workers=workers, stream_writers={"events": events})
        servers = {"main": make_homeserver(self, config, "main")}
        for name in workers:
            servers[name] = make_homeserver(self, config, name)
        self.bus = LoopbackBus(echo=echo)
        self.endpoints = {name: self.bus.join(hs) for name, hs in servers.items()}
        return servers

    async def test_rdata_reaches_other_process(self) -> None:
        servers = self.start(["persister1"], ["persister1"])
        main, p1 = servers["main"], servers["persister1"]
        await eventually(lambda: main.replication.connected)
        invalidated: list[str] = []
        main.replication.receiver.add_row_hook(
            "events",
            lambda instance, token, rows: invalidated.extend(
                r.event_id for r in rows if hasattr(r, "event_id")
            ),
        )
        [event] = await p1.store.persist_events([message()])
        await main.waiters.wait_for_stream_position(
            "persister1", "events", event.stream_ordering, timeout=5
        )
        self.assertEqual(invalidated, [event.event_id])
        self.assertEqual(
            main.store.get_room_max_token().get_position("persister1"), event.stream_ordering
        )
        self.assertEqual((await main.store.get_event(event.event_id)), event)
        rdata = [c for _, c in self.bus.published if isinstance(c, RdataCommand)]
        self.assertEqual(
            [(c.stream_name, c.instance_name, c.token) for c in rdata if c.stream_name == "events"],
            [("events", "persister1", event.stream_ordering)],
        )

    async def test_catch_up_in_pages_after_reconnect(self) -> None:
        servers = self.start(["persister1"], ["persister1"])
        main, p1 = servers["main"], servers["persister1"]
        seen: list[str] = []
        main.replication.receiver.add_row_hook(
            "events",
            lambda instance, token, rows: seen.extend(
                r.event_id for r in rows if hasattr(r, "event_id")
            ),
        )
        self.bus.leave(self.endpoints["main"])
        persisted = []
        for _ in range(5):
            persisted += await p1.store.persist_events([message() for _ in range(50)])
        last = persisted[-1].stream_ordering
        events_stream = p1.replication.streams["events"]
        await eventually(
            lambda: events_stream.last_sent_position == last, what="p1 to send its rows"
        )

        def event_rdata() -> int:
            return len(
                [
                    c
                    for _, c in self.bus.published
                    if isinstance(c, RdataCommand) and c.stream_name == "events"
                ]
            )

        self.assertEqual(event_rdata(), 250)  # sent once, while main was away
        pages: list[tuple[int, int]] = []
        stream = main.replication.streams["events"]
        real_update_function = stream._update_function

        async def counting_update_function(*args: Any) -> Any:
            updates, upto, limited = await real_update_function(*args)
            pages.append((len(updates), upto))
            return updates, upto, limited

        stream._update_function = counting_update_function
        self.endpoints["main"] = self.bus.join(main)
        await main.waiters.wait_for_stream_position("persister1", "events", last, timeout=5)
        # Rejoining sent no old rows again: main read all 250 itself, in order,
        # in pages (more than one batch of the update function).
        self.assertEqual(event_rdata(), 250)
        self.assertEqual(seen, [e.event_id for e in persisted])
        self.assertEqual([n for n, _ in pages], [100, 100, 50])

    async def test_own_echo_is_ignored(self) -> None:
        servers = self.start(["persister1"], ["persister1"], echo=True)
        main, p1 = servers["main"], servers["persister1"]
        processed: list[tuple[str, int]] = []
        p1.replication.receiver.add_row_hook(
            "events", lambda instance, token, rows: processed.append((instance, token))
        )
        [event] = await p1.store.persist_events([message()])
        await main.waiters.wait_for_stream_position(
            "persister1", "events", event.stream_ordering, timeout=5
        )
        await task.deferLater(reactor, 0.05, lambda: None)
        echoed = [
            c
            for sender, c in self.bus.published
            if sender == "persister1" and isinstance(c, RdataCommand)
        ]
        self.assertTrue(echoed)  # the bus did deliver p1's own RDATA back to it...
        self.assertEqual(processed, [])  # ...and p1 ignored it

    async def test_idle_writer_lets_persisted_upto_advance(self) -> None:
        """Only persister1 writes; persister2, idle, announces how far it has
        got, so the minimum over writers (main's current token) advances.

        Id 1 is lost (taken by a transaction that crashed), so main cannot
        advance by counting ids: only persister2's announcement moves it.
        """
        servers = self.start(["persister1", "persister2"], ["persister1", "persister2"])
        main, p1 = servers["main"], servers["persister1"]
        await eventually(lambda: main.replication.connected)

        def waste_id(txn: Any) -> None:
            txn.database_engine.sequence_next_values(txn.raw_cursor, "events_stream_seq", 1)

        await p1.store.db_pool.runInteraction("crashed_txn", waste_id)
        events = await p1.store.persist_events([message() for _ in range(5)])
        last = events[-1].stream_ordering
        start = reactor.seconds()
        await eventually(
            lambda: main.store._stream_id_gen.persisted_upto_position() >= last,
            timeout=3,
            what="persisted-up-to to pass the idle writer",
        )
        self.assertLess(reactor.seconds() - start, 2.5)
        positions = [
            c
            for s, c in self.bus.published
            if s == "persister2" and isinstance(c, PositionCommand) and c.stream_name == "events"
        ]
        self.assertTrue(any(c.new_token >= last for c in positions))

    async def test_out_of_order_writers_never_skip_or_repeat(self) -> None:
        """persister1 holds id 1 in flight while persister2 persists 2 and 3; a
        reader paging by tokens sees every event exactly once."""
        servers = self.start(["persister1", "persister2"], ["persister1", "persister2"])
        main, p1, p2 = servers["main"], servers["persister1"], servers["persister2"]
        await eventually(lambda: main.replication.connected)
        store = main.store
        room = "!ooo:test.local"
        read: list[str] = []
        from_token = store.get_room_max_token()

        async def read_up_to_now() -> None:
            nonlocal from_token
            to_token = store.get_room_max_token()
            events = await store.get_room_events_between(
                [room], from_token, to_token, 1000, newest_first=False
            )
            read.extend(e.event_id for e in events)
            from_token = to_token

        slow = p1.store._stream_id_gen.get_next()
        slow_id = await slow.__aenter__()
        fast = await p2.store.persist_events([message(room), message(room)])
        await main.waiters.wait_for_stream_position(
            "persister2", "events", fast[-1].stream_ordering, timeout=5
        )
        await read_up_to_now()
        self.assertEqual(read, [e.event_id for e in fast])

        slow_event_id = random_event_id("test.local")
        await p1.store.db_pool.execute(
            "insert_slow",
            "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id, type,"
            " sender, origin_server_ts, content, instance_name)"
            " VALUES (?, 1, ?, ?, 'm.room.message', '@bob:test.local', 1, '{}', 'persister1')",
            slow_id,
            slow_event_id,
            room,
        )
        await slow.__aexit__(None, None, None)
        await main.waiters.wait_for_stream_position("persister1", "events", slow_id, timeout=5)
        await read_up_to_now()
        more = await p2.store.persist_events([message(room)])
        await main.waiters.wait_for_stream_position(
            "persister2", "events", more[0].stream_ordering, timeout=5
        )
        await read_up_to_now()
        expected = [e.event_id for e in fast] + [slow_event_id, more[0].event_id]
        self.assertEqual(sorted(read), sorted(expected))
        self.assertEqual(len(read), len(set(read)))

    async def test_wait_for_stream_position_times_out(self) -> None:
        servers = self.start(["persister1"], ["persister1"])
        d = defer.ensureDeferred(
            servers["main"].waiters.wait_for_stream_position(
                "persister1", "events", 10_000, timeout=0.2
            )
        )
        with self.assertRaises(defer.TimeoutError):
            await d

    async def test_rows_of_every_store_stream_reach_other_processes(self) -> None:
        """Store update functions return tuples; what goes on the wire must be
        lists, or the streamer fails to encode RDATA and nothing is sent."""
        servers = self.start(["persister1"], ["persister1"])
        main, p1 = servers["main"], servers["persister1"]
        await eventually(lambda: p1.replication.connected)
        received: list[tuple[str, Any]] = []

        def hook(stream: str) -> Any:
            return lambda instance, token, rows: received.extend((stream, r) for r in rows)

        for stream in ("receipts", "caches", "device_lists"):
            p1.replication.receiver.add_row_hook(stream, hook(stream))
        receipt_id = await main.store.insert_receipt(
            "!room:test.local", "m.read", "@alice:test.local", "$event", {"ts": 1}
        )
        assert receipt_id is not None
        await main.store.register_user("@alice:test.local", None)
        await main.store.replace_access_tokens("@alice:test.local", "DEV", "ab" * 32, None)
        await main.store.delete_devices("@alice:test.local", ["DEV"])
        await p1.waiters.wait_for_stream_position("main", "receipts", receipt_id, timeout=5)
        await eventually(
            lambda: {s for s, _ in received} == {"receipts", "caches", "device_lists"},
            what="rows of receipts, caches and device_lists",
        )
        rows = dict(received)
        self.assertEqual(rows["receipts"].event_id, "$event")
        self.assertEqual(rows["device_lists"].device_id, "DEV")
        self.assertEqual(rows["caches"].cache_func, "get_user_by_access_token")


class _FakeConnection:
    """A connection we hand commands through ourselves."""

    vouches_for_claims = False

    def send_command(self, cmd: Any) -> None:
        pass

    def describe(self) -> str:
        return "fake"


class LiftedPositionTestCase(DatabaseTestCase):
    """Another writer's announcement must not lift a writer's position past
    rows of it this process has not processed: a POSITION is not a finished id
    (the idle persister2 may announce an id persister1 has in flight or has
    not sent us yet). The row must still be processed, and tokens must not
    cover it before."""

    async def test_rows_below_an_announced_position_are_processed(self) -> None:
        config = make_config(
            self.test_db,
            workers=["persister1", "persister2"],
            stream_writers={"events": ["persister1", "persister2"]},
        )
        main = make_homeserver(self, config, "main")
        handler = main.replication
        connection = _FakeConnection()
        handler.new_connection(connection)
        seen: list[str] = []
        handler.receiver.add_row_hook(
            "events",
            lambda instance, token, rows: seen.extend(
                r.event_id for r in rows if hasattr(r, "event_id")
            ),
        )
        for writer in ("persister1", "persister2"):
            handler.on_command(connection, PositionCommand("events", writer, 0, 0))
        await eventually(lambda: main.store.get_room_max_token().stream == 0)
        # persister1 allocates id 1 (the sequence hands it out: a claim up to
        # it is believable); persister2, idle, has seen persister1 reach 1 and
        # says so first (Redis does not order messages of different publishers).
        pool = main.store.db_pool
        await pool.runInteraction(
            "allocate",
            lambda txn: pool.engine.sequence_next_values(txn.raw_cursor, "events_stream_seq", 1),
        )
        handler.on_command(connection, PositionCommand("events", "persister2", 0, 1))
        events_stream = handler.streams["events"]
        await eventually(lambda: events_stream.positions.writer_position("persister2") == 1)
        # persister1 is not lifted, and no token covers its unprocessed row...
        self.assertEqual(events_stream.positions.writer_position("persister1"), 0)
        self.assertEqual(main.store.get_room_max_token().get_position("persister1"), 0)
        row = ["ev", ["$late", "!room:test.local", "m.room.message", *[None] * 4, *[False] * 3]]
        handler.on_command(connection, RdataCommand("events", "persister1", 1, row))
        # ...and the row itself must not be dropped as old.
        await eventually(lambda: seen == ["$late"], what="the row to be processed")
        self.assertEqual(main.store.get_room_max_token().get_position("persister1"), 1)
