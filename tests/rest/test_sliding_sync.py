"""Sliding sync (MSC4186) over HTTP: lists, ordering, filters, room
subscriptions, incremental responses, long-poll, connections and their pos,
extensions, and bad input. On the main process alone and through the
default layout's workers (the connection continued by another process)."""

from __future__ import annotations

import time
from typing import Any

from twisted.internet import defer

from tests.harness.client_api import (
    DEFAULT_LAYOUT_STREAM_WRITERS,
    DEFAULT_LAYOUT_WORKERS,
    ClientApi,
    ThreeUsersTestCase,
    caught_up_with_writers,
    serve,
    start_cluster,
)
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase, make_homeserver

PATH = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync"
ALL_STATE: dict[str, Any] = {"timeline_limit": 5, "required_state": [["*", "*"]]}


def room_list(ranges: list[list[int]], timeline_limit: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "ranges": ranges,
        "timeline_limit": timeline_limit,
        "required_state": [["m.room.create", ""], ["m.room.name", ""]],
        **extra,
    }


async def sliding(
    client: ClientApi, body: dict[str, Any], pos: str | None = None, timeout: int = 0
) -> Any:
    query = f"?timeout={timeout}" + (f"&pos={pos}" if pos else "")
    return await client.ok("POST", PATH + query, body)


def check_shape(testcase: DatabaseTestCase, response: dict[str, Any]) -> None:
    """The MSC's response shapes."""
    testcase.assertIsInstance(response["pos"], str)
    for result in response.get("lists", {}).values():
        testcase.assertIsInstance(result["count"], int)
    for room in response.get("rooms", {}).values():
        for key in ("timeline", "required_state", "heroes", "stripped_state"):
            if key in room:
                testcase.assertIsInstance(room[key], list)
        for key in ("bump_stamp", "joined_count", "invited_count", "num_live"):
            if key in room:
                testcase.assertIsInstance(room[key], int)
        for key in ("initial", "limited", "is_dm"):
            if key in room:
                testcase.assertIsInstance(room[key], bool)
        for event in room.get("timeline", []):
            testcase.assertIn("event_id", event)
        for event in room.get("required_state", []):
            testcase.assertIn("state_key", event)
            # An event, or a StateStub (deleted state): type and state_key alone.
            if "content" not in event:
                testcase.assertEqual(set(event), {"type", "state_key"})


