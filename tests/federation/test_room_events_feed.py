"""Where the room events feed starts and what it records before queueing
(federation/sender/room_events.py, ``RoomEventsFeed``), over a scripted
store: positions in numbers."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from twisted.internet import defer, task
from twisted.trial import unittest

from synapse_lite.clock import Clock
from synapse_lite.events import Event
from synapse_lite.federation.sender.pdu_queue import FeedProgress
from synapse_lite.federation.sender.room_events import RoomEventsFeed
from synapse_lite.replication.notifier import ReplicationNotifier
from synapse_lite.storage.databases.main.destination_rooms import DestinationRoom, QueuedPdu
from synapse_lite.storage.databases.main.roommember import MemberChange
from synapse_lite.tokens import RoomStreamToken

JOINED = frozenset({"@alice:a.test", "@bob:b.test", "@carol:c.test"})


def message(n: int, room: str = "!r:a.test") -> Event:
    return Event(
        event_id=f"$e{n}",
        room_id=room,
        type="m.room.message",
        state_key=None,
        sender="@alice:a.test",
        content={},
        origin_server_ts=0,
        stream_ordering=n,
        depth=n,
        instance_name="main",
    )


class Changes:
    """A change tracker that knows nothing: the feed reads every batch (the
    skip from memory is tests/federation/test_room_events_feed_skip.py's)."""

    def may_have_changed(self, room_id: str, since: Any) -> bool:
        return False

    def changed_after(self, position: int) -> None:
        return None

    def __len__(self) -> int:
        return 0


class ScriptedStore:
    """The reads and the one write of the feed."""

    def __init__(self, current: int, written: int | None, behind: dict[str, int]) -> None:
        self.current = current
        self.written = written
        self.behind = behind
        self.events: list[Event] = []
        self.recorded: list[tuple[list[DestinationRoom], int, int]] = []
        #: The rooms' membership changes (current_state_delta_stream's).
        self.member_changes: list[MemberChange] = []
        self.room_membership_changes = Changes()
        self.room_changes = Changes()

    def get_room_max_stream_ordering(self) -> int:
        return self.current

    def get_room_max_token(self) -> RoomStreamToken:
        return RoomStreamToken(self.current)

    async def get_current_state_ids(self, room_id: str) -> dict[Any, str]:
        return {}

    async def get_federation_feed_position(self) -> int | None:
        return self.written

    async def get_destinations_behind(self) -> dict[str, int]:
        return dict(self.behind)

    async def get_stream_events_between(self, after: int, upto: int, limit: int) -> list[Event]:
        found = [e for e in self.events if after < e.stream_ordering <= upto]
        return found[:limit]

    async def get_received_pdu_origins(self, event_ids: Iterable[str]) -> dict[str, str]:
        return {}

    async def get_users_in_room(self, room_id: str) -> frozenset[str]:
        return frozenset({"@alice:a.test"}) if room_id.startswith("!local") else JOINED

    async def get_member_changes_after(
        self, room_ids: Collection[str], stream_id: int
    ) -> list[MemberChange]:
        return [c for c in self.member_changes if c.room_id in room_ids and c.stream_id > stream_id]

    async def record_destination_rooms(
        self, rows: Iterable[DestinationRoom], batch_from: int, feed_upto: int
    ) -> None:
        self.recorded.append((list(rows), batch_from, feed_upto))


class RoomEventsFeedTestCase(unittest.TestCase):
    def make_feed(
        self, store: ScriptedStore, owned: Collection[str] = ("b.test", "c.test")
    ) -> RoomEventsFeed:
        self.progress = FeedProgress()
        self.queued: list[tuple[str, list[QueuedPdu]]] = []
        self.caught_up: list[list[str]] = []
        self.filled = 0

        def fill() -> None:
            self.filled += 1

        return RoomEventsFeed(
            store=store,  # type: ignore[arg-type]
            clock=Clock(task.Clock()),
            server_name="a.test",
            queue_pdus=lambda d, pdus: self.queued.append((d, list(pdus))),
            local_writes=ReplicationNotifier(),
            progress=self.progress,
            owns=lambda destination: destination in owned,
            catch_up=lambda destinations: self.caught_up.append(list(destinations)),
            filled=fill,
            coalesce_seconds=0,
        )

    async def started(self, feed: RoomEventsFeed) -> None:
        feed.start()
        # The scripted store answers at once: the feed has run.
        await defer.succeed(None)

    def queued_ids(self, destination: str) -> list[str]:
        return [p.event_id for d, pdus in self.queued if d == destination for p in pdus]

    async def test_first_run_starts_now(self) -> None:
        store = ScriptedStore(current=500, written=None, behind={})
        store.events = [message(n) for n in (400, 501)]
        feed = self.make_feed(store)
        await self.started(feed)
        self.assertEqual((self.progress.live_from, self.progress.filled_upto), (500, 500))
        self.assertEqual(self.filled, 1)
        store.current = 501
        feed.wake()
        self.assertEqual(self.queued_ids("b.test"), ["$e501"])

    async def test_replays_from_the_lowest_owned_destination_behind(self) -> None:
        # Written up to 150; b.test (ours) got up to 80, d.test (another
        # sender's) up to 20: this sender replays from 80, not 20.
        store = ScriptedStore(current=160, written=150, behind={"b.test": 80, "d.test": 20})
        store.events = [message(n) for n in (70, 90, 155)]
        feed = self.make_feed(store)
        await self.started(feed)
        self.assertEqual(self.progress.live_from, 80)
        self.assertEqual(self.caught_up, [["b.test"]])
        # Both destinations get 90 and 155 (each queue drops what is at or
        # below its own position); nothing at or below 80.
        self.assertEqual(self.queued_ids("b.test"), ["$e90", "$e155"])
        self.assertEqual(self.queued_ids("c.test"), ["$e90", "$e155"])
        rows, batch_from, upto = store.recorded[0]
        self.assertEqual((batch_from, upto), (80, 160))
        self.assertEqual(
            sorted((r.destination, r.pdu.event_id) for r in rows),
            [("b.test", "$e155"), ("c.test", "$e155")],
        )

    async def test_too_far_behind_catches_up_instead_of_replaying(self) -> None:
        # b.test is 3,000 positions behind: it catches up; c.test replays.
        store = ScriptedStore(current=5000, written=4900, behind={"b.test": 2000, "c.test": 4800})
        store.events = [message(n) for n in (2500, 4850, 4950)]
        feed = self.make_feed(store)
        await self.started(feed)
        self.assertEqual(self.progress.live_from, 4800)
        self.assertEqual(self.caught_up, [["b.test", "c.test"]])
        self.assertEqual(self.queued_ids("c.test"), ["$e4850", "$e4950"])

    async def test_a_long_stop_fills_the_rows_without_queueing(self) -> None:
        # Every sender was down for 20,000 events: they are written to
        # destination_rooms (catch-up sends the newest per room), not
        # queued in memory one by one.
        store = ScriptedStore(current=20_100, written=100, behind={})
        store.events = [message(n, f"!r{n % 3}:a.test") for n in range(101, 20_101)]
        feed = self.make_feed(store)
        await self.started(feed)
        self.assertEqual(self.progress.live_from, 20_100)
        self.assertEqual(self.filled, 1)
        self.assertEqual(self.queued, [])
        newest = {}
        for rows, _, _ in store.recorded:
            for r in rows:
                newest[(r.destination, r.room_id)] = r.pdu.stream_ordering
        self.assertEqual(
            newest,
            {
                (d, f"!r{k}:a.test"): 20_100 - ((20_100 - k) % 3)
                for d in ("b.test", "c.test")
                for k in range(3)
            },
        )

    async def test_no_write_for_events_no_server_gets(self) -> None:
        # Only our users in the room: nothing to record, and the feed's
        # position is written only every RECORD_POSITION_EVERY positions.
        store = ScriptedStore(current=100, written=100, behind={})
        feed = self.make_feed(store)
        await self.started(feed)
        store.events = [message(n, "!local:a.test") for n in range(101, 111)]
        store.current = 110
        feed.wake()
        self.assertEqual(store.recorded, [])
        self.assertEqual(self.progress.filled_upto, 110)
        store.events = [message(n, "!local:a.test") for n in range(111, 701)]
        store.current = 700
        feed.wake()
        # Read 100 at a time: the batch ending at 610 is 500 past 110.
        self.assertEqual([(rows, upto) for rows, _, upto in store.recorded], [([], 610)])

    async def test_events_before_a_join_are_not_sent_to_the_joiners_server(self) -> None:
        # The feed reads 101-105 late: carol@c.test joined at 103 and
        # bob@b.test left at 104, so the room's members now are alice and
        # carol. Each event goes to the servers joined just before it:
        # 101 and 102 to b.test only, 105 to c.test only.
        store = ScriptedStore(current=100, written=100, behind={})
        feed = self.make_feed(store)
        await self.started(feed)
        room = "!r:a.test"
        store.member_changes = [
            MemberChange(room, "@carol:c.test", 103, None),
            MemberChange(room, "@bob:b.test", 104, "join"),
        ]
        self.patch(
            store,
            "get_users_in_room",
            lambda room_id: defer.succeed(frozenset({"@alice:a.test", "@carol:c.test"})),
        )
        store.events = [message(n) for n in (101, 102, 105)]
        store.current = 105
        feed.wake()
        self.assertEqual(self.queued_ids("b.test"), ["$e101", "$e102"])
        self.assertEqual(self.queued_ids("c.test"), ["$e105"])
