"""Each /sync section on its own, over fake stores of exactly the reads its
store Protocol names (no database, no homeserver)."""

from __future__ import annotations

import gc
from typing import Any

from twisted.internet import defer
from twisted.trial import unittest

from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.filtering import EventFilter, SyncFilter
from synapse_lite.handlers.sync_sections.account_data import AccountDataSection
from synapse_lite.handlers.sync_sections.device_lists import DeviceListsSection
from synapse_lite.handlers.sync_sections.e2e_keys import E2EKeysSection
from synapse_lite.handlers.sync_sections.ephemeral import EphemeralSection
from synapse_lite.handlers.sync_sections.presence import PresenceSection
from synapse_lite.handlers.sync_sections.request import (
    Memberships,
    SyncRequest,
    SyncResponse,
    SyncSection,
    run_sections,
)
from synapse_lite.handlers.sync_sections.rooms import RoomsSection
from synapse_lite.handlers.sync_sections.stream_parts import StreamPartSection
from synapse_lite.handlers.sync_sections.to_device import TO_DEVICE_LIMIT, ToDeviceSection
from synapse_lite.storage.change_tracker import PositionChangeTracker
from synapse_lite.storage.databases.main.presence import UserPresenceState
from synapse_lite.tokens import RoomStreamToken, StreamToken

ALICE = "@alice:test"
BOB = "@bob:test"
CAROL = "@carol:test"
ROOM = "!room:test"


def token(room: int = 10, **positions: int) -> StreamToken:
    return StreamToken(RoomStreamToken(room), positions)


def request(
    since: StreamToken | None,
    *,
    memberships: Memberships | None = None,
    joined: list[str] | None = None,
    sharing: set[str] | None = None,
    sync_filter: SyncFilter | None = None,
) -> SyncRequest:
    return SyncRequest(
        requester=Requester(ALICE, "DEVICE", "hash"),
        since=since,
        full_state=False,
        filter=sync_filter or SyncFilter(),
        now_ms=1_000,
        memberships=memberships or Memberships({}, set(), {}),
        joined=joined or [],
        sharing=sharing or {ALICE},
        ignored=defer.succeed(frozenset()),
    )


class Reads:
    """A fake store: answers from ``answers``, records every read."""

    #: The rooms section's change tracker, when a test sets one.
    room_changes: Any
    #: The integer streams' change trackers: knowing nothing unless a test
    #: sets one (every read is made, as before a tracker existed).
    receipt_changes = account_data_changes = to_device_changes = push_rules_changes = (
        PositionChangeTracker(lambda: 2**62)
    )
    presence_changes = device_list_changes = receipt_changes

    def __init__(self, **answers: Any) -> None:
        self.answers = answers
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        if name not in self.answers:
            raise AttributeError(name)
        answer = self.answers[name]

        async def read(*args: Any) -> Any:
            self.calls.append((name, args))
            return answer(*args) if callable(answer) else answer

        return read


class ToDeviceSectionTests(unittest.TestCase):
    async def test_the_token_moves_only_as_far_as_the_messages_sent(self) -> None:
        store = Reads(get_messages_for_device=([{"type": "m.x", "content": {}}], 7))
        response = SyncResponse(token(to_device=9))
        await ToDeviceSection(store).add_to(request(token(to_device=3)), response)
        self.assertEqual(
            store.calls, [("get_messages_for_device", (ALICE, "DEVICE", 3, 9, TO_DEVICE_LIMIT))]
        )
        self.assertEqual(response.now.get("to_device"), 7)
        self.assertEqual(response.body["to_device"], {"events": [{"type": "m.x", "content": {}}]})
        self.assertTrue(response.news)

    async def test_nothing_new_reads_nothing(self) -> None:
        store = Reads()
        response = SyncResponse(token(to_device=5))
        await ToDeviceSection(store).add_to(request(token(to_device=5)), response)
        self.assertEqual(store.calls, [])
        self.assertEqual(response.body["to_device"], {"events": []})
        self.assertFalse(response.news)


class E2EKeysSectionTests(unittest.TestCase):
    async def test_counts_always_name_signed_curve25519_and_are_never_news(self) -> None:
        store = Reads(get_device_key_counts=({"curve25519": 2}, ["x"]))
        section = E2EKeysSection(store)
        self.assertTrue(section.independent)
        response = SyncResponse(token())
        await section.add_to(request(token()), response)
        self.assertEqual(
            response.body["device_one_time_keys_count"],
            {"signed_curve25519": 0, "curve25519": 2},
        )
        self.assertEqual(response.body["device_unused_fallback_key_types"], ["x"])
        self.assertFalse(response.news)