class SlidingSyncTestCase(ThreeUsersTestCase):
    """alice on the main process, bob on the last process."""

    async def settle(self) -> None:
        """Every process has read what each events writer wrote so far."""
        writers = [w for w in ("persister1", "persister2") if w in self.servers]
        await caught_up_with_writers(self.servers, writers)

    async def rooms_with_bob(self, count: int) -> list[str]:
        rooms = []
        for i in range(count):
            room = await self.alice.create_room(preset="public_chat", name=f"room {i}")
            await self.bob.ok("POST", f"/join/{room}", {})
            rooms.append(room)
        return rooms

    async def test_list_ordered_by_recency_with_ranges(self) -> None:
        rooms = await self.rooms_with_bob(4)
        await self.alice.send(rooms[1], "newest activity")
        await self.settle()
        first = await sliding(self.bob, {"lists": {"all": room_list([[0, 1]])}})
        check_shape(self, first)
        self.assertEqual(first["lists"]["all"]["count"], 4)
        self.assertEqual(set(first["rooms"]), {rooms[1], rooms[3]})
        entry = first["rooms"][rooms[1]]
        self.assertTrue(entry["initial"])
        self.assertEqual(entry["name"], "room 1")
        self.assertEqual(entry["membership"], "join")
        self.assertEqual([e["content"].get("body") for e in entry["timeline"]], ["newest activity"])
        self.assertTrue(entry["limited"])
        self.assertEqual(entry["num_live"], 0)
        self.assertEqual((entry["joined_count"], entry["invited_count"]), (2, 0))
        self.assertEqual((entry["notification_count"], entry["highlight_count"]), (1, 0))
        self.assertEqual(entry["lists"], ["all"])
        self.assertGreater(entry["bump_stamp"], first["rooms"][rooms[3]]["bump_stamp"])
        types = {(e["type"], e["state_key"]) for e in entry["required_state"]}
        self.assertEqual(types, {("m.room.create", ""), ("m.room.name", "")})
        # The prev_batch pages back with /messages.
        page = await self.bob.ok(
            "GET", f"/rooms/{rooms[1]}/messages?dir=b&limit=3&from={entry['prev_batch']}"
        )
        self.assertEqual(len(page["chunk"]), 3)
        # Growing the range sends only the rooms not sent yet.
        grown = await sliding(self.bob, {"lists": {"all": room_list([[0, 3]])}}, pos=first["pos"])
        self.assertEqual(set(grown["rooms"]), {rooms[0], rooms[2]})
        # Nothing new: nothing sent.
        same = await sliding(self.bob, {"lists": {"all": room_list([[0, 3]])}}, pos=grown["pos"])
        self.assertEqual(same["rooms"], {})

    async def test_incremental_and_long_poll(self) -> None:
        rooms = await self.rooms_with_bob(2)
        await self.settle()
        body = {"lists": {"all": room_list([[0, 9]], timeline_limit=3)}}
        first = await sliding(self.bob, body)
        start = time.monotonic()
        waiting = defer.ensureDeferred(sliding(self.bob, body, pos=first["pos"], timeout=10_000))
        event_id = await self.alice.send(rooms[0], "wake")
        woken = await waiting
        self.assertLess(time.monotonic() - start, 5)
        check_shape(self, woken)
        self.assertEqual(list(woken["rooms"]), [rooms[0]])
        entry = woken["rooms"][rooms[0]]
        self.assertNotIn("initial", entry)
        self.assertEqual([e["event_id"] for e in entry["timeline"]], [event_id])
        self.assertEqual(entry["num_live"], 1)
        self.assertFalse(entry["limited"])
        # A long-poll with nothing new times out empty.
        empty = await sliding(self.bob, body, pos=woken["pos"], timeout=200)
        self.assertEqual(empty["rooms"], {})

    async def test_required_state_wildcards_me_and_lazy(self) -> None:
        [room] = await self.rooms_with_bob(1)
        await self.alice.send(room, "hello")
        await self.settle()
        body = {
            "room_subscriptions": {
                room: {
                    "timeline_limit": 2,
                    "required_state": [
                        ["m.room.member", "$ME"],
                        ["m.room.member", "$LAZY"],
                        ["m.room.join_rules", "*"],
                    ],
                }
            }
        }
        result = await sliding(self.bob, body)
        state = {(e["type"], e["state_key"]) for e in result["rooms"][room]["required_state"]}
        self.assertIn(("m.room.member", self.bob.user_id), state)
        self.assertIn(("m.room.member", self.alice.user_id), state)  # the sender: lazy
        self.assertIn(("m.room.join_rules", ""), state)
        self.assertNotIn(("m.room.create", ""), state)
        self.assertNotIn("lists", result["rooms"][room])
        # The MSC's newer shape: include everything but the create event.
        newer = {
            "room_subscriptions": {
                room: {
                    "timeline_limit": 1,
                    "required_state": {
                        "include": [{}],
                        "exclude": [{"type": "m.room.create", "state_key": ""}],
                    },
                }
            }
        }
        result = await sliding(self.bob, newer)
        state = {(e["type"], e["state_key"]) for e in result["rooms"][room]["required_state"]}
        self.assertIn(("m.room.power_levels", ""), state)
        self.assertNotIn(("m.room.create", ""), state)

    async def test_subscription_raising_the_timeline_expands_it(self) -> None:
        [room] = await self.rooms_with_bob(1)
        sent = [await self.alice.send(room, f"m{i}") for i in range(4)]
        await self.settle()
        first = await sliding(self.bob, {"lists": {"all": room_list([[0, 0]], timeline_limit=1)}})
        self.assertEqual([e["event_id"] for e in first["rooms"][room]["timeline"]], sent[-1:])
        body = {
            "lists": {"all": room_list([[0, 0]], timeline_limit=1)},
            "room_subscriptions": {room: {"timeline_limit": 3, "required_state": []}},
        }
        raised = await sliding(self.bob, body, pos=first["pos"])
        entry = raised["rooms"][room]
        self.assertTrue(entry["expanded_timeline"])
        self.assertEqual([e["event_id"] for e in entry["timeline"]], sent[-3:])
        self.assertEqual(entry["num_live"], 0)

    async def test_filters_and_invites(self) -> None:
        rooms = await self.rooms_with_bob(2)
        space = await self.alice.create_room(
            preset="public_chat", creation_content={"type": "m.space"}
        )
        await self.bob.ok("POST", f"/join/{space}", {})
        invite = await self.alice.create_room(name="come in")
        await self.alice.ok("POST", f"/rooms/{invite}/invite", {"user_id": self.bob.user_id})
        await self.alice.ok(
            "PUT",
            f"/rooms/{rooms[0]}/state/m.room.encryption",
            {"algorithm": "m.megolm.v1.aes-sha2"},
        )
        await self.bob.ok(
            "PUT",
            f"/user/{self.bob.user_id}/account_data/m.direct",
            {self.alice.user_id: [rooms[1]]},
        )
        await self.settle()
        lists = {
            "invites": room_list([[0, 9]], filters={"is_invite": True}),
            "no_spaces": room_list([[0, 9]], filters={"not_room_types": ["m.space"]}),
            "spaces": room_list([[0, 9]], filters={"room_types": ["m.space"]}),
            "encrypted": room_list([[0, 9]], filters={"is_encrypted": True}),
            "dms": room_list([[0, 9]], filters={"is_dm": True}),
        }
        result = await sliding(self.bob, {"lists": lists})
        check_shape(self, result)
        counts = {name: r["count"] for name, r in result["lists"].items()}
        self.assertEqual(
            counts, {"invites": 1, "no_spaces": 3, "spaces": 1, "encrypted": 1, "dms": 1}
        )
        entry = result["rooms"][invite]
        self.assertEqual(entry["membership"], "invite")
        stripped = {e["type"] for e in entry["stripped_state"]}
        self.assertIn("m.room.member", stripped)
        self.assertEqual(entry["invite_state"], entry["stripped_state"])
        self.assertNotIn("timeline", entry)
        self.assertTrue(result["rooms"][rooms[1]]["is_dm"])
        self.assertFalse(result["rooms"][rooms[0]]["is_dm"])

    async def test_timeline_bundles_and_ignored_invites(self) -> None:
        [room] = await self.rooms_with_bob(1)
        root = await self.alice.send(room, "root")
        reply = {
            "msgtype": "m.text",
            "body": "in thread",
            "m.relates_to": {"rel_type": "m.thread", "event_id": root},
        }
        await self.alice.ok("PUT", f"/rooms/{room}/send/m.room.message/t1", reply)
        eve_room = await self.eve.create_room()
        await self.eve.ok("POST", f"/rooms/{eve_room}/invite", {"user_id": self.bob.user_id})
        await self.bob.ok(
            "PUT",
            f"/user/{self.bob.user_id}/account_data/m.ignored_user_list",
            {"ignored_users": {self.eve.user_id: {}}},
        )
        await self.settle()
        result = await sliding(self.bob, {"lists": {"all": room_list([[0, 9]], 5)}})
        self.assertNotIn(eve_room, result["rooms"])
        [root_event] = [e for e in result["rooms"][room]["timeline"] if e["event_id"] == root]
        self.assertEqual(root_event["unsigned"]["m.relations"]["m.thread"]["count"], 1)

    async def test_left_and_kicked_rooms(self) -> None:
        kicked, left, sent_then_left = await self.rooms_with_bob(3)
        body = {"lists": {"all": room_list([[0, 9]])}}
        await self.bob.ok("POST", f"/rooms/{left}/leave", {})
        await self.alice.ok("POST", f"/rooms/{kicked}/kick", {"user_id": self.bob.user_id})
        await self.settle()
        first = await sliding(self.bob, body)
        # Kicked: listed, up to the kick; left by the user: not.
        self.assertEqual(set(first["rooms"]), {kicked, sent_then_left})
        self.assertEqual(first["rooms"][kicked]["membership"], "leave")
        self.assertEqual(first["rooms"][kicked]["timeline"][-1]["type"], "m.room.member")
        await self.bob.ok("POST", f"/rooms/{sent_then_left}/leave", {})
        await self.alice.send(sent_then_left, "after bob left")
        await self.settle()
        later = await sliding(self.bob, body, pos=first["pos"])
        entry = later["rooms"][sent_then_left]
        self.assertEqual((entry["membership"], entry["initial"]), ("leave", True))
        bodies = [e["content"].get("body") for e in entry["timeline"]]
        self.assertNotIn("after bob left", bodies)

    async def test_left_room_state_is_as_at_the_leave(self) -> None:
        [room] = await self.rooms_with_bob(1)
        body = {"lists": {"all": room_list([[0, 9]])}}
        await self.settle()
        first = await sliding(self.bob, body)
        await self.bob.ok("POST", f"/rooms/{room}/leave", {})
        await self.alice.ok("PUT", f"/rooms/{room}/state/m.room.name", {"name": "after bob"})
        await self.settle()
        later = await sliding(self.bob, body, pos=first["pos"])
        entry = later["rooms"][room]
        self.assertEqual((entry["membership"], entry["initial"]), ("leave", True))
        self.assertEqual(entry["name"], "room 0")
        names = [e["content"] for e in entry["required_state"] if e["type"] == "m.room.name"]
        self.assertEqual(names, [{"name": "room 0"}])

    async def test_deleted_state_is_sent_as_a_stub(self) -> None:
        """A state key the room's current state loses (a state reset, as
        state resolution writes it: the row gone from current_state_events
        and a delta with no event) reaches the client as a StateStub."""
        [room] = await self.rooms_with_bob(1)
        await self.alice.ok("PUT", f"/rooms/{room}/state/m.room.topic", {"topic": "soon gone"})
        await self.settle()
        config = room_list([[0, 0]])
        config["required_state"] = [["m.room.topic", ""], ["m.room.name", ""]]
        body = {"lists": {"all": config}}
        first = await sliding(self.bob, body)
        topics = [e for e in first["rooms"][room]["required_state"] if e["type"] == "m.room.topic"]
        self.assertEqual(topics[0]["content"], {"topic": "soon gone"})
        event_id = await self.alice.send(room, "the reset came with this")
        await self.settle()
        main = self.servers["main"]
        event = (await main.store.get_events([event_id]))[event_id]
        await main.store.db_pool.execute(
            "test_state_reset",
            "DELETE FROM current_state_events WHERE room_id = ? AND type = 'm.room.topic'",
            room,
        )
        await main.store.db_pool.execute(
            "test_state_reset",
            "INSERT INTO current_state_delta_stream (stream_id, instance_name, room_id, type,"
            " state_key, event_id, prev_event_id) VALUES (?, ?, ?, 'm.room.topic', '', NULL, NULL)",
            event.stream_ordering,
            event.instance_name,
            room,
        )
        for hs in self.servers.values():
            hs.store.get_current_state_ids.invalidate(room)
        later = await sliding(self.bob, body, pos=first["pos"])
        check_shape(self, later)
        entry = later["rooms"][room]
        self.assertNotIn("initial", entry)
        self.assertEqual(entry["required_state"], [{"type": "m.room.topic", "state_key": ""}])
        self.assertEqual([e["event_id"] for e in entry["timeline"]], [event_id])

    async def test_tag_and_space_filters(self) -> None:
        favourite, in_space, other = await self.rooms_with_bob(3)
        space = await self.alice.create_room(
            preset="public_chat", creation_content={"type": "m.space"}
        )
        await self.bob.ok("POST", f"/join/{space}", {})
        await self.alice.ok(
            "PUT", f"/rooms/{space}/state/m.space.child/{in_space}", {"via": ["test.local"]}
        )
        await self.alice.ok("PUT", f"/rooms/{space}/state/m.space.child/{other}", {})
        await self.bob.ok("PUT", f"/user/{self.bob.user_id}/rooms/{favourite}/tags/m.favourite", {})
        await self.bob.ok(
            "PUT", f"/user/{self.bob.user_id}/rooms/{in_space}/tags/m.lowpriority", {}
        )
        await self.settle()
        lists = {
            "favourites": room_list([[0, 9]], filters={"tags": ["m.favourite"]}),
            "not_low": room_list(
                [[0, 9]], filters={"not_tags": ["m.lowpriority"], "not_room_types": ["m.space"]}
            ),
            "in_space": room_list([[0, 9]], filters={"spaces": [space, "!unknown:x"]}),
        }
        result = await sliding(self.bob, {"lists": lists})
        listed = {
            name: sorted(r for r, e in result["rooms"].items() if name in e.get("lists", []))
            for name in lists
        }
        self.assertEqual(listed["favourites"], [favourite])
        self.assertEqual(listed["not_low"], sorted([favourite, other]))
        # A child whose event has no "via" is no longer a child.
        self.assertEqual(listed["in_space"], [in_space])

    async def test_pos_is_the_connections_own(self) -> None:
        await self.rooms_with_bob(1)
        await self.settle()
        body = {"conn_id": "room-list", "lists": {"all": room_list([[0, 0]])}}
        first = await sliding(self.bob, body)
        code, error = await self.bob.request("POST", PATH + "?pos=nonsense", body)
        self.assertEqual((code, error["errcode"]), (400, "M_UNKNOWN_POS"))
        # Another user, or another conn_id, cannot continue the connection.
        code, error = await self.alice.request("POST", PATH + f"?pos={first['pos']}", body)
        self.assertEqual((code, error["errcode"]), (400, "M_UNKNOWN_POS"))
        other_conn = {**body, "conn_id": "encryption"}
        code, error = await self.bob.request("POST", PATH + f"?pos={first['pos']}", other_conn)
        self.assertEqual((code, error["errcode"]), (400, "M_UNKNOWN_POS"))
        # A retry with the same pos works; once the next is used, the old is gone.
        second = await sliding(self.bob, body, pos=first["pos"])
        retry = await sliding(self.bob, body, pos=first["pos"])
        await sliding(self.bob, body, pos=retry["pos"])
        code, error = await self.bob.request("POST", PATH + f"?pos={second['pos']}", body)
        self.assertEqual((code, error["errcode"]), (400, "M_UNKNOWN_POS"))

    async def test_two_connections_of_one_device(self) -> None:
        [room] = await self.rooms_with_bob(1)
        await self.settle()
        rooms_conn = {"conn_id": "room-list", "lists": {"all": room_list([[0, 0]])}}
        e2ee_conn = {
            "conn_id": "encryption",
            "extensions": {"e2ee": {"enabled": True}, "to_device": {"enabled": True}},
        }
        a = await sliding(self.bob, rooms_conn)
        b = await sliding(self.bob, e2ee_conn)
        self.assertIn(room, a["rooms"])
        self.assertEqual(b["rooms"], {})
        self.assertIn("signed_curve25519", b["extensions"]["e2ee"]["device_one_time_keys_count"])
        await self.alice.send(room, "news")
        await self.settle()
        a2 = await sliding(self.bob, rooms_conn, pos=a["pos"])
        self.assertIn(room, a2["rooms"])
        b2 = await sliding(self.bob, e2ee_conn, pos=b["pos"])
        self.assertEqual(b2["rooms"], {})

    async def test_extensions(self) -> None:
        [room] = await self.rooms_with_bob(1)
        await self.bob.ok("PUT", f"/user/{self.bob.user_id}/account_data/org.example", {"a": 1})
        await self.bob.ok(
            "PUT",
            f"/user/{self.bob.user_id}/rooms/{room}/account_data/org.example.room",
            {"b": 2},
        )
        event_id = await self.alice.send(room, "read me")
        await self.alice.ok("POST", f"/rooms/{room}/receipt/m.read/{event_id}", {})
        await self.alice.ok(
            "PUT", f"/rooms/{room}/typing/{self.alice.user_id}", {"typing": True, "timeout": 30000}
        )
        await self.alice.ok(
            "PUT",
            "/sendToDevice/m.test/txn1",
            {"messages": {self.bob.user_id: {self.bob.device_id: {"hello": "bob"}}}},
        )
        await self.settle()
        body = {
            "lists": {"all": room_list([[0, 0]])},
            "extensions": {
                name: {"enabled": True}
                for name in ("to_device", "e2ee", "account_data", "receipts", "typing")
            },
        }
        result = await sliding(self.bob, body)
        ext = result["extensions"]
        self.assertEqual([m["content"] for m in ext["to_device"]["events"]], [{"hello": "bob"}])
        self.assertIn("org.example", [d["type"] for d in ext["account_data"]["global"]])
        self.assertEqual(
            [d["type"] for d in ext["account_data"]["rooms"][room]], ["org.example.room"]
        )
        receipt = ext["receipts"]["rooms"][room]
        self.assertIn(self.alice.user_id, receipt["content"][event_id]["m.read"])
        self.assertEqual(ext["typing"]["rooms"][room]["content"]["user_ids"], [self.alice.user_id])
        self.assertIn("device_lists", ext["e2ee"])
        # The to-device messages are acknowledged by the next request.
        to_device_since = ext["to_device"]["next_batch"]
        body["extensions"]["to_device"]["since"] = to_device_since
        later = await sliding(self.bob, body, pos=result["pos"])
        self.assertEqual(later["extensions"]["to_device"]["events"], [])
        self.assertNotIn(room, later["extensions"]["account_data"]["rooms"])

    async def test_bad_input(self) -> None:
        cases = [
            ({"lists": {"a": {"ranges": [[3, 1]], "timeline_limit": 1}}}, "lists.a.ranges[0]"),
            ({"lists": {"a": {"ranges": "all", "timeline_limit": 1}}}, "lists.a.ranges"),
            ({"lists": {"a": {"timeline_limit": -1}}}, "lists.a.timeline_limit"),
            ({"lists": {"a": {"required_state": [["m.room.name"]]}}}, "required_state[0]"),
            ({"lists": {"a": {"filters": {"is_dm": "yes"}}}}, "lists.a.filters.is_dm"),
            ({"lists": []}, "'lists'"),
            ({"room_subscriptions": {"!r:x": {"timeline_limit": "5"}}}, "timeline_limit"),
            ({"conn_id": 5}, "'conn_id'"),
            ({"set_presence": "away"}, "'set_presence'"),
            ({"extensions": {"to_device": {"enabled": True, "since": "x"}}}, "since"),
            ({"lists": {str(i): {} for i in range(101)}}, "at most 100"),
        ]
        for body, where in cases:
            code, error = await self.bob.request("POST", PATH, body)
            self.assertEqual((code, error.get("errcode")), (400, "M_INVALID_PARAM"), (body, error))
            self.assertIn(where, error["error"])
        code, error = await self.bob.request("POST", PATH, raw=b"{not json")
        self.assertEqual((code, error["errcode"]), (400, "M_NOT_JSON"))
        code, _ = await self.bob.request("POST", PATH, {}, token=None)
        self.assertEqual(code, 401)

    async def test_versions_announce_it(self) -> None:
        versions = await self.bob.ok("GET", "/_matrix/client/versions")
        self.assertTrue(versions["unstable_features"]["org.matrix.simplified_msc3575"])


