"""Events received from another server, persisted by their room's writer
with their outcome (``persist_received_event``): the spec's checks against
the event's own auth events and the state before it reject, the check
against the current state soft-fails; rejected events change no state and
are no extremity, soft-failed ones are in the graph and their state groups
but not in the current state or the extremities, outliers have no state.
The events are built as a remote server would, with the core's hashing and
signing. On SQLite and PostgreSQL (``SYNAPSE_LITE_TEST_DB``)."""

from __future__ import annotations

from typing import Any

from synapse_lite.api.errors import SynapseError
from synapse_lite.api.room_versions import RoomVersion
from synapse_lite.event_graph.hashing import event_id_of, sign_event
from synapse_lite.events import Event
from synapse_lite.federation.crypto import SigningKey
from synapse_lite.server import HomeServer
from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.server import DatabaseTestCase

REMOTE = "remote.test"
BOB = f"@bob:{REMOTE}"
REMOTE_KEY = SigningKey("k1", b"\x07" * 32)


class ReceivedEventsTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        # Our events go to remote.test now that it has a user in the room:
        # somewhere that refuses at once, not a DNS lookup.
        self.servers, clients, _ = start_cluster(
            self, self.test_db, federation={"destinations": {REMOTE: "http://127.0.0.1:9"}}
        )
        self.hs: HomeServer = self.servers["main"]
        self.alice = await ClientApi(self, clients["main"].base_url).register("alice")
        self.room = await self.alice.create_room(preset="public_chat")
        self.version: RoomVersion = await self.hs.store.get_room_version(self.room)
        self.state = dict(await self.hs.store.get_current_state_ids(self.room))

    def pdu(
        self,
        event_type: str,
        content: dict[str, Any],
        prev: list[str],
        auth: list[str],
        state_key: str | None = None,
        sender: str = BOB,
    ) -> dict[str, Any]:
        """A signed event of ``sender``'s server, one deeper than the
        deepest of ``prev`` (depths read from the database)."""
        pdu: dict[str, Any] = {
            "room_id": self.room,
            "type": event_type,
            "sender": sender,
            "content": content,
            "prev_events": prev,
            "auth_events": auth,
            "depth": 0,
            "origin_server_ts": 1_000,
        }
        if state_key is not None:
            pdu["state_key"] = state_key
        return pdu

    async def received(self, pdu: dict[str, Any], outlier: bool = False) -> Event:
        depths = [
            int(r[0])
            for r in await self.hs.store.db_pool.select(
                "test_depths",
                "SELECT topological_ordering FROM events WHERE event_id IN ("
                + ", ".join("?" for _ in pdu["prev_events"])
                + ")",
                *pdu["prev_events"],
            )
        ] if pdu["prev_events"] else []  # fmt: skip
        pdu = {**pdu, "depth": 1 + max(depths, default=0)}
        signed = sign_event(self.version, pdu, REMOTE, REMOTE_KEY)
        event = await self.hs.handlers.events.persist_received_event(signed, outlier=outlier)
        self.assertEqual(event.event_id, event_id_of(self.version, signed))
        return event

    def key(self, event_type: str, state_key: str = "") -> str:
        return self.state[(event_type, state_key)]

    async def extremities(self) -> set[str]:
        return set(await self.hs.store.get_forward_extremities(self.room))

    async def row(self, event_id: str) -> tuple[Any, ...]:
        [row] = await self.hs.store.db_pool.select(
            "test_row",
            "SELECT rejected, soft_failed, outlier, state_group_before, state_group"
            " FROM events WHERE event_id = ?",
            event_id,
        )
        return (bool(row[0]), bool(row[1]), bool(row[2]), row[3], row[4])

    async def rejection(self, event_id: str) -> str | None:
        rows = await self.hs.store.db_pool.select(
            "test_rejection", "SELECT reason FROM rejections WHERE event_id = ?", event_id
        )
        return str(rows[0][0]) if rows else None

    async def bob_joins(self) -> Event:
        [tip] = await self.extremities()
        join = await self.received(
            self.pdu(
                "m.room.member",
                {"membership": "join"},
                [tip],
                [
                    self.key("m.room.create"),
                    self.key("m.room.join_rules"),
                    self.key("m.room.power_levels"),
                ],
                state_key=BOB,
            )
        )
        self.assertEqual((await self.row(join.event_id))[:3], (False, False, False))
        self.assertEqual(await self.extremities(), {join.event_id})
        self.assertEqual(
            (await self.hs.store.get_current_state_ids(self.room))[("m.room.member", BOB)],
            join.event_id,
        )
        return join

    def bob_auth(self, join: Event) -> list[str]:
        return [self.key("m.room.create"), self.key("m.room.power_levels"), join.event_id]

    async def test_an_accepted_event_is_in_the_room(self) -> None:
        join = await self.bob_joins()
        message = await self.received(
            self.pdu("m.room.message", {"body": "hi", "msgtype": "m.text"}, [join.event_id],
                     self.bob_auth(join))
        )  # fmt: skip
        self.assertTrue(message.served)
        self.assertEqual(await self.extremities(), {message.event_id})
        sync = await self.alice.sync()
        timeline = sync["rooms"]["join"][self.room]["timeline"]["events"]
        self.assertIn(message.event_id, [e["event_id"] for e in timeline])
        # A local event after it names it as its parent.
        local = await self.alice.send(self.room, "hello bob")
        edges = await self.hs.store.get_event_edges([local])
        self.assertEqual(list(edges[local][0]), [message.event_id])

    async def test_rejected_against_its_own_auth_events(self) -> None:
        """A message whose auth events lack the sender's membership, and a
        topic by a sender without the power for it: rejected, with the
        rule's reason; no extremity, no state, the state after is the state
        before."""
        join = await self.bob_joins()
        before_state = dict(await self.hs.store.get_current_state_ids(self.room))
        message = await self.received(
            self.pdu("m.room.message", {"body": "hi", "msgtype": "m.text"}, [join.event_id],
                     [self.key("m.room.create"), self.key("m.room.power_levels")])
        )  # fmt: skip
        self.assertTrue(message.rejected)
        self.assertFalse(message.served)
        self.assertIn("against its auth events", await self.rejection(message.event_id) or "")
        topic = await self.received(
            self.pdu("m.room.topic", {"topic": "mine"}, [join.event_id], self.bob_auth(join), "")
        )
        self.assertTrue(topic.rejected)
        rejected, soft, outlier, before, after = await self.row(topic.event_id)
        self.assertEqual((rejected, soft, outlier), (True, False, False))
        self.assertIsNotNone(before)
        self.assertEqual(before, after)
        self.assertEqual(await self.extremities(), {join.event_id})
        self.assertEqual(dict(await self.hs.store.get_current_state_ids(self.room)), before_state)
        # The room's state as clients read it has no topic.
        code, _body = await self.alice.request("GET", f"/rooms/{self.room}/state/m.room.topic")
        self.assertEqual(code, 404)
        state = await self.alice.ok("GET", f"/rooms/{self.room}/state")
        self.assertNotIn(topic.event_id, [e["event_id"] for e in state])
        # An event citing a rejected event as an auth event is rejected too.
        member = await self.received(
            self.pdu("m.room.message", {"body": "x", "msgtype": "m.text"}, [join.event_id],
                     [self.key("m.room.create"), self.key("m.room.power_levels"), join.event_id,
                      topic.event_id])
        )  # fmt: skip
        self.assertTrue(member.rejected)
        # The next local event names the room's real extremity, not them.
        local = await self.alice.send(self.room, "still here")
        edges = await self.hs.store.get_event_edges([local])
        self.assertEqual(list(edges[local][0]), [join.event_id])

    async def test_rejected_against_the_state_before_it(self) -> None:
        """Bob's message cites his join as its auth event, but its parent
        is before the join: the state before it has no Bob in the room."""
        [before_join] = await self.extremities()
        join = await self.bob_joins()
        message = await self.received(
            self.pdu("m.room.message", {"body": "hi", "msgtype": "m.text"}, [before_join],
                     self.bob_auth(join))
        )  # fmt: skip
        self.assertTrue(message.rejected)
        self.assertIn("state before it", await self.rejection(message.event_id) or "")
        self.assertEqual(await self.extremities(), {join.event_id})

    async def test_soft_failed_against_the_current_state(self) -> None:
        """Bob is banned; his message and his profile change made before he
        saw the ban (parent: his join) pass the first two checks and fail
        the current state: soft-failed, in the graph and its state groups,
        not in the current state, extremities or anything served."""
        join = await self.bob_joins()
        await self.alice.ok("POST", f"/rooms/{self.room}/ban", {"user_id": BOB})
        [ban] = await self.extremities()
        message = await self.received(
            self.pdu("m.room.message", {"body": "hi", "msgtype": "m.text"}, [join.event_id],
                     self.bob_auth(join))
        )  # fmt: skip
        self.assertEqual((message.rejected, message.soft_failed), (False, True))
        self.assertIsNone(await self.rejection(message.event_id))
        profile = await self.received(
            self.pdu("m.room.member", {"membership": "join", "displayname": "Bobby"},
                     [join.event_id],
                     [*self.bob_auth(join), self.key("m.room.join_rules")], BOB)
        )  # fmt: skip
        self.assertTrue(profile.soft_failed)
        _r, _s, _o, before, after = await self.row(profile.event_id)
        self.assertNotEqual(before, after)
        # In its own state (the graph's), not in the room's current state.
        assert after is not None
        self.assertEqual(
            (await self.hs.store.get_state_ids_for_group(after))[("m.room.member", BOB)],
            profile.event_id,
        )
        current = await self.hs.store.get_current_state_ids(self.room)
        self.assertEqual(current[("m.room.member", BOB)], ban)
        member = await self.alice.ok("GET", f"/rooms/{self.room}/state/m.room.member/{BOB}")
        self.assertEqual(member, {"membership": "ban"})
        self.assertEqual(await self.extremities(), {ban})
        messages = await self.alice.ok("GET", f"/rooms/{self.room}/messages?dir=b&limit=50")
        ids = [e["event_id"] for e in messages["chunk"]]
        self.assertIn(ban, ids)
        self.assertNotIn(message.event_id, ids)
        self.assertNotIn(profile.event_id, ids)

    async def test_outliers_have_no_state(self) -> None:
        """An event whose parent is unknown is refused (400 naming it)
        unless persisted as an outlier: stored without state groups, no
        extremity, not served; its auth events are still checked."""
        join = await self.bob_joins()
        pdu = self.pdu("m.room.message", {"body": "hi", "msgtype": "m.text"}, [join.event_id],
                       self.bob_auth(join))  # fmt: skip
        pdu["prev_events"] = ["$unknown"]
        pdu["depth"] = 10
        signed = sign_event(self.version, pdu, REMOTE, REMOTE_KEY)
        with self.assertRaises(SynapseError) as refused:
            await self.hs.handlers.events.persist_received_event(signed)
        self.assertEqual(refused.exception.code, 400)
        self.assertIn("$unknown", refused.exception.msg)
        outlier = await self.hs.handlers.events.persist_received_event(signed, outlier=True)
        self.assertEqual(await self.row(outlier.event_id), (False, False, True, None, None))
        self.assertEqual(await self.extremities(), {join.event_id})
        self.assertIsNone(await self.hs.store.get_state_ids_before_event(outlier.event_id))
        # Received again: the stored event, unchanged.
        again = await self.hs.handlers.events.persist_received_event(signed)
        self.assertTrue(again.outlier)
        # An outlier whose auth events refuse it is rejected.
        bad = self.pdu("m.room.topic", {"topic": "t"}, ["$unknown"], self.bob_auth(join), "")
        bad["depth"] = 10
        refused_outlier = await self.hs.handlers.events.persist_received_event(
            sign_event(self.version, bad, REMOTE, REMOTE_KEY), outlier=True
        )
        self.assertTrue(refused_outlier.rejected)

    async def test_malformed_and_misplaced_events_are_refused(self) -> None:
        pdu = self.pdu("m.room.message", {"body": "hi"}, [], [])
        del pdu["sender"]
        with self.assertRaises(SynapseError) as malformed:
            await self.hs.handlers.events.persist_received_event(pdu)
        self.assertEqual((malformed.exception.code, malformed.exception.errcode),
                         (400, "M_BAD_JSON"))  # fmt: skip
        create = self.pdu("m.room.create", {"creator": BOB}, [], [], "")
        with self.assertRaises(SynapseError) as second_create:
            await self.hs.handlers.events.persist_received_event(create)
        self.assertEqual(second_create.exception.code, 400)

    async def test_a_late_accepted_event_branches_and_the_next_local_event_merges(self) -> None:
        join = await self.bob_joins()
        local = await self.alice.send(self.room, "meanwhile")
        late = await self.received(
            self.pdu("m.room.message", {"body": "late", "msgtype": "m.text"}, [join.event_id],
                     self.bob_auth(join))
        )  # fmt: skip
        self.assertTrue(late.served)
        self.assertEqual(await self.extremities(), {local, late.event_id})
        merge = await self.alice.send(self.room, "both seen")
        edges = await self.hs.store.get_event_edges([merge])
        self.assertEqual(set(edges[merge][0]), {local, late.event_id})
        self.assertEqual(await self.extremities(), {merge})
