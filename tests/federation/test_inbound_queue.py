"""The durable inbound queue (handlers/inbound_pdus.py,
storage/databases/main/inbound_pdu_queue.py): PDUs queued in order and
once, persisted by the room's writer exactly once in effect and dequeued in
the persist transaction, kept queued across a failure (injected) between
enqueue and persist and taken again after a restart, refused ones dropped,
and a room held up not holding up the others (SQLite and PostgreSQL: the
servers' databases follow ``SYNAPSE_LITE_TEST_DB``)."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer

from synapse_lite.api.room_versions import RoomVersion
from synapse_lite.event_graph.hashing import event_id_of, sign_event
from synapse_lite.handlers import inbound_pdus
from synapse_lite.handlers.inbound_pdus import InboundQueue
from synapse_lite.server import HomeServer
from tests.federation.test_inbound_pdus import InboundPdusBase


def queue_of(hs: HomeServer) -> InboundQueue:
    """The writer's queue processor (one of its loops)."""
    [queue] = [loop for loop in hs.loops._loops if isinstance(loop, InboundQueue)]
    return queue


class InboundQueueTestCase(InboundPdusBase):
    async def chain(self, room_id: str, version: RoomVersion, n: int) -> list[dict[str, Any]]:
        """``n`` messages of carol, each the child of the one before, on
        the room's extremities."""
        store = self.b["main"].store
        prev = sorted(await store.get_forward_extremities(room_id))
        events = []
        for i in range(n):
            event = await self.event(
                room_id, content={"msgtype": "m.text", "body": f"m{i}"}, prev_events=prev
            )
            event["depth"] += i
            event = sign_event(version, event, "a.test", self.a_key)
            events.append(event)
            prev = [event_id_of(version, event)]
        return events

    async def enqueue(self, version: RoomVersion, events: list[dict[str, Any]]) -> list[str]:
        """Queue ``events`` as a receiving process does after its checks."""
        ids = [event_id_of(version, e) for e in events]
        await self.b["fed1"].store.enqueue_inbound_pdus(
            (i, e["room_id"], "a.test", e) for i, e in zip(ids, events, strict=True)
        )
        return ids

    def hold_writer(self) -> None:
        """The writer takes no queue (as if stopped) until :meth:`release_writer`."""
        queue = queue_of(self.b["main"])
        self.patch(queue, "wake", lambda room_id: defer.succeed(None))
        self.patch(inbound_pdus, "OUTCOME_WAIT_SECONDS", 0.2)

    async def test_queue_keeps_order_and_each_pdu_once(self) -> None:
        _, room_id, version = await self.joined_room()
        _, other_room, _ = await self.joined_room()
        self.hold_writer()
        events = await self.chain(room_id, version, 3)
        other = await self.chain(other_room, version, 1)
        store = self.b["fed1"].store
        ids = await self.enqueue(version, events[:2])
        other_ids = await self.enqueue(version, other)
        # Sent again (another transaction): it keeps its place.
        ids += await self.enqueue(version, [events[2], events[0]])
        queued = await store.get_inbound_queue(room_id, 50)
        self.assertEqual([q.event_id for q in queued], ids[:3])
        self.assertEqual([q.origin for q in queued], ["a.test"] * 3)
        self.assertEqual(queued[0].pdu, events[0])
        self.assertEqual(await store.get_inbound_queue_rooms(), [room_id, other_room])
        self.assertEqual([q.event_id for q in await store.get_inbound_queue(room_id, 2)], ids[:2])
        self.assertEqual(
            await store.get_queued_inbound_event_ids([*ids, *other_ids, "$no"]),
            {*ids, *other_ids},
        )
        self.assertEqual(await store.count_inbound_pdu_failure(ids[1]), 1)
        self.assertEqual(await store.count_inbound_pdu_failure(ids[1]), 2)
        self.assertEqual(await store.count_inbound_pdu_failure("$no"), 0)
        await store.remove_inbound_pdu(other_ids[0])
        self.assertEqual(await store.get_inbound_queue_rooms(), [room_id])

    async def test_the_writer_persists_the_queue_in_order_once(self) -> None:
        alice, room_id, version = await self.joined_room()
        writer = self.b["main"]
        events = await self.chain(room_id, version, 3)
        ids = await self.enqueue(version, events)
        queue = queue_of(writer)
        await defer.gatherResults([queue.wake(room_id), queue.wake(room_id)])
        store = writer.store
        self.assertEqual(await store.get_inbound_queue(room_id, 50), [])
        stored = await store.get_events(ids)
        self.assertEqual([stored[i].content["body"] for i in ids], ["m0", "m1", "m2"])
        orderings = [stored[i].stream_ordering for i in ids]
        self.assertEqual(orderings, sorted(orderings))
        # Served as received: the queued rows became received_pdus rows.
        self.assertEqual(await store.get_received_pdus(ids), dict(zip(ids, events, strict=True)))
        # Queued again after it was persisted (a retried transaction racing
        # the writer): dequeued without a second copy.
        await self.enqueue(version, events[:1])
        await queue.sweep()
        await queue.wake(room_id)
        self.assertEqual(await store.get_inbound_queue_rooms(), [])
        bodies = [e["content"]["body"] for e in await self.timeline(alice, room_id)]
        self.assertEqual(bodies, ["before carol", "m0", "m1", "m2"])

    async def test_a_failure_inside_the_persist_leaves_the_pdu_queued(self) -> None:
        _, room_id, version = await self.joined_room()
        writer = self.b["main"]
        store = writer.store
        [event_id] = await self.enqueue(version, await self.chain(room_id, version, 1))
        persist_txn = store._persist_events_txn

        def crash_before_commit(txn: Any, *args: Any, **kwargs: Any) -> Any:
            # The event and the dequeue are written, then the process
            # "dies" before the commit: the transaction is rolled back.
            persist_txn(txn, *args, **kwargs)
            raise RuntimeError("killed before the commit")

        self.patch(store, "_persist_events_txn", crash_before_commit)
        queue = queue_of(writer)
        await queue.wake(room_id)
        self.assertIsNone(await store.get_event(event_id))
        self.assertEqual(await store.get_received_pdus([event_id]), {})
        [queued] = await store.get_inbound_queue(room_id, 50)
        self.assertEqual((queued.event_id, queued.attempts), (event_id, 1))
        # The writer started again: the queue is taken and the event is
        # persisted once.
        self.patch(store, "_persist_events_txn", persist_txn)
        await queue.sweep()
        await queue.wake(room_id)
        self.assertIsNotNone(await store.get_event(event_id))
        self.assertEqual(await store.get_inbound_queue_rooms(), [])
        self.assertEqual(list(await store.get_received_pdus([event_id])), [event_id])

    async def test_send_answers_once_queued_and_the_writer_persists_later(self) -> None:
        alice, room_id, version = await self.joined_room()
        self.hold_writer()
        [event] = await self.chain(room_id, version, 1)
        event_id = event_id_of(version, event)
        # Answered {} (accepted for processing) while the writer is held.
        self.assertEqual(await self.send("t1", [event]), {event_id: {}})
        store = self.b["main"].store
        self.assertIsNone(await store.get_event(event_id))
        self.assertEqual(await store.get_queued_inbound_event_ids([event_id]), {event_id})
        # The same transaction again: queued once, answered {} again.
        self.assertEqual(await self.send("t1", [event]), {event_id: {}})
        self.assertEqual(len(await store.get_inbound_queue(room_id, 50)), 1)
        # A child sent meanwhile: its parent is queued, so known (no
        # get_missing_events), and it queues behind it.
        fake = await self.scripted_a()
        child = await self.event(room_id, prev_events=[event_id])
        child["depth"] = event["depth"] + 1
        child = sign_event(version, child, "a.test", self.a_key)
        child_id = event_id_of(version, child)
        self.assertEqual(await self.send("t2", [child]), {child_id: {}})
        self.assertEqual(fake.asked, [])
        # The writer comes back: its sweep takes what was queued.
        queue = queue_of(self.b["main"])
        del queue.wake
        await queue.sweep()
        await queue.wake(room_id)
        self.assertEqual(await store.get_inbound_queue_rooms(), [])
        bodies = [e["content"].get("body") for e in await self.timeline(alice, room_id)]
        self.assertEqual(bodies, ["before carol", "m0", "hi"])
        # Its outcome is known now (read from the store after the fact).
        self.assertEqual(await self.send("t3", [child]), {child_id: {}})

    async def test_refused_and_failing_pdus_leave_the_queue(self) -> None:
        _, room_id, version = await self.joined_room()
        writer = self.b["main"]
        store = writer.store
        orphan = await self.event(room_id, prev_events=["$never-seen"])
        [orphan_id] = await self.enqueue(version, [orphan])
        queue = queue_of(writer)
        await queue.wake(room_id)
        # Refused by the writer (its parent unknown): dropped, not stored.
        self.assertEqual(await store.get_inbound_queue_rooms(), [])
        self.assertIsNone(await store.get_event(orphan_id))
        self.assertIn("$never-seen", queue._outcomes.get(orphan_id)[1]["error"])  # type: ignore[index]

        [bad_id, next_id] = await self.enqueue(version, await self.chain(room_id, version, 2))

        async def broken(pdu: Any, **kwargs: Any) -> Any:
            raise RuntimeError("a bug")

        events = writer.handlers.events
        self.patch(events, "persist_received_event", broken)
        # Tried and left queued (the room waits) until the last try.
        for attempt in range(1, inbound_pdus.MAX_ATTEMPTS):
            await queue.wake(room_id)
            queued = await store.get_inbound_queue(room_id, 50)
            self.assertEqual(
                [(q.event_id, q.attempts) for q in queued], [(bad_id, attempt), (next_id, 0)]
            )
        await queue.wake(room_id)
        self.assertEqual(queue._outcomes.get(bad_id)[1], {"error": inbound_pdus.UNPROCESSABLE})
        self.assertEqual(
            [q.event_id for q in await store.get_inbound_queue(room_id, 50)], [next_id]
        )
        self.flushLoggedErrors(RuntimeError)
        # Fixed: the next one goes on, refused (its parent was dropped)
        # with its reason.
        del events.persist_received_event
        await queue.wake(room_id)
        self.assertEqual(await store.get_inbound_queue_rooms(), [])
        self.assertIsNone(await store.get_event(next_id))
        self.assertIn(bad_id, queue._outcomes.get(next_id)[1]["error"])  # type: ignore[index]

    async def test_a_room_held_up_does_not_hold_up_the_others(self) -> None:
        _, slow_room, version = await self.joined_room()
        _, other_room, _ = await self.joined_room()
        writer = self.b["main"]
        events = writer.handlers.events
        persist = events.persist_received_event
        held: defer.Deferred[None] = defer.Deferred()

        async def slow(pdu: Any, **kwargs: Any) -> Any:
            if pdu["room_id"] == slow_room:
                await held
            return await persist(pdu, **kwargs)

        self.patch(events, "persist_received_event", slow)
        slow_ids = await self.enqueue(version, await self.chain(slow_room, version, 2))
        other_ids = await self.enqueue(version, await self.chain(other_room, version, 3))
        queue = queue_of(writer)
        slow_done = queue.wake(slow_room)
        await queue.wake(other_room)
        store = writer.store
        self.assertEqual(len(await store.get_events(other_ids)), 3)
        self.assertEqual(await store.get_events(slow_ids), {})
        self.assertFalse(slow_done.called)
        held.callback(None)
        await slow_done
        self.assertEqual(len(await store.get_events(slow_ids)), 2)
