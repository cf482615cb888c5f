"""PDUs in ``PUT /send/{txnId}`` (handlers/inbound_pdus.py): a joined remote
user's events accepted and seen by our clients, sent twice without effect,
and hostile PDUs each refused with its own error while the rest of the
transaction is applied.

``b.test`` is the server under test (main, the events writer, and
``fed1``, which receives the transactions: every accepted PDU goes through
the internal call to the room's writer); the tests speak for ``a.test``
with its key (tests/federation/test_rooms.py's setup)."""

from __future__ import annotations

import json
from typing import Any, cast

from twisted.internet import reactor, task
from twisted.web.resource import Resource
from twisted.web.server import Site

from synapse_lite.api.room_versions import RoomVersion
from synapse_lite.event_graph.authorisation import select_auth_event_ids
from synapse_lite.event_graph.hashing import (
    content_hash_matches,
    event_id_of,
    sign_event,
    verify_event_signature,
)
from synapse_lite.event_graph.pdu import Pdu
from synapse_lite.federation.client import FederationClient
from synapse_lite.federation.crypto import SigningKey
from synapse_lite.handlers.inbound_pdus import (
    MISSING_EVENTS_LIMIT,
    MISSING_EVENTS_REQUESTS_PER_PDU,
)
from tests.federation.test_rooms import CAROL, FederationRoomsBase, q
from tests.harness.client_api import ClientApi
from tests.harness.polling import eventually

_reactor = cast(Any, reactor)