class FakeTyping:
    def __init__(self, typing: dict[str, list[str]], key: int) -> None:
        self.typing, self.key = typing, key

    def get_typing_for_rooms(
        self, room_ids: list[str], since_token: int | None
    ) -> tuple[dict[str, list[str]], int]:
        return {r: u for r, u in self.typing.items() if r in room_ids}, self.key


class EphemeralSectionTests(unittest.TestCase):
    RECEIPTS = [
        (ROOM, "m.read", BOB, "$e1", {"ts": 1}),
        (ROOM, "m.read.private", BOB, "$e1", {"ts": 2}),
        (ROOM, "m.read.private", ALICE, "$e2", {"ts": 3}),
    ]

    async def test_typing_and_receipts_go_to_the_room_not_others_private_receipts(self) -> None:
        store = Reads(get_receipts_for_rooms=self.RECEIPTS)
        section = EphemeralSection(store, FakeTyping({ROOM: [BOB]}, 4))  # type: ignore[arg-type]
        response = SyncResponse(token(typing=1, receipts=6))
        await section.add_to(request(token(typing=1, receipts=2), joined=[ROOM]), response)
        self.assertEqual(response.now.get("typing"), 4)
        self.assertEqual(store.calls, [("get_receipts_for_rooms", ([ROOM], 2, 6))])
        self.assertEqual(
            response.room_events_of(ROOM, "ephemeral"),
            [
                {"type": "m.typing", "content": {"user_ids": [BOB]}},
                {
                    "type": "m.receipt",
                    "content": {
                        "$e1": {"m.read": {BOB: {"ts": 1}}},
                        "$e2": {"m.read.private": {ALICE: {"ts": 3}}},
                    },
                },
            ],
        )
        # Per-room events are the rooms section's to place: no top-level part.
        self.assertEqual(response.body, {})

    async def test_initial_sync_leaves_out_rooms_nobody_types_in(self) -> None:
        store = Reads(get_receipts_for_rooms=[])
        section = EphemeralSection(store, FakeTyping({ROOM: []}, 1))  # type: ignore[arg-type]
        response = SyncResponse(token(receipts=0))
        await section.add_to(request(None, joined=[ROOM]), response)
        self.assertEqual(response.room_events, {})

    async def test_the_ephemeral_filter_applies(self) -> None:
        store = Reads(get_receipts_for_rooms=self.RECEIPTS)
        section = EphemeralSection(store, FakeTyping({ROOM: [BOB]}, 4))  # type: ignore[arg-type]
        response = SyncResponse(token(receipts=6))
        only_typing = SyncFilter(ephemeral=EventFilter(types=("m.typing",)))
        await section.add_to(
            request(token(receipts=2), joined=[ROOM], sync_filter=only_typing), response
        )
        self.assertEqual(
            [e["type"] for e in response.room_events_of(ROOM, "ephemeral")], ["m.typing"]
        )


class AccountDataSectionTests(unittest.TestCase):
    async def test_only_what_changed_and_a_deleted_last_tag_as_no_tags(self) -> None:
        store = Reads(
            get_account_data_changes=[(5, None, "m.a"), (6, ROOM, "m.tag")],
            get_global_account_data={"m.a": {"a": 1}, "m.b": {"b": 2}},
            get_room_account_data={},
            get_tags_for_user={},
        )
        response = SyncResponse(token(account_data=6, push_rules=1))
        await AccountDataSection(store).add_to(
            request(token(account_data=4, push_rules=1), joined=[ROOM]), response
        )
        self.assertEqual(
            response.body["account_data"], {"events": [{"type": "m.a", "content": {"a": 1}}]}
        )
        self.assertEqual(
            response.room_events_of(ROOM, "account_data"),
            [{"type": "m.tag", "content": {"tags": {}}}],
        )
        self.assertTrue(response.news)

    async def test_nothing_new_reads_nothing(self) -> None:
        store = Reads()
        response = SyncResponse(token(account_data=3, push_rules=2))
        await AccountDataSection(store).add_to(
            request(token(account_data=3, push_rules=2)), response
        )
        self.assertEqual(store.calls, [])
        self.assertEqual(response.body["account_data"], {"events": []})
        self.assertFalse(response.news)


class PresenceSectionTests(unittest.TestCase):
    async def test_a_user_who_joins_in_the_response_comes_with_their_presence(self) -> None:
        store = Reads(get_presence_changes=[], get_presence_for_users={})
        response = SyncResponse(token(presence=3))
        response.joined_rooms = {
            ROOM: {
                "timeline": {
                    "events": [
                        {
                            "type": "m.room.member",
                            "state_key": BOB,
                            "content": {"membership": "join"},
                        }
                    ]
                },
                "state": {"events": []},
            }
        }
        await PresenceSection(store).add_to(
            request(token(presence=3), sharing={ALICE, BOB}), response
        )
        # The presence stream did not move: no changes read, Bob's presence
        # read as newly seen (the default: he has none stored).
        self.assertEqual(store.calls, [("get_presence_for_users", ([BOB],))])
        expected = UserPresenceState.default(BOB).to_client_content(1_000)
        self.assertEqual(
            response.body["presence"],
            {"events": [{"type": "m.presence", "sender": BOB, "content": expected}]},
        )


