"""/sync long-poll wake-ups on a fake clock: woken by their user or their
rooms, at the end of the reactor turn (once for all the news of the turn),
never missed (a waiter registers before it checks), timed out otherwise."""

from __future__ import annotations

from twisted.internet import defer, task
from twisted.trial import unittest

from synapse_lite.clock import Clock
from synapse_lite.notifier import Notifier
from synapse_lite.streams.definition import Wake


class NotifierTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.clock = task.Clock()
        self.notifier = Notifier(Clock(self.clock))
        self.news: dict[str, bool] = {"@a:x": False, "@b:x": False}
        self.checks = 0

    def wait(self, user: str, rooms: list[str], timeout_ms: int = 10_000) -> defer.Deferred[bool]:
        async def check() -> bool:
            self.checks += 1
            return self.news[user]

        return defer.ensureDeferred(self.notifier.wait_for_events(user, rooms, timeout_ms, check))

    def test_woken_by_its_user_or_its_rooms_only(self) -> None:
        a = self.wait("@a:x", ["!r1:x"])
        b = self.wait("@b:x", ["!r2:x"])
        self.notifier.wake(Wake(rooms=frozenset({"!r3:x"})))
        self.clock.advance(0)
        self.news["@a:x"] = self.news["@b:x"] = True
        self.notifier.wake(Wake(rooms=frozenset({"!r1:x"})))
        self.clock.advance(0)
        self.assertTrue(self.successResultOf(a))
        self.assertFalse(b.called)
        self.notifier.wake(Wake(users=frozenset({"@b:x"})))
        self.clock.advance(0)
        self.assertTrue(self.successResultOf(b))

    def test_a_spurious_wake_checks_again_and_keeps_waiting(self) -> None:
        a = self.wait("@a:x", ["!r1:x"])
        self.notifier.wake(Wake(everyone=True))
        self.clock.advance(0)
        self.assertFalse(a.called)
        self.assertEqual(self.checks, 2)

    def test_times_out_with_the_last_check(self) -> None:
        a = self.wait("@a:x", [], timeout_ms=3000)
        self.clock.advance(3)
        self.assertFalse(self.successResultOf(a))
        # A finished waiter leaves nothing behind.
        self.assertEqual(self.notifier._users, {})
        self.assertEqual(dict(self.notifier._room_users), {})

    def test_one_users_waiters_keep_their_own_rooms(self) -> None:
        # A /sync in !r1 and an /events peeking into !r2, of one user: news
        # in either room reaches them (they share the user's wake-up).
        joined = self.wait("@a:x", ["!r1:x"])
        peek = self.wait("@a:x", ["!r2:x"])
        self.news["@a:x"] = True
        self.notifier.wake(Wake(rooms=frozenset({"!r1:x"})))
        self.clock.advance(0)
        self.assertTrue(self.successResultOf(joined))
        self.assertTrue(self.successResultOf(peek))
        # The first to end takes only its own rooms away.
        self.news["@a:x"] = False
        joined = self.wait("@a:x", ["!r1:x"], timeout_ms=1000)
        peek = self.wait("@a:x", ["!r2:x"], timeout_ms=20_000)
        self.clock.advance(1)
        self.assertFalse(self.successResultOf(joined))
        self.assertEqual(set(self.notifier._room_users), {"!r2:x"})
        self.news["@a:x"] = True
        self.notifier.wake(Wake(rooms=frozenset({"!r2:x"})))
        self.clock.advance(0)
        self.assertTrue(self.successResultOf(peek))
        self.assertEqual(dict(self.notifier._room_users), {})

    def test_the_news_of_one_turn_wakes_a_waiter_once_at_its_end(self) -> None:
        a = self.wait("@a:x", ["!r1:x", "!r2:x"])
        self.assertEqual(self.checks, 1)
        self.news["@a:x"] = True
        self.notifier.wake(Wake(rooms=frozenset({"!r1:x"})))
        self.notifier.notify(users=["@a:x"], rooms=["!r2:x"])
        self.notifier.notify_all()
        # Nothing yet: the turn has not ended.
        self.assertFalse(a.called)
        self.assertEqual(self.checks, 1)
        self.clock.advance(0)
        self.assertTrue(self.successResultOf(a))
        self.assertEqual(self.checks, 2)
        # Nobody waits: news schedules nothing.
        self.notifier.notify(users=["@a:x"], rooms=["!r1:x"])
        self.assertEqual(self.clock.getDelayedCalls(), [])