class ScriptedServer(Resource):
    """Stands in for a.test's federation API once its key is known to
    b.test: records transactions (answering 500 to the first
    ``fail_sends``) and answers ``get_missing_events`` with ``missing``."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.transactions: list[dict[str, Any]] = []
        self.fail_sends = 0
        self.missing: list[dict[str, Any]] = []
        #: When set (event id -> event), ``get_missing_events`` is answered
        #: from it as a server holding those events would: the nearest
        #: ancestors of ``latest_events``, up to ``limit``, stopping at
        #: ``earliest_events`` and at events it does not hold.
        self.graph: dict[str, dict[str, Any]] | None = None
        self.asked: list[dict[str, Any]] = []

    def render_PUT(self, request: Any) -> bytes:
        request.setHeader(b"Content-Type", b"application/json")
        if self.fail_sends:
            self.fail_sends -= 1
            request.setResponseCode(500)
            return b"{}"
        self.transactions.append(json.loads(request.content.read()))
        return b'{"pdus": {}}'

    def render_POST(self, request: Any) -> bytes:
        request.setHeader(b"Content-Type", b"application/json")
        asked = json.loads(request.content.read())
        self.asked.append(asked)
        if self.graph is None:
            return json.dumps({"events": self.missing}).encode()
        given: list[dict[str, Any]] = []
        seen = set(asked["earliest_events"]) | set(asked["latest_events"])
        frontier = list(asked["latest_events"])
        while frontier and len(given) < asked["limit"]:
            parents = [p for e in frontier for p in self.graph[e]["prev_events"]]
            frontier = []
            for parent in parents:
                if parent in seen or parent not in self.graph or len(given) >= asked["limit"]:
                    continue
                seen.add(parent)
                given.append(self.graph[parent])
                frontier.append(parent)
        return json.dumps({"events": given}).encode()


class InboundPdusBase(FederationRoomsBase):
    """Helpers speaking for a.test in b.test's rooms (no tests)."""

    async def scripted_a(self, fake: ScriptedServer | None = None) -> ScriptedServer:
        """From now on b.test reaches a.test at a :class:`ScriptedServer`
        (``fake``, else a new one; its open connections to the real one,
        pooled by server name, are closed first)."""
        fake = fake or ScriptedServer()
        port = _reactor.listenTCP(0, Site(fake), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        url = f"http://127.0.0.1:{port.getHost().port}"
        # Every client that may hold a pooled connection to the real a.test:
        # the keyring's, and the sender's (a sender worker has no keyring).
        clients: dict[int, FederationClient] = {}
        for hs in self.b.values():
            hs.config.federation.destinations["a.test"] = url
            for owner in (hs.keyring, hs.outbox):
                client = getattr(owner, "_client", None)
                if isinstance(client, FederationClient):
                    clients[id(client)] = client
        # Twice: a connection still carrying a transaction (the join's) when
        # the pool is first closed goes back to it afterwards, and under
        # load once carried the next transaction to the real a.test.
        for _ in range(2):
            for client in clients.values():
                await client.close()
            await task.deferLater(_reactor, 0.5, lambda: None)
        return fake

    async def joined_room(self) -> tuple[ClientApi, str, RoomVersion]:
        """A room of b.test's alice that carol of a.test joined."""
        alice, room_id = await self.room()
        return alice, room_id, await self.join_carol(room_id)

    async def event(
        self,
        room_id: str,
        event_type: str = "m.room.message",
        content: dict[str, Any] | None = None,
        *,
        state_key: str | None = None,
        sender: str = CAROL,
        prev_events: list[str] | None = None,
        key: SigningKey | None = None,
        server: str = "a.test",
    ) -> dict[str, Any]:
        """An event of ``sender`` on the room's extremities, as a.test makes
        it: auth events selected from b.test's current state, signed."""
        store = self.b["main"].store
        version = await store.get_room_version(room_id)
        extremities = await store.get_forward_extremities(room_id)
        event: dict[str, Any] = {
            "room_id": room_id,
            "type": event_type,
            "sender": sender,
            "content": content if content is not None else {"msgtype": "m.text", "body": "hi"},
            "origin_server_ts": 1_700_000_000_000,
            "depth": max(extremities.values()) + 1,
        }
        if state_key is not None:
            event["state_key"] = state_key
        probe = Pdu.from_json(version, {**event, "prev_events": [], "auth_events": []}, "")
        state_ids = await store.get_current_state_ids(room_id)
        event["auth_events"] = select_auth_event_ids(version, probe, state_ids)
        event["prev_events"] = prev_events if prev_events is not None else sorted(extremities)
        return sign_event(version, event, server, key or self.a_key)

    async def send(self, txn_id: str, pdus: list[Any]) -> dict[str, Any]:
        code, answer = await self.federation(
            "PUT",
            f"/_matrix/federation/v1/send/{txn_id}",
            {"origin": "a.test", "origin_server_ts": 1, "pdus": pdus, "edus": []},
        )
        self.assertEqual(code, 200, answer)
        results: dict[str, Any] = answer["pdus"]
        return results

    async def timeline(self, alice: ClientApi, room_id: str) -> list[Any]:
        path = f"/rooms/{q(room_id)}/messages?dir=b&limit=50"
        chunk = (await alice.ok("GET", path))["chunk"]
        return [e for e in reversed(chunk) if e["type"] == "m.room.message"]


class InboundPdusTestCase(InboundPdusBase):
    async def test_a_message_is_accepted_once_and_seen(self) -> None:
        alice, room_id, version = await self.joined_room()
        since = (await alice.sync())["next_batch"]
        first = await self.event(room_id, content={"msgtype": "m.text", "body": "from carol"})
        first_id = event_id_of(version, first)
        self.assertEqual(await self.send("t1", [first]), {first_id: {}})
        second = await self.event(room_id, content={"msgtype": "m.text", "body": "again"})
        second_id = event_id_of(version, second)
        # Sent again with the next one in another transaction: nothing doubled.
        self.assertEqual(await self.send("t2", [second, first]), {first_id: {}, second_id: {}})
        bodies = [(e["sender"], e["content"]["body"]) for e in await self.timeline(alice, room_id)]
        self.assertEqual(
            bodies, [(alice.user_id, "before carol"), (CAROL, "from carol"), (CAROL, "again")]
        )
        synced = await alice.sync(since=since)
        events = synced["rooms"]["join"][room_id]["timeline"]["events"]
        self.assertEqual([e["event_id"] for e in events], [first_id, second_id])
        # Served back as received (a.test's signature kept).
        stored = await self.b["main"].store.get_received_pdus([first_id])
        self.assertEqual(stored[first_id]["signatures"], first["signatures"])

    async def test_a_received_message_notifies_and_a_rejected_one_does_not(self) -> None:
        # carol's message (a one-to-one room) notifies alice as a local
        # one would; eve's, rejected (she never joined), does not.
        alice, room_id, version = await self.joined_room()
        await alice.sync()
        message = await self.event(room_id, content={"msgtype": "m.text", "body": "ping"})
        rejected = await self.event(
            room_id, content={"msgtype": "m.text", "body": "no"}, sender="@eve:a.test"
        )
        ids = [event_id_of(version, e) for e in (rejected, message)]
        self.assertEqual(await self.send("n1", [rejected, message]), {i: {} for i in ids})
        room = (await alice.sync())["rooms"]["join"][room_id]
        self.assertEqual(room["unread_notifications"]["notification_count"], 1)
        store = self.b["main"].store
        self.assertTrue((await store.get_event(ids[0])).rejected)  # type: ignore[union-attr]

    async def test_hostile_pdus_are_refused_one_by_one(self) -> None:
        alice, room_id, version = await self.joined_room()
        _, other_room = await self.room()  # carol is not in it
        good = await self.event(room_id, content={"msgtype": "m.text", "body": "good"})

        forged = await self.event(room_id, key=SigningKey.generate())
        tampered = await self.event(room_id, content={"msgtype": "m.text", "body": "signed"})
        tampered["content"] = {"msgtype": "m.text", "body": "changed after signing"}
        elsewhere = await self.event(other_room)
        unknown_room = {**(await self.event(room_id)), "room_id": "!nowhere:b.test"}
        unknown_room["event_id"] = "$unknown-room"
        huge = await self.event(room_id, content={"msgtype": "m.text", "body": "x" * 70_000})
        no_parents = await self.event(room_id, prev_events=[])
        orphan = await self.event(room_id, prev_events=["$never-seen"])
        as_alice = await self.event(room_id, sender=str(alice.user_id))
        power = await self.event(
            room_id,
            "m.room.power_levels",
            {"users": {CAROL: 100}},
            state_key="",
        )
        pdus: list[Any] = [
            good,
            forged,
            tampered,
            elsewhere,
            unknown_room,
            huge,
            no_parents,
            orphan,
        ]
        pdus += [as_alice, power, "junk"]
        results = await self.send("t1", pdus)

        def error(pdu: dict[str, Any]) -> str:
            result = results[event_id_of(version, pdu)]
            self.assertIn("error", result, pdu)
            return str(result["error"])

        self.assertEqual(results[event_id_of(version, good)], {})
        self.assertIn("not signed by a.test", error(forged))
        self.assertIn("a.test has no user in room", error(elsewhere))
        self.assertIn("room '!nowhere:b.test' is not known", results["$unknown-room"]["error"])
        self.assertNotIn(event_id_of(version, huge), results)  # its id needs a format check
        self.assertNotIn(event_id_of(version, no_parents), results)
        self.assertIn("$never-seen", error(orphan))
        self.assertIn("not signed by b.test", error(as_alice))
        # Rejected is processed: answered {}, stored as rejected with why.
        self.assertEqual(results[event_id_of(version, power)], {})
        reason = await self.b["main"].store.get_rejection_reason(event_id_of(version, power))
        self.assertIn("against", reason)
        # The tampered one is kept in its redacted form: no body.
        tampered_id = event_id_of(version, tampered)
        self.assertEqual(results[tampered_id], {})
        store = self.b["main"].store
        self.assertEqual((await store.get_event(tampered_id)).content, {})  # type: ignore[union-attr]
        self.assertTrue((await store.get_event(event_id_of(version, power))).rejected)  # type: ignore[union-attr]
        # No state is served at a rejected event (as at an outlier): 404.
        power_id = q(event_id_of(version, power))
        for endpoint in ("state", "state_ids"):
            path = f"/_matrix/federation/v1/{endpoint}/{q(room_id)}?event_id={power_id}"
            code, answer = await self.federation("GET", path)
            self.assertEqual((code, answer.get("errcode")), (404, "M_NOT_FOUND"), endpoint)
        for refused in (forged, elsewhere, orphan, as_alice, huge, no_parents):
            self.assertIsNone(await store.get_event(event_id_of(version, refused)))
        bodies = [e["content"].get("body") for e in await self.timeline(alice, room_id)]
        self.assertEqual(bodies, ["before carol", "good", None])

    async def test_huge_and_malformed_pdus_are_refused_under_their_claimed_id(self) -> None:
        _, room_id, _version = await self.joined_room()
        huge = await self.event(room_id, content={"msgtype": "m.text", "body": "x" * 70_000})
        huge["event_id"] = "$huge"
        bad = {**(await self.event(room_id)), "depth": "deep", "event_id": "$bad"}
        results = await self.send("t1", [huge, bad])
        self.assertIn("larger than 65536 bytes", results["$huge"]["error"])
        self.assertIn("malformed", results["$bad"]["error"])

    async def test_missing_parents_are_fetched_from_the_origin(self) -> None:
        alice, room_id, version = await self.joined_room()
        extremities = sorted(await self.b["main"].store.get_forward_extremities(room_id))
        chain = await self.chain(room_id, version, 3)
        fake = await self.scripted_a()
        fake.missing = chain[:2]
        last_id = event_id_of(version, chain[2])
        self.assertEqual(await self.send("t1", [chain[2]]), {last_id: {}})
        [asked] = fake.asked
        self.assertEqual(asked["latest_events"], [last_id])
        self.assertEqual(asked["earliest_events"], extremities)
        self.assertEqual(asked["limit"], 10)
        bodies = [e["content"]["body"] for e in await self.timeline(alice, room_id)]
        self.assertEqual(bodies, ["before carol", "m0", "m1", "m2"])

    async def chain(self, room_id: str, version: RoomVersion, length: int) -> list[dict[str, Any]]:
        """``length`` messages of carol's, each the parent of the next, on
        the room's extremities (none sent)."""
        prev = sorted(await self.b["main"].store.get_forward_extremities(room_id))
        chain = []
        for i in range(length):
            event = await self.event(
                room_id, content={"msgtype": "m.text", "body": f"m{i}"}, prev_events=prev
            )
            event["depth"] += i
            event = sign_event(version, event, "a.test", self.a_key)
            chain.append(event)
            prev = [event_id_of(version, event)]
        return chain

    async def test_a_gap_wider_than_one_request_is_walked_back_and_kept_in_order(self) -> None:
        """25 missing parents: three requests, each from where the last
        answer's gap was still open; every message in place, in order (not
        left to backfill: docs/federation.md, "Catch-up")."""
        alice, room_id, version = await self.joined_room()
        chain = await self.chain(room_id, version, 26)
        fake = await self.scripted_a()
        fake.graph = {event_id_of(version, e): e for e in chain}
        last_id = event_id_of(version, chain[-1])
        self.assertEqual(await self.send("t1", [chain[-1]]), {last_id: {}})
        self.assertEqual(len(fake.asked), 3)
        self.assertEqual(fake.asked[0]["latest_events"], [last_id])
        self.assertEqual(fake.asked[1]["latest_events"], [event_id_of(version, chain[15])])
        self.assertTrue(all(a["limit"] == MISSING_EVENTS_LIMIT for a in fake.asked))
        bodies = [e["content"]["body"] for e in await self.timeline(alice, room_id)]
        self.assertEqual(bodies, ["before carol"] + [f"m{i}" for i in range(26)])

    async def test_walking_back_a_gap_is_bounded(self) -> None:
        """A chain of 200 missing parents costs at most
        MISSING_EVENTS_REQUESTS_PER_PDU requests, and one PDU per
        transaction cannot make more whatever the transaction holds."""
        _, room_id, version = await self.joined_room()
        chain = await self.chain(room_id, version, 201)
        fake = await self.scripted_a()
        fake.graph = {event_id_of(version, e): e for e in chain}
        await self.send("t1", [chain[-1]])
        self.assertEqual(len(fake.asked), MISSING_EVENTS_REQUESTS_PER_PDU)

    async def test_our_events_are_sent_to_the_servers_in_the_room(self) -> None:
        alice, room_id, version = await self.joined_room()
        fake = await self.scripted_a()
        fake.fail_sends = 2  # backed off, then sent
        sent = [await alice.send(room_id, f"n{i}") for i in range(60)]

        async def all_arrived() -> bool:
            ids = [event_id_of(version, p) for t in fake.transactions for p in t["pdus"]]
            return ids[-1:] == sent[-1:] if ids else False

        # Two backoffs (1 s, then about 2 s) and the catch-up: seconds, but
        # minutes' worth of margin on a loaded machine (CI's PostgreSQL pass
        # once needed more than 20 s).
        await eventually(all_arrived, timeout=60, what="the newest of the 60 events at a.test")
        pdus = [p for t in fake.transactions for p in t["pdus"]]
        # In order, once each, at most 50 per transaction, none of carol's.
        # Had more than a transaction's worth waited while it backed off, it
        # caught up with the newest (it fetches the gap: docs/federation.md,
        # "Catch-up"), so what came is in order and ends with the newest.
        # Events of the room from before these 60 (the join's transaction,
        # in flight when a.test was swapped for the fake) may come first.
        ids = [event_id_of(version, p) for p in pdus]
        ours = [i for i in ids if i in sent]
        self.assertEqual(ours, sorted(set(ours), key=sent.index))
        self.assertEqual(ids[-len(ours) :], ours)
        self.assertEqual(ours[-1], sent[-1])
        self.assertFalse([p for p in pdus if p["sender"] == CAROL])
        self.assertTrue(all(len(t["pdus"]) <= 50 for t in fake.transactions))
        # Current again: the next events go as they come, every one.
        more = [await alice.send(room_id, f"m{i}") for i in range(3)]

        async def more_arrived() -> bool:
            got = [event_id_of(version, p) for t in fake.transactions for p in t["pdus"]]
            return got[-3:] == more

        await eventually(more_arrived, timeout=60, what="the 3 later events at a.test")
        self.assertTrue(all(t["origin"] == "b.test" for t in fake.transactions))
        for pdu in pdus:
            self.assertNotIn("event_id", pdu)
            self.assertNotIn("unsigned", pdu)
            self.assertTrue(content_hash_matches(version, pdu))
            verify_event_signature(
                version, pdu, "b.test", self.b_key.key_id, self.b_key.verify_key_base64
            )


class DefaultLayoutTestCase(InboundPdusBase):
    """b.test as the default layout splits it: the events writer, the
    federation sender and the process receiving federation requests are
    three workers (events cross by the internal call and replication)."""

    b_workers = ("writer", "sender", "fed1")
    b_config = {"stream_writers": {"events": ["writer"]}, "federation_sender": "sender"}

    async def test_both_ways_across_workers(self) -> None:
        alice, room_id, version = await self.joined_room()
        fake = await self.scripted_a()
        message = await self.event(room_id, content={"msgtype": "m.text", "body": "in"})
        self.assertEqual(await self.send("t1", [message]), {event_id_of(version, message): {}})
        sent = await alice.send(room_id, "out")

        async def arrived() -> bool:
            return any(
                event_id_of(version, p) == sent for t in fake.transactions for p in t["pdus"]
            )

        await eventually(arrived, timeout=20)
        bodies = [e["content"]["body"] for e in await self.timeline(alice, room_id)]
        self.assertEqual(bodies, ["before carol", "in", "out"])