class SlidingSyncWorkersTestCase(SlidingSyncTestCase):
    """The same through the default layout: bob talks to the synchrotron,
    alice to the main process, events written by the persisters."""

    workers = DEFAULT_LAYOUT_WORKERS
    stream_writers = DEFAULT_LAYOUT_STREAM_WRITERS

    async def test_connection_continues_on_another_process(self) -> None:
        [room] = await self.rooms_with_bob(1)
        await self.settle()
        body = {"lists": {"all": room_list([[0, 0]])}}
        first = await sliding(self.bob, body)
        await self.alice.send(room, "elsewhere")
        await self.settle()
        # The same connection, continued by the main process.
        on_main = self.bob.as_user(self.bob.token)
        on_main.base_url = self.alice.base_url
        later = await sliding(on_main, body, pos=first["pos"])
        self.assertEqual(
            [e["content"].get("body") for e in later["rooms"][room]["timeline"]], ["elsewhere"]
        )
        self.assertNotIn("initial", later["rooms"][room])

    async def test_account_data_changed_on_another_process_is_seen(self) -> None:
        """bob's process keeps his ``m.direct`` and ignored users in memory;
        written through the main process (the account_data writer), they
        are forgotten when the stream's rows reach bob's process."""
        [room] = await self.rooms_with_bob(1)
        eve_room = await self.eve.create_room()
        await self.eve.ok("POST", f"/rooms/{eve_room}/invite", {"user_id": self.bob.user_id})
        await self.settle()
        body = {"lists": {"all": room_list([[0, 9]])}}
        first = await sliding(self.bob, body)
        self.assertFalse(first["rooms"][room]["is_dm"])
        self.assertIn(eve_room, first["rooms"])
        bob_store = self.servers[list(self.servers)[-1]].store
        cache = bob_store.get_global_account_data_of_type.cache
        self.assertEqual(cache.get((self.bob.user_id, "m.direct")), (True, None))
        on_main = self.bob.as_user(self.bob.token)
        on_main.base_url = self.alice.base_url
        await on_main.ok(
            "PUT",
            f"/user/{self.bob.user_id}/account_data/m.direct",
            {self.alice.user_id: [room]},
        )
        await on_main.ok(
            "PUT",
            f"/user/{self.bob.user_id}/account_data/m.ignored_user_list",
            {"ignored_users": {self.eve.user_id: {}}},
        )

        async def bob_sees_both() -> bool:
            later = await sliding(self.bob, body)
            return later["rooms"][room]["is_dm"] and eve_room not in later["rooms"]

        await eventually(bob_sees_both, what="bob's process to see his new account data")


