"""The deprecated r0 reads: ``GET /events`` (long-polled, woken through
workers, ``limit`` paging, typing, receipts, presence, account data and
tags, peeking with ``room_id``), ``GET /initialSync`` (``limit``,
``archived``, receipts, tags, account data, presence) and ``GET
/rooms/{roomId}/initialSync``; answers checked against the spec's last
description of them, tokens shared with /sync and /messages, bad input
refused. On SQLite and PostgreSQL (``SYNAPSE_LITE_TEST_DB``)."""

from __future__ import annotations

import urllib.parse
from typing import Any

from twisted.internet import defer

from tests.harness.client_api import ClientApi, caught_up, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase
from tests.harness.spec import assert_spec_response


def q(value: str | None) -> str:
    assert value is not None
    return urllib.parse.quote(value, safe="")


def of_type(chunk: list[dict[str, Any]], event_type: str) -> list[dict[str, Any]]:
    return [e for e in chunk if e["type"] == event_type]


def bodies(chunk: list[dict[str, Any]]) -> list[str]:
    return [e["content"]["body"] for e in of_type(chunk, "m.room.message")]


class LegacySyncTestCase(DatabaseTestCase):
    """Alice on a reader (the process serving reads), her room's events on
    an events writer, Bob on the main process."""

    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, self.clients, _ = start_cluster(
            self, self.test_db, workers=["reader", "writer"], stream_writers={"events": ["writer"]}
        )
        await eventually(lambda: all(hs.replication.connected for hs in self.servers.values()))
        self.alice = await ClientApi(self, self.clients["reader"].base_url).register("alice")
        self.bob = await ClientApi(self, self.clients["main"].base_url).register("bob")
        #: Alice's token on the events writer: her sends land there directly.
        self.alice_on_writer = self.clients["writer"].as_user(self.alice.token)

    async def caught_up(self) -> None:
        await caught_up(self.servers, "writer")

    async def events(self, client: ClientApi, query: str) -> dict[str, Any]:
        answer: dict[str, Any] = await client.ok("GET", "/events?" + query)
        return answer

    async def test_event_stream(self) -> None:
        first = await self.events(self.alice, "timeout=0")
        assert_spec_response(self, "old_sync.yaml", "/events", "GET", 200, first)
        room = await self.alice.create_room(preset="public_chat")
        created = await self.events(self.alice, f"timeout=0&from={first['end']}")
        self.assertEqual(
            [e["type"] for e in created["chunk"][:2]], ["m.room.create", "m.room.member"]
        )
        self.assertTrue(all(e["room_id"] == room for e in created["chunk"][:2]))
        self.assertEqual(created["start"], first["end"])
        # A long-poll on the reader, woken by a send on the writer (Alice's
        # own presence, online once she listens, may come first).
        token = created["end"]
        waiting = defer.ensureDeferred(self.events(self.alice, f"timeout=10000&from={token}"))
        self.assertFalse(waiting.called)
        event_id = await self.alice_on_writer.send(room, "woken", txn_id="w1")
        woken = await waiting
        while not of_type(woken["chunk"], "m.room.message"):
            woken = await self.events(self.alice, f"timeout=10000&from={woken['end']}")
        [message] = of_type(woken["chunk"], "m.room.message")
        self.assertEqual(
            (message["event_id"], message["user_id"], message["sender"], message["room_id"]),
            (event_id, self.alice.user_id, self.alice.user_id, room),
        )
        self.assertEqual(message["unsigned"]["transaction_id"], "w1")
        # The schema describes the chunk's room events; Alice's presence may
        # share the answer (docs/client-api.md, "Deprecated endpoints": the
        # stream carries presence, typing, receipts and account data too,
        # as SyTest expects), and it has no event_id.
        room_events = [e for e in woken["chunk"] if e.get("type") != "m.presence"]
        self.assertTrue(all("event_id" in e for e in room_events))
        assert_spec_response(
            self, "old_sync.yaml", "/events", "GET", 200, {**woken, "chunk": room_events}
        )
        # limit: the oldest events first, each answer resuming after the last.
        for i in range(7):
            await self.alice_on_writer.send(room, f"m{i}")
        await self.caught_up()
        token, seen = woken["end"], []
        for _ in range(4):
            page = await self.events(self.alice, f"timeout=0&limit=3&from={token}")
            # limit caps the room events; presence (Alice's own, going online
            # as she listens) may come beside them.
            self.assertLessEqual(len([e for e in page["chunk"] if "event_id" in e]), 3)
            seen += bodies(page["chunk"])
            token = page["end"]
        self.assertEqual(seen, [f"m{i}" for i in range(7)])
        # The token works for /sync and /messages, and back.
        sync = await self.alice.sync(since=token)
        self.assertNotIn(room, sync["rooms"]["join"])
        back = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=b&limit=1&from={token}")
        self.assertEqual(bodies(back["chunk"]), ["m6"])
        again = await self.events(self.alice, f"timeout=0&from={sync['next_batch']}")
        self.assertEqual(again["chunk"], [])

    async def test_ephemeral_events_and_account_data_in_the_stream(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room}", {})
        await self.caught_up()
        token = (await self.events(self.alice, "timeout=0"))["end"]
        event_id = await self.bob.send(room, "read me")
        await self.caught_up()
        me = q(self.alice.user_id)
        await self.alice.ok("POST", f"/rooms/{room}/receipt/m.read/{q(event_id)}", {})
        await self.bob.ok(
            "PUT", f"/rooms/{room}/typing/{q(self.bob.user_id)}", {"typing": True, "timeout": 9000}
        )
        await self.alice.ok("PUT", f"/user/{me}/account_data/org.example.cats", {"n": 1})
        await self.alice.ok("PUT", f"/user/{me}/rooms/{room}/account_data/org.example.rats", {})
        await self.alice.ok("PUT", f"/user/{me}/rooms/{room}/tags/u.work", {"order": 1})
        chunk: list[dict[str, Any]] = []

        async def everything_arrived() -> bool:
            chunk[:] = (await self.events(self.alice, f"timeout=0&from={token}"))["chunk"]
            types = {e["type"] for e in chunk}
            wanted = {"m.receipt", "m.typing", "org.example.cats", "org.example.rats", "m.tag"}
            return wanted <= types

        await eventually(everything_arrived, what="receipt, typing and account data in /events")
        [receipt] = of_type(chunk, "m.receipt")
        self.assertEqual(receipt["room_id"], room)
        self.assertIn(self.alice.user_id, receipt["content"][event_id]["m.read"])
        [typing] = of_type(chunk, "m.typing")
        self.assertEqual(
            (typing["room_id"], typing["content"]), (room, {"user_ids": [self.bob.user_id]})
        )
        [cats] = of_type(chunk, "org.example.cats")
        self.assertNotIn("room_id", cats)
        [tag] = of_type(chunk, "m.tag")
        self.assertEqual(
            (tag["room_id"], tag["content"]), (room, {"tags": {"u.work": {"order": 1}}})
        )
        self.assertEqual(of_type(chunk, "org.example.rats")[0]["room_id"], room)
        self.assertEqual(bodies(chunk), ["read me"])

    async def test_peeking_into_a_world_readable_room(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        await self.alice.send(room, "before")
        code, body = await self.bob.request("GET", f"/events?timeout=0&room_id={q(room)}")
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        code, body = await self.bob.request("GET", f"/rooms/{room}/initialSync")
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        await self.alice.ok(
            "PUT",
            f"/rooms/{room}/state/m.room.history_visibility",
            {"history_visibility": "world_readable"},
        )
        await self.caught_up()
        snapshot = await self.bob.ok("GET", f"/rooms/{room}/initialSync")
        assert_spec_response(
            self, "room_initial_sync.yaml", "/rooms/{roomId}/initialSync", "GET", 200, snapshot
        )
        self.assertEqual(
            [e["type"] for e in snapshot["messages"]["chunk"]], ["m.room.history_visibility"]
        )
        # Bob, in no room, long-polls the room on the main process.
        waiting = defer.ensureDeferred(
            self.events(
                self.bob, f"timeout=10000&room_id={q(room)}&from={snapshot['messages']['end']}"
            )
        )
        await self.alice_on_writer.send(room, "peeked")
        answer = await waiting
        while not bodies(answer["chunk"]):  # Alice's presence may come first
            answer = await self.events(
                self.bob, f"timeout=10000&room_id={q(room)}&from={answer['end']}"
            )
        self.assertEqual(bodies(answer["chunk"]), ["peeked"])

    async def test_initial_sync(self) -> None:
        me = q(self.alice.user_id)
        joined = await self.alice.create_room(preset="public_chat", visibility="public")
        earlier = [await self.alice.send(joined, f"m{i}") for i in range(3)]
        last = await self.alice.send(joined, "m3")
        await self.alice.ok("POST", f"/rooms/{joined}/receipt/m.read/{q(last)}", {})
        # A receipt only moves forward: one for an earlier event is ignored.
        await self.alice.ok("POST", f"/rooms/{joined}/receipt/m.read/{q(earlier[0])}", {})
        await self.alice.ok("PUT", f"/user/{me}/rooms/{joined}/account_data/org.example.r", {})
        await self.alice.ok("PUT", f"/user/{me}/rooms/{joined}/tags/u.work", {"order": 1})
        await self.alice.ok("PUT", f"/user/{me}/account_data/org.example.g", {"g": 1})
        left = await self.alice.create_room(
            preset="private_chat",
            power_level_content_override={"users": {self.alice.user_id: 100, self.bob.user_id: 50}},
        )
        await self.alice.ok("PUT", f"/rooms/{left}/state/m.room.topic", {"topic": "kept"})
        await self.alice.ok("POST", f"/rooms/{left}/invite", {"user_id": self.bob.user_id})
        await self.bob.ok("POST", f"/join/{left}", {})
        await self.alice.ok("POST", f"/rooms/{left}/leave", {})
        await self.bob.ok("PUT", f"/rooms/{left}/state/m.room.topic", {"topic": "later"})
        invited = await self.bob.create_room(preset="private_chat")
        await self.bob.ok("POST", f"/rooms/{invited}/invite", {"user_id": self.alice.user_id})
        await self.caught_up()

        body = await self.alice.ok("GET", "/initialSync?limit=2")
        assert_spec_response(self, "old_sync.yaml", "/initialSync", "GET", 200, body)
        rooms = {r["room_id"]: r for r in body["rooms"]}
        self.assertEqual(set(rooms), {joined, invited})
        room = rooms[joined]
        self.assertEqual((room["membership"], room["visibility"]), ("join", "public"))
        self.assertEqual(bodies(room["messages"]["chunk"]), ["m2", "m3"])
        self.assertEqual([d["type"] for d in room["account_data"]], ["m.tag", "org.example.r"])
        self.assertIn("m.room.create", {e["type"] for e in room["state"]})
        page = await self.alice.ok(
            "GET", f"/rooms/{joined}/messages?dir=b&limit=1&from={room['messages']['start']}"
        )
        self.assertEqual(bodies(page["chunk"]), ["m1"])
        invite = rooms[invited]
        self.assertEqual((invite["membership"], invite["inviter"]), ("invite", self.bob.user_id))
        self.assertEqual(invite["invite"]["state_key"], self.alice.user_id)
        # An invitee reads the room (as history visibility lets them), not
        # who is online in it or what they read.
        as_invitee = await self.alice.ok("GET", f"/rooms/{invited}/initialSync")
        self.assertEqual(as_invitee["membership"], "invite")
        self.assertEqual((as_invitee["presence"], as_invitee["receipts"]), ([], []))
        [receipt] = [r for r in body["receipts"] if r["room_id"] == joined]
        self.assertEqual(list(receipt["content"]), [last])
        self.assertIn(self.alice.user_id, receipt["content"][last]["m.read"])
        self.assertEqual(
            [(d["type"], d["content"]) for d in body["account_data"]], [("org.example.g", {"g": 1})]
        )
        self.assertEqual([p["content"]["user_id"] for p in body["presence"]], [self.alice.user_id])
        # archived: the left room too, as it was when Alice left.
        archived = await self.alice.ok("GET", "/initialSync?archived=true&limit=1")
        departed = {r["room_id"]: r for r in archived["rooms"]}[left]
        self.assertEqual(departed["membership"], "leave")
        topics = [e["content"]["topic"] for e in departed["state"] if e["type"] == "m.room.topic"]
        self.assertEqual(topics, ["kept"])
        self.assertEqual(
            [e["content"]["membership"] for e in departed["messages"]["chunk"]], ["leave"]
        )
        # The end token starts an event stream.
        await self.bob.ok("POST", f"/join/{joined}", {})
        # Presence: everyone sharing a room, whether or not they ever had one.
        await self.caught_up()
        shared = await self.alice.ok("GET", "/initialSync?limit=0")
        self.assertEqual(
            {(p["content"]["user_id"], p["content"]["presence"]) for p in shared["presence"]},
            {(self.alice.user_id, "offline"), (self.bob.user_id, "offline")},
        )
        bob_id = await self.bob.send(joined, "after the snapshot")
        await self.caught_up()
        stream = await self.events(self.alice, f"timeout=0&from={body['end']}")
        self.assertEqual(
            [e["event_id"] for e in of_type(stream["chunk"], "m.room.message")], [bob_id]
        )
        # The same snapshot of a room from main and from the reader.
        answers = []
        for client in (self.alice, self.clients["main"].as_user(self.alice.token)):
            snapshot = await client.ok("GET", f"/rooms/{joined}/initialSync?limit=3")
            assert_spec_response(
                self, "room_initial_sync.yaml", "/rooms/{roomId}/initialSync", "GET", 200, snapshot
            )
            answers.append(
                (
                    [e["event_id"] for e in snapshot["messages"]["chunk"]],
                    sorted(e["event_id"] for e in snapshot["state"]),
                    snapshot["membership"],
                    snapshot["account_data"],
                )
            )
        self.assertEqual(answers[0], answers[1])
        empty = await self.alice.ok("GET", f"/rooms/{joined}/initialSync?limit=0")
        self.assertEqual(empty["messages"]["chunk"], [])

    async def test_bad_input(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        for path in (
            "/events?limit=hello",
            "/events?limit=-2",
            "/events?timeout=hello",
            "/events?from=nonsense",
            "/events?room_id=nonsense&timeout=0",
            "/initialSync?limit=hello",
            "/initialSync?limit=-1",
            "/initialSync?archived=maybe",
            f"/rooms/{room}/initialSync?limit=x",
            "/rooms/x/initialSync",
        ):
            code, body = await self.alice.request("GET", path)
            self.assertEqual(code, 400, path)
            self.assertTrue(body["errcode"].startswith("M_"), path)
        code, body = await self.alice.request("GET", "/events?timeout=0&room_id=!nope:test.local")
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        for path in ("/events", "/initialSync", f"/rooms/{room}/initialSync"):
            code, body = await self.alice.request("GET", path, token=None)
            self.assertEqual((code, body["errcode"]), (401, "M_MISSING_TOKEN"))
