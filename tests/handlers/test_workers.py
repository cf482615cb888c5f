"""Several processes in one test (in-memory replication bus, real internal
HTTP): writes forwarded to their stream's writer, read-your-writes on the
receiving process, /sync on one process seeing what others persisted, tokens
moving between processes, out-of-order writers, presence from USER_SYNC."""

from __future__ import annotations

import json
import time
import urllib.parse
from typing import Any, cast

from twisted.internet import defer, protocol, reactor, task

from synapse_lite.config.homeserver import InstanceLocation
from synapse_lite.handlers import presence as presence_module
from synapse_lite.handlers.presence import PresenceFollowerHandler, PresenceWriterHandler
from synapse_lite.replication.http import calls as internal_calls
from synapse_lite.streams.catalog import EVENTS_WRITERS
from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase
from tests.rest.test_sync import bodies

WIDE = urllib.parse.quote(json.dumps({"room": {"timeline": {"limit": 500}}}))
WRITERS = {
    "events": ["p1", "p2"],
    "typing": "typer",
    "account_data": "p1",
    "receipts": "p2",
    "to_device": "typer",
    "presence": "main",
}


class WorkersTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, self.clients, self.bus = start_cluster(
            self, self.test_db, workers=["sync1", "p1", "p2", "typer"], stream_writers=WRITERS
        )
        await eventually(lambda: all(hs.replication.connected for hs in self.servers.values()))
        self.alice = await ClientApi(self, self.clients["sync1"].base_url).register("alice")
        self.bob = await ClientApi(self, self.clients["main"].base_url).register("bob")
        self.bob_on_sync1 = self.clients["sync1"].as_user(self.bob.token)

    async def rooms_on_both_writers(self) -> list[str]:
        """Public rooms (bob joined) until both persisters have one."""
        rooms: list[str] = []
        writers: set[str] = set()
        while len(rooms) < 4 or writers != {"p1", "p2"}:
            room = await self.alice.create_room(preset="public_chat")
            await self.bob.ok("POST", f"/join/{room}", {})
            rooms.append(room)
            writers.add(str(await self.servers["main"].store.get_event_writer_for_room(room, ())))
        return rooms

    async def test_registration_on_a_worker_creates_the_device_on_main(self) -> None:
        rows = await self.servers["main"].store.db_pool.select(
            "t",
            "SELECT instance_name FROM device_lists_stream WHERE user_id = ?",
            self.alice.user_id,
        )
        self.assertEqual(rows, [("main",)])
        await self.alice.ok("POST", "/logout", {})
        code, _ = await self.bob_on_sync1.as_user(self.alice.token).request(
            "GET", "/account/whoami"
        )
        self.assertEqual(code, 401)

    async def test_send_forwarded_and_visible_at_once_on_the_receiving_process(self) -> None:
        rooms = await self.rooms_on_both_writers()
        sync1 = self.servers["sync1"]
        for room in rooms:
            event_id = await self.alice.send(room, "hello")
            event = await sync1.store.get_event(event_id)
            assert event is not None
            self.assertIn(event.instance_name, ("p1", "p2"))
            # Answered only once sync1 has seen the writer reach the event.
            self.assertTrue(
                sync1.store.get_room_max_token().contains(
                    event.instance_name, event.stream_ordering
                )
            )

    async def test_every_message_reaches_the_other_user_once_in_order(self) -> None:
        rooms = await self.rooms_on_both_writers()
        since = (await self.bob_on_sync1.sync())["next_batch"]
        sent: dict[str, list[str]] = {room: [] for room in rooms}
        received: dict[str, list[str]] = {room: [] for room in rooms}
        clients = [self.bob_on_sync1, self.clients["main"].as_user(self.bob.token)]
        for i in range(24):
            room = rooms[i % len(rooms)]
            sent[room].append(f"m{i}")
            await self.alice.send(room, f"m{i}")
            if i % 5 == 0:
                # Hop processes with the token.
                result = await clients[i % 2].sync(since=since)
                for r in rooms:
                    received[r].extend(bodies(result, r))
                since = result["next_batch"]
        result = await clients[0].sync(since=since)
        for r in rooms:
            received[r].extend(bodies(result, r))
        self.assertEqual(received, sent)

    async def test_concurrent_senders_on_both_persisters_lose_nothing(self) -> None:
        """8 concurrent senders through both persisters, bob long-polling on
        sync1: every message arrives exactly once. (Concurrent persists on one
        writer finish out of order; rows held back by an allocation in flight
        must still be sent before a position covering them.)"""
        rooms = await self.rooms_on_both_writers()
        senders = [self.clients[p].as_user(self.alice.token) for p in ("p1", "p2")]
        since = (await self.bob_on_sync1.sync())["next_batch"]
        sent: list[str] = []
        received: list[str] = []

        async def sender(k: int) -> None:
            for i in range(25):
                sent.append(await senders[k % 2].send(rooms[(k + i) % len(rooms)], f"{k}.{i}"))

        sending = defer.gatherResults([defer.ensureDeferred(sender(k)) for k in range(8)])
        while not (sending.called and set(sent) <= set(received)):
            result = await self.bob_on_sync1.sync(since=since, timeout=500, filter=WIDE)
            since = result["next_batch"]
            for room in result["rooms"]["join"].values():
                self.assertFalse(room["timeline"]["limited"])
                received.extend(e["event_id"] for e in room["timeline"]["events"])
        await sending
        self.assertEqual(sorted(received), sorted(sent))

    async def test_out_of_order_writer_is_neither_skipped_nor_repeated(self) -> None:
        rooms = await self.rooms_on_both_writers()
        by_writer = {
            await self.servers["main"].store.get_event_writer_for_room(r, ()): r for r in rooms
        }
        slow_room, fast_room = by_writer["p1"], by_writer["p2"]
        p1 = self.servers["p1"]
        since = (await self.bob_on_sync1.sync())["next_batch"]
        slow = p1.store._stream_id_gen.get_next()
        slow_id = await slow.__aenter__()
        await self.alice.send(fast_room, "fast")
        first = await self.bob_on_sync1.sync(since=since)
        self.assertEqual(bodies(first, fast_room), ["fast"])
        # The token handed out keeps p1 below its id in flight, p2 past its event.
        store = self.servers["sync1"].store
        room_key = await store.parse_room_token(first["next_batch"].split("_")[0])
        self.assertLess(room_key.get_position("p1"), slow_id)
        self.assertGreater(room_key.get_position("p2"), slow_id)
        event_id = "$slow-event"
        await p1.store.db_pool.execute(
            "insert_slow",
            "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id, type,"
            " sender, origin_server_ts, content, instance_name)"
            " VALUES (?, 100, ?, ?, 'm.room.message', ?, 1, '{\"body\": \"slow\"}', 'p1')",
            slow_id,
            event_id,
            slow_room,
            self.alice.user_id,
        )
        await slow.__aexit__(None, None, None)
        await self.servers["sync1"].waiters.wait_for_stream_position("p1", "events", slow_id)
        second = await self.bob_on_sync1.sync(since=first["next_batch"])
        self.assertEqual(bodies(second, slow_room), ["slow"])
        self.assertEqual(bodies(second, fast_room), [])
        third = await self.clients["main"].as_user(self.bob.token).sync(since=second["next_batch"])
        self.assertEqual(third["rooms"]["join"], {})

    async def test_long_poll_on_one_process_wakes_for_a_write_on_another(self) -> None:
        rooms = await self.rooms_on_both_writers()
        since = (await self.bob_on_sync1.sync())["next_batch"]
        result, since = await self.wait_for_sync(
            since, lambda: self.alice.send(rooms[0], "ping"), lambda r: bodies(r, rooms[0])
        )
        self.assertEqual(bodies(result, rooms[0]), ["ping"])
        # A room joined elsewhere while waiting (membership caches on sync1 are
        # invalidated before the sync wakes, so the room is in the answer).
        room = await self.alice.create_room(preset="public_chat")
        result, _ = await self.wait_for_sync(
            since,
            lambda: self.bob.ok("POST", f"/join/{room}", {}),
            lambda r: room in r["rooms"]["join"],
        )
        self.assertIn(room, await self.servers["sync1"].store.get_rooms_for_user(self.bob.user_id))

    async def wait_for_sync(self, since: str, action: Any, found: Any) -> tuple[Any, str]:
        """Start a long-poll on sync1, run ``action``, and keep long-polling
        until a response satisfies ``found`` (other news, such as presence,
        may wake it first)."""
        waiting = defer.ensureDeferred(self.bob_on_sync1.sync(since=since, timeout=10_000))
        await action()
        for _ in range(10):
            result = await waiting
            since = result["next_batch"]
            if found(result):
                return result, since
            waiting = defer.ensureDeferred(self.bob_on_sync1.sync(since=since, timeout=10_000))
        raise AssertionError("the sync never showed it")

    async def test_stream_writes_forwarded_to_their_writers(self) -> None:
        rooms = await self.rooms_on_both_writers()
        since = (await self.bob_on_sync1.sync())["next_batch"]
        event_id = await self.alice.send(rooms[0], "read me")
        await self.alice.ok(
            "PUT", f"/rooms/{rooms[0]}/typing/{self.alice.user_id}", {"typing": True}
        )
        await self.alice.ok("POST", f"/rooms/{rooms[0]}/receipt/m.read/{event_id}", {})
        await self.bob_on_sync1.ok(
            "PUT", f"/user/{self.bob.user_id}/account_data/org.example", {"k": "v"}
        )
        await self.alice.ok(
            "PUT",
            "/sendToDevice/m.test/t1",
            {"messages": {self.bob.user_id: {self.bob.device_id: {"n": 1}}}},
        )
        # Written by their writers...
        ids = await self.servers["main"].store.db_pool.select(
            "t",
            "SELECT (SELECT instance_name FROM receipts_linearized),"
            " (SELECT instance_name FROM account_data),"
            " (SELECT instance_name FROM device_inbox)",
        )
        self.assertEqual(ids, [("p2", "p1", "typer")])
        # ...and seen by bob's sync on another process.
        await eventually(lambda: self.servers["sync1"].typing.get_current_token() > 0)
        result = await self.bob_on_sync1.sync(since=since)
        ephemeral = {e["type"] for e in result["rooms"]["join"][rooms[0]]["ephemeral"]["events"]}
        self.assertEqual(ephemeral, {"m.typing", "m.receipt"})
        self.assertEqual(result["account_data"]["events"][0]["content"], {"k": "v"})
        self.assertEqual(result["to_device"]["events"][0]["content"], {"n": 1})

    async def test_presence_follows_syncs_on_another_process(self) -> None:
        self.patch(presence_module, "SYNC_ONLINE_GRACE_MS", 0)
        self.patch(presence_module, "SYNC_STOP_DELAY_SECONDS", 0.1)
        main = self.servers["main"]
        states: list[str] = []
        assert self.bob.user_id is not None
        bob = self.bob.user_id

        async def bob_state() -> str:
            return (await main.presence.get_state(bob)).state

        waiting = defer.ensureDeferred(self.bob_on_sync1.sync(since=None))
        await waiting
        # USER_SYNC from sync1 made the presence writer mark bob online...
        for _ in range(300):
            states.append(await bob_state())
            if states[-1] == "online":
                break
            await task.deferLater(reactor, 0.01, lambda: None)
        self.assertEqual(states[-1], "online")
        # ...and once his last sync ended, offline (after the grace period).
        for _ in range(300):
            states.append(await bob_state())
            if states[-1] == "offline":
                break
            await task.deferLater(reactor, 0.01, lambda: None)
        self.assertEqual(states[-1], "offline")

    async def test_presence_set_from_sync_on_another_process(self) -> None:
        room = (await self.rooms_on_both_writers())[0]
        assert self.bob.user_id is not None
        bob = self.bob.user_id
        main = self.servers["main"]

        async def bob_is(state: str) -> bool:
            return (await main.presence.get_state(bob)).state == state

        async def alice_sees_bob(state: str) -> None:
            async def seen() -> bool:
                result = await self.alice.sync()
                found = [e for e in result["presence"]["events"] if e["sender"] == bob]
                return bool(found) and found[0]["content"]["presence"] == state

            await eventually(seen, what=f"alice seeing bob {state}")

        await self.bob_on_sync1.sync(set_presence="unavailable")
        await eventually(lambda: bob_is("unavailable"))
        await alice_sees_bob("unavailable")
        self.assertIn(room, (await self.alice.sync())["rooms"]["join"])
        # Back from idle: a sync without set_presence marks him online.
        await self.bob_on_sync1.sync()
        await eventually(lambda: bob_is("online"))
        await alice_sees_bob("online")
        # An unavailable he set himself stays through his syncs.
        await self.bob_on_sync1.ok(
            "PUT", f"/presence/{bob}/status", {"presence": "unavailable", "status_msg": "away"}
        )
        await self.bob_on_sync1.sync()
        await self.bob_on_sync1.sync()
        state = await main.presence.get_state(bob)
        self.assertEqual((state.state, state.status_msg), ("unavailable", "away"))

    async def test_presence_left_out_by_the_filter_does_not_end_a_long_poll(self) -> None:
        room = (await self.rooms_on_both_writers())[0]
        no_presence = urllib.parse.quote(json.dumps({"presence": {"not_types": ["m.presence"]}}))
        first = await self.bob_on_sync1.sync(filter=no_presence)
        sync1 = self.servers["sync1"]
        presence_before = sync1.streams["presence"].positions.sync_position()
        waiting = defer.ensureDeferred(
            self.bob_on_sync1.sync(since=first["next_batch"], timeout=10_000, filter=no_presence)
        )
        await self.alice.ok(
            "PUT", f"/presence/{self.alice.user_id}/status", {"presence": "unavailable"}
        )
        # The change has reached sync1 (and woken the long-poll, which found
        # nothing it may answer) before the message is sent.
        await eventually(
            lambda: sync1.streams["presence"].positions.sync_position() > presence_before
        )
        await self.alice.send(room, "after the presence change")
        result = await waiting
        self.assertEqual(bodies(result, room), ["after the presence change"])
        self.assertEqual(result["presence"]["events"], [])

    async def test_clear_user_sync_when_a_sync_process_stops(self) -> None:
        main, sync1 = self.servers["main"].presence, self.servers["sync1"].presence
        assert isinstance(main, PresenceWriterHandler)
        assert isinstance(sync1, PresenceFollowerHandler)
        assert self.bob.user_id is not None

        def syncing_on_sync1() -> bool:
            users = main._external_syncs.get(sync1._instance_id, set())
            return self.bob.user_id in users

        # A sync in progress on sync1 (entered, never left).
        in_progress = sync1.user_syncing(self.bob.user_id, "DEV")
        await in_progress.__aenter__()
        await eventually(syncing_on_sync1)
        sync1.end_of_syncs()  # what sync1 does when it stops: CLEAR_USER_SYNC
        await eventually(lambda: not syncing_on_sync1())
        self.assertIn(self.bob.user_id, main._last_sync_end)


