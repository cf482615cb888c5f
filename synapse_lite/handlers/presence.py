"""Presence: who is online, decided by the presence writer from who is syncing.

Processes serving /sync tell the presence writer which users are syncing with
USER_SYNC (start/end), naming themselves by a per-run instance id; they re-send
their syncing users when they reconnect and send CLEAR_USER_SYNC when they stop
cleanly. The writer marks a user online while any process has them syncing and
offline once their last sync has ended (after a short grace, so the gap between
two long-polls does not flap). A process that is the presence writer tells
nobody: it counts its own syncs directly.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attr
from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.replication.http.calls import EmptyBody
from synapse_lite.replication.http.writes import SET_PRESENCE, PresenceChange, RemotePresence
from synapse_lite.replication.tcp.commands import (
    ClearUserSyncCommand,
    Command,
    UserSyncCommand,
)
from synapse_lite.storage.databases.main.presence import UserPresenceState

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.notifier import Notifier
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

PRESENCE_STATES = ("online", "unavailable", "offline")
#: How long after a user's last sync ended they are still shown online.
SYNC_ONLINE_GRACE_MS = 10_000
#: How long a process serving /sync waits before saying a user stopped
#: syncing: a client opens its next long-poll within milliseconds, and saying
#: nothing then spares the presence writer two commands and a read per poll.
SYNC_STOP_DELAY_SECONDS = 2.0
MAX_STATUS_MSG_LENGTH = 1024


def check_presence_state(state: Any, status_msg: Any) -> None:
    if state not in PRESENCE_STATES:
        raise SynapseError(
            400, f"'presence' must be one of {', '.join(PRESENCE_STATES)}", Codes.INVALID_PARAM
        )
    if status_msg is not None and (
        not isinstance(status_msg, str)
        or len(status_msg) > MAX_STATUS_MSG_LENGTH
        # Stored as text: PostgreSQL cannot hold NUL.
        or "\x00" in status_msg
    ):
        raise SynapseError(400, "'status_msg' must be a short string", Codes.INVALID_PARAM)


class PresenceHandlerBase:
    """Reading presence; recording syncs is role-specific."""

    #: Users remembered as marked idle by a sync here (bounded: cleared when
    #: full, which at worst leaves a user idle until they set online).
    MAX_IDLE_FROM_SYNC = 100_000

    def __init__(self, store: GenericWorkerStore, clock: Clock, calls: InternalCalls) -> None:
        self._store = store
        self._clock = clock
        self._calls = calls
        #: Users a /sync on this process marked unavailable (set_presence).
        self._idle_from_sync: set[str] = set()

    async def get_state(self, user_id: str) -> UserPresenceState:
        states = await self._store.get_presence_for_users([user_id])
        return states.get(user_id) or UserPresenceState.default(user_id)

    def get_user_sync_commands(self) -> list[Command]:
        """USER_SYNC commands to re-send on a new replication connection."""
        return []

    @asynccontextmanager
    async def user_syncing(self, user_id: str, device_id: str | None) -> AsyncIterator[None]:
        """Wrap a /sync request that counts towards the user being online."""
        yield

    async def apply_sync_presence(self, user_id: str, set_presence: str) -> None:
        """What a /sync's ``set_presence`` says beyond the user syncing (which
        :meth:`user_syncing` records, marking an offline user online):
        ``unavailable`` marks them idle (when they are not already);
        ``online`` after a sync here marked them idle marks them online again.
        An ``unavailable`` set with ``PUT /presence`` stays until the client
        changes it (a sync does not undo it); ``offline`` changes nothing.
        Through the presence writer, like any change."""
        if set_presence == "unavailable":
            current = await self.get_state(user_id)
            if current.state != "unavailable":
                await self.set_state(user_id, "unavailable", current.status_msg)
            if len(self._idle_from_sync) >= self.MAX_IDLE_FROM_SYNC:
                self._idle_from_sync.clear()
            self._idle_from_sync.add(user_id)
        elif set_presence == "online" and user_id in self._idle_from_sync:
            self._idle_from_sync.discard(user_id)
            current = await self.get_state(user_id)
            if current.state == "unavailable":
                await self.set_state(user_id, "online", current.status_msg)

    async def set_state(self, user_id: str, state: str, status_msg: str | None) -> None:
        """Set a user's presence, on the presence writer."""
        check_presence_state(state, status_msg)
        await self._calls.call(SET_PRESENCE, PresenceChange(user_id, state, status_msg))

    def start(self) -> None:
        """Background work begins."""

    def stop(self) -> None:
        """Background work ends."""

    def end_of_syncs(self) -> None:
        """The process is stopping cleanly: its syncs are over."""