class SlidingSyncRestartTestCase(DatabaseTestCase):
    async def test_a_restarted_worker_continues_the_connection(self) -> None:
        servers, clients, bus = start_cluster(
            self,
            self.test_db,
            workers=DEFAULT_LAYOUT_WORKERS,
            stream_writers=DEFAULT_LAYOUT_STREAM_WRITERS,
        )
        alice = await ClientApi(self, clients["main"].base_url).register("alice")
        bob = await ClientApi(self, clients["synchrotron1"].base_url).register("bob")
        room = await alice.create_room(preset="public_chat")
        await bob.ok("POST", f"/join/{room}", {})
        body = {"conn_id": "room-list", "lists": {"all": room_list([[0, 0]], 3)}}
        first = await sliding(bob, body)
        self.assertIn(room, first["rooms"])
        # synchrotron1 stops; a new one starts with nothing in memory.
        old = servers["synchrotron1"]
        for endpoint in list(bus.endpoints):
            if endpoint.hs is old:
                bus.leave(endpoint)
        await old.service.stopService()
        new = make_homeserver(self, old.config, "synchrotron1")
        bus.join(new)
        bob_again = bob.as_user(bob.token)
        bob_again.base_url = serve(self, new)
        event_id = await alice.send(room, "after the restart")
        later = await sliding(bob_again, body, pos=first["pos"], timeout=10_000)
        entry = later["rooms"][room]
        self.assertNotIn("initial", entry)
        self.assertEqual([e["event_id"] for e in entry["timeline"]], [event_id])


