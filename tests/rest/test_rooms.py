"""Rooms over HTTP: creation presets, membership rules, sending, state,
/messages pagination and what users who left (or were never in) can read."""

from __future__ import annotations

from tests.harness.client_api import ThreeUsersTestCase


class RoomsTestCase(ThreeUsersTestCase):
    async def test_presets(self) -> None:
        for preset, join_rule in [
            ("public_chat", "public"),
            ("private_chat", "invite"),
            ("trusted_private_chat", "invite"),
        ]:
            room = await self.alice.create_room(
                preset=preset, name="Room", topic="Things", invite=[self.bob.user_id]
            )
            rules = await self.alice.ok("GET", f"/rooms/{room}/state/m.room.join_rules")
            self.assertEqual(rules, {"join_rule": join_rule})
            history = await self.alice.ok("GET", f"/rooms/{room}/state/m.room.history_visibility/")
            self.assertEqual(history, {"history_visibility": "shared"})
            self.assertEqual(
                await self.alice.ok("GET", f"/rooms/{room}/state/m.room.name"), {"name": "Room"}
            )
            levels = await self.alice.ok("GET", f"/rooms/{room}/state/m.room.power_levels")
            expected = 100 if preset == "trusted_private_chat" else None
            self.assertEqual(levels["users"].get(self.bob.user_id), expected)
            members = await self.alice.ok("GET", f"/rooms/{room}/members")
            memberships = {e["state_key"]: e["content"]["membership"] for e in members["chunk"]}
            self.assertEqual(memberships, {self.alice.user_id: "join", self.bob.user_id: "invite"})
            # The spec's preset table: guests forbidden in public rooms.
            guests = await self.alice.ok("GET", f"/rooms/{room}/state/m.room.guest_access")
            expected_access = "forbidden" if preset == "public_chat" else "can_join"
            self.assertEqual(guests, {"guest_access": expected_access})

    async def test_initial_state_overrides_the_preset(self) -> None:
        room = await self.alice.create_room(
            preset="public_chat",
            initial_state=[
                {"type": "m.room.history_visibility", "content": {"history_visibility": "joined"}},
                {"type": "m.room.guest_access", "content": {"guest_access": "can_join"}},
                {"type": "org.example.x", "state_key": "k", "content": {"v": 1}},
            ],
        )
        for event_type, content in (
            ("m.room.history_visibility", {"history_visibility": "joined"}),
            ("m.room.guest_access", {"guest_access": "can_join"}),
            ("m.room.join_rules", {"join_rule": "public"}),
            ("org.example.x/k", {"v": 1}),
        ):
            self.assertEqual(
                await self.alice.ok("GET", f"/rooms/{room}/state/{event_type}"), content
            )

    async def test_join_rules(self) -> None:
        private = await self.alice.create_room(preset="private_chat")
        code, body = await self.bob.request("POST", f"/join/{private}", {})
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        await self.alice.ok("POST", f"/rooms/{private}/invite", {"user_id": self.bob.user_id})
        await self.bob.ok("POST", f"/join/{private}", {})
        public = await self.alice.create_room(preset="public_chat")
        await self.eve.ok("POST", f"/rooms/{public}/join", {})
        code, body = await self.bob.request("POST", "/join/!nowhere:test.local", {})
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))

    async def test_only_members_send_and_kick_needs_power(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        code, body = await self.bob.request(
            "PUT", f"/rooms/{room}/send/m.room.message/t1", {"body": "hi"}
        )
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        await self.bob.ok("POST", f"/join/{room}", {})
        await self.eve.ok("POST", f"/join/{room}", {})
        code, body = await self.bob.request(
            "POST", f"/rooms/{room}/kick", {"user_id": self.eve.user_id}
        )
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        code, _ = await self.bob.request(
            "PUT", f"/rooms/{room}/state/m.room.name", {"name": "mine now"}
        )
        self.assertEqual(code, 403)
        await self.alice.ok("POST", f"/rooms/{room}/kick", {"user_id": self.eve.user_id})
        code, _ = await self.eve.request(
            "PUT", f"/rooms/{room}/send/m.room.message/t2", {"body": "still here?"}
        )
        self.assertEqual(code, 403)
        await self.bob.ok("POST", f"/rooms/{room}/leave", {})
        code, _ = await self.bob.request("POST", f"/rooms/{room}/leave", {})
        self.assertEqual(code, 403)

    async def test_send_is_idempotent_per_device_and_txn(self) -> None:
        room = await self.alice.create_room()
        first = await self.alice.send(room, "once", txn_id="txn1")
        again = await self.alice.send(room, "once", txn_id="txn1")
        self.assertEqual(first, again)
        other_device = self.alice.as_user(
            (
                await self.alice.as_user(None).ok(
                    "POST",
                    "/login",
                    {"type": "m.login.password", "user": "alice", "password": "secret-pw"},
                )
            )["access_token"]
        )
        self.assertNotEqual(await other_device.send(room, "twice", txn_id="txn1"), first)
        page = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=b&limit=50")
        bodies = [e["content"].get("body") for e in page["chunk"]]
        self.assertEqual(bodies.count("once"), 1)

    async def test_retry_answered_from_the_database_after_leave_and_rate_limit(self) -> None:
        """A retry this process no longer remembers still gets the first
        event, even when the send itself would now be refused."""
        room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/rooms/{room}/join", {})
        first = await self.bob.send(room, "once", txn_id="t1")
        await self.bob.ok("POST", f"/rooms/{room}/leave", {})
        handler = self.servers["main"].handlers.events
        handler._recent_txns.clear()
        self.assertEqual(await self.bob.send(room, "once", txn_id="t1"), first)
        # Not joined any more: a new transaction id is refused.
        code, body = await self.bob.request(
            "PUT", f"/rooms/{room}/send/m.room.message/t2", {"body": "new"}
        )
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        # A rate-limited retry of a send that succeeded gets its event too.
        second = await self.alice.send(room, "twice", txn_id="t3")
        handler._recent_txns.clear()
        handler._ratelimiter._enabled = True
        handler._ratelimiter._rate = 0
        handler._ratelimiter._buckets[str(self.alice.user_id)] = (0.0, 0.0)
        self.assertEqual(await self.alice.send(room, "twice", txn_id="t3"), second)
        code, body = await self.alice.request(
            "PUT", f"/rooms/{room}/send/m.room.message/t4", {"body": "new"}
        )
        self.assertEqual((code, body["errcode"]), (429, "M_LIMIT_EXCEEDED"))
        page = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=b&limit=50")
        bodies = [e["content"].get("body") for e in page["chunk"]]
        self.assertEqual((bodies.count("once"), bodies.count("twice")), (1, 1))

    async def test_a_repeated_state_put_sends_nothing_new(self) -> None:
        """PUT /state has no txnId: a client's retry of it gets the event it
        already sent; other content, or another sender, is a new event."""
        room = await self.alice.create_room(preset="public_chat")
        path = f"/rooms/{room}/state/m.room.topic"
        first = await self.alice.ok("PUT", path, {"topic": "tea"})
        self.assertEqual(await self.alice.ok("PUT", path, {"topic": "tea"}), first)
        changed = await self.alice.ok("PUT", path, {"topic": "coffee"})
        self.assertNotEqual(changed, first)
        page = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=b&limit=50")
        topics = [e["content"]["topic"] for e in page["chunk"] if e["type"] == "m.room.topic"]
        self.assertEqual(sorted(topics), ["coffee", "tea"])

    async def test_messages_pagination_back_and_forward(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        sent = [await self.alice.send(room, f"m{i}") for i in range(7)]
        page1 = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=b&limit=3")
        self.assertEqual([e["event_id"] for e in page1["chunk"]], sent[:-4:-1])
        page2 = await self.alice.ok(
            "GET", f"/rooms/{room}/messages?dir=b&limit=3&from={page1['end']}"
        )
        self.assertEqual([e["event_id"] for e in page2["chunk"]], sent[-4:-7:-1])
        forward = await self.alice.ok(
            "GET", f"/rooms/{room}/messages?dir=f&limit=2&from={page2['end']}"
        )
        # page2 ended before m1: going forward from there starts at m1
        self.assertEqual([e["event_id"] for e in forward["chunk"]], sent[1:3])
        rest = await self.alice.ok(
            "GET", f"/rooms/{room}/messages?dir=f&limit=100&from={forward['end']}"
        )
        self.assertEqual([e["event_id"] for e in rest["chunk"]], sent[3:])
        self.assertNotIn(
            "end",
            await self.alice.ok(
                "GET", f"/rooms/{room}/messages?dir=f&limit=100&from={rest['end']}"
            ),
        )
        code, body = await self.alice.request("GET", f"/rooms/{room}/messages?from=garbage")
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"))

    async def test_leavers_and_strangers_see_nothing_new(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room}", {})
        before = await self.alice.send(room, "before leaving")
        await self.bob.ok("POST", f"/rooms/{room}/leave", {})
        after = await self.alice.send(room, "after leaving")
        await self.alice.ok("PUT", f"/rooms/{room}/state/m.room.topic", {"topic": "secret"})
        page = await self.bob.ok("GET", f"/rooms/{room}/messages?dir=b&limit=100")
        ids = [e["event_id"] for e in page["chunk"]]
        self.assertIn(before, ids)
        self.assertNotIn(after, ids)
        forward = await self.bob.ok("GET", f"/rooms/{room}/messages?dir=f&limit=100&from=s0")
        self.assertNotIn(after, [e["event_id"] for e in forward["chunk"]])
        code, _ = await self.bob.request("GET", f"/rooms/{room}/state/m.room.topic")
        self.assertEqual(code, 404)  # the topic was set after bob left
        for path in ("messages", "state", "members", "state/m.room.name"):
            code, body = await self.eve.request("GET", f"/rooms/{room}/{path}")
            self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"), path)
        code, body = await self.eve.request("GET", "/rooms/!unknown:test.local/messages")
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))

    async def test_read_markers_need_membership(self) -> None:
        """A stranger's read markers are refused even when the body names no
        marker (it used to answer 200 for any room)."""
        room = await self.alice.create_room(preset="private_chat")
        for body in ({}, {"m.read": "$x:test.local"}, {"m.fully_read": "$x:test.local"}):
            code, answer = await self.eve.request("POST", f"/rooms/{room}/read_markers", body)
            self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"), body)
        await self.alice.ok("POST", f"/rooms/{room}/read_markers", {})

    async def test_state_events(self) -> None:
        room = await self.alice.create_room()
        await self.alice.ok("PUT", f"/rooms/{room}/state/org.example.thing/key%2Fone", {"a": 1})
        self.assertEqual(
            await self.alice.ok("GET", f"/rooms/{room}/state/org.example.thing/key%2Fone"),
            {"a": 1},
        )
        state = await self.alice.ok("GET", f"/rooms/{room}/state")
        keys = {(e["type"], e["state_key"]) for e in state}
        self.assertIn(("org.example.thing", "key/one"), keys)
        self.assertIn(("m.room.create", ""), keys)
        code, body = await self.alice.request("GET", f"/rooms/{room}/state/m.room.topic")
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))
        code, body = await self.alice.request(
            "PUT", f"/rooms/{room}/state/m.room.power_levels", {"users": "everyone"}
        )
        self.assertEqual((code, body["errcode"]), (400, "M_BAD_JSON"))
        joined = await self.alice.ok("GET", "/joined_rooms")
        self.assertEqual(joined["joined_rooms"], [room])
