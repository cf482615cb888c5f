"""/sync over HTTP in one process: initial and incremental, long-poll,
timeline limits, rooms joined/invited/left, ephemeral data, account data,
to-device messages and presence."""

from __future__ import annotations

import gc
import json
import time
import urllib.parse
from typing import Any

from twisted.internet import defer

from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase


def timeline(sync: dict[str, Any], room_id: str) -> list[dict[str, Any]]:
    return sync["rooms"]["join"].get(room_id, {}).get("timeline", {}).get("events", [])


def bodies(sync: dict[str, Any], room_id: str) -> list[str]:
    return [e["content"].get("body") for e in timeline(sync, room_id) if "body" in e["content"]]


class SyncTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(
            self, self.test_db, limits={"max_concurrent_syncs_per_user": 2}
        )
        base = clients["main"].base_url
        self.alice = await ClientApi(self, base).register("alice")
        self.bob = await ClientApi(self, base).register("bob")

    async def shared_room(self) -> str:
        room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room}", {})
        return room

    async def test_initial_and_incremental(self) -> None:
        room = await self.shared_room()
        initial = await self.bob.sync()
        self.assertIn(room, initial["rooms"]["join"])
        types = [e["type"] for e in timeline(initial, room)]
        self.assertEqual(types[0], "m.room.create")
        await self.alice.send(room, "one")
        await self.alice.send(room, "two")
        later = await self.bob.sync(since=initial["next_batch"])
        self.assertEqual(bodies(later, room), ["one", "two"])
        self.assertFalse(later["rooms"]["join"][room]["timeline"]["limited"])
        again = await self.bob.sync(since=later["next_batch"])
        self.assertEqual(again["rooms"]["join"], {})

    async def test_long_poll_wakes_on_a_message(self) -> None:
        room = await self.shared_room()
        initial = await self.bob.sync()
        start = time.monotonic()
        waiting = defer.ensureDeferred(self.bob.sync(since=initial["next_batch"], timeout=10_000))
        await self.alice.send(room, "wake up")
        result = await waiting
        self.assertEqual(bodies(result, room), ["wake up"])
        self.assertLess(time.monotonic() - start, 5)

    async def test_long_poll_times_out_empty(self) -> None:
        await self.shared_room()
        initial = await self.bob.sync()
        start = time.monotonic()
        result = await self.bob.sync(since=initial["next_batch"], timeout=300)
        self.assertGreaterEqual(time.monotonic() - start, 0.25)
        self.assertEqual(result["rooms"]["join"], {})

    async def test_limited_timeline_and_prev_batch(self) -> None:
        room = await self.shared_room()
        initial = await self.bob.sync()
        sent = [await self.alice.send(room, f"m{i}") for i in range(8)]
        limit_filter = urllib.parse.quote(json.dumps({"room": {"timeline": {"limit": 3}}}))
        later = await self.bob.sync(since=initial["next_batch"], filter=limit_filter)
        entry = later["rooms"]["join"][room]["timeline"]
        self.assertTrue(entry["limited"])
        self.assertEqual([e["event_id"] for e in entry["events"]], sent[-3:])
        page = await self.bob.ok(
            "GET", f"/rooms/{room}/messages?dir=b&limit=5&from={entry['prev_batch']}"
        )
        self.assertEqual([e["event_id"] for e in page["chunk"]], sent[-4:-9:-1])

    async def test_uploaded_filter(self) -> None:
        room = await self.shared_room()
        for i in range(4):
            await self.alice.send(room, f"m{i}")
        created = await self.bob.ok(
            "POST", f"/user/{self.bob.user_id}/filter", {"room": {"timeline": {"limit": 2}}}
        )
        result = await self.bob.sync(filter=created["filter_id"])
        self.assertEqual(bodies(result, room), ["m2", "m3"])
        code, body = await self.bob.request("GET", "/sync?filter=99")
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))
        code, body = await self.bob.request("GET", "/sync?filter=%7Bbad")
        self.assertEqual((code, body["errcode"]), (400, "M_NOT_JSON"))

    async def test_presence_filter(self) -> None:
        await self.shared_room()
        no_presence = urllib.parse.quote(json.dumps({"presence": {"not_types": ["m.presence"]}}))
        result = await self.bob.sync(filter=no_presence)
        self.assertEqual(result["presence"]["events"], [])
        only_alice = urllib.parse.quote(json.dumps({"presence": {"senders": [self.alice.user_id]}}))
        result = await self.bob.sync(filter=only_alice)
        self.assertLessEqual(
            {e["sender"] for e in result["presence"]["events"]}, {self.alice.user_id}
        )
        everyone = await self.bob.sync(
            filter=urllib.parse.quote(json.dumps({"presence": {"types": ["m.*"]}}))
        )
        self.assertIn(self.bob.user_id, {e["sender"] for e in everyone["presence"]["events"]})
        bad = urllib.parse.quote(json.dumps({"presence": {"types": "m.presence"}}))
        code, body = await self.bob.request("GET", f"/sync?filter={bad}")
        self.assertEqual((code, body["errcode"]), (400, "M_BAD_JSON"))
        self.assertIn("'presence.types' must be a list of strings", body["error"])

    async def test_invites_joins_and_leaves(self) -> None:
        initial = await self.bob.sync()
        room = await self.alice.create_room(preset="private_chat", invite=[self.bob.user_id])
        invited = await self.bob.sync(since=initial["next_batch"])
        self.assertIn(room, invited["rooms"]["invite"])
        states = invited["rooms"]["invite"][room]["invite_state"]["events"]
        self.assertIn("m.room.member", [e["type"] for e in states])
        # The invite itself, from whoever created the room with it (SYN-205).
        invite = next(
            e for e in states if e["type"] == "m.room.member" and e["state_key"] == self.bob.user_id
        )
        self.assertEqual(
            (invite["sender"], invite["content"]["membership"]), (self.alice.user_id, "invite")
        )
        await self.bob.ok("POST", f"/join/{room}", {})
        joined = await self.bob.sync(since=invited["next_batch"])
        self.assertIn(room, joined["rooms"]["join"])
        self.assertEqual(joined["rooms"]["invite"], {})
        await self.alice.send(room, "before kick")
        await self.alice.ok("POST", f"/rooms/{room}/kick", {"user_id": self.bob.user_id})
        await self.alice.send(room, "after kick")
        left = await self.bob.sync(since=joined["next_batch"])
        self.assertIn(room, left["rooms"]["leave"])
        left_bodies = [
            e["content"].get("body") for e in left["rooms"]["leave"][room]["timeline"]["events"]
        ]
        self.assertIn("before kick", left_bodies)
        self.assertNotIn("after kick", left_bodies)
        later = await self.bob.sync(since=left["next_batch"])
        self.assertNotIn(room, later["rooms"]["join"])
        self.assertEqual(later["rooms"]["leave"], {})

    async def test_ephemeral_and_account_data(self) -> None:
        room = await self.shared_room()
        initial = await self.bob.sync()
        event_id = await self.alice.send(room, "read me")
        await self.alice.ok(
            "PUT", f"/rooms/{room}/typing/{self.alice.user_id}", {"typing": True, "timeout": 5000}
        )
        await self.bob.ok("POST", f"/rooms/{room}/receipt/m.read/{event_id}", {})
        await self.bob.ok("PUT", f"/user/{self.bob.user_id}/account_data/org.example", {"x": 1})
        await self.bob.ok(
            "PUT", f"/user/{self.bob.user_id}/rooms/{room}/account_data/org.room", {"y": 2}
        )
        later = await self.bob.sync(since=initial["next_batch"])
        joined = later["rooms"]["join"][room]
        ephemeral = {e["type"]: e["content"] for e in joined["ephemeral"]["events"]}
        self.assertEqual(ephemeral["m.typing"], {"user_ids": [self.alice.user_id]})
        self.assertIn(self.bob.user_id, ephemeral["m.receipt"][event_id]["m.read"])
        self.assertEqual(
            later["account_data"]["events"], [{"type": "org.example", "content": {"x": 1}}]
        )
        self.assertEqual(
            joined["account_data"]["events"], [{"type": "org.room", "content": {"y": 2}}]
        )
        self.assertEqual(
            await self.bob.ok("GET", f"/user/{self.bob.user_id}/account_data/org.example"),
            {"x": 1},
        )
        code, _ = await self.alice.request("GET", f"/user/{self.bob.user_id}/account_data/x")
        self.assertEqual(code, 403)
        await self.alice.ok("PUT", f"/rooms/{room}/typing/{self.alice.user_id}", {"typing": False})
        stopped = await self.bob.sync(since=later["next_batch"])
        ephemeral = stopped["rooms"]["join"][room]["ephemeral"]["events"]
        self.assertEqual(ephemeral, [{"type": "m.typing", "content": {"user_ids": []}}])

    async def test_to_device_delivered_then_deleted(self) -> None:
        initial = await self.bob.sync()
        messages = {self.bob.user_id: {"*": {"secret": 1}}}
        await self.alice.ok("PUT", "/sendToDevice/m.test/txn1", {"messages": messages})
        await self.alice.ok("PUT", "/sendToDevice/m.test/txn1", {"messages": messages})
        first = await self.bob.sync(since=initial["next_batch"])
        self.assertEqual(
            first["to_device"]["events"],
            [{"type": "m.test", "sender": self.alice.user_id, "content": {"secret": 1}}],
        )
        # Not acknowledged yet: the same since gives it again.
        repeat = await self.bob.sync(since=initial["next_batch"])
        self.assertEqual(len(repeat["to_device"]["events"]), 1)
        acked = await self.bob.sync(since=first["next_batch"])
        self.assertEqual(acked["to_device"]["events"], [])
        rows = await self.servers["main"].store.db_pool.select(
            "t", "SELECT COUNT(*) FROM device_inbox"
        )
        self.assertEqual(rows[0][0], 0)

    async def test_presence(self) -> None:
        await self.shared_room()
        await self.alice.ok(
            "PUT",
            f"/presence/{self.alice.user_id}/status",
            {"presence": "unavailable", "status_msg": "lunch"},
        )
        status = await self.bob.ok("GET", f"/presence/{self.alice.user_id}/status")
        self.assertEqual((status["presence"], status["status_msg"]), ("unavailable", "lunch"))
        initial = await self.bob.sync()
        senders = {e["sender"]: e["content"] for e in initial["presence"]["events"]}
        self.assertEqual(senders[self.alice.user_id]["presence"], "unavailable")
        self.assertEqual(senders[self.bob.user_id]["presence"], "online")  # bob is syncing
        code, body = await self.bob.request(
            "PUT", f"/presence/{self.bob.user_id}/status", {"presence": "sleepy"}
        )
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"))

    async def test_concurrent_syncs_are_capped_and_tokens_checked(self) -> None:
        room = await self.shared_room()
        initial = await self.bob.sync()
        waits = [
            defer.ensureDeferred(self.bob.sync(since=initial["next_batch"], timeout=2000))
            for _ in range(2)
        ]
        in_flight = self.servers["main"].handlers.sync._in_flight
        bob = self.bob.user_id or ""
        await eventually(lambda: in_flight[bob] == 2, what="both syncs waiting")
        code, body = await self.bob.request(
            "GET", f"/sync?since={initial['next_batch']}&timeout=10"
        )
        self.assertEqual((code, body["errcode"]), (429, "M_LIMIT_EXCEEDED"))
        await self.alice.send(room, "wake both")
        for d in waits:
            self.assertEqual(bodies(await d, room), ["wake both"])
        for bad in ("nonsense", "s1_2", "m1~99.5_0_0_0_0_0_0", "s-1_0_0_0_0_0_0"):
            code, body = await self.bob.request("GET", f"/sync?since={bad}")
            self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"), bad)
        code, body = await self.bob.request("GET", "/sync?timeout=soon")
        self.assertEqual(code, 400)

    async def test_full_state(self) -> None:
        room = await self.shared_room()
        await self.alice.ok("PUT", f"/rooms/{room}/state/m.room.topic", {"topic": "t"})
        for i in range(12):
            await self.alice.send(room, f"m{i}")
        initial = await self.bob.sync()
        full = await self.bob.sync(since=initial["next_batch"], full_state="true")
        state = full["rooms"]["join"][room]["state"]["events"]
        self.assertIn(("m.room.topic", ""), {(e["type"], e["state_key"]) for e in state})


