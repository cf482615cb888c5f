"""One destination's room events against a real database and a scripted
remote server (federation/sender/pdu_queue.py): the per-destination
position survives the queue (a restart or a handover resumes exactly there,
re-forming the in-flight transaction with its id), catch-up sends the newest
event of each room, and a backlog the destination is not taking while it
backs off turns into catch-up."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.internet import task

from synapse_lite.clock import Clock
from synapse_lite.federation.client import FederationRequestError
from synapse_lite.federation.sender import pdu_queue
from synapse_lite.federation.sender.destination import DestinationQueue
from synapse_lite.federation.sender.pdu_queue import FeedProgress
from synapse_lite.storage.databases.main.destination_rooms import (
    DestinationRoom,
    PduPositions,
    QueuedPdu,
)
from synapse_lite.storage.id_generators import generator as id_generators
from tests.federation.test_destination_queue import ScriptedRemote
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase, make_config, make_homeserver


async def render(event_ids: Sequence[str]) -> list[dict[str, Any]]:
    return [{"event_id": e} for e in event_ids]


def pdus(first: int, last: int, room: str = "!r") -> list[QueuedPdu]:
    """Events ``$<room>:<n>`` at positions ``first..last``."""
    return [QueuedPdu(f"${room}:{n}", n) for n in range(first, last + 1)]


class PduQueueTestCase(DatabaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)
        self.config = make_config(
            self.test_db,
            server_name="a.test",
            federation={"retry": {"initial_seconds": 10, "max_seconds": 40}},
            # Another process sends: main's own sender would send to b.test
            # for real beside the queue under test.
            workers=["federation_sender1"],
            federation_sender_instances=["federation_sender1"],
        )
        self.hs = make_homeserver(self, self.config)
        self.time = task.Clock()
        self.time.advance(1_000_000)
        self.remote = ScriptedRemote()

    def make_queue(self, progress: FeedProgress) -> DestinationQueue:
        return DestinationQueue(
            "b.test",
            store=self.hs.store,
            clock=Clock(self.time),
            client=self.remote,  # type: ignore[arg-type]
            server_name="a.test",
            retry=self.config.federation.retry,
            on_sent=lambda destination: None,
            render_pdus=render,
            feed=progress,
        )

    async def record(self, queued: list[QueuedPdu], batch_from: int, room: str = "!r") -> None:
        """What the feed writes before queueing (the newest per room)."""
        row = DestinationRoom("b.test", room, queued[-1])
        await self.hs.store.record_destination_rooms([row], batch_from, queued[-1].stream_ordering)

    async def calls(self, n: int) -> None:
        await eventually(lambda: len(self.remote.calls) >= n, what=f"{n} transactions")
        self.assertEqual(len(self.remote.calls), n)

    def sent_ids(self, i: int) -> list[str]:
        return [p["event_id"] for p in self.remote.calls[i][1]["pdus"]]

    async def sent_upto(self) -> int | None:
        return await self.hs.store.get_pdus_sent_upto("b.test")

    async def test_restart_resumes_at_the_destinations_position(self) -> None:
        # A burst: 120 events, filled transactions of 50.
        burst = pdus(1, 120)
        await self.record(burst, batch_from=0)
        queue = self.make_queue(FeedProgress(live_from=0, filled_upto=120))
        queue.add_pdus(burst)
        await self.calls(1)
        self.assertEqual(self.sent_ids(0), [p.event_id for p in burst[:50]])
        self.remote.calls[0][2].callback({"pdus": {}})
        await self.calls(2)
        self.assertEqual(await self.sent_upto(), 50)
        in_flight_id = self.remote.calls[1][0]
        # The process dies with 51..100 in flight. The next run's feed
        # replays from 50 (the lowest position of those behind): the same
        # 50 events, hence the same transaction id.
        self.assertEqual(await self.hs.store.get_destinations_behind(), {"b.test": 50})
        queue.stop()
        again = self.make_queue(FeedProgress(live_from=50, filled_upto=120))
        again.add_pdus(burst[50:])
        await self.calls(3)
        self.assertEqual(self.remote.calls[2][0], in_flight_id)
        self.remote.calls[2][2].callback({"pdus": {}})
        await self.calls(4)
        self.assertEqual(self.sent_ids(3), [p.event_id for p in burst[100:]])
        self.remote.calls[3][2].callback({"pdus": {}})
        await eventually(lambda: self.sent_upto_is(120))
        self.assertEqual(await self.hs.store.get_destinations_behind(), {})

    async def test_the_transaction_in_flight_is_formed_again(self) -> None:
        # One event in flight when two more come; the process dies. The next
        # run is handed all three, but sends the one in flight first, alone:
        # same transaction id.
        await self.record(pdus(1, 1), batch_from=0)
        queue = self.make_queue(FeedProgress(live_from=0, filled_upto=1))
        queue.add_pdus(pdus(1, 1))
        await self.calls(1)
        await self.record(pdus(2, 3), batch_from=1)
        queue.add_pdus(pdus(2, 3))
        queue.stop()
        self.assertEqual(await self.hs.store.get_pdu_positions("b.test"), PduPositions(0, 1))
        again = self.make_queue(FeedProgress(live_from=0, filled_upto=3))
        again.add_pdus(pdus(1, 3))
        await self.calls(2)
        self.assertEqual(self.remote.calls[1][0], self.remote.calls[0][0])
        self.assertEqual(self.sent_ids(1), ["$!r:1"])
        self.remote.calls[1][2].callback({"pdus": {}})
        await self.calls(3)
        self.assertEqual(self.sent_ids(2), ["$!r:2", "$!r:3"])
        self.assertEqual(await self.hs.store.get_pdu_positions("b.test"), PduPositions(1, 3))

    async def test_a_new_owner_drops_what_the_old_one_sent(self) -> None:
        # Handed over: the new owner's feed started lower than this
        # destination's position (another destination was further behind).
        await self.record(pdus(1, 30), batch_from=0)
        await self.hs.store.set_pdus_sent_upto("b.test", 20)
        queue = self.make_queue(FeedProgress(live_from=10, filled_upto=30))
        queue.add_pdus(pdus(11, 30))
        await self.calls(1)
        self.assertEqual(self.sent_ids(0), [p.event_id for p in pdus(21, 30)])

    async def test_catch_up_sends_the_newest_event_of_each_room(self) -> None:
        # Behind from 10 in three rooms (thousands of events while it was
        # away); this run's memory starts at 5000.
        await self.record(pdus(11, 2000, "!a"), batch_from=10, room="!a")
        await self.record(pdus(2001, 4000, "!b"), batch_from=10, room="!b")
        await self.record(pdus(4001, 4500, "!a"), batch_from=10, room="!a")
        await self.record(pdus(4501, 4999, "!c"), batch_from=10, room="!c")
        await self.hs.store.set_pdus_sent_upto("b.test", 10)
        progress = FeedProgress(live_from=5000, filled_upto=5000)
        queue = self.make_queue(progress)
        queue.wake()
        await self.calls(1)
        self.assertTrue(queue.pdus.catching_up)
        # One event per room, oldest first; the peer fetches the gaps.
        self.assertEqual(self.sent_ids(0), ["$!b:4000", "$!a:4500", "$!c:4999"])
        self.remote.calls[0][2].callback({"pdus": {}})
        await eventually(lambda: not queue.pdus.catching_up, what="caught up")
        self.assertEqual(await self.sent_upto(), 4999)
        # Live again: the next event goes as it comes.
        await self.record(pdus(5001, 5001, "!a"), batch_from=5000, room="!a")
        queue.add_pdus(pdus(5001, 5001, "!a"))
        await self.calls(2)
        self.assertEqual(self.sent_ids(1), ["$!a:5001"])

    async def test_catch_up_waits_for_the_feed_to_fill(self) -> None:
        # Memory starts at 100 but the feed has only written rows up to 40:
        # catching up cannot end before the rest is written.
        await self.record(pdus(1, 40), batch_from=0)
        progress = FeedProgress(live_from=100, filled_upto=40)
        queue = self.make_queue(progress)
        queue.wake()
        await self.calls(1)
        self.assertEqual(self.sent_ids(0), ["$!r:40"])
        self.remote.calls[0][2].callback({"pdus": {}})
        await eventually(lambda: self.sent_upto_is(40))
        self.assertTrue(queue.pdus.catching_up)
        await self.record(pdus(41, 90, "!s"), batch_from=40, room="!s")
        progress.filled_upto = 100
        queue.add_pdus([])  # the feed's wake-up
        await self.calls(2)
        self.assertEqual(self.sent_ids(1), ["$!s:90"])
        self.remote.calls[1][2].callback({"pdus": {}})
        await eventually(lambda: not queue.pdus.catching_up, what="caught up")

    async def sent_upto_is(self, value: int) -> bool:
        return await self.sent_upto() == value

    async def test_a_backlog_while_backing_off_becomes_catch_up(self) -> None:
        await self.record(pdus(1, 3), batch_from=0)
        queue = self.make_queue(FeedProgress(live_from=0, filled_upto=3))
        queue.add_pdus(pdus(1, 3))
        await self.calls(1)
        first_id = self.remote.calls[0][0]
        self.remote.calls[0][2].errback(FederationRequestError("b.test", "timeout"))
        await eventually(lambda: queue.is_backing_off)
        self.assertEqual(queue.failing_since_ms, 1_000_000_000)
        # One transaction's worth: kept, and retried as it was.
        self.assertFalse(queue.pdus.catching_up)
        self.time.advance(12.1)
        await self.calls(2)
        self.assertEqual(self.remote.calls[1][0], first_id)
        self.remote.calls[1][2].errback(FederationRequestError("b.test", "timeout"))
        await eventually(lambda: queue.is_backing_off)
        # Traffic goes on while it is down: more than a transaction waits.
        for start in range(4, 204, 50):
            batch = pdus(start, start + 49)
            await self.record(batch, batch_from=start - 1)
            queue.add_pdus(batch)
        self.assertTrue(queue.pdus.catching_up)
        self.assertEqual(queue.pending_pdus, 0)
        self.time.advance(24.1)
        await self.calls(3)
        self.assertEqual(self.sent_ids(2), ["$!r:203"])  # the newest, not 200 one by one
        self.remote.calls[2][2].callback({"pdus": {}})
        await eventually(lambda: not queue.pdus.catching_up, what="caught up")
        self.assertEqual(await self.sent_upto(), 203)
        self.assertIsNone(queue.failing_since_ms)

    async def test_too_many_waiting_becomes_catch_up(self) -> None:
        self.patch(pdu_queue, "MAX_PENDING_PDUS", 100)
        await self.record(pdus(1, 150), batch_from=0)
        queue = self.make_queue(FeedProgress(live_from=0, filled_upto=150))
        queue.add_pdus(pdus(1, 50))
        await self.calls(1)
        queue.add_pdus(pdus(51, 150))  # 150 waiting > 100
        self.assertTrue(queue.pdus.catching_up)
        self.remote.calls[0][2].callback({"pdus": {}})
        await self.calls(2)
        self.assertEqual(self.sent_ids(1), ["$!r:150"])

    async def test_nothing_sent_before_the_feed_starts(self) -> None:
        progress = FeedProgress()
        queue = self.make_queue(progress)
        queue.add_pdus(pdus(1, 2))
        await task.deferLater(self.hs.reactor, 0.05, lambda: None)
        self.assertEqual(self.remote.calls, [])
        self.assertEqual(queue.pending_pdus, 2)
