"""The outbound room events feed (federation/sender/room_events.py), its
skip from memory (where it starts and what it records:
test_room_events_feed.py): events
of rooms with only our users joined are skipped from memory, without reading
them; any room with another server's user, or a membership change, is read
and queued as before."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from twisted.internet.task import Clock as ReactorClock
from twisted.trial import unittest

from synapse_lite.clock import Clock
from synapse_lite.events import Event
from synapse_lite.federation.sender import room_events
from synapse_lite.federation.sender.pdu_queue import FeedProgress
from synapse_lite.federation.sender.room_events import RoomEventsFeed
from synapse_lite.replication.notifier import ReplicationNotifier
from synapse_lite.storage.change_tracker import StreamChangeTracker
from synapse_lite.tokens import RoomStreamToken

US = "b.test"


class FakeStore:
    """The events stream as the feed reads it: events in order, the
    change trackers recorded as a writer records them, joined users."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.joined: dict[str, frozenset[str]] = {}
        self.position = 0
        self.room_changes = StreamChangeTracker(self.get_room_max_token)
        self.room_membership_changes = StreamChangeTracker(self.get_room_max_token)
        self.reads = 0

    def get_room_max_token(self) -> RoomStreamToken:
        return RoomStreamToken(self.position)

    def get_room_max_stream_ordering(self) -> int:
        return self.position

    def send(self, room_id: str, sender: str, event_type: str = "m.room.message",
             state_key: str | None = None) -> None:  # fmt: skip
        self.position += 1
        self.events.append(
            Event(
                event_id=f"$e{self.position}",
                room_id=room_id,
                type=event_type,
                state_key=state_key,
                sender=sender,
                content={},
                origin_server_ts=0,
                stream_ordering=self.position,
                depth=self.position,
                instance_name="main",
            )
        )
        self.room_changes.record(room_id, "main", self.position)
        if event_type == "m.room.member":
            self.room_membership_changes.record(room_id, "main", self.position)

    async def get_stream_events_between(self, after: int, upto: int, limit: int) -> list[Event]:
        self.reads += 1
        return [e for e in self.events if after < e.stream_ordering <= upto][:limit]

    async def get_users_in_room(self, room_id: str) -> frozenset[str]:
        return self.joined.get(room_id, frozenset())

    async def get_received_pdu_origins(self, event_ids: Collection[str]) -> dict[str, str]:
        return {}

    async def get_member_changes_after(self, room_ids: Collection[str], stream_id: int) -> list:
        return []

    async def get_current_state_ids(self, room_id: str) -> dict[Any, str]:
        return {}

    async def get_federation_feed_position(self) -> int | None:
        return None

    async def get_destinations_behind(self) -> dict[str, int]:
        return {}

    async def record_destination_rooms(self, rows: Any, batch_from: int, feed_upto: int) -> None:
        pass


class RoomEventsFeedTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.store = FakeStore()
        self.queued: list[tuple[str, list[str]]] = []
        self.writes = ReplicationNotifier()
        self.feed = RoomEventsFeed(
            store=self.store,  # type: ignore[arg-type]
            clock=Clock(ReactorClock()),
            server_name=US,
            queue_pdus=lambda d, pdus: self.queued.append((d, [p.event_id for p in pdus])),
            local_writes=self.writes,
            progress=FeedProgress(),
            coalesce_seconds=0,
        )
        self.store.joined["!local:b.test"] = frozenset({"@alice:b.test", "@bob:b.test"})
        self.store.joined["!shared:b.test"] = frozenset({"@alice:b.test", "@carol:a.test"})
        self.feed.start()

    def send(self, *args: Any) -> None:
        self.store.send(*args)
        self.writes.notify_replication()

    def test_local_rooms_events_are_not_read(self) -> None:
        for _ in range(3):
            self.send("!local:b.test", "@alice:b.test")
        self.assertEqual(self.store.reads, 0)
        self.assertEqual(self.queued, [])

    def test_a_room_with_another_server_is_read_and_queued(self) -> None:
        self.send("!local:b.test", "@alice:b.test")
        self.send("!shared:b.test", "@alice:b.test")
        self.assertEqual(self.store.reads, 1)
        self.assertEqual(self.queued, [("a.test", ["$e2"])])

    def test_an_invite_to_another_server_in_a_local_room_is_queued(self) -> None:
        self.send("!local:b.test", "@alice:b.test", "m.room.member", "@dave:c.test")
        self.assertEqual(self.queued, [("c.test", ["$e1"])])
        # Once the membership is behind the feed, messages are skipped again.
        self.send("!local:b.test", "@alice:b.test")
        self.assertEqual(self.store.reads, 1)

    def test_unprocessed_rows_of_another_writer_are_read(self) -> None:
        # The persisted-up-to position passed rows this process has not
        # processed (their changes not recorded yet): no shortcut.
        self.store.position += 1
        self.store.events.append(
            Event(
                event_id="$w",
                room_id="!shared:b.test",
                type="m.room.message",
                state_key=None,
                sender="@alice:b.test",
                content={},
                origin_server_ts=0,
                stream_ordering=self.store.position,
                depth=1,
                instance_name="w1",
            )
        )
        self.store.get_room_max_token = lambda: RoomStreamToken(0)  # type: ignore[method-assign]
        self.writes.notify_replication()
        self.assertEqual(self.queued, [("a.test", ["$w"])])

    def test_many_remembered_rooms_are_read(self) -> None:
        self.patch(room_events, "MAX_ROOMS_WALKED", 0)
        self.send("!local:b.test", "@alice:b.test")
        self.assertEqual(self.store.reads, 1)
        self.assertEqual(self.queued, [])