class PresenceWriterHandler(PresenceHandlerBase):
    """The presence writer: decides online/offline and writes the stream."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        calls: InternalCalls,
        notifier: Notifier,
    ) -> None:
        super().__init__(store, clock, calls)
        self._notifier = notifier
        self._local_syncs: dict[str, int] = defaultdict(int)
        #: instance_id -> users syncing there.
        self._external_syncs: dict[str, set[str]] = defaultdict(set)
        self._last_sync_end: dict[str, int] = {}
        #: Users this writer last stored as online and currently active: a new
        #: sync of theirs changes nothing, so needs no read.
        self._active: set[str] = set()
        self._loop: Any = None

    def start(self) -> None:
        self._loop = self._clock.looping_call(self._check_offline, 1.0)

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()

    def _is_syncing(self, user_id: str) -> bool:
        return self._local_syncs.get(user_id, 0) > 0 or any(
            user_id in users for users in self._external_syncs.values()
        )

    @asynccontextmanager
    async def user_syncing(self, user_id: str, device_id: str | None) -> AsyncIterator[None]:
        self._local_syncs[user_id] += 1
        try:
            await self._became_syncing(user_id)
            yield
        finally:
            self._local_syncs[user_id] -= 1
            if self._local_syncs[user_id] <= 0:
                del self._local_syncs[user_id]
                self._sync_ended(user_id)

    def on_user_sync(self, cmd: UserSyncCommand) -> None:
        """A USER_SYNC from a process serving /sync."""
        if cmd.is_syncing:
            self._external_syncs[cmd.instance_id].add(cmd.user_id)
            self._clock.call_later(0, self._run, self._became_syncing(cmd.user_id))
        else:
            self._external_syncs[cmd.instance_id].discard(cmd.user_id)
            self._sync_ended(cmd.user_id)

    def on_clear_user_sync(self, cmd: ClearUserSyncCommand) -> None:
        """A process serving /sync stopped: none of its syncs continue."""
        for user_id in self._external_syncs.pop(cmd.instance_id, set()):
            self._sync_ended(user_id)

    @staticmethod
    def _run(coro: Any) -> None:
        defer.ensureDeferred(coro).addErrback(
            lambda f: logger.error("Presence update failed: %s", f.getTraceback())
        )

    def _sync_ended(self, user_id: str) -> None:
        if not self._is_syncing(user_id):
            self._last_sync_end[user_id] = self._clock.time_msec()

    async def _became_syncing(self, user_id: str) -> None:
        self._last_sync_end.pop(user_id, None)
        if user_id in self._active:
            return
        current = await self.get_state(user_id)
        # Offline users come online; an idle (unavailable) one stays idle.
        if current.state == "offline" or (
            current.state == "online" and not current.currently_active
        ):
            now = self._clock.time_msec()
            await self._store_state(
                attr.evolve(
                    current,
                    state="online" if current.state == "offline" else current.state,
                    last_active_ts=now,
                    last_user_sync_ts=now,
                    currently_active=True,
                )
            )

    def _check_offline(self) -> None:
        now = self._clock.time_msec()
        for user_id, ended in list(self._last_sync_end.items()):
            if now - ended >= SYNC_ONLINE_GRACE_MS and not self._is_syncing(user_id):
                del self._last_sync_end[user_id]
                self._run(self._go_offline(user_id))

    async def _go_offline(self, user_id: str) -> None:
        current = await self.get_state(user_id)
        if current.state != "offline":
            await self._store_state(attr.evolve(current, state="offline", currently_active=False))

    async def apply_state(self, change: PresenceChange) -> EmptyBody:
        """Serves :data:`SET_PRESENCE`."""
        user_id, state, status_msg = change.user_id, change.presence, change.status_msg
        check_presence_state(state, status_msg)
        current = await self.get_state(user_id)
        now = self._clock.time_msec()
        await self._store_state(
            attr.evolve(
                current,
                state=state,
                status_msg=status_msg,
                last_active_ts=now if state == "online" else current.last_active_ts,
                currently_active=state == "online",
            )
        )
        return EmptyBody()

    async def apply_remote_state(self, change: RemotePresence) -> EmptyBody:
        """Serves :data:`SET_REMOTE_PRESENCE`: another server's user's
        presence, stored as it says (their server times it out, not us)."""
        check_presence_state(change.presence, change.status_msg)
        await self._store.update_presence(
            [
                UserPresenceState(
                    user_id=change.user_id,
                    state=change.presence,
                    last_active_ts=change.last_active_ts,
                    last_federation_update_ts=self._clock.time_msec(),
                    status_msg=change.status_msg,
                    currently_active=change.currently_active,
                )
            ]
        )
        self._notifier.notify_all()
        return EmptyBody()

    async def _store_state(self, state: UserPresenceState) -> None:
        self._active.discard(state.user_id)
        await self._store.update_presence([state])
        if state.state != "offline" and state.currently_active:
            self._active.add(state.user_id)
        self._notifier.notify_all()


class PresenceFollowerHandler(PresenceHandlerBase):
    """A process serving /sync that is not the presence writer."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        calls: InternalCalls,
        send_command: Callable[[Command], None],
        instance_id: str,
    ) -> None:
        """``send_command``: replication's way out; ``instance_id``: names this
        run of the process in USER_SYNC (differs on every start)."""
        super().__init__(store, clock, calls)
        self._send_command = send_command
        self._instance_id = instance_id
        self._syncing: dict[str, int] = defaultdict(int)
        self._devices: dict[str, str | None] = {}
        #: Users whose last sync ended, with the call that will say so.
        self._stopping: dict[str, IDelayedCall] = {}

    def _send(self, user_id: str, syncing: bool) -> None:
        self._send_command(
            UserSyncCommand(
                self._instance_id,
                user_id,
                self._devices.get(user_id),
                syncing,
                self._clock.time_msec(),
            )
        )

    @asynccontextmanager
    async def user_syncing(self, user_id: str, device_id: str | None) -> AsyncIterator[None]:
        self._syncing[user_id] += 1
        self._devices[user_id] = device_id
        pending_stop = self._stopping.pop(user_id, None)
        if pending_stop is not None:
            pending_stop.cancel()  # the writer still has them syncing
        elif self._syncing[user_id] == 1:
            self._send(user_id, True)
        try:
            yield
        finally:
            self._syncing[user_id] -= 1
            if self._syncing[user_id] <= 0:
                del self._syncing[user_id]
                self._stopping[user_id] = self._clock.call_later(
                    SYNC_STOP_DELAY_SECONDS, self._stopped, user_id
                )

    def _stopped(self, user_id: str) -> None:
        del self._stopping[user_id]
        self._send(user_id, False)
        self._devices.pop(user_id, None)

    def get_user_sync_commands(self) -> list[Command]:
        now = self._clock.time_msec()
        return [
            UserSyncCommand(self._instance_id, user_id, self._devices.get(user_id), True, now)
            for user_id in [*self._syncing, *self._stopping]
        ]

    def stop(self) -> None:
        """Drop the pending "stopped syncing" notices (shutdown)."""
        for call in self._stopping.values():
            if call.active():
                call.cancel()
        self._stopping.clear()

    def end_of_syncs(self) -> None:
        self.stop()
        self._send_command(ClearUserSyncCommand(self._instance_id))
