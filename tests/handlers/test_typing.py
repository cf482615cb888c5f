"""The typing stream's positions carry the run of its writer: a follower or a
/sync token of an earlier run (or of the time before runs, small serials) gets
the whole current state, not nothing until the new run's count passes it."""

from __future__ import annotations

from typing import Any, cast

from twisted.trial import unittest

from synapse_lite.handlers.typing import (
    RUN_SPAN,
    TypingFollowerHandler,
    TypingWriterHandler,
    typing_run,
)
from synapse_lite.replication.http.writes import TypingChange
from synapse_lite.streams.catalog import TypingStreamRow
from tests.harness.server import DatabaseTestCase, make_config, make_homeserver

ALICE, BOB = "@alice:test.local", "@bob:test.local"
ROOM, OTHER_ROOM = "!room:test.local", "!other:test.local"


class _Members:
    async def get_users_in_room(self, room_id: str) -> list[str]:
        return [ALICE, BOB]


class _Quiet:
    """Clock, notifiers and calls: the handler only calls them."""

    def time_msec(self) -> int:
        return 0

    def notify(self, **kwargs: Any) -> None:
        pass

    def notify_replication(self) -> None:
        pass


def writer(run: int) -> TypingWriterHandler:
    quiet = cast(Any, _Quiet())
    return TypingWriterHandler(
        positions=TypingWriterHandler.positions(run),
        store=cast(Any, _Members()),
        clock=quiet,
        notifier=quiet,
        replication_notifier=quiet,
    )


async def type_in(handler: TypingWriterHandler, user_id: str, room_id: str, typing: bool) -> None:
    await handler.apply_typing(TypingChange(user_id, user_id, room_id, typing, None))


