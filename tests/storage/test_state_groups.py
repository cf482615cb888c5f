"""The state at every event (state groups): written by the room's writer in
the persist transaction, read back as the state before and after events;
concurrent branches resolved into the current state and merged by the next
event, which /sync, /messages and room state then read. On SQLite and
PostgreSQL (``SYNAPSE_LITE_TEST_DB``)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from synapse_lite.api.room_versions import RoomVersion
from synapse_lite.event_graph.pdu import StateKey
from synapse_lite.event_graph.state_resolution import auth_difference, resolve_state
from synapse_lite.server import HomeServer
from synapse_lite.storage.database import LoggingTransaction
from synapse_lite.storage.databases.main import state_groups
from synapse_lite.storage.databases.main.auth_chains import auth_difference_txn
from synapse_lite.storage.databases.main.state_groups import TxnEvents
from tests.harness.client_api import ClientApi, caught_up, start_cluster
from tests.harness.server import DatabaseTestCase


def resolve_in_txn(
    txn: LoggingTransaction, version: RoomVersion, sets: list[Mapping[StateKey, str]]
) -> dict[StateKey, str]:
    """The core's resolution of ``sets``, the events read in ``txn``."""
    return resolve_state(version, sets, TxnEvents(txn))


def differences_in_txn(
    txn: LoggingTransaction, sets: list[Mapping[StateKey, str]]
) -> tuple[set[str] | None, set[str]]:
    """The auth difference of ``sets`` from the stored auth chain index, and
    by walking the stored auth events."""
    return auth_difference_txn(txn, sets), auth_difference(sets, TxnEvents(txn))