def choose_event_writer(room_id: str, writers: list[str]) -> str:
    """The events writer a new room goes to (the events stream's rule)."""
    assert EVENTS_WRITERS.shard is not None
    return EVENTS_WRITERS.shard.pick(room_id, writers)


class RoomWriterTestCase(DatabaseTestCase):
    async def test_choice_is_stable_and_spread(self) -> None:
        writers = ["p1", "p2"]
        chosen = {choose_event_writer(f"!r{i}:x", writers) for i in range(50)}
        self.assertEqual(chosen, {"p1", "p2"})
        self.assertEqual(
            choose_event_writer("!abc:x", ["p1", "p2"]), choose_event_writer("!abc:x", ["p2", "p1"])
        )

    async def test_rooms_of_removed_writers_move_and_others_forget_the_old_one(self) -> None:
        servers, clients, _ = start_cluster(
            self, self.test_db, workers=["p1", "p2"], stream_writers={"events": ["p1", "p2"]}
        )
        await eventually(lambda: all(hs.replication.connected for hs in servers.values()))
        alice = await ClientApi(self, clients["main"].base_url).register("alice")
        room = await alice.create_room(preset="public_chat")
        p1 = servers["p1"]
        self.assertIn(await p1.store.get_event_writer_for_room(room, ()), ("p1", "p2"))
        await servers["main"].store.db_pool.execute(
            "t", "UPDATE rooms SET event_writer = 'gone' WHERE room_id = ?", room
        )
        p1.store.invalidate_event_writer(room)
        self.assertEqual(await p1.store.get_event_writer_for_room(room, ()), "gone")  # cached now
        moved = await servers["main"].store.reassign_rooms_of_removed_writers(["p1", "p2"])
        self.assertEqual(moved, 1)
        expected = choose_event_writer(room, ["p1", "p2"])
        await eventually(lambda: p1.store._get_event_writer_for_room.cache.get(room)[0] is False)
        self.assertEqual(await p1.store.get_event_writer_for_room(room, ()), expected)
        await alice.send(room, "after the move")


class _Silent(protocol.Protocol):
    """Accepts a connection and never answers (a frozen process)."""


class FrozenWriterTestCase(DatabaseTestCase):
    async def test_send_to_a_frozen_writer_is_a_503_within_the_forwarding_timeout(self) -> None:
        self.patch(internal_calls, "REQUEST_TIMEOUT_SECONDS", 0.5)
        servers, clients, _ = start_cluster(
            self, self.test_db, workers=["p1"], stream_writers={"events": ["p1"]}
        )
        alice = await ClientApi(self, clients["main"].base_url).register("alice")
        room = await alice.create_room()
        # p1 freezes: its address now leads to a listener that never answers.
        factory = protocol.ServerFactory.forProtocol(_Silent)
        silent: Any = cast(Any, reactor).listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(silent.stopListening)
        servers["main"].config.instance_map["p1"] = InstanceLocation(
            "127.0.0.1", silent.getHost().port
        )
        started = time.monotonic()
        code, body = await alice.request(
            "PUT", f"/rooms/{room}/send/m.room.message/t1", {"body": "hello?"}
        )
        self.assertEqual((code, body["errcode"]), (503, "M_UNKNOWN"))
        self.assertLess(time.monotonic() - started, 3.0)
