"""Unread counts carried over (``UnreadCountMemo``,
storage/databases/main/push_rules.py): a count reads only the events after
the last one, and answers exactly what counting the room's whole history
does (SQLite and PostgreSQL: ``SYNAPSE_LITE_TEST_DB``).

* Differential: random traffic (messages, mentions, read receipts moving
  forward and back, private receipts, leaves and joins, a user's own rule
  for a room) in a cluster of the main process and a worker; after each step
  every user's counts are read on each process, with the counts carried over
  from the step before, and compared with the full count.
* A carried count is not read again; one counted past the horizon (rows
  some writer has not committed) is not carried.
* The sole events writer (main here) counts new events from its memory of
  their outcomes (``RecentPushOutcomes``), with no read; the differential
  test covers it, as main answers there.
"""

from __future__ import annotations

import random
from typing import Any

from synapse_lite.server import HomeServer
from synapse_lite.streams.catalog import EventsStreamCurrentStateRow
from tests.harness.client_api import ClientApi, caught_up_on_every_stream, q, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase

#: Random steps of traffic in the differential test.
STEPS = 70


async def full_count(
    hs: HomeServer, user_id: str, room_ids: list[str], upto: int
) -> dict[str, tuple[int, int]]:
    """The count over the room's whole history since the basis, in one
    statement: what ``get_unread_counts`` answered before counts were
    carried over (the oracle)."""
    placeholders = ", ".join("?" for _ in room_ids)
    read_after = (
        " AND {t}.stream_ordering > COALESCE(("
        "  SELECT MAX(e.stream_ordering) FROM receipts_linearized AS r"
        "  JOIN events AS e ON e.event_id = r.event_id"
        "  WHERE r.room_id = {t}.room_id AND r.user_id = ?"
        "  AND r.receipt_type IN ('m.read', 'm.read.private')), 0)"
    )
    rows = await hs.store.db_pool.select(
        "full_unread_count",
        "SELECT room_id, COUNT(*), SUM(CASE WHEN highlight THEN 1 ELSE 0 END) FROM ("
        " SELECT s.room_id AS room_id, s.push_highlight AS highlight"
        " FROM events AS s JOIN local_current_membership AS m"
        "  ON m.room_id = s.room_id AND m.user_id = ? AND m.membership = 'join'"
        f" WHERE s.room_id IN ({placeholders}) AND s.stream_ordering <= ?"
        "  AND s.push_actions IS NOT NULL AND NOT s.rejected AND NOT s.soft_failed"
        "  AND s.stream_ordering > m.event_stream_ordering AND s.sender != ?"
        + read_after.format(t="s")
        + "  AND NOT EXISTS (SELECT 1 FROM event_push_actions AS x"
        "   WHERE x.event_id = s.event_id AND x.user_id = ?)"
        " UNION ALL"
        " SELECT a.room_id AS room_id, a.highlight AS highlight FROM event_push_actions AS a"
        f" WHERE a.user_id = ? AND a.notif = ? AND a.room_id IN ({placeholders})"
        "  AND a.stream_ordering <= ?"
        + read_after.format(t="a")
        + ") AS notifications GROUP BY room_id",
        user_id,
        *room_ids,
        upto,
        user_id,
        user_id,
        user_id,
        user_id,
        True,
        *room_ids,
        upto,
        user_id,
    )
    return {r[0]: (int(r[1]), int(r[2] or 0)) for r in rows}


class UnreadCountsCarriedTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(self, self.test_db, workers=["worker1"])
        base = clients["main"].base_url
        self.users = [await ClientApi(self, base).register(n) for n in ("alice", "bob", "carol")]
        self.rooms = [await self.users[0].create_room(preset="public_chat") for _ in range(2)]
        for user in self.users[1:]:
            for room in self.rooms:
                await user.ok("POST", f"/join/{q(room)}", {})

    async def settled(self) -> None:
        """Every process has every stream's rows main has: the counts it
        answers from memory are those of the receipts and memberships it
        has processed, which the full count reads from the database."""
        await caught_up_on_every_stream(self.servers)

    async def step(self, rng: random.Random, events: dict[str, list[str]]) -> str:
        """One random action of a random user; what it was ("... refused"
        when not answered 200, as a message to a room left)."""
        user = rng.choice(self.users)
        room = rng.choice(self.rooms)
        r = q(room)
        action = rng.choice(
            ["message", "message", "message", "mention", "room_mention", "read", "read",
             "private_read", "leave", "join", "own_rule", "no_own_rule"]
        )  # fmt: skip
        n = rng.randrange(1_000_000)
        code = 200
        if action in ("message", "mention", "room_mention"):
            content: dict[str, Any] = {"msgtype": "m.text", "body": f"m{n}"}
            if action == "mention":
                # A highlight of one user: an outcome of their own.
                content["m.mentions"] = {"user_ids": [str(rng.choice(self.users).user_id)]}
            elif action == "room_mention":
                # A highlight of everyone (the default outcome) when the
                # sender may notify the room (the creator).
                content["body"] = f"@room m{n}"
                content["m.mentions"] = {"room": True}
            code, body = await user.request("PUT", f"/rooms/{r}/send/m.room.message/t{n}", content)
            if code == 200:
                events.setdefault(room, []).append(body["event_id"])
        elif action in ("read", "private_read") and events.get(room):
            # Any event of the room: a receipt may also move back.
            event_id = rng.choice(events[room])
            kind = "m.read" if action == "read" else "m.read.private"
            code, _ = await user.request("POST", f"/rooms/{r}/receipt/{kind}/{q(event_id)}", {})
        elif action == "leave":
            code, _ = await user.request("POST", f"/rooms/{r}/leave", {})
        elif action == "join":
            code, _ = await user.request("POST", f"/join/{r}", {})
        elif action == "own_rule":
            # The user's own outcome for the room: rows of their own.
            code, _ = await user.request(
                "PUT",
                f"/pushrules/global/room/{r}",
                {"actions": [rng.choice(["dont_notify", "notify"])]},
            )
        elif action == "no_own_rule":
            code, _ = await user.request("DELETE", f"/pushrules/global/room/{r}")
        return f"{user.user_id} {action} {room}" + ("" if code == 200 else " refused")

    async def test_carried_counts_answer_what_the_full_count_does(self) -> None:
        rng = random.Random(20261130)
        events: dict[str, list[str]] = {}
        history: list[str] = []
        compared = highlighted = 0
        main = self.servers["main"].store
        from_memory: list[str] = []
        carry = main._unread_from_outcomes

        def noting(user_id: str, room_id: str, *args: Any) -> Any:
            count = carry(user_id, room_id, *args)
            if count is not None:
                from_memory.append(room_id)
            return count

        self.patch(main, "_unread_from_outcomes", noting)
        for _ in range(STEPS):
            history.append(await self.step(rng, events))
            await self.settled()
            for name, hs in self.servers.items():
                upto = hs.store.get_room_max_stream_ordering()
                for user in self.users:
                    uid = str(user.user_id)
                    got = await hs.store.get_unread_counts(uid, list(self.rooms), upto)
                    want = await full_count(hs, uid, list(self.rooms), upto)
                    self.assertEqual(
                        got, want, f"{uid} on {name} after:\n" + "\n".join(history[-8:])
                    )
                    compared += 1
                    highlighted += sum(1 for _, h in want.values() if h)
        self.assertEqual(compared, STEPS * len(self.servers) * len(self.users))
        # Main, the sole events writer, carried counts from memory.
        self.assertIsNotNone(main.push_outcomes)
        self.assertIsNone(self.servers["worker1"].store.push_outcomes)
        self.assertGreater(len(from_memory), STEPS // 4)
        self.assertGreater(highlighted, 0)
        # The traffic had what the counts depend on.
        self.assertGreater(sum(map(len, events.values())), STEPS // 4)
        self.assertTrue(any(" read " in h and "refused" not in h for h in history))
        self.assertTrue(any(" leave " in h and "refused" not in h for h in history))
        self.assertTrue(any(h.startswith("@alice") and " room_mention " in h for h in history))

    async def test_a_carried_count_reads_only_the_events_after_it(self) -> None:
        hs = self.servers["main"]
        alice, bob = self.users[0], self.users[1]
        room = self.rooms[0]
        for i in range(5):
            await bob.send(room, f"before {i}")
        upto = hs.store.get_room_max_stream_ordering()
        uid = str(alice.user_id)
        self.assertEqual(await hs.store.get_unread_counts(uid, [room], upto), {room: (5, 0)})
        # Take the default outcome off what was counted: a count that read
        # those rows again would now find none of them.
        await hs.store.db_pool.execute(
            "forget_outcomes",
            "UPDATE events SET push_actions = NULL WHERE room_id = ? AND stream_ordering <= ?",
            room,
            upto,
        )
        self.assertEqual(await full_count(hs, uid, [room], upto), {})
        await bob.send(room, "after")
        upto = hs.store.get_room_max_stream_ordering()
        self.assertEqual(await hs.store.get_unread_counts(uid, [room], upto), {room: (6, 0)})
        # A new basis (a read receipt) counts again from it.
        last = await bob.send(room, "last")
        await alice.ok("POST", f"/rooms/{q(room)}/receipt/m.read/{q(last)}", {})
        upto = hs.store.get_room_max_stream_ordering()
        self.assertEqual(await hs.store.get_unread_counts(uid, [room], upto), {})

    async def test_a_count_past_the_horizon_is_not_carried(self) -> None:
        hs = self.servers["main"]
        alice, bob = self.users[0], self.users[1]
        room = self.rooms[0]
        await bob.send(room, "one")
        horizon = hs.store.get_room_max_stream_ordering()
        await bob.send(room, "two")
        await bob.send(room, "three")
        upto = hs.store.get_room_max_stream_ordering()
        uid = str(alice.user_id)
        # As if a writer had not committed everything up to ``upto``.
        id_gen = hs.id_generators.of("events")
        self.patch(id_gen, "persisted_upto_position", lambda: horizon)
        self.assertEqual(await hs.store.get_unread_counts(uid, [room], upto), {room: (3, 0)})
        kept = hs.store._unread_memo.get(uid, room)
        assert kept is not None
        self.assertEqual((kept.upto, kept.notifications), (horizon, 1))
        # Counted again on top of what was kept, not twice.
        self.assertEqual(await hs.store.get_unread_counts(uid, [room], upto), {room: (3, 0)})
        # An older position than a count kept is counted in full.
        self.assertEqual(await hs.store.get_unread_counts(uid, [room], horizon), {room: (1, 0)})

    async def test_a_room_with_nothing_new_is_answered_without_a_read(self) -> None:
        hs = self.servers["worker1"]
        alice, bob = self.users[0], self.users[1]
        uid = str(alice.user_id)
        await bob.send(self.rooms[0], "one")
        await bob.send(self.rooms[1], "two")
        await self.settled()
        rooms = list(self.rooms)
        upto = hs.store.get_room_max_stream_ordering()
        want = {self.rooms[0]: (1, 0), self.rooms[1]: (1, 0)}
        self.assertEqual(await hs.store.get_unread_counts(uid, rooms, upto), want)
        reads: list[str] = []
        run = hs.store.db_pool.runInteraction

        async def counting(desc: str, *args: Any, **kwargs: Any) -> Any:
            if desc == "get_unread_counts":  # not the worker's replication reads
                reads.append(desc)
            return await run(desc, *args, **kwargs)

        self.patch(hs.store.db_pool, "runInteraction", counting)
        self.assertEqual(await hs.store.get_unread_counts(uid, rooms, upto), want)
        self.assertEqual(reads, [])
        # A new event in one room: one read, for that room's new events.
        three = await bob.send(self.rooms[1], "three")
        await self.settled()
        upto = hs.store.get_room_max_stream_ordering()
        want[self.rooms[1]] = (2, 0)
        self.assertEqual(await hs.store.get_unread_counts(uid, rooms, upto), want)
        self.assertEqual(reads, ["get_unread_counts"])
        # Another user's receipt in one room, hers in the other: the bases
        # are read again.
        last = await bob.send(self.rooms[0], "four")
        await bob.ok("POST", f"/rooms/{q(self.rooms[0])}/receipt/m.read/{q(last)}", {})
        await alice.ok("POST", f"/rooms/{q(self.rooms[1])}/receipt/m.read/{q(three)}", {})
        main_receipts = self.servers["main"].id_generators.of("receipts")
        receipts = hs.id_generators.of("receipts")
        await eventually(
            lambda: receipts.persisted_upto_position() == main_receipts.persisted_upto_position(),
            what="the worker has main's receipts",
        )
        await self.settled()
        upto = hs.store.get_room_max_stream_ordering()
        got = await hs.store.get_unread_counts(uid, rooms, upto)
        self.assertEqual(got, await full_count(hs, uid, rooms, upto))
        self.assertEqual(got, {self.rooms[0]: (2, 0)})

    async def test_a_receipt_of_an_event_not_here_is_read_again_every_time(self) -> None:
        hs = self.servers["main"]
        alice, bob = self.users[0], self.users[1]
        uid, room = str(alice.user_id), self.rooms[0]
        await bob.send(room, "one")
        await hs.store.insert_receipt(room, "m.read", uid, "$not-here:elsewhere", {})
        upto = hs.store.get_room_max_stream_ordering()
        self.assertEqual(await hs.store.get_unread_counts(uid, [room], upto), {room: (1, 0)})
        kept = hs.store._unread_memo.get(uid, room)
        assert kept is not None
        self.assertIsNone(kept.basis.read_at_positions)

    async def test_a_resolved_membership_is_a_membership_change(self) -> None:
        # Resolution can move a member's current membership with no new event
        # of theirs: followers learn it from a current state row.
        hs = self.servers["worker1"]
        before = hs.store.get_room_max_token()
        user = "@someone:test.local"
        row = EventsStreamCurrentStateRow(self.rooms[0], "m.room.member", user, "$e")
        hs.store.invalidate_for_events_rows("main", before.get_max_position() + 1, [row])
        self.assertTrue(hs.store.membership_changes.may_have_changed(user, before))
        self.assertTrue(hs.store.room_membership_changes.may_have_changed(self.rooms[0], before))
        # The writer notes it as its persist commits (the rows resolution
        # produced, by stream id).
        writer = self.servers["main"].store
        before = writer.get_room_max_token()
        position = before.get_max_position() + 1
        writer._record_persisted_positions([], {position: [row]})
        self.assertTrue(writer.membership_changes.may_have_changed(user, before))

    async def test_the_sole_writer_counts_new_events_without_a_read(self) -> None:
        hs = self.servers["main"]
        alice, bob, carol = self.users
        uid, room = str(alice.user_id), self.rooms[0]
        await bob.send(room, "one")
        upto = hs.store.get_room_max_stream_ordering()
        self.assertEqual(await hs.store.get_unread_counts(uid, [room], upto), {room: (1, 0)})
        reads: list[str] = []
        run = hs.store.db_pool.runInteraction

        async def counting(desc: str, *args: Any, **kwargs: Any) -> Any:
            if desc == "get_unread_counts":
                reads.append(desc)
            return await run(desc, *args, **kwargs)

        self.patch(hs.store.db_pool, "runInteraction", counting)
        # A message, a mention of alice (an outcome of her own), alice's own
        # message and a mention of carol: two notifications, one highlight.
        await bob.send(room, "two")
        await carol.ok(
            "PUT",
            f"/rooms/{q(room)}/send/m.room.message/mention-alice",
            {"msgtype": "m.text", "body": "hey", "m.mentions": {"user_ids": [uid]}},
        )
        await alice.send(room, "mine")
        await bob.ok(
            "PUT",
            f"/rooms/{q(room)}/send/m.room.message/mention-carol",
            {"msgtype": "m.text", "body": "hey", "m.mentions": {"user_ids": [carol.user_id]}},
        )
        upto = hs.store.get_room_max_stream_ordering()
        got = await hs.store.get_unread_counts(uid, [room], upto)
        self.assertEqual(got, {room: (4, 1)})
        self.assertEqual(reads, [])
        self.assertEqual(got, await full_count(hs, uid, [room], upto))
        # Beyond what the memory holds of the room, the count reads.
        outcomes = hs.store.push_outcomes
        assert outcomes is not None
        self.patch(outcomes, "PER_ROOM", 2)
        for i in range(3):
            await bob.send(room, f"more {i}")
        upto = hs.store.get_room_max_stream_ordering()
        self.assertEqual(await hs.store.get_unread_counts(uid, [room], upto), {room: (7, 1)})
        self.assertEqual(reads, ["get_unread_counts"])