class DeviceListsSectionTests(unittest.TestCase):
    async def test_changes_of_users_sharing_a_room_and_who_left_every_shared_room(self) -> None:
        store = Reads(
            get_users_whose_devices_changed={BOB, CAROL},
            get_users_in_room=frozenset({ALICE, CAROL}),
            get_membership_changes_in_rooms=[],
        )
        memberships = Memberships({}, {"!gone:test"}, {"!gone:test": "join"})
        response = SyncResponse(token(room=12, device_lists=8))
        await DeviceListsSection(store).add_to(
            request(
                token(room=10, device_lists=2),
                memberships=memberships,
                joined=[ROOM],
                sharing={ALICE, BOB},
            ),
            response,
        )
        # Carol changed devices but shares no room any more: left, not changed.
        self.assertEqual(response.body["device_lists"], {"changed": [BOB], "left": [CAROL]})
        self.assertTrue(response.news)

    async def test_an_invitee_is_changed_not_left(self) -> None:
        # Dave was invited to a room of Alice's: his keys are wanted (clients
        # encrypt to invitees) though he shares no room yet; Erin was
        # invited and rejected it: left (she shares no room).
        dave, erin = "@dave:other", "@erin:other"
        store = Reads(
            get_users_whose_devices_changed=set(),
            get_membership_changes_in_rooms=[(dave, "invite"), (erin, "invite"), (erin, "leave")],
        )
        response = SyncResponse(token(room=12, device_lists=2))
        await DeviceListsSection(store).add_to(
            request(
                token(room=10, device_lists=2),
                memberships=Memberships({}, set(), {}),
                joined=[ROOM],
                sharing={ALICE},
            ),
            response,
        )
        self.assertEqual(response.body["device_lists"], {"changed": [dave], "left": [erin]})

    async def test_initial_sync_has_none(self) -> None:
        store = Reads()
        response = SyncResponse(token(device_lists=8))
        await DeviceListsSection(store).add_to(request(None), response)
        self.assertEqual(response.body["device_lists"], {"changed": [], "left": []})
        self.assertFalse(response.news)


class NeverChanged:
    def may_have_changed(self, entity: str, since: RoomStreamToken) -> bool:
        return False


class RoomsSectionTests(unittest.TestCase):
    async def test_a_quiet_room_with_ephemeral_events_gets_an_entry_for_them(self) -> None:
        store = Reads(get_unread_counts={ROOM: (2, 1)}, room_token_to_string="s10")
        store.room_changes = NeverChanged()
        section = RoomsSection(store, formatter=None, relations=None)  # type: ignore[arg-type]
        memberships = Memberships({ROOM: (ROOM, "join", "$m", 1, "main")}, set(), {})
        response = SyncResponse(token(room=10))
        typing = [{"type": "m.typing", "content": {"user_ids": [BOB]}}]
        response.add_room_events(ROOM, "ephemeral", typing)
        await section.add_to(
            request(token(room=10), memberships=memberships, joined=[ROOM]), response
        )
        join = response.body["rooms"]["join"]
        self.assertEqual(list(join), [ROOM])
        self.assertEqual(join[ROOM]["ephemeral"], {"events": typing})
        self.assertEqual(
            join[ROOM]["timeline"], {"events": [], "limited": False, "prev_batch": "s10"}
        )
        self.assertEqual(
            join[ROOM]["unread_notifications"], {"notification_count": 2, "highlight_count": 1}
        )
        self.assertEqual(response.joined_rooms, join)
        self.assertTrue(response.news)

    async def test_nothing_new_is_no_news(self) -> None:
        store = Reads(get_unread_counts={})
        store.room_changes = NeverChanged()
        section = RoomsSection(store, formatter=None, relations=None)  # type: ignore[arg-type]
        memberships = Memberships({ROOM: (ROOM, "join", "$m", 1, "main")}, set(), {})
        response = SyncResponse(token(room=10))
        await section.add_to(
            request(token(room=10), memberships=memberships, joined=[ROOM]), response
        )
        self.assertEqual(
            response.body["rooms"], {"join": {}, "invite": {}, "leave": {}, "knock": {}}
        )
        self.assertFalse(response.news)


