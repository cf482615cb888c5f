"""``RoomVisibility.visible_ranges`` says for a range of events what
``can_see`` says event by event: checked over generated membership histories
and every history visibility (what full-text search relies on)."""

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


@st.composite
def histories(draw: st.DrawFn) -> tuple[tuple[int, str], ...]:
    positions = draw(st.lists(st.integers(1, 60), unique=True, max_size=8))
    return tuple((p, draw(st.sampled_from(MEMBERSHIPS))) for p in sorted(positions))


class VisibleRangesTestCase(unittest.TestCase):
    @settings(max_examples=400, deadline=None)
    @given(histories(), st.sampled_from(VISIBILITIES))
    def test_ranges_agree_with_can_see(
        self, history: tuple[tuple[int, str], ...], visibility: str
    ) -> None:
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
            RoomVisibility("@me:test", "shared", joined_then_left).visible_ranges(),
            [(None, 20)],
        )
        self.assertEqual(
            RoomVisibility("@me:test", "joined", joined_then_left).visible_ranges(),
            [(10, 20)],
        )
        self.assertEqual(
            RoomVisibility("@me:test", "world_readable", ()).visible_ranges(), [(None, None)]
        )
        self.assertEqual(RoomVisibility("@me:test", "shared", ()).visible_ranges(), [])
