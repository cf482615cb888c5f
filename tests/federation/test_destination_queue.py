"""One destination's queue, against a real database and a scripted remote
server: one transaction in flight, batching, backoff, REMOTE_SERVER_UP,
stable transaction ids, and EDUs the destination refuses."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, task

from synapse_lite.clock import Clock
from synapse_lite.federation.client import FederationRequestError
from synapse_lite.federation.sender.destination import DestinationQueue
from synapse_lite.storage.id_generators import generator as id_generators
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase, make_config, make_homeserver


class ScriptedRemote:
    """Stands in for the federation client: each PUT waits for the test."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], defer.Deferred[Any]]] = []

    def put_json(self, destination: str, path: str, body: dict[str, Any]) -> defer.Deferred[Any]:
        d: defer.Deferred[Any] = defer.Deferred()
        self.calls.append((path.rsplit("/", 1)[1], body, d))
        return d

    def close(self) -> None:
        pass

    def contents(self, i: int) -> list[Any]:
        return [edu["content"]["n"] for edu in self.calls[i][1]["edus"]]


class DestinationQueueTestCase(DatabaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)
        config = make_config(
            self.test_db,
            server_name="a.test",
            federation={"retry": {"initial_seconds": 10, "max_seconds": 40}},
            # Another process sends: main's own sender would send the
            # outbox's EDUs to b.test for real and record its failure over
            # the queue's success (CI saw 10000 != 0).
            workers=["federation_sender1"],
            federation_sender_instances=["federation_sender1"],
        )
        self.hs = make_homeserver(self, config)
        self.time = task.Clock()
        self.time.advance(1_000_000)
        self.remote = ScriptedRemote()
        #: Destinations whose transactions went through, in order.
        self.sent: list[str] = []
        self.queue = DestinationQueue(
            "b.test",
            store=self.hs.store,
            clock=Clock(self.time),
            client=self.remote,  # type: ignore[arg-type]
            server_name="a.test",
            retry=config.federation.retry,
            on_sent=self.sent.append,
        )
        self.queued = 0

    async def queue_edus(self, n: int) -> int:
        stream_id = 0
        for _ in range(n):
            edu = {"sender": "@a:a.test", "type": "m.t", "message_id": f"m{self.queued}"}
            edu["n"] = self.queued  # type: ignore[assignment]
            self.queued += 1
            stream_id, _ = await self.hs.store.add_messages_to_device_inbox({}, {"b.test": edu})
        return stream_id

    async def calls(self, n: int) -> None:
        await eventually(lambda: len(self.remote.calls) >= n, what=f"{n} transactions")
        self.assertEqual(len(self.remote.calls), n)

    async def pending(self) -> int:
        rows = await self.hs.store.db_pool.select(
            "t", "SELECT COUNT(*) FROM device_federation_outbox"
        )
        return int(rows[0][0])

    async def test_one_in_flight_then_batch(self) -> None:
        self.queue.wake(await self.queue_edus(1))
        await self.calls(1)
        self.queue.wake(await self.queue_edus(3))  # queued while the first is in flight
        await task.deferLater(self.hs.reactor, 0.05, lambda: None)
        await self.calls(1)
        self.remote.calls[0][2].callback({"pdus": {}})
        await self.calls(2)
        self.assertEqual(self.remote.contents(1), [1, 2, 3])
        self.remote.calls[1][2].callback({"pdus": {}})
        await eventually(lambda: len(self.sent) == 2)
        self.assertEqual(await self.pending(), 0)

    async def test_backoff_retry_same_id_and_server_up(self) -> None:
        self.queue.wake(await self.queue_edus(2))
        await self.calls(1)
        first_id = self.remote.calls[0][0]
        self.remote.calls[0][2].errback(FederationRequestError("b.test", "refused"))
        await eventually(lambda: self.queue.is_backing_off)
        state = await self.hs.store.get_retry_state("b.test")
        self.assertEqual(state.retry_interval_ms, 10_000)
        self.queue.wake(await self.queue_edus(1))  # does not cut the backoff short
        await task.deferLater(self.hs.reactor, 0.05, lambda: None)
        await self.calls(1)
        # Second failure: 20 s. The same EDUs would reuse the id; more came, so
        # the next transaction carries all three under a new one.
        self.time.advance(12.1)
        await self.calls(2)
        self.assertEqual(self.remote.contents(1), [0, 1, 2])
        self.assertNotEqual(self.remote.calls[1][0], first_id)
        self.remote.calls[1][2].errback(FederationRequestError("b.test", "timeout"))
        await eventually(lambda: self.queue.is_backing_off)
        self.time.advance(24.1)
        await self.calls(3)
        self.assertEqual(self.remote.calls[2][0], self.remote.calls[1][0])  # same EDUs, same id
        self.remote.calls[2][2].errback(FederationRequestError("b.test", "timeout"))
        await eventually(lambda: self.queue.is_backing_off)
        self.assertTrue(self.queue.is_down)  # three in a row
        # REMOTE_SERVER_UP: at once.
        self.queue.reset_backoff()
        await self.calls(4)
        self.remote.calls[3][2].callback({"pdus": {}})
        await eventually(lambda: self.sent == ["b.test"])
        self.assertEqual((await self.hs.store.get_retry_state("b.test")).retry_interval_ms, 0)
        self.assertFalse(self.queue.is_down)
        self.assertEqual(await self.pending(), 0)

    async def test_refused_edus_go_one_by_one_then_are_dropped(self) -> None:
        self.queue.wake(await self.queue_edus(2))
        await self.calls(1)
        self.remote.calls[0][2].errback(FederationRequestError("b.test", "too large", 413))
        await self.calls(2)
        self.assertEqual(self.remote.contents(1), [0])
        self.remote.calls[1][2].errback(FederationRequestError("b.test", "bad", 400))
        await self.calls(3)  # 0 was dropped; 1 goes on its own
        self.assertEqual(self.remote.contents(2), [1])
        self.remote.calls[2][2].callback({"pdus": {}})
        await eventually(lambda: self.sent == ["b.test"])
        self.assertEqual(await self.pending(), 0)

    async def test_many_server_up_announcements_send_once(self) -> None:
        # Every process that hears from b announces it: a flood must cost one
        # transaction and one database write, not one each.
        self.queue.wake(await self.queue_edus(1))
        await self.calls(1)
        self.remote.calls[0][2].errback(FederationRequestError("b.test", "refused"))
        await eventually(lambda: self.queue.is_backing_off)
        for _ in range(50):
            self.queue.reset_backoff()
        await self.calls(2)
        self.remote.calls[1][2].callback({"pdus": {}})
        await eventually(lambda: self.sent == ["b.test"])
        for _ in range(50):
            self.queue.reset_backoff()  # up already: nothing to do
        await task.deferLater(self.hs.reactor, 0.1, lambda: None)
        await self.calls(2)
        self.assertEqual((await self.hs.store.get_retry_state("b.test")).retry_interval_ms, 0)

    async def test_ephemeral_edus_ride_with_to_device_ones(self) -> None:
        typing = {"edu_type": "m.typing", "content": {"room_id": "!r:a.test", "typing": True}}
        self.queue.add_edus([typing])
        await self.calls(1)
        self.assertEqual(self.remote.calls[0][1]["edus"], [typing])
        first_id = self.remote.calls[0][0]
        # Queued while one is in flight: the next transaction, after the
        # outbox's to-device EDUs; a failed one is retried with the same id.
        receipt = {"edu_type": "m.receipt", "content": {"!r:a.test": {}}}
        self.queue.add_edus([receipt])
        upto = await self.queue_edus(1)
        self.queue.wake(upto)
        self.remote.calls[0][2].callback({"pdus": {}})
        await self.calls(2)
        edus = self.remote.calls[1][1]["edus"]
        self.assertEqual([e["edu_type"] for e in edus], ["m.direct_to_device", "m.receipt"])
        self.assertNotEqual(self.remote.calls[1][0], first_id)
        self.remote.calls[1][2].errback(FederationRequestError("b.test", "timeout"))
        await eventually(lambda: self.queue.is_backing_off)
        self.time.advance(12.1)
        await self.calls(3)
        self.assertEqual(self.remote.calls[2][0], self.remote.calls[1][0])
        self.remote.calls[2][2].callback({"pdus": {}})
        await eventually(lambda: len(self.sent) == 2)
        self.assertEqual(await self.pending(), 0)

    async def test_refused_ephemeral_edus_are_dropped(self) -> None:
        self.queue.add_edus([{"edu_type": "m.typing", "content": {"bad": True}}])
        await self.calls(1)
        self.remote.calls[0][2].errback(FederationRequestError("b.test", "bad", code=400))
        await task.deferLater(self.hs.reactor, 0.05, lambda: None)
        await self.calls(1)  # nothing left to send
        self.assertFalse(self.queue.is_backing_off)
