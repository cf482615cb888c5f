"""``RoomVisibility.visible_ranges`` says for a range of events what
``can_see`` says event by event: checked over generated membership histories
and history visibility settings changing over time (what full-text search
relies on)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial import unittest

from synapse_lite.events import Event
from synapse_lite.handlers.visibility import RoomVisibility

VISIBILITIES = ("shared", "invited", "joined", "world_readable")
MEMBERSHIPS = ("join", "invite", "leave", "ban")


def message_at(position: int) -> Event:
    return Event(
        event_id=f"$e{position}",
        room_id="!r:test",
        type="m.room.message",
        state_key=None,
        sender="@other:test",
        content={"body": "x"},
        origin_server_ts=0,
        stream_ordering=position,
        depth=position,
        instance_name="main",
    )


def in_ranges(position: int, ranges: list[tuple[int | None, int | None]]) -> bool:
    return any(
        (start is None or position >= start) and (end is None or position < end)
        for start, end in ranges
    )


Settings = tuple[tuple[int, str | None], ...]
History = tuple[tuple[int, str], ...]


@st.composite
def rooms(draw: st.DrawFn) -> tuple[Settings, History]:
    """The room's settings and the user's memberships: distinct events, so
    at distinct positions; a setting may be one the rules do not know."""
    positions = draw(st.lists(st.integers(1, 60), unique=True, max_size=12))
    settings_: list[tuple[int, str | None]] = []
    history: list[tuple[int, str]] = []
    for p in sorted(positions):
        if draw(st.booleans()):
            settings_.append((p, draw(st.sampled_from((*VISIBILITIES, "bogus", None)))))
        else:
            history.append((p, draw(st.sampled_from(MEMBERSHIPS))))
    return tuple(settings_), tuple(history)


def setting(visibility: str) -> Settings:
    """The room's one setting, its event at position 1 (before it, the
    spec's default, ``shared``, is in force)."""
    return ((1, visibility),)


class VisibleRangesTestCase(unittest.TestCase):
    @settings(max_examples=400, deadline=None)
    @given(rooms())
    def test_ranges_agree_with_can_see(self, room: tuple[Settings, History]) -> None:
        visibility, history = room
        view = RoomVisibility("@me:test", visibility, history)
        ranges = view.visible_ranges()
        # Sorted and disjoint.
        for (_, end), (start, _) in itertools.pairwise(ranges):
            assert end is not None and start is not None and end < start, ranges
        for position in range(0, 70):
            self.assertEqual(
                view.can_see(message_at(position)),
                in_ranges(position, ranges),
                (history, visibility, position, ranges),
            )

    def test_examples(self) -> None:
        joined_then_left = ((10, "join"), (20, "leave"))
        self.assertEqual(
            RoomVisibility("@me:test", setting("shared"), joined_then_left).visible_ranges(),
            [(None, 20)],
        )
        self.assertEqual(
            RoomVisibility("@me:test", setting("joined"), joined_then_left).visible_ranges(),
            [(None, 2), (10, 20)],
        )
        self.assertEqual(
            RoomVisibility("@me:test", setting("world_readable"), ()).visible_ranges(),
            [(2, None)],
        )
        self.assertEqual(RoomVisibility("@me:test", setting("shared"), ()).visible_ranges(), [])
        # World-readable from 1 until 30, joined-only after: a stranger sees
        # what was sent in between (not the setting events' own positions:
        # the ranges cover ordinary events, and each setting event is judged
        # by the settings on both sides of it).
        changed = ((1, "world_readable"), (30, "joined"))
        self.assertEqual(RoomVisibility("@me:test", changed, ()).visible_ranges(), [(2, 31)])