class TypingRunsTestCase(unittest.TestCase):
    async def test_a_run_counts_from_its_own_span(self) -> None:
        handler = writer(3)
        self.assertEqual(handler.get_current_token(), 3 * RUN_SPAN)
        await type_in(handler, ALICE, ROOM, True)
        self.assertEqual(handler.get_current_token(), 3 * RUN_SPAN + 1)
        self.assertEqual(typing_run(handler.get_current_token()), 3)

    async def test_a_token_of_the_previous_run_gets_the_whole_state(self) -> None:
        """Run 1 made five changes; run 2 two, with Bob typing in ROOM. A
        token of run 1 at 1e12+5 lies below run 2's positions but belongs to
        another run: every room of the client comes back, OTHER_ROOM (where
        run 1 may have shown Alice typing) as an empty list."""
        old_token = RUN_SPAN + 5
        handler = writer(2)
        await type_in(handler, ALICE, ROOM, True)
        await type_in(handler, BOB, ROOM, True)
        typing, token = handler.get_typing_for_rooms([ROOM, OTHER_ROOM], old_token)
        self.assertEqual(typing, {ROOM: [ALICE, BOB], OTHER_ROOM: []})
        self.assertEqual(token, 2 * RUN_SPAN + 2)
        # From the token just handed out: nothing new.
        self.assertEqual(handler.get_typing_for_rooms([ROOM, OTHER_ROOM], token), ({}, token))

    async def test_a_token_from_before_runs_still_parses_and_gets_the_whole_state(self) -> None:
        """Tokens handed out before positions carried runs hold small serials
        (run 0); they are accepted and answered with the current state."""
        handler = writer(1)
        await type_in(handler, ALICE, ROOM, True)
        typing, _ = handler.get_typing_for_rooms([ROOM], 7)
        self.assertEqual(typing, {ROOM: [ALICE]})

    async def test_the_same_serial_in_a_new_run_is_not_mistaken_for_the_old(self) -> None:
        """The defect this fixes: run 2's second change has the same offset as
        the old token's; the old token still sees both changes."""
        handler = writer(2)
        await type_in(handler, ALICE, ROOM, True)
        await type_in(handler, BOB, ROOM, True)
        typing, _ = handler.get_typing_for_rooms([ROOM], RUN_SPAN + 2)
        self.assertEqual(typing, {ROOM: [ALICE, BOB]})

    async def test_catching_up_from_another_run_reads_every_room(self) -> None:
        handler = writer(2)
        await type_in(handler, ALICE, ROOM, True)
        await type_in(handler, BOB, OTHER_ROOM, True)
        current = handler.get_current_token()
        updates, upto, limited = await handler.get_all_typing_updates(
            "typer", RUN_SPAN + 40, current, 100
        )
        self.assertEqual(
            updates,
            [
                (2 * RUN_SPAN + 1, TypingStreamRow(ROOM, [ALICE])),
                (2 * RUN_SPAN + 2, TypingStreamRow(OTHER_ROOM, [BOB])),
            ],
        )
        self.assertEqual((upto, limited), (current, False))

    def test_a_follower_resets_when_the_run_changes_even_upwards(self) -> None:
        """Run 1 showed Alice typing in OTHER_ROOM; run 2 (which forgot it)
        sends a row for ROOM at a higher position: the follower drops
        OTHER_ROOM rather than keep showing Alice typing there forever."""
        follower = TypingFollowerHandler(TypingFollowerHandler.positions(), cast(Any, None))
        follower.on_rows("typer", RUN_SPAN + 1, [TypingStreamRow(OTHER_ROOM, [ALICE])])
        follower.on_rows("typer", 2 * RUN_SPAN + 1, [TypingStreamRow(ROOM, [BOB])])
        typing, token = follower.get_typing_for_rooms([ROOM, OTHER_ROOM], None)
        self.assertEqual(typing, {ROOM: [BOB]})
        self.assertEqual(token, 2 * RUN_SPAN + 1)
        # Within one run, rows add up.
        follower.on_rows("typer", 2 * RUN_SPAN + 2, [TypingStreamRow(OTHER_ROOM, [ALICE])])
        typing, _ = follower.get_typing_for_rooms([ROOM, OTHER_ROOM], None)
        self.assertEqual(typing, {ROOM: [BOB], OTHER_ROOM: [ALICE]})

    def test_a_lower_position_of_the_same_or_an_older_run_moves_nothing(self) -> None:
        """Issue 34: a row hook told of a lower position (which the command
        handler refuses before it gets here) keeps who is typing and its
        position; only a higher run is a restart."""
        follower = TypingFollowerHandler(TypingFollowerHandler.positions(), cast(Any, None))
        follower.on_rows("typer", 2 * RUN_SPAN + 3, [TypingStreamRow(ROOM, [ALICE])])
        with self.assertLogs("synapse_lite.handlers.typing", "WARNING"):
            follower.on_rows("typer", 5, [])
            follower.on_rows("typer", RUN_SPAN + 9, [TypingStreamRow(ROOM, [])])
            follower.on_rows("typer", 2 * RUN_SPAN + 1, [])
        self.assertEqual(
            follower.get_typing_for_rooms([ROOM], None), ({ROOM: [ALICE]}, 2 * RUN_SPAN + 3)
        )
        self.assertTrue(follower._positions.lower_position_is_false)
        self.assertTrue(TypingWriterHandler.positions(1).lower_position_is_false)

    def test_a_run_that_does_not_fit_in_a_token_is_refused(self) -> None:
        with self.assertRaises(ValueError):
            writer(10**6)
        with self.assertRaises(ValueError):
            writer(0)


class TypingRunsStoredTestCase(DatabaseTestCase):
    """The run comes from ``stream_runs``: each start of the writer on the
    same database takes the next one (SQLite and PostgreSQL)."""

    async def test_each_start_of_the_writer_takes_the_next_run(self) -> None:
        config = make_config(self.test_db)
        first = make_homeserver(self, config)
        self.assertEqual(typing_run(first.typing.get_current_token()), 1)
        await first.service.stopService()
        second = make_homeserver(self, config)
        self.assertEqual(typing_run(second.typing.get_current_token()), 2)