class SyncReadFailureTestCase(DatabaseTestCase):
    """The reads a /sync starts early (ignored users, key counts) overlap the
    others; when the /sync fails before it needs them and they fail too, the
    client gets a 500 and nothing is left unhandled."""

    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(self, self.test_db)
        self.bob = await ClientApi(self, clients["main"].base_url).register("bob")

    async def test_a_failing_sync_settles_its_early_reads(self) -> None:
        hs = self.servers["main"]
        failing_read: defer.Deferred[None] = defer.Deferred()

        async def get_device_key_counts(
            user_id: str, device_id: str
        ) -> tuple[dict[str, int], list[str]]:
            await failing_read
            return {}, []

        async def unread_counts(*args: Any) -> Any:
            raise RuntimeError("the unread counts read failed")

        self.patch(hs.store, "get_device_key_counts", get_device_key_counts)
        # A read of the rooms section, which runs while the key counts
        # (an independent section) are still being read.
        self.patch(hs.store, "get_unread_counts", unread_counts)
        code, body = await self.bob.request("GET", "/sync")
        self.assertEqual(code, 500, body)
        # The early read fails after the response: consumed, never reported
        # as an unhandled error (which Twisted logs when the Deferred goes).
        failing_read.errback(RuntimeError("the key count read failed"))
        gc.collect()
        self.assertEqual(self.flushLoggedErrors(RuntimeError), [])
