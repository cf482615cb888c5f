"""Adding and retiring an events writer while the other processes keep running
with the config they started with (in-process, over the in-memory bus)."""

from __future__ import annotations

from functools import partial
from typing import Any

from twisted.internet import protocol, reactor

from synapse_lite.api.errors import SynapseError
from synapse_lite.config.homeserver import InstanceLocation
from synapse_lite.replication.http.instances import RETIRE_EVENTS_WRITER, WriterToRetire
from synapse_lite.server import HomeServer
from synapse_lite.storage.databases.main.instances import InstancesWorkerStore
from synapse_lite.storage.id_generators import generator as id_generators
from synapse_lite.streams.catalog import EventsStreamEventRow
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase, LoopbackBus, make_config, make_homeserver
from tests.replication.test_handler import message


class InstanceDirectoryTestCase(DatabaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)
        self.bus = LoopbackBus()
        self.endpoints: dict[str, Any] = {}

    def start(self, workers: list[str], events: list[str], *names: str) -> dict[str, HomeServer]:
        config = make_config(self.test_db, workers=workers, stream_writers={"events": events})
        servers = {}
        for name in names:
            servers[name] = make_homeserver(self, config, name)
            self.endpoints[name] = self.bus.join(servers[name])
        return servers

    def seen_events(self, hs: HomeServer) -> list[str]:
        seen: list[str] = []
        hs.replication.receiver.add_row_hook(
            "events",
            lambda instance, token, rows: seen.extend(
                r.event_id for r in rows if isinstance(r, EventsStreamEventRow)
            ),
        )
        return seen

    async def test_added_writer_is_learnt_by_running_processes(self) -> None:
        old = self.start(["persister1", "sync"], ["persister1"], "main", "persister1", "sync")
        main, sync = old["main"], old["sync"]
        self.assertEqual(main.directory.event_writers(), ("persister1",))

        # persister3 starts with a config that lists it; the others keep theirs.
        new = self.start(
            ["persister1", "sync", "persister3"],
            ["persister1", "persister3"],
            "persister3",
        )
        p3 = new["persister3"]
        for hs in (main, sync):
            await eventually(
                partial(lambda hs: "persister3" in hs.directory.event_writers(), hs),
                what=f"{hs.instance_name} to learn of persister3",
            )
            self.assertEqual(
                hs.directory.locations_of("persister3"),
                [p3.config.location_of("persister3")],
            )
        with self.assertRaises(KeyError):
            main.config.location_of("persister3")  # only the table knew it

        seen = self.seen_events(sync)
        events = await p3.store.persist_events([message() for _ in range(3)])
        last = events[-1].stream_ordering
        for hs in (main, sync):
            await hs.waiters.wait_for_stream_position("persister3", "events", last, timeout=5)
        self.assertEqual(seen, [e.event_id for e in events])
        # The idle persister1 lets the stream move on everywhere.
        for hs in (main, sync):
            await eventually(
                partial(lambda hs: hs.store.get_room_max_stream_ordering() >= last, hs),
                what=f"persisted-up-to on {hs.instance_name}",
            )

    async def test_retired_writer_is_read_to_its_end_then_forgotten(self) -> None:
        servers = self.start(
            ["persister1", "persister2", "sync"],
            ["persister1", "persister2"],
            "main",
            "persister1",
            "persister2",
            "sync",
        )
        main, p1, p2, sync = (servers[n] for n in ("main", "persister1", "persister2", "sync"))
        seen = {name: self.seen_events(servers[name]) for name in ("main", "sync")}
        first = await p2.store.persist_events([message()])
        await sync.waiters.wait_for_stream_position(
            "persister2", "events", first[0].stream_ordering, timeout=5
        )

        # persister2 persists two events nobody hears about, then stops.
        self.bus.leave(self.endpoints["persister2"])
        unheard = await p2.store.persist_events([message(), message()])
        await p2.store._stream_id_gen.flush_stream_positions()
        await p2.service.stopService()

        # persister1 goes on; persister2's last known position holds the
        # stream back on the others.
        later = await p1.store.persist_events([message() for _ in range(3)])
        last = later[-1].stream_ordering
        await sync.waiters.wait_for_stream_position("persister1", "events", last, timeout=5)
        self.assertLess(sync.store.get_room_max_stream_ordering(), last)

        answer = await main.calls.call(RETIRE_EVENTS_WRITER, WriterToRetire("persister2"))
        self.assertEqual(answer.retired, True)
        self.assertEqual(answer.events_writers, ["persister1"])
        for hs in (main, sync, p1):
            await eventually(
                partial(lambda hs: hs.directory.event_writers() == ("persister1",), hs),
                what=f"{hs.instance_name} to retire persister2",
            )
            await eventually(
                partial(lambda hs: hs.store.get_room_max_stream_ordering() >= last, hs),
                what=f"persisted-up-to on {hs.instance_name} to pass persister2",
            )
            self.assertNotIn("persister2", hs.store._stream_id_gen.known_writer_positions())
        # Nothing persister2 wrote was skipped or delivered twice.
        everything = [first[0].event_id, *(e.event_id for e in unheard + later)]
        for name in ("main", "sync"):
            self.assertEqual(sorted(seen[name]), sorted(everything))

        # Retiring again changes nothing.
        again = await main.calls.call(RETIRE_EVENTS_WRITER, WriterToRetire("persister2"))
        self.assertEqual(again.retired, False)

    async def test_retire_refuses_a_running_or_last_writer(self) -> None:
        servers = self.start(
            ["persister1", "persister2"], ["persister1", "persister2"], "main", "persister1"
        )
        main = servers["main"]
        # Something answers where persister2 listens: it is still running.
        [location] = main.directory.locations_of("persister2")
        factory = protocol.ServerFactory()
        factory.protocol = protocol.Protocol
        port = reactor.listenTCP(location.port, factory, interface=location.host)
        with self.assertRaises(SynapseError) as cm:
            await main.calls.call(RETIRE_EVENTS_WRITER, WriterToRetire("persister2"))
        self.assertEqual(cm.exception.code, 409)
        self.assertIn("stop it first", cm.exception.msg)
        await port.stopListening()  # type: ignore[misc]

        await main.calls.call(RETIRE_EVENTS_WRITER, WriterToRetire("persister2"))
        with self.assertRaises(SynapseError) as cm:
            await main.calls.call(RETIRE_EVENTS_WRITER, WriterToRetire("persister1"))
        self.assertIn("only events writer", cm.exception.msg)
        # persister1 heard and forgot persister2 before the test ends.
        p1_positions = servers["persister1"].store._stream_id_gen.known_writer_positions
        await eventually(lambda: "persister2" not in p1_positions(), what="persister1 to forget")

    async def test_a_process_moved_since_is_tried_where_it_recorded(self) -> None:
        servers = self.start(["persister1"], ["persister1"], "main")
        main = servers["main"]
        configured = main.config.location_of("persister1")
        moved = InstanceLocation("127.0.0.1", configured.port + 100)

        def record_move(txn: Any) -> None:
            InstancesWorkerStore.record_instance_txn(txn, "persister1", moved, True)

        await main.store.db_pool.runInteraction("move", record_move)
        await main.directory.refresh()
        self.assertEqual(main.directory.locations_of("persister1"), [configured, moved])
        with self.assertRaises(KeyError):
            main.directory.locations_of("nobody")