class StateGroupsTestCase(DatabaseTestCase):
    """The monolith's main process writes the rooms (a reader worker reads)."""

    #: The process that writes the events (the rooms' writer).
    writer = "main"
    workers = ["reader"]
    stream_writers: dict[str, Any] | None = None

    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(
            self, self.test_db, workers=self.workers, stream_writers=self.stream_writers
        )
        self.hs: HomeServer = self.servers[self.writer]
        self.alice = await ClientApi(self, clients["main"].base_url).register("alice")
        self.on_reader = ClientApi(self, clients["reader"].base_url).as_user(self.alice.token)

    async def set_topic(self, room: str, topic: str) -> str:
        result = await self.alice.ok("PUT", f"/rooms/{room}/state/m.room.topic", {"topic": topic})
        return str(result["event_id"])

    async def current_state(self, room: str) -> dict[tuple[str, str], str]:
        rows = await self.hs.store.db_pool.select(
            "test_current_state",
            "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = ?",
            room,
        )
        return {(str(t), str(k)): str(e) for t, k, e in rows}

    async def count(self, sql: str, *args: Any) -> int:
        return int((await self.hs.store.db_pool.select("test_count", sql, *args))[0][0])

    async def test_state_before_and_after_each_event_of_a_line(self) -> None:
        """Each event's state before is the state after its parent; a
        message shares its parent's group (no group written), a state event
        adds a one-key delta; the newest event's state is the current state."""
        store = self.hs.store
        room = await self.alice.create_room()
        state_at_create = dict(await self.current_state(room))
        groups_before = await self.count("SELECT COUNT(*) FROM state_groups")
        message = await self.alice.send(room, "hello")
        self.assertEqual(await self.count("SELECT COUNT(*) FROM state_groups"), groups_before)
        self.assertEqual(dict(await store.get_state_ids_before_event(message) or {}),
                         state_at_create)  # fmt: skip
        topic = await self.set_topic(room, "first")
        self.assertEqual(await self.count("SELECT COUNT(*) FROM state_groups"), groups_before + 1)
        rows = await store.db_pool.select(
            "test_rows",
            "SELECT s.type, s.event_id, g.prev_group FROM events AS e"
            " JOIN state_groups AS g ON g.id = e.state_group"
            " JOIN state_group_state AS s ON s.state_group = g.id WHERE e.event_id = ?",
            topic,
        )
        self.assertEqual([(r[0], r[1]) for r in rows], [("m.room.topic", topic)])
        self.assertIsNotNone(rows[0][2])  # a delta, not a snapshot
        self.assertEqual(dict(await store.get_state_ids_before_event(topic) or {}),
                         state_at_create)  # fmt: skip
        after = await store.get_state_ids_after_events([topic, message])
        self.assertEqual(dict(after[topic]), {**state_at_create, ("m.room.topic", ""): topic})
        self.assertEqual(dict(after[message]), state_at_create)
        self.assertEqual(dict(after[topic]), await self.current_state(room))
        # The create event's state before is empty; an unknown event has none.
        create = state_at_create[("m.room.create", "")]
        self.assertEqual(await store.get_state_ids_before_event(create), {})
        self.assertIsNone(await store.get_state_ids_before_event("$nope"))
        # The auth chain of the topic: the create, power levels, alice's join
        # and what authorised those (all in the room's state).
        chain = await store.get_auth_chain_ids([topic])
        self.assertIn(create, chain)
        self.assertIn(state_at_create[("m.room.power_levels", "")], chain)
        self.assertIn(state_at_create[("m.room.member", str(self.alice.user_id))], chain)
        self.assertNotIn(topic, chain)

    async def test_the_writer_indexes_auth_chains_as_it_persists(self) -> None:
        """Each power levels change continues the room's power levels chain
        (from the writer's memory, and after it is cleared from the rows), a
        message gets no position, and the index's auth chains are the
        walked ones."""
        store = self.hs.store
        room = await self.alice.create_room()
        levels = []
        for level in (10, 20, 30):
            if level == 30:
                store._auth_positions.clear()  # as after a restart
            result = await self.alice.ok(
                "PUT",
                f"/rooms/{room}/state/m.room.power_levels",
                {"users": {self.alice.user_id: 100, "@x:test": level}},
            )
            levels.append(str(result["event_id"]))
        message = await self.alice.send(room, "hi")
        rows = await store.db_pool.select(
            "test_positions",
            "SELECT c.chain_id, c.sequence_number FROM event_auth_chains AS c"
            " JOIN events AS e ON e.event_id = c.event_id"
            " WHERE e.room_id = ? AND e.type = 'm.room.power_levels' ORDER BY e.stream_ordering",
            room,
        )
        self.assertEqual(len({chain for chain, _ in rows}), 1)
        self.assertEqual([s for _, s in rows], [1, 2, 3, 4])  # the room's first, then ours
        self.assertEqual(
            await self.count("SELECT COUNT(*) FROM event_auth_chains WHERE event_id = ?", message),
            0,
        )
        for event_id in [*levels, message]:
            walked = await store.db_pool.select(
                "test_walk",
                "WITH RECURSIVE chain (event_id) AS ("
                " SELECT auth_id FROM event_auth_edges WHERE event_id = ?"
                " UNION SELECT a.auth_id FROM event_auth_edges AS a"
                " JOIN chain AS c ON a.event_id = c.event_id)"
                " SELECT event_id FROM chain",
                event_id,
            )
            self.assertEqual(
                await store.get_auth_chain_ids([event_id]), {str(r[0]) for r in walked}
            )

    async def test_a_writer_without_cached_groups_reads_its_parents(self) -> None:
        """After a restart (the writer's memory of groups empty) the next
        event's parent group is read from the database."""
        room = await self.alice.create_room()
        first = await self.set_topic(room, "before")
        self.hs.store._event_group.clear()
        second = await self.set_topic(room, "after")
        store = self.hs.store
        self.assertEqual(
            dict(await store.get_state_ids_before_event(second) or {}),
            dict((await store.get_state_ids_after_events([first]))[first]),
        )
        self.assertEqual(
            dict((await store.get_state_ids_after_events([second]))[second]),
            await self.current_state(room),
        )

    async def test_random_forks_keep_current_state_the_resolution(self) -> None:
        """Topics and names sent against random earlier events (branches),
        with merges between: after each send the current state is the
        core's resolution of the states after the room's extremities."""
        rng = random.Random(30)
        store = self.hs.store
        room = await self.alice.create_room()
        sent = [await self.alice.send(room, "start")]
        version = await store.get_room_version(room)
        forked = 0
        for step in range(12):
            kind = rng.choice(["topic", "name", "merge"])
            if kind == "merge":
                sent.append(await self.alice.send(room, f"merge {step}"))
            else:
                parent = rng.choice(sent[-4:])
                event_type = "m.room.topic" if kind == "topic" else "m.room.name"
                body = {"topic": f"t{step}"} if kind == "topic" else {"name": f"n{step}"}
                sent.append(await self.send_state_against(room, parent, event_type, body))
            extremities = sorted(await store.get_forward_extremities(room))
            forked += len(extremities) > 1
            states = await store.get_state_ids_after_events(extremities)

            sets = [states[e] for e in extremities]
            expected = await store.db_pool.runInteraction(
                "test_resolve", resolve_in_txn, version, sets
            )
            self.assertEqual(await self.current_state(room), expected, f"step {step}")
            # The index the writer kept answers as walking does.
            indexed, walked = await store.db_pool.runInteraction(
                "test_difference", differences_in_txn, sets
            )
            self.assertEqual(indexed, walked, f"step {step}")
        self.assertGreaterEqual(forked, 3)  # the seed makes branches, not a line

    async def test_delta_chains_are_bounded_by_snapshots(self) -> None:
        """Every MAX_DELTA_CHAIN deltas the room's state is written whole,
        and reading a group through deltas and snapshots gives the same."""
        self.patch(state_groups, "MAX_DELTA_CHAIN", 3)
        room = await self.alice.create_room()
        topics = [await self.set_topic(room, f"topic {i}") for i in range(8)]
        rows = await self.hs.store.db_pool.select(
            "test_chain",
            "SELECT g.chain_length, g.prev_group IS NULL FROM events AS e"
            " JOIN state_groups AS g ON g.id = e.state_group WHERE e.room_id = ?"
            " AND e.type = 'm.room.topic' ORDER BY e.stream_ordering",
            room,
        )
        lengths = [int(r[0]) for r in rows]
        self.assertTrue(all(length <= 3 for length in lengths), lengths)
        self.assertIn(0, lengths)
        self.assertEqual([bool(r[1]) for r in rows], [length == 0 for length in lengths])
        state = await self.hs.store.get_state_ids_after_events(topics)
        for topic in topics:
            self.assertEqual(state[topic][("m.room.topic", "")], topic)
        self.assertEqual(dict(state[topics[-1]]), await self.current_state(room))

    async def send_against(self, room: str, parent: str, topic: str) -> str:
        """A topic change whose parent is ``parent`` (not the room's
        extremity): a concurrent branch, as a remote server's would be,
        stamped a minute earlier (so that the other branch's topic, the
        later, wins the resolution: not what the event's own update of the
        current state wrote)."""
        return await self.send_state_against(room, parent, "m.room.topic", {"topic": topic})

    async def send_state_against(
        self, room: str, parent: str, event_type: str, content: dict[str, Any]
    ) -> str:
        """A state event (key "") whose parent is ``parent``, stamped a
        minute earlier."""
        depth = int(
            (
                await self.hs.store.db_pool.select(
                    "test_depth",
                    "SELECT topological_ordering FROM events WHERE event_id = ?",
                    parent,
                )
            )[0][0]
        )
        handler = self.hs.handlers.events
        handler._room_extremities.set(room, {parent: depth})
        # Stamped where the client's request arrives (main), not on the writer.
        clock = self.servers["main"].handlers.events._clock
        real_time_msec = clock.time_msec
        clock.time_msec = lambda: real_time_msec() - 60_000  # type: ignore[method-assign]
        try:
            result = await self.alice.ok("PUT", f"/rooms/{room}/state/{event_type}", content)
        finally:
            clock.time_msec = real_time_msec  # type: ignore[method-assign]
        handler._room_extremities.pop(room)  # as after a restart
        return str(result["event_id"])

    async def test_concurrent_branches_resolve_and_merge(self) -> None:
        """Two topics sent against the same parent: the room has two
        extremities, its current state is their states resolved (v2:
        the later topic by mainline ordering, the first branch's, although
        the second was persisted last); the next event names both,
        its state before is that resolution, and /sync, /messages and the
        room's state read it."""
        store = self.hs.store
        room = await self.alice.create_room()
        parent = await self.alice.send(room, "before the fork")
        one = await self.set_topic(room, "one")
        await caught_up(self.servers, self.writer)
        # The reader has the room's state cached before the branch.
        self.assertEqual(
            (await self.on_reader.ok("GET", f"/rooms/{room}/state/m.room.topic"))["topic"], "one"
        )
        two = await self.send_against(room, parent, "two")
        self.assertEqual(set(await store.get_forward_extremities(room)), {one, two})
        events = await store.get_events([one, two])
        winner = max((one, two), key=lambda e: (events[e].origin_server_ts, e))
        self.assertEqual(winner, one)
        current = await self.current_state(room)
        self.assertEqual(current[("m.room.topic", "")], winner)
        # A delta row tells readers of the current state what changed.
        self.assertGreaterEqual(
            await self.count(
                "SELECT COUNT(*) FROM current_state_delta_stream WHERE room_id = ?"
                " AND type = 'm.room.topic' AND event_id = ?",
                room,
                winner,
            ),
            1,
        )
        await caught_up(self.servers, self.writer)
        for client in (self.alice, self.on_reader):
            state = await client.ok("GET", f"/rooms/{room}/state/m.room.topic")
            self.assertEqual(state["topic"], "one")
        merge = await self.alice.send(room, "merge")
        self.assertEqual(list(await store.get_forward_extremities(room)), [merge])
        before_merge = await store.get_state_ids_before_event(merge)
        self.assertEqual(dict(before_merge or {}), current)
        self.assertEqual(await self.current_state(room), current)
        state = await self.alice.ok("GET", f"/rooms/{room}/state/m.room.topic")
        self.assertEqual(state["topic"], "one")
        page = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=b&limit=20")
        ids = [e["event_id"] for e in page["chunk"]]
        self.assertEqual(ids[0], merge)
        self.assertTrue({one, two, parent} <= set(ids))
        await caught_up(self.servers, self.writer)
        sync = await self.on_reader.sync()
        joined = sync["rooms"]["join"][room]
        timeline = [e["event_id"] for e in joined["timeline"]["events"]]
        self.assertEqual(timeline[-1], merge)
        topics = [
            e["event_id"]
            for e in joined["state"]["events"] + joined["timeline"]["events"]
            if e["type"] == "m.room.topic"
        ]
        self.assertIn(winner, topics)
        # A later topic goes on from the merged state, on every process.
        last = await self.set_topic(room, "three")
        self.assertEqual((await self.current_state(room))[("m.room.topic", "")], last)
        await caught_up(self.servers, self.writer)
        state = await self.on_reader.ok("GET", f"/rooms/{room}/state/m.room.topic")
        self.assertEqual(state["topic"], "three")

    async def test_resolution_group_is_a_delta_against_a_parent(self) -> None:
        """The merged state is stored once, as a group of its own (a delta
        against the parent state it differs least from)."""
        store = self.hs.store
        room = await self.alice.create_room()
        parent = await self.alice.send(room, "fork")
        await self.set_topic(room, "one")
        await self.send_against(room, parent, "two")
        merge = await self.alice.send(room, "merge")

        def groups(txn: LoggingTransaction) -> tuple[Any, Any]:
            txn.execute(
                "SELECT state_group_before, state_group FROM events WHERE event_id = ?", (merge,)
            )
            return tuple(txn.fetchone())

        before, after = await store.db_pool.runInteraction("test_groups", groups)
        self.assertEqual(before, after)
        rows = await store.db_pool.select(
            "test_group", "SELECT prev_group, chain_length FROM state_groups WHERE id = ?", before
        )
        self.assertIsNotNone(rows[0][0])


class StateGroupsOnPersisterTestCase(StateGroupsTestCase):
    """The same in the default layout's shape: an event persister writes
    the rooms, clients talk to main, a reader worker reads."""

    writer = "persister1"
    workers = ["persister1", "reader"]
    stream_writers = {"events": ["persister1"]}
