"""``get_member_changes_after`` (storage/databases/main/roommember.py): a
room's membership changes after a position, each with the membership it
replaced, what the federation feed undoes to know who was joined before an
event it reads late (SQLite and PostgreSQL)."""

from __future__ import annotations

from synapse_lite.events import EventSpec
from synapse_lite.handlers.auth import Requester
from synapse_lite.storage.databases.main.roommember import MemberChange
from tests.harness.server import DatabaseTestCase, make_config, make_homeserver

ALICE = "@alice:test.local"
BOB = "@bob:test.local"


class MemberChangesTestCase(DatabaseTestCase):
    async def test_changes_after_a_position_with_what_they_replaced(self) -> None:
        hs = make_homeserver(self, make_config(self.test_db))
        events, clock = hs.handlers.events, hs.handlers.clock
        room_id = await hs.handlers.room_creation.create_room(
            Requester(ALICE, "PHONE", "x"), {"preset": "public_chat"}
        )
        other = await hs.handlers.room_creation.create_room(
            Requester(ALICE, "PHONE", "x"), {"preset": "public_chat"}
        )
        before = hs.store.get_room_max_stream_ordering()

        def member(membership: str) -> EventSpec:
            return EventSpec(
                "m.room.member", BOB, BOB, {"membership": membership}, clock.time_msec()
            )

        [join] = await events.persist_as_writer(room_id, [member("join")])
        message = EventSpec("m.room.message", None, ALICE, {"body": "hi"}, clock.time_msec())
        await events.persist_as_writer(room_id, [message])
        [leave] = await events.persist_as_writer(room_id, [member("leave")])
        await events.persist_as_writer(other, [member("join")])
        self.assertEqual(
            await hs.store.get_member_changes_after([room_id], before),
            [
                MemberChange(room_id, BOB, join.stream_ordering, None),
                MemberChange(room_id, BOB, leave.stream_ordering, "join"),
            ],
        )
        self.assertEqual(
            await hs.store.get_member_changes_after([room_id], join.stream_ordering),
            [MemberChange(room_id, BOB, leave.stream_ordering, "join")],
        )
        self.assertEqual(len(await hs.store.get_member_changes_after([room_id, other], before)), 3)
        self.assertEqual(await hs.store.get_member_changes_after([], before), [])
