"""Filling a gap with ``/state_ids`` (handlers/state_gaps.py): a PDU whose
parent ``get_missing_events`` gives but whose grandparent it does not is
persisted with the state a scripted a.test gives for the grandparent
(``/state_ids`` and ``/event``), resolved with the state b.test has; and
hostile answers (an event that is not the one asked for, a malformed
``/state_ids``) store nothing of the PDU. b.test is a main process and a
federation worker (tests/federation/test_inbound_pdus.py); SQLite and
PostgreSQL."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import attr
from twisted.trial import unittest

from synapse_lite.api.room_versions import KNOWN_ROOM_VERSIONS, RoomVersion
from synapse_lite.event_graph.hashing import event_id_of, sign_event
from synapse_lite.events import Event
from synapse_lite.handlers.state_gaps import StateGapWriter
from synapse_lite.replication.http.federation_rooms import StateGap
from tests.federation.test_inbound_pdus import InboundPdusBase, ScriptedServer
from tests.federation.test_room_events_feed import message
from tests.federation.test_rooms import CAROL, q
from tests.harness.client_api import ClientApi


class GapServer(ScriptedServer):
    """A scripted a.test that also answers ``/state_ids`` (``state_ids``)
    and ``/event`` (``events``, by id)."""

    def __init__(self) -> None:
        super().__init__()
        self.state_ids: dict[str, Any] = {}
        self.events: dict[str, dict[str, Any]] = {}
        self.gets: list[str] = []

    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"Content-Type", b"application/json")
        path = urllib.parse.unquote(request.path.decode())
        self.gets.append(urllib.parse.unquote(request.uri.decode()))
        if "/state_ids/" in path:
            return json.dumps(self.state_ids).encode()
        if "/backfill/" in path:
            return json.dumps({"origin": "a.test", "origin_server_ts": 1, "pdus": []}).encode()
        if "/event/" in path:
            event_id = path.rsplit("/", 1)[1]
            if event_id in self.events:
                return json.dumps({"origin": "a.test", "pdus": [self.events[event_id]]}).encode()
        request.setResponseCode(404)
        return b'{"errcode": "M_NOT_FOUND"}'


class StateGapsTestCase(InboundPdusBase):
    async def gap(self) -> tuple[Any, str, GapServer, dict[str, dict[str, Any]]]:
        """carol (a.test, power 100) in alice's room; the events of a gap:
        Y and T (state, never sent), X (a message after the room's
        extremity and Y) and C (after the extremity and X)."""
        alice, room_id, version = await self.joined_room()
        levels = await alice.ok("GET", f"/rooms/{q(room_id)}/state/m.room.power_levels")
        levels["users"][CAROL] = 100
        await alice.ok("PUT", f"/rooms/{q(room_id)}/state/m.room.power_levels", levels)
        store = self.b["main"].store
        y = await self.event(room_id, "test_state", {"body": "y"}, state_key="Y")
        t = await self.event(room_id, "test_state", {"topic": "t"}, state_key="T")
        y_id, t_id = event_id_of(version, y), event_id_of(version, t)
        extremities = sorted(await store.get_forward_extremities(room_id))
        x = await self.event(room_id, content={"body": "x"}, prev_events=[*extremities, y_id])
        x_id = event_id_of(version, x)
        c = await self.event(room_id, content={"body": "c"}, prev_events=[*extremities, x_id])
        c["depth"] = x["depth"] + 1
        c = sign_event(version, c, "a.test", self.a_key)
        fake = GapServer()
        await self.scripted_a(fake)
        fake.missing = [x]
        state = await store.get_current_state_ids(room_id)
        fake.state_ids = {"pdu_ids": [*state.values(), t_id], "auth_chain_ids": []}
        fake.events = {y_id: y, t_id: t}
        return alice, room_id, fake, {"X": x, "Y": y, "T": t, "C": c}

    async def test_the_state_at_a_missing_parent_is_asked_and_resolved(self) -> None:
        alice, room_id, fake, events = await self.gap()
        store = self.b["main"].store
        version = await store.get_room_version(room_id)
        ids = {k: event_id_of(version, e) for k, e in events.items()}
        self.assertEqual(await self.send("g1", [events["C"]]), {ids["C"]: {}})
        self.assertIn(f"/_matrix/federation/v1/state_ids/{room_id}", fake.gets[0])
        # X and C in the room, the state of Y's side resolved in.
        bodies = [e["content"]["body"] for e in await self.timeline(alice, room_id)]
        self.assertEqual(bodies[-2:], ["x", "c"])
        state = await store.get_current_state_ids(room_id)
        self.assertEqual(state[("test_state", "Y")], ids["Y"])
        self.assertEqual(state[("test_state", "T")], ids["T"])
        # Y and T are outliers: known, not in the timeline.
        y = await store.get_event(ids["Y"])
        assert y is not None
        self.assertTrue(y.outlier)
        # Paging back over X, whose parent Y is only an outlier (a hole),
        # asks a.test to backfill from Y. (On fed1: main's route to a.test,
        # from sending to it before, is the real a.test's.)
        url = self.b["fed1"].config.instance_map["fed1"].base_url
        on_fed1 = ClientApi(self, url).as_user(alice.token)
        await on_fed1.ok("GET", f"/rooms/{q(room_id)}/messages?dir=b&limit=5")
        backfills = [p for p in fake.gets if "/backfill/" in p]
        self.assertTrue(backfills, fake.gets)
        self.assertIn(f"v={ids['Y']}", backfills[0])

    async def test_a_missing_parent_that_is_a_message_is_left_a_hole(self) -> None:
        # M (a message, never sent) before X: the state after M is the state
        # before it; M itself is not stored as an outlier (never shown), so
        # paging back asks a.test to backfill it into the timeline.
        alice, room_id, version = await self.joined_room()
        store = self.b["main"].store
        m = await self.event(room_id, content={"msgtype": "m.text", "body": "m"})
        m_id = event_id_of(version, m)
        extremities = sorted(await store.get_forward_extremities(room_id))
        x = await self.event(room_id, content={"body": "x"}, prev_events=[m_id])
        x["depth"] = m["depth"] + 1
        x = sign_event(version, x, "a.test", self.a_key)
        x_id = event_id_of(version, x)
        c = await self.event(room_id, content={"body": "c"}, prev_events=[*extremities, x_id])
        c["depth"] = x["depth"] + 1
        c = sign_event(version, c, "a.test", self.a_key)
        c_id = event_id_of(version, c)
        fake = GapServer()
        await self.scripted_a(fake)
        fake.missing = [x]
        state = await store.get_current_state_ids(room_id)
        fake.state_ids = {"pdu_ids": list(state.values()), "auth_chain_ids": []}
        fake.events = {m_id: m}
        self.assertEqual(await self.send("g4", [c]), {c_id: {}})
        self.assertTrue(any(f"/event/{m_id}" in g for g in fake.gets), fake.gets)
        self.assertIsNone(await store.get_event(m_id))
        bodies = [e["content"]["body"] for e in await self.timeline(alice, room_id)]
        self.assertEqual(bodies[-2:], ["x", "c"])
        await alice.ok("GET", f"/rooms/{q(room_id)}/messages?dir=b&limit=5")
        backfills = [p for p in fake.gets if "/backfill/" in p]
        self.assertTrue(backfills, fake.gets)
        self.assertIn(f"v={m_id}", backfills[0])

    async def test_a_rejected_missing_parent_changes_no_state(self) -> None:
        # Y, the missing parent, is sent by eve@a.test, who never joined:
        # stored as a rejected outlier, and the state after it is the state
        # before it (no Y key), though a.test's answer put Y in.
        alice, room_id, fake, events = await self.gap()
        store = self.b["main"].store
        version = await store.get_room_version(room_id)
        extremities = sorted(await store.get_forward_extremities(room_id))
        y = await self.event(
            room_id, "test_state", {"body": "y"}, state_key="Y", sender="@eve:a.test"
        )
        y_id = event_id_of(version, y)
        x = await self.event(room_id, content={"body": "x"}, prev_events=[*extremities, y_id])
        x_id = event_id_of(version, x)
        c = await self.event(room_id, content={"body": "c"}, prev_events=[*extremities, x_id])
        c["depth"] = x["depth"] + 1
        c = sign_event(version, c, "a.test", self.a_key)
        fake.missing = [x]
        fake.events = {y_id: y, event_id_of(version, events["T"]): events["T"]}
        c_id = event_id_of(version, c)
        self.assertEqual(await self.send("g5", [c]), {c_id: {}})
        bodies = [e["content"]["body"] for e in await self.timeline(alice, room_id)]
        self.assertEqual(bodies[-2:], ["x", "c"])
        state = await store.get_current_state_ids(room_id)
        self.assertNotIn(("test_state", "Y"), state)
        self.assertIn(("test_state", "T"), state)
        self.assertIsNotNone(await store.get_rejection_reason(y_id))

    async def test_an_event_that_is_not_the_one_asked_for_is_refused(self) -> None:
        _alice, room_id, fake, events = await self.gap()
        store = self.b["main"].store
        version = await store.get_room_version(room_id)
        ids = {k: event_id_of(version, e) for k, e in events.items()}
        fake.events[ids["Y"]] = events["T"]
        answer = await self.send("g2", [events["C"]])
        self.assertIn("unknown here", answer[ids["C"]]["error"])
        self.assertIsNone(await store.get_event(ids["X"]))
        self.assertIsNone(await store.get_event(ids["C"]))

    async def test_a_malformed_state_ids_answer_is_refused(self) -> None:
        _alice, room_id, fake, events = await self.gap()
        store = self.b["main"].store
        version = await store.get_room_version(room_id)
        ids = {k: event_id_of(version, e) for k, e in events.items()}
        for bad in (
            {"pdu_ids": "nope", "auth_chain_ids": []},
            {"pdu_ids": [1], "auth_chain_ids": []},
        ):
            fake.state_ids = bad
            answer = await self.send(f"g3{len(fake.gets)}", [events["C"]])
            self.assertIn("error", answer[ids["C"]])
            self.assertIsNone(await store.get_event(ids["X"]))


class HostileRedactionsTestCase(InboundPdusBase):
    """Redactions in ``/send`` that must not redact (docs/federation.md,
    "Redactions")."""

    async def test_a_redaction_of_another_rooms_event_is_kept_out(self) -> None:
        alice, room_1, _version = await self.joined_room()
        kept = await alice.send(room_1, "keep me")
        _bob, room_2 = await self.room()
        version = await self.join_carol(room_2)
        redaction = await self.event(room_2, "m.room.redaction", {"redacts": kept})
        redaction = sign_event(version, {**redaction, "redacts": kept}, "a.test", self.a_key)
        redaction_id = event_id_of(version, redaction)
        # Answered {} but kept out of the room (soft-failed): nothing shows it.
        self.assertEqual(await self.send("r1", [redaction]), {redaction_id: {}})
        stored = await self.b["main"].store.get_event(redaction_id)
        assert stored is not None
        self.assertTrue(stored.soft_failed)
        event = await alice.ok("GET", f"/rooms/{q(room_1)}/event/{q(kept)}")
        self.assertEqual(event["content"]["body"], "keep me")


class _Rejecting:
    """The store reads of :class:`StateGapWriter` for a gap whose outliers
    are already stored: ``$x`` rejected, ``$pl`` and ``$join`` accepted."""

    def __init__(self) -> None:
        self.events = {
            e: attr.evolve(message(n, "!r:b.test"), event_id=e, state_key="", rejected=e == "$x")
            for n, e in enumerate(["$pl", "$x", "$join"], 1)
        }

    async def get_room_version(self, room_id: str) -> RoomVersion:
        return KNOWN_ROOM_VERSIONS["1"]

    async def get_events(self, event_ids: list[str]) -> dict[str, Event]:
        return {e: self.events[e] for e in event_ids if e in self.events}


class _Persisting:
    def __init__(self) -> None:
        self.given: list[Any] = []

    async def persist_received_event(self, pdu: Any, given_states: Any) -> Event:
        self.given = given_states
        return message(9, "!r:b.test")


class GivenStateTestCase(unittest.TestCase):
    async def test_rejected_events_are_left_out_of_a_given_state(self) -> None:
        # a.test's state at the gap names $x, a power levels event it made
        # up that we rejected (stored as an outlier): the state the event
        # is persisted with has no $x (SyTest 50federation "Should not be
        # able to take over the room by pretending there is no PL event").
        events = _Persisting()
        writer = StateGapWriter(_Rejecting(), events)  # type: ignore[arg-type]
        state = [["m.room.power_levels", "", "$x"], ["m.room.member", "@c:a.test", "$join"]]
        answer = {"pdu": {"room_id": "!r:b.test"}, "outliers": [], "states": [state]}
        await writer.persist(StateGap("!r:b.test", "a.test", answer))
        self.assertEqual(events.given, [{("m.room.member", "@c:a.test"): "$join"}])
