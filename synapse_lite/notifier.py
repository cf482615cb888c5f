"""Waking /sync long-polls when something they may show has happened.

A waiting /sync registers its user and the rooms it is in. News (a local write,
or rows arriving over replication) names rooms and users; every waiter of those
users, or of users listening in those rooms, is woken and re-checks what it has
to send. Wake-ups may be spurious; they are never missed, because a waiter
registers before it checks.

Wake-ups are batched by reactor turn: news only marks its users, and one call
scheduled for the end of the turn (``call_later(0)``: after the database
threads' results the reactor is handling now) wakes each marked user once. A
/sync woken on a room's writer computes its answer from memory without
yielding, so waking it at once answered with the first event of a turn that
persisted several; woken at the end, it answers with all of them, and a
client long-polling a busy room makes fewer /syncs for the same events.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from twisted.internet import defer

from synapse_lite.streams.definition import Wake

if TYPE_CHECKING:
    from synapse_lite.clock import Clock

logger = logging.getLogger(__name__)


class _UserListeners:
    def __init__(self) -> None:
        self.waiting: list[defer.Deferred[None]] = []
        #: The rooms this user's waiting requests listen in, with how many of
        #: them listen in each (a /sync and an /events peeking elsewhere
        #: may wait together).
        self.rooms: Counter[str] = Counter()
        #: Requests of this user currently waiting.
        self.active = 0

    def wake(self) -> None:
        waiting, self.waiting = self.waiting, []
        for d in waiting:
            if not d.called:
                d.callback(None)


class Notifier:
    """Long-poll wake-ups for /sync (and the deprecated /events) on this process."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._users: dict[str, _UserListeners] = {}
        self._room_users: dict[str, set[str]] = defaultdict(set)
        #: Users to wake at the end of this reactor turn.
        self._to_wake: set[str] = set()
        self._wake_scheduled = False

    # Waking

    def notify(self, users: Iterable[str] = (), rooms: Iterable[str] = ()) -> None:
        """Wake waiters of ``users`` and of users listening in ``rooms``, at
        the end of this reactor turn (a waiter registered by then is woken)."""
        to_wake = self._to_wake
        for user_id in users:
            if user_id in self._users:
                to_wake.add(user_id)
        for room_id in rooms:
            to_wake.update(self._room_users.get(room_id, ()))
        self._schedule_wake()

    def notify_all(self) -> None:
        self._to_wake.update(self._users)
        self._schedule_wake()

    def _schedule_wake(self) -> None:
        if self._to_wake and not self._wake_scheduled:
            self._wake_scheduled = True
            self._clock.call_later(0, self._wake_marked)

    def _wake_marked(self) -> None:
        self._wake_scheduled = False
        to_wake, self._to_wake = self._to_wake, set()
        for user_id in to_wake:
            listeners = self._users.get(user_id)
            if listeners is not None:
                listeners.wake()

    def wake(self, wake: Wake) -> None:
        """Wake the waiters a stream's rows concern (see ``StreamDefinition.wake``)."""
        if wake.everyone:
            self.notify_all()
        else:
            self.notify(wake.users, wake.rooms)

    # Waiting

    async def wait_for_events(
        self,
        user_id: str,
        room_ids: Iterable[str],
        timeout_ms: int,
        check: Callable[[], Awaitable[bool]],
    ) -> bool:
        """Wait until ``check()`` says there is something to send, or the timeout.

        Returns the last result of ``check()``.
        """
        listeners = self._users.get(user_id)
        if listeners is None:
            listeners = self._users[user_id] = _UserListeners()
        listeners.active += 1
        rooms = set(room_ids)
        self._add_rooms(user_id, listeners, rooms)
        clock = self._clock
        deadline = clock.time() + timeout_ms / 1000
        woken: defer.Deferred[None] | None = None
        try:
            while True:
                woken = defer.Deferred()
                listeners.waiting.append(woken)
                if await check():
                    return True
                remaining = deadline - clock.time()
                if remaining <= 0:
                    return False
                try:
                    await clock.timeout(woken, remaining)
                except defer.TimeoutError:
                    return await check()
        finally:
            if woken is not None and woken in listeners.waiting:
                listeners.waiting.remove(woken)
            listeners.active -= 1
            self._remove_rooms(user_id, listeners, rooms)
            if listeners.active == 0:
                self._users.pop(user_id, None)

    def _add_rooms(self, user_id: str, listeners: _UserListeners, rooms: set[str]) -> None:
        for room_id in rooms:
            listeners.rooms[room_id] += 1
            self._room_users[room_id].add(user_id)

    def _remove_rooms(self, user_id: str, listeners: _UserListeners, rooms: set[str]) -> None:
        for room_id in rooms:
            listeners.rooms[room_id] -= 1
            if listeners.rooms[room_id] > 0:
                continue
            del listeners.rooms[room_id]
            members = self._room_users.get(room_id)
            if members is not None:
                members.discard(user_id)
                if not members:
                    del self._room_users[room_id]