class SlidingSyncConcurrencyTestCase(DatabaseTestCase):
    async def test_requests_are_capped_and_a_newer_one_ends_the_older(self) -> None:
        servers, clients, _ = start_cluster(
            self, self.test_db, limits={"max_concurrent_syncs_per_user": 2}
        )
        base = clients["main"].base_url
        alice = await ClientApi(self, base).register("alice")
        bob = await ClientApi(self, base).register("bob")
        room = await alice.create_room(preset="public_chat")
        await bob.ok("POST", f"/join/{room}", {})
        handler = servers["main"].handlers.sliding_sync
        assert bob.user_id is not None
        bob_id = bob.user_id

        def body(conn_id: str) -> dict[str, Any]:
            return {"conn_id": conn_id, "lists": {"all": room_list([[0, 0]])}}

        first_a = await sliding(bob, body("a"))
        first_b = await sliding(bob, body("b"))
        waiting_a = defer.ensureDeferred(sliding(bob, body("a"), first_a["pos"], 10_000))
        waiting_b = defer.ensureDeferred(sliding(bob, body("b"), first_b["pos"], 10_000))
        await eventually(lambda: handler._open.get(bob_id) == 2, what="two long-polls")
        # A third at once: refused, as /sync's are.
        code, error = await bob.request("POST", PATH + "?timeout=0", body("c"))
        self.assertEqual((code, error["errcode"]), (429, "M_LIMIT_EXCEEDED"))
        self.assertIn("retry_after_ms", error)
        # The client gives up on its long-poll of "a" and asks again: the
        # older request ends at once, with its pos and nothing new.
        start = time.monotonic()
        again_a = defer.ensureDeferred(sliding(bob, body("a"), first_a["pos"], 10_000))
        ended = await waiting_a
        self.assertLess(time.monotonic() - start, 5)
        self.assertEqual((ended["pos"], ended["rooms"]), (first_a["pos"], {}))
        await eventually(lambda: handler._open.get(bob_id) == 2, what="the newer parked")
        event_id = await alice.send(room, "for both connections")
        results = [await again_a, await waiting_b]
        for result in results:
            self.assertEqual([e["event_id"] for e in result["rooms"][room]["timeline"]], [event_id])
        await eventually(lambda: bob_id not in handler._open, what="every request over")
        # The newer request's pos carries the connection on.
        after = await sliding(bob, body("a"), results[0]["pos"])
        self.assertEqual(after["rooms"], {})
