"""/sync: everything new for a user since their token, long-polled.

A sync reads up to the token it will hand out (``now``), fixed before it reads
anything; for the events stream that is ``get_room_max_token()``, which holds
every writer's position, so an event a slow writer persists out of order is
picked up by the next sync, never skipped and never repeated. A token from
another process that is ahead of this one is waited for (briefly) and never
handed back smaller. Handed-out tokens go to the position log for the audit.

What the response holds is the sections' (``handlers/sync_sections/``): this
handler parses and hands out tokens, waits for news, and runs the sections.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet import defer

from synapse_lite.api.errors import Codes, LimitExceededError, SynapseError
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.filtering import SyncFilter
from synapse_lite.handlers.ignored_users import IgnoredUsersStore, get_ignored_users
from synapse_lite.handlers.sync_sections.builtin import BuiltInSections
from synapse_lite.handlers.sync_sections.request import (
    MembershipStore,
    SyncRequest,
    SyncResponse,
    SyncSection,
    load_memberships,
    run_sections,
    users_sharing_rooms,
)
from synapse_lite.metrics import OPEN_SYNC_REQUESTS
from synapse_lite.tokens import InvalidToken, RoomStreamToken, StreamToken

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.config.homeserver import HomeServerConfig
    from synapse_lite.handlers.presence import PresenceHandlerBase
    from synapse_lite.notifier import Notifier
    from synapse_lite.position_log import PositionLog
    from synapse_lite.replication.streams import Stream
    from synapse_lite.replication.tcp.receiver import PositionWaiters
    from synapse_lite.storage.change_tracker import PositionChangeTracker

logger = logging.getLogger(__name__)

#: How long a sync waits for this process to reach a token from another process.
SINCE_CATCH_UP_SECONDS = 5.0
#: The position-log writer name of stream-wide (persisted-up-to) positions.
STREAM_WIDE = "*"


class SyncHandlerStore(MembershipStore, IgnoredUsersStore, Protocol):
    """The store reads of the sync handler itself (the sections have theirs)."""

    async def get_name_from_instance_id(self, instance_id: int) -> str | None: ...

    async def get_id_for_instance(self, name: str) -> int: ...

    def get_room_max_token(self) -> RoomStreamToken: ...

    async def get_rooms_for_user(self, user_id: str) -> frozenset[str]: ...

    async def delete_messages_for_device(
        self, user_id: str, device_id: str, up_to_id: int
    ) -> int: ...

    @property
    def to_device_changes(self) -> PositionChangeTracker: ...


class SyncHandler:
    """Answers /sync requests: tokens, waiting for news, and the loop over
    the sections."""

    def __init__(
        self,
        *,
        store: SyncHandlerStore,
        clock: Clock,
        config: HomeServerConfig,
        notifier: Notifier,
        presence: PresenceHandlerBase,
        streams: Mapping[str, Stream],
        waiters: PositionWaiters,
        event_writers: Callable[[], Sequence[str]],
        position_log: PositionLog | None,
        sections: BuiltInSections,
        stream_sections: Sequence[SyncSection] = (),
    ) -> None:
        """``streams``: this process's streams (their positions make the
        token); ``event_writers()``: the events writers known now;
        ``sections``: the spec's parts of the response; ``stream_sections``:
        the parts that streams added later feed, run after them."""
        self._store = store
        self._clock = clock
        self._config = config
        self._limits = config.limits
        self._notifier = notifier
        self._presence_handler = presence
        self._streams = streams
        self._waiters = waiters
        self._event_writers = event_writers
        self._position_log = position_log
        self._sections = sections
        self._in_order: list[SyncSection] = [*sections.in_order(), *stream_sections]
        #: The streams whose positions follow the room key in tokens.
        self._token_streams = [
            name for name in config.streams.sync_token_streams() if name != "events"
        ]
        self._in_flight: dict[str, int] = defaultdict(int)
        #: (user, device) -> to-device stream id already deleted up to.
        self._to_device_deleted: dict[tuple[str, str], int] = {}

    # The request

    async def sync(
        self,
        requester: Requester,
        since: str | None,
        timeout_ms: int,
        full_state: bool,
        sync_filter: SyncFilter,
        set_presence: str,
    ) -> dict[str, Any]:
        """Answer one /sync request."""
        user_id = requester.user_id
        since_token = await self._parse_since(since) if since is not None else None
        if self._in_flight[user_id] >= self._limits.max_concurrent_syncs_per_user:
            raise LimitExceededError(1000)
        self._in_flight[user_id] += 1
        OPEN_SYNC_REQUESTS.inc()
        try:
            timeout_ms = min(timeout_ms, self._limits.max_sync_timeout_ms)
            await self._presence_handler.apply_sync_presence(user_id, set_presence)
            if set_presence == "offline":
                return await self._sync(requester, since_token, timeout_ms, full_state, sync_filter)
            async with self._presence_handler.user_syncing(user_id, requester.device_id):
                return await self._sync(requester, since_token, timeout_ms, full_state, sync_filter)
        finally:
            OPEN_SYNC_REQUESTS.dec()
            self._in_flight[user_id] -= 1
            if self._in_flight[user_id] <= 0:
                del self._in_flight[user_id]

    async def _parse_since(self, since: str) -> StreamToken:
        try:
            return await StreamToken.parse(
                since, self._token_streams, self._store.get_name_from_instance_id
            )
        except InvalidToken as e:
            raise SynapseError(400, str(e)[:300], Codes.INVALID_PARAM) from None

    async def _sync(
        self,
        requester: Requester,
        since: StreamToken | None,
        timeout_ms: int,
        full_state: bool,
        sync_filter: SyncFilter,
    ) -> dict[str, Any]:
        if since is not None:
            await self._catch_up_to(since)
            await self._delete_acknowledged_to_device(requester, since.get("to_device"))
        if since is None or full_state or timeout_ms <= 0:
            response, token, _ = await self._compute(requester, since, full_state, sync_filter)
        else:
            last: list[tuple[dict[str, Any], StreamToken, bool]] = []

            async def check() -> bool:
                last[:] = [await self._compute(requester, since, False, sync_filter)]
                return not last[0][2]

            rooms = await self._store.get_rooms_for_user(requester.user_id)
            await self._notifier.wait_for_events(requester.user_id, rooms, timeout_ms, check)
            response, token, _ = last[0]
        response["next_batch"] = await token.to_string(
            self._token_streams, self._store.get_id_for_instance
        )
        self._log_token(token)
        return response

    # Tokens

    def _current_token(self, since: StreamToken | None) -> StreamToken:
        """Where this sync reads up to: this process's positions, never behind
        a token the client already has (but for a stream that can reset, such
        as typing after its writer restarted, where the client's token may be
        ahead of the writer's new count)."""
        room_key = self._store.get_room_max_token()
        positions = {
            name: self._streams[name].positions.persisted_upto_position()
            for name in self._token_streams
        }
        if since is None:
            return StreamToken(room_key, positions)
        for name in self._token_streams:
            if not self._streams[name].positions.can_reset:
                positions[name] = max(positions[name], since.get(name))
        return StreamToken(room_key.copy_and_advance(since.room_key), positions)

    async def _catch_up_to(self, since: StreamToken) -> None:
        """A token handed out by a process further along: wait (a little) for
        replication to bring this process there too."""
        waits = []
        room_max = self._store.get_room_max_token()
        for writer in self._event_writers():
            position = since.room_key.get_position(writer)
            if position > room_max.get_position(writer):
                waits.append(self._waiters.wait_for_stream_position(writer, "events", position))
        for name in self._token_streams:
            stream = self._streams[name]
            writers = self._config.writers.writers(name)
            if stream.positions.can_reset or len(writers) != 1:
                continue
            wanted = since.get(name)
            if wanted > stream.positions.persisted_upto_position():
                waits.append(self._waiters.wait_for_stream_position(writers[0], name, wanted))
        if not waits:
            return
        try:
            results = await self._clock.timeout(
                defer.DeferredList([defer.ensureDeferred(w) for w in waits], consumeErrors=True),
                SINCE_CATCH_UP_SECONDS,
            )
        except defer.TimeoutError:
            results = [(False, None)]
        if not all(ok for ok, _ in results):
            logger.info("Syncing from a token this process has not caught up with yet")

    # The same tokens, for the deprecated event stream and initial syncs
    # (handlers/legacy_sync.py): a /sync token works there and back.

    async def parse_stream_token(self, value: str) -> StreamToken:
        """A client's token (400 ``M_INVALID_PARAM`` if it is none of ours),
        once this process has (briefly) waited to reach it."""
        token = await self._parse_since(value)
        await self._catch_up_to(token)
        return token

    def current_stream_token(self, since: StreamToken | None = None) -> StreamToken:
        """Where a read now goes up to (never behind ``since``)."""
        return self._current_token(since)

    async def stream_token_string(self, token: StreamToken) -> str:
        """``token`` as handed to the client (and to the position log)."""
        self._log_token(token)
        return await token.to_string(self._token_streams, self._store.get_id_for_instance)

    async def receipt_events(
        self, user_id: str, room_ids: list[str], since: StreamToken | None, now: StreamToken
    ) -> dict[str, dict[str, Any]]:
        """The ``m.receipt`` event of each room whose receipts changed in
        ``(since, now]`` (every receipt when ``since`` is None), as /sync has them."""
        return await self._sections.ephemeral.receipts(user_id, room_ids, since, now)

    async def account_data_events(
        self, user_id: str, since: StreamToken | None, now: StreamToken
    ) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
        """Global and per-room account data that changed (all of it when
        ``since`` is None), as /sync has them."""
        return await self._sections.account_data.events(user_id, since, now)

    async def presence_events(
        self, users: set[str], since: StreamToken | None, now: StreamToken, now_ms: int
    ) -> list[dict[str, Any]]:
        """Presence of ``users`` that changed in ``(since, now]`` (all of it
        when ``since`` is None), as /sync has it."""
        return await self._sections.presence.events(users, since, now, now_ms, set())

    def _log_token(self, token: StreamToken) -> None:
        log = self._position_log
        if log is None:
            return
        for writer in self._event_writers():
            log.position("events", writer, token.room_key.get_position(writer), "sync")
        for name in self._token_streams:
            if not self._streams[name].positions.can_reset:
                log.position(name, STREAM_WIDE, token.get(name), "sync")

    async def _delete_acknowledged_to_device(self, requester: Requester, upto: int) -> None:
        """The client's token shows it has the messages up to ``upto``. Any
        process may delete them: deleting is not a write to the stream."""
        key = (requester.user_id, requester.device_id)
        deleted = self._to_device_deleted.get(key)
        if upto <= (0 if deleted is None else deleted):
            return
        if deleted is None or self._store.to_device_changes.may_have_changed(
            requester.user_id, deleted
        ):
            await self._store.delete_messages_for_device(
                requester.user_id, requester.device_id, upto
            )
        # Else no message came for the user since the last deletion: none to delete.
        if len(self._to_device_deleted) > 50_000:
            self._to_device_deleted.clear()
        self._to_device_deleted[key] = upto

    # Computing a response

    async def _compute(
        self,
        requester: Requester,
        since: StreamToken | None,
        full_state: bool,
        sync_filter: SyncFilter,
    ) -> tuple[dict[str, Any], StreamToken, bool]:
        """The response for (since, now], ``now`` and whether it is empty.
        Reads that depend on nothing else (ignored users, the independent
        sections) run beside the others: each is a round trip a woken /sync
        would otherwise wait for in turn (issue 18's wake-up latency)."""
        now = self._current_token(since)
        user_id = requester.user_id
        # Usually from memory: the store keeps each user's list until the
        # account_data stream brings a change of it.
        ignored = defer.ensureDeferred(get_ignored_users(self._store, user_id))
        try:
            memberships = await load_memberships(self._store, user_id, since, now.room_key)
            request = SyncRequest(
                requester=requester,
                since=since,
                full_state=full_state,
                filter=sync_filter,
                now_ms=self._clock.time_msec(),
                memberships=memberships,
                joined=[r for r in memberships.rooms("join") if sync_filter.allows_room(r)],
                sharing=await users_sharing_rooms(self._store, user_id, memberships.rooms("join")),
                ignored=ignored,
            )
            response = SyncResponse(now)
            await run_sections(self._in_order, request, response)
        finally:
            # Never awaited when the /sync failed first: its failure must not
            # be logged as unhandled.
            ignored.addErrback(lambda _: None)
        return response.body, response.now, not response.news

    async def device_list_changes(
        self, user_id: str, from_string: str, to_string: str
    ) -> tuple[list[str], list[str]]:
        """``GET /keys/changes``: ``device_lists`` between two /sync tokens,
        for the rooms ``user_id`` is in now."""
        since = await self._parse_since(from_string)
        upto = await self._parse_since(to_string)
        memberships = await load_memberships(self._store, user_id, since, upto.room_key)
        joined = memberships.rooms("join")
        sharing = await users_sharing_rooms(self._store, user_id, joined)
        return await self._sections.device_lists.changes(
            user_id, memberships, joined, sharing, since, upto
        )