class NotesPart:
    key = "org.example.notes"

    def __init__(self) -> None:
        self.asked: list[tuple[str, int | None, int]] = []

    async def changes(self, user_id: str, since: int | None, upto: int) -> Any:
        self.asked.append((user_id, since, upto))
        return {"notes": ["n"]}


class StreamPartSectionTests(unittest.TestCase):
    async def test_asked_only_when_its_stream_moved(self) -> None:
        part = NotesPart()
        section = StreamPartSection("notes", part)
        quiet = SyncResponse(token(notes=4))
        await section.add_to(request(token(notes=4)), quiet)
        self.assertEqual((part.asked, quiet.body, quiet.news), ([], {}, False))
        moved = SyncResponse(token(notes=6))
        await section.add_to(request(token(notes=4)), moved)
        self.assertEqual(part.asked, [(ALICE, 4, 6)])
        self.assertEqual(moved.body, {"org.example.notes": {"notes": ["n"]}})
        self.assertTrue(moved.news)


class Recording:
    """A section recording when it starts and ends, in a shared log."""

    def __init__(
        self, name: str, log: list[str], independent: bool = False, wait: Any = None
    ) -> None:
        self.name, self.log, self.independent, self.wait = name, log, independent, wait

    async def add_to(self, request: SyncRequest, response: SyncResponse) -> None:
        self.log.append(f"{self.name} starts, seeing {sorted(response.body)}")
        if self.wait is not None:
            await self.wait
        response.put(self.name, True, news=False)
        self.log.append(f"{self.name} ends")


class FailingSection:
    independent = False

    async def add_to(self, request: SyncRequest, response: SyncResponse) -> None:
        raise RuntimeError("the section failed")


class RunSectionsTests(unittest.TestCase):
    async def test_independent_sections_start_first_and_the_others_run_in_order(self) -> None:
        log: list[str] = []
        keys_read: defer.Deferred[None] = defer.Deferred()
        sections = [
            Recording("a", log),
            Recording("keys", log, independent=True, wait=keys_read),
            Recording("b", log),
        ]
        running = defer.ensureDeferred(run_sections(sections, request(None), SyncResponse(token())))
        self.assertEqual(
            log,
            [
                "keys starts, seeing []",
                "a starts, seeing []",
                "a ends",
                "b starts, seeing ['a']",
                "b ends",
            ],
        )
        self.assertNoResult(running)  # waits for the independent section
        keys_read.callback(None)
        self.successResultOf(running)
        self.assertEqual(log[-1], "keys ends")

    def test_a_failure_leaves_no_running_read_unhandled(self) -> None:
        keys_read: defer.Deferred[None] = defer.Deferred()
        sections: list[SyncSection] = [
            Recording("keys", [], independent=True, wait=keys_read),
            FailingSection(),
        ]
        running = defer.ensureDeferred(run_sections(sections, request(None), SyncResponse(token())))
        self.failureResultOf(running, RuntimeError)
        # The independent section's read fails after the sync has: consumed.
        keys_read.errback(RuntimeError("the key count read failed"))
        del running, sections, keys_read
        gc.collect()
        self.assertEqual(self.flushLoggedErrors(RuntimeError), [])


class ChangeTrackerTests(unittest.TestCase):
    """A stream that moved for other users only: its change tracker (the
    horizon at 0, Bob's and another room's changes recorded) spares the
    read, and the part is as the database would have it, empty."""

    def store(self) -> Reads:
        store = Reads()
        for name in ("receipt_changes", "account_data_changes", "to_device_changes"):
            tracker = PositionChangeTracker(lambda: 0)
            tracker.record(BOB, 6)
            tracker.record("!other:test", 6)
            setattr(store, name, tracker)
        return store

    async def test_receipts_of_other_rooms_read_nothing(self) -> None:
        store = self.store()
        section = EphemeralSection(store, FakeTyping({}, 1))  # type: ignore[arg-type]
        response = SyncResponse(token(receipts=6))
        await section.add_to(request(token(receipts=2), joined=[ROOM]), response)
        self.assertEqual(store.calls, [])
        self.assertEqual(response.room_events, {})

    async def test_account_data_of_others_reads_nothing(self) -> None:
        store = self.store()
        response = SyncResponse(token(account_data=6, push_rules=1))
        await AccountDataSection(store).add_to(
            request(token(account_data=2, push_rules=1)), response
        )
        self.assertEqual(store.calls, [])
        self.assertEqual(response.body["account_data"], {"events": []})

    async def test_to_device_messages_of_others_read_nothing(self) -> None:
        store = self.store()
        response = SyncResponse(token(to_device=6))
        await ToDeviceSection(store).add_to(request(token(to_device=2)), response)
        self.assertEqual(store.calls, [])
        self.assertEqual(response.now.get("to_device"), 6)
        self.assertFalse(response.news)
