"""/sync: everything new for a user since their token, long-polled.

A sync reads up to the token it will hand out (``now``), fixed before it reads
anything; for the events stream that is ``get_room_max_token()``, which holds
every writer's position, so an event a slow writer persists out of order is
picked up by the next sync, never skipped and never repeated. A token from
another process that is ahead of this one is waited for (briefly) and never
handed back smaller. Handed-out tokens go to the position log for the audit.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attr
from twisted.internet import defer

from synapse_lite.api.errors import Codes, LimitExceededError, SynapseError
from synapse_lite.events import Event
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.client_events import ClientEventFormatter
from synapse_lite.handlers.filtering import EventFilter, SyncFilter
from synapse_lite.handlers.ignored_users import get_ignored_users, is_hidden, without_ignored
from synapse_lite.handlers.visibility import load_room_visibility, member_sees_everything
from synapse_lite.metrics import OPEN_SYNC_REQUESTS
from synapse_lite.storage.databases.main.account_data import TAG_DATA_TYPE
from synapse_lite.storage.databases.main.presence import UserPresenceState
from synapse_lite.storage.databases.main.roommember import MembershipRow
from synapse_lite.tokens import InvalidToken, RoomStreamToken, StreamToken

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.config.homeserver import HomeServerConfig
    from synapse_lite.handlers.presence import PresenceHandlerBase
    from synapse_lite.handlers.relations import RelationsHandler
    from synapse_lite.handlers.typing import TypingHandlerBase
    from synapse_lite.notifier import Notifier
    from synapse_lite.position_log import PositionLog
    from synapse_lite.replication.streams import Stream
    from synapse_lite.replication.tcp.receiver import PositionWaiters
    from synapse_lite.storage.databases.main import GenericWorkerStore
    from synapse_lite.streams.definition import SyncSection

logger = logging.getLogger(__name__)

#: To-device messages per sync (more wait for the next one).
TO_DEVICE_LIMIT = 100
#: How long a sync waits for this process to reach a token from another process.
SINCE_CATCH_UP_SECONDS = 5.0
#: Members named in a room summary of a room without a name.
HEROES = 5
#: Events read per query while filling a filtered timeline.
TIMELINE_PAGE = 100
#: State shown with an invite, besides the invite itself.
INVITE_STATE_TYPES = (
    "m.room.create",
    "m.room.join_rules",
    "m.room.name",
    "m.room.topic",
    "m.room.avatar",
    "m.room.canonical_alias",
    "m.room.encryption",
)
#: The position-log writer name of stream-wide (persisted-up-to) positions.
STREAM_WIDE = "*"


class LazyMembersSent:
    """Which member events each device was sent in lazy-loading syncs, so
    incremental syncs leave out the redundant ones. Per process and bounded:
    a device that syncs through another process, or after the memory was
    cleared, is sent some members again, which the spec allows."""

    MAX_DEVICES = 10_000

    def __init__(self) -> None:
        #: (user, device) -> room -> member state key -> member event id.
        self._sent: dict[tuple[str, str], dict[str, dict[str, str]]] = {}

    def record(self, requester: Requester, room_id: str, events: list[Event], reset: bool) -> None:
        """Remember the member events in ``events``; ``reset``: a full sync,
        which the client starts again from."""
        key = (requester.user_id, requester.device_id)
        if key not in self._sent and len(self._sent) >= self.MAX_DEVICES:
            self._sent.clear()
        rooms = self._sent.setdefault(key, {})
        if reset:
            rooms.pop(room_id, None)
        members = rooms.setdefault(room_id, {})
        for event in events:
            if event.type == "m.room.member" and event.state_key is not None:
                members[event.state_key] = event.event_id

    def was_sent(self, requester: Requester, room_id: str, user_id: str) -> bool:
        rooms = self._sent.get((requester.user_id, requester.device_id), {})
        return user_id in rooms.get(room_id, {})


@attr.s(slots=True, auto_attribs=True)
class _Memberships:
    """A user's rooms as of ``now`` and what changed since ``since``."""

    now: dict[str, MembershipRow]
    #: Rooms with a membership event of the user in (since, now].
    changed: set[str]
    #: For changed rooms: the membership as of ``since`` (None: none).
    at_since: dict[str, str | None]

    def rooms(self, membership: str) -> list[str]:
        return sorted(r for r, row in self.now.items() if row[1] == membership)


class _EarlyReads:
    """Reads a /sync starts before it needs them, so that they overlap the
    others; :meth:`settle` once done (a read never awaited, because the /sync
    failed first, must not log its failure as unhandled)."""

    def __init__(
        self,
        *,
        ignored: Coroutine[Any, Any, frozenset[str]],
        one_time_keys: Coroutine[Any, Any, dict[str, int]],
        fallback_types: Coroutine[Any, Any, list[str]],
    ) -> None:
        self.ignored = defer.ensureDeferred(ignored)
        self.one_time_keys = defer.ensureDeferred(one_time_keys)
        self.fallback_types = defer.ensureDeferred(fallback_types)

    def settle(self) -> None:
        for read in (self.ignored, self.one_time_keys, self.fallback_types):
            read.addErrback(lambda _: None)


def _filter_room_events(
    by_room: dict[str, list[dict[str, Any]]], event_filter: EventFilter
) -> None:
    """Drop, in place, the non-timeline room events (ephemeral, account
    data: no sender) that ``event_filter`` refuses."""
    if event_filter.allows_all:
        return
    for room_id, events in by_room.items():
        by_room[room_id] = [
            e for e in events if event_filter.matches(e["type"], "", room_id, e.get("content"))
        ]


def _is_limited(entry: dict[str, Any]) -> bool:
    return bool(entry["timeline"].get("limited"))


def _before(event: Event) -> RoomStreamToken:
    """A room token covering exactly the room's events before ``event`` (a
    room's events are persisted in stream order by its one writer)."""
    return RoomStreamToken(event.stream_ordering - 1)


class SyncHandler:
    """Computes /sync responses and waits for news."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        config: HomeServerConfig,
        notifier: Notifier,
        typing: TypingHandlerBase,
        presence: PresenceHandlerBase,
        streams: Mapping[str, Stream],
        waiters: PositionWaiters,
        event_writers: Callable[[], Sequence[str]],
        position_log: PositionLog | None,
        sections: Mapping[str, SyncSection],
        formatter: ClientEventFormatter,
        relations: RelationsHandler | None = None,
    ) -> None:
        """``streams``: this process's streams (their positions make the
        token); ``event_writers()``: the events writers known now;
        ``sections``: the parts of the response that streams other than the
        built-in ones feed, by stream name; ``formatter``: serves the room
        events; ``relations``: adds the bundled
        aggregations to timeline events."""
        self._store = store
        self._clock = clock
        self._config = config
        self._limits = config.limits
        self._notifier = notifier
        self._typing = typing
        self._presence_handler = presence
        self._streams = streams
        self._waiters = waiters
        self._event_writers = event_writers
        self._position_log = position_log
        self._sections = sections
        self._formatter = formatter
        self._lazy_sent = LazyMembersSent()
        self._relations = relations
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
            name: self._streams[name].positions.sync_position() for name in self._token_streams
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
            if wanted > stream.positions.sync_position():
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
        return await self._receipts(user_id, room_ids, since, now)

    async def account_data_events(
        self, user_id: str, since: StreamToken | None, now: StreamToken
    ) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
        """Global and per-room account data that changed (all of it when
        ``since`` is None), as /sync has them."""
        return await self._account_data(user_id, since, now)

    async def presence_events(
        self, users: set[str], since: StreamToken | None, now: StreamToken, now_ms: int
    ) -> list[dict[str, Any]]:
        """Presence of ``users`` that changed in ``(since, now]`` (all of it
        when ``since`` is None), as /sync has it."""
        return await self._presence(users, since, now, now_ms, set())

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
        if upto <= self._to_device_deleted.get(key, 0):
            return
        await self._store.delete_messages_for_device(requester.user_id, requester.device_id, upto)
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
        """The response for (since, now], ``now`` and whether it is empty."""
        now = self._current_token(since)
        user_id = requester.user_id
        device_id = requester.device_id
        now_ms = self._clock.time_msec()
        # Reads that depend on nothing computed below start now and run beside
        # the others on the database threads: each is a round trip a woken
        # /sync would otherwise wait for in turn (issue 18's wake-up latency).
        early = _EarlyReads(
            ignored=get_ignored_users(self._store, user_id),
            one_time_keys=self._store.count_one_time_keys(user_id, device_id),
            fallback_types=self._store.get_unused_fallback_key_types(user_id, device_id),
        )
        try:
            return await self._compute_with(
                requester, since, full_state, sync_filter, now, now_ms, early
            )
        finally:
            early.settle()

    async def _compute_with(
        self,
        requester: Requester,
        since: StreamToken | None,
        full_state: bool,
        sync_filter: SyncFilter,
        now: StreamToken,
        now_ms: int,
        early: _EarlyReads,
    ) -> tuple[dict[str, Any], StreamToken, bool]:
        user_id = requester.user_id
        memberships = await self._memberships(user_id, since, now.room_key)
        joined = [r for r in memberships.rooms("join") if sync_filter.allows_room(r)]

        typing, typing_key = self._typing.get_typing_for_rooms(
            joined, None if since is None else since.get("typing")
        )
        now = now.with_positions(typing=typing_key)
        ephemeral: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for room_id, user_ids in typing.items():
            if since is not None or user_ids:
                ephemeral[room_id].append({"type": "m.typing", "content": {"user_ids": user_ids}})
        for room_id, receipt in (await self._receipts(user_id, joined, since, now)).items():
            ephemeral[room_id].append(receipt)
        _filter_room_events(ephemeral, sync_filter.ephemeral)

        global_data, room_data = await self._account_data(user_id, since, now)
        global_data = [d for d in global_data if sync_filter.account_data.matches(d["type"], "")]
        _filter_room_events(room_data, sync_filter.room_account_data)
        ignored = await early.ignored
        join = await self._joined_rooms(
            requester, joined, memberships, since, now, full_state, sync_filter, now_ms, ignored
        )
        for room_id in joined:
            if ephemeral.get(room_id) or room_data.get(room_id):
                entry = join.setdefault(room_id, self._empty_joined_room(now))
                entry["ephemeral"]["events"] = ephemeral.get(room_id, [])
                entry["account_data"]["events"] = room_data.get(room_id, [])
        counts = await self._store.get_unread_counts(
            user_id, sorted(join), now.room_key.get_max_position()
        )
        for room_id, entry in join.items():
            notifications, highlights = counts.get(room_id, (0, 0))
            entry["unread_notifications"] = {
                "notification_count": notifications,
                "highlight_count": highlights,
            }
        for entry in join.values():
            if isinstance(entry["timeline"].get("prev_batch"), RoomStreamToken):
                entry["timeline"]["prev_batch"] = await self._store.room_token_to_string(
                    entry["timeline"]["prev_batch"]
                )
        invite: dict[str, Any] = {}
        knock: dict[str, Any] = {}
        for membership, section in (("invite", invite), ("knock", knock)):
            rooms = await self._invited_rooms(memberships, since, ignored, membership)
            section.update((r, e) for r, e in rooms.items() if sync_filter.allows_room(r))
        leave = await self._left_rooms(
            requester, memberships, since, full_state, sync_filter, now_ms, ignored
        )
        for room_id, entry in leave.items():
            # A left room carries the user's account data for it (the spec's
            # LeftRoom), as changed since the token (all of it in full).
            entry["account_data"]["events"] = room_data.get(room_id, [])

        to_device, to_device_key = await self._to_device(requester, since, now)
        now = now.with_positions(to_device=to_device_key)
        sharing = await self._users_sharing_rooms(user_id, memberships.rooms("join"))
        newly_seen = await self._newly_seen_users(user_id, memberships, since, join)
        presence = [
            event
            for event in await self._presence(sharing, since, now, now_ms, newly_seen)
            if sync_filter.presence.allows(event)
        ]
        changed_devices, left_devices = await self._device_lists(
            user_id, memberships, joined, sharing, since, now
        )
        one_time_keys = await early.one_time_keys
        fallback_types = await early.fallback_types

        extra = await self._sections_of(user_id, since, now)
        response: dict[str, Any] = {
            "rooms": {"join": join, "invite": invite, "leave": leave, "knock": knock},
            "account_data": {"events": global_data},
            "to_device": {"events": to_device},
            "presence": {"events": presence},
            "device_lists": {"changed": changed_devices, "left": left_devices},
            # signed_curve25519 always: clients read a missing count as "unknown".
            "device_one_time_keys_count": {"signed_curve25519": 0, **one_time_keys},
            "device_unused_fallback_key_types": fallback_types,
        }
        response.update(extra)
        empty = not (
            join
            or invite
            or knock
            or leave
            or global_data
            or to_device
            or presence
            or changed_devices
            or left_devices
            or extra
        )
        return response, now, empty

    async def _device_lists(
        self,
        user_id: str,
        memberships: _Memberships,
        joined: list[str],
        sharing: set[str],
        since: StreamToken | None,
        now: StreamToken,
    ) -> tuple[list[str], list[str]]:
        """``device_lists``: who of the users sharing a room with ``user_id``
        changed devices or keys in (since, now], or began sharing one (their
        keys are new to the client); who no longer shares any room."""
        if since is None:
            return [], []
        changed: set[str] = set()
        left: set[str] = set()
        if since.get("device_lists") < now.get("device_lists"):
            changed = await self._store.get_users_whose_devices_changed(
                since.get("device_lists"), now.get("device_lists"), user_id
            )
            changed &= sharing
        if since.room_key != now.room_key:
            for room_id in memberships.changed:
                was_joined = memberships.at_since.get(room_id) == "join"
                if room_id in joined and not was_joined:
                    changed |= await self._store.get_users_in_room(room_id)
                elif was_joined and room_id not in joined:
                    left |= await self._store.get_users_in_room(room_id)
            others = await self._store.get_membership_changes_in_rooms(
                joined, since.room_key, now.room_key
            )
            for other, membership in others:
                if other == user_id:
                    continue
                if membership == "join":
                    changed.add(other)
                else:
                    left.add(other)
        left -= sharing
        changed &= sharing
        return sorted(changed), sorted(left)

    async def device_list_changes(
        self, user_id: str, from_string: str, to_string: str
    ) -> tuple[list[str], list[str]]:
        """``GET /keys/changes``: ``device_lists`` between two /sync tokens,
        for the rooms ``user_id`` is in now."""
        since = await self._parse_since(from_string)
        upto = await self._parse_since(to_string)
        memberships = await self._memberships(user_id, since, upto.room_key)
        joined = memberships.rooms("join")
        sharing = await self._users_sharing_rooms(user_id, joined)
        return await self._device_lists(user_id, memberships, joined, sharing, since, upto)

    async def _sections_of(
        self, user_id: str, since: StreamToken | None, now: StreamToken
    ) -> dict[str, Any]:
        """The parts that streams beyond the built-in ones feed."""
        parts: dict[str, Any] = {}
        for name, section in self._sections.items():
            if since is not None and since.get(name) >= now.get(name):
                continue
            value = await section.changes(
                user_id, None if since is None else since.get(name), now.get(name)
            )
            if value:
                parts[section.key] = value
        return parts

    @staticmethod
    def _empty_joined_room(now: StreamToken) -> dict[str, Any]:
        return {
            "timeline": {"events": [], "limited": False, "prev_batch": now.room_key},
            "state": {"events": []},
            "ephemeral": {"events": []},
            "account_data": {"events": []},
            "unread_notifications": {},
            "summary": {},
        }

    async def _memberships(
        self, user_id: str, since: StreamToken | None, now: RoomStreamToken
    ) -> _Memberships:
        current: dict[str, MembershipRow] = {}
        for row in await self._store.get_local_memberships_with_positions(user_id):
            room_id, _, _, position, instance = row
            if now.contains(instance, position):
                current[room_id] = row
            else:
                # Changed after our token: what it was as of the token.
                at_now = await self._store.get_membership_at(user_id, room_id, now)
                if at_now is not None:
                    current[room_id] = at_now
        changed: set[str] = set()
        at_since: dict[str, str | None] = {}
        if (
            since is not None
            and since.room_key != now
            and self._store.membership_changes.may_have_changed(user_id, since.room_key)
        ):
            for row in await self._store.get_membership_changes_between(
                user_id, since.room_key, now
            ):
                changed.add(row[0])
            for room_id in changed:
                before = await self._store.get_membership_at(user_id, room_id, since.room_key)
                at_since[room_id] = before[1] if before else None
        return _Memberships(current, changed, at_since)

    async def _joined_rooms(
        self,
        requester: Requester,
        joined: list[str],
        memberships: _Memberships,
        since: StreamToken | None,
        now: StreamToken,
        full_state: bool,
        sync_filter: SyncFilter,
        now_ms: int,
        ignored: frozenset[str],
    ) -> dict[str, dict[str, Any]]:
        limit = sync_filter.timeline_limit
        whole: list[str] = []
        incremental: list[str] = []
        for room_id in joined:
            newly_joined = room_id in memberships.changed and (
                memberships.at_since.get(room_id) != "join"
            )
            if since is None or full_state or newly_joined:
                whole.append(room_id)
            else:
                incremental.append(room_id)

        result: dict[str, dict[str, Any]] = {}
        for room_id in whole:
            events = await self._timeline_events(
                room_id, None, now.room_key, sync_filter.timeline, limit
            )
            entry = await self._room_entry(
                requester, room_id, events, None, now.room_key, sync_filter, now_ms, ignored
            )
            assert entry is not None  # a whole room is always there
            shown = events[:limit]
            if since is not None and not (shown and shown[-1].type == "m.room.create"):
                # Joined since the token: the client has none of the room's
                # history, so a timeline not reaching back to its start is a gap.
                entry["timeline"]["limited"] = True
            result[room_id] = entry
        if since is not None:
            # Only rooms that may have events after the token need a query.
            room_changes = self._store.room_changes
            incremental = [
                r for r in incremental if room_changes.may_have_changed(r, since.room_key)
            ]
        if incremental and since is not None and since.room_key != now.room_key:
            if sync_filter.timeline.allows_all:
                by_room = await self._events_by_room(
                    incremental, since.room_key, now.room_key, limit
                )
            else:
                by_room = {}
                for room_id in incremental:
                    by_room[room_id] = await self._timeline_events(
                        room_id, since.room_key, now.room_key, sync_filter.timeline, limit
                    )
            for room_id, events in by_room.items():
                entry = await self._room_entry(
                    requester,
                    room_id,
                    events,
                    since.room_key,
                    now.room_key,
                    sync_filter,
                    now_ms,
                    ignored,
                )
                if entry is None:
                    continue
                if entry["timeline"]["events"] or entry["state"]["events"] or _is_limited(entry):
                    result[room_id] = entry
        if self._relations is not None and not sync_filter.event_format.federation:
            # One pass over every room's timeline: the user is joined to each,
            # and the timelines are already what they may see. Events that
            # ``event_fields`` cut down to no ``event_id`` get no bundle: the
            # client asked for fields that leave it nothing to relate them by.
            # Federation's ``unsigned`` holds no bundles.
            await self._relations.add_bundles_to(
                [
                    e
                    for entry in result.values()
                    for e in entry["timeline"]["events"]
                    if "event_id" in e
                ],
                requester.user_id,
            )
        return result

    async def _timeline_events(
        self,
        room_id: str,
        since: RoomStreamToken | None,
        upper: RoomStreamToken,
        event_filter: EventFilter,
        limit: int,
        keep: Callable[[Event], bool] | None = None,
    ) -> list[Event]:
        """Up to ``limit + 1`` newest events of the room in (since, upper]
        that pass ``event_filter`` (and ``keep``), newest first: read in
        pages, so a filter that matches few events still fills the
        timeline."""
        if event_filter.allows_all and keep is None:
            return await self._store.get_room_events_between([room_id], since, upper, limit + 1)
        page = max(2 * (limit + 1), TIMELINE_PAGE)
        found: list[Event] = []
        while True:
            events = await self._store.get_room_events_between([room_id], since, upper, page)
            found.extend(
                e
                for e in events
                if event_filter.matches(e.type, e.sender, e.room_id, e.content)
                and (keep is None or keep(e))
            )
            if len(found) > limit or len(events) < page:
                return found[: limit + 1]
            upper = _before(events[-1])

    async def _events_by_room(
        self, room_ids: list[str], since: RoomStreamToken, now: RoomStreamToken, limit: int
    ) -> dict[str, list[Event]]:
        """Up to ``limit + 1`` newest events of each room in (since, now]: one
        query for all rooms, or one per room when one room has a backlog."""
        batch_limit = (limit + 1) * len(room_ids)
        events = await self._store.get_room_events_between(room_ids, since, now, batch_limit)
        if len(events) >= batch_limit and len(room_ids) > 1:
            return {
                room_id: found
                for room_id in room_ids
                if (
                    found := await self._store.get_room_events_between(
                        [room_id], since, now, limit + 1
                    )
                )
            }
        by_room: dict[str, list[Event]] = defaultdict(list)
        for event in events:
            by_room[event.room_id].append(event)
        return by_room

    async def _room_entry(
        self,
        requester: Requester,
        room_id: str,
        newest_first: list[Event],
        since: RoomStreamToken | None,
        upper: RoomStreamToken,
        sync_filter: SyncFilter,
        now_ms: int,
        ignored: frozenset[str],
    ) -> dict[str, Any] | None:
        """One room's timeline (``newest_first`` holds up to ``limit + 1``
        events, already through the timeline filter) and state block, up to
        ``upper`` (now, or where the user left); ``since`` None: the room in
        full. ``prev_batch`` is left as a token for the caller to print.
        ``ignored`` users' messages are left out; None for an incremental
        entry whose every new event is an ignored user's message (the room
        is left out)."""
        limit = sync_filter.timeline_limit
        if not await member_sees_everything(self._store, requester.user_id, room_id):
            # History open to members shows a member all of it; otherwise the
            # limit counts the events the user may see, read until it is reached.
            visibility = await load_room_visibility(self._store, requester.user_id, room_id)
            if not all(visibility.can_see(e) for e in newest_first):
                # The room's state as of ``upper`` is a member's to see (they
                # are in the room, or see it as they left it): a state event
                # that is part of it stays in the timeline even where history
                # visibility hides its neighbours. Not for someone who was
                # only ever invited (a rejected invite).
                current: set[str] = set()
                if any(m == "join" for _, m in visibility.history):
                    current = {e.event_id for e in await self._store.get_state_at(room_id, upper)}
                newest_first = await self._timeline_events(
                    room_id,
                    since,
                    upper,
                    sync_filter.timeline,
                    limit,
                    keep=lambda e: e.event_id in current or visibility.can_see(e),
                )
        limited = len(newest_first) > limit
        raw = list(reversed(newest_first[:limit]))
        timeline = without_ignored(raw, ignored)
        prev_batch = _before(raw[0]) if raw else (since or upper)
        if since is None and not limited:
            # The whole of the room's history that passes the filter is in
            # the timeline: there is nothing earlier to read. Paging back from
            # the timeline's end then gives the client its events again (as
            # the reference server does, and SyTest expects), not nothing.
            prev_batch = upper
        complete = not limited and sync_filter.timeline.allows_all
        state = await self._state_block(
            requester, room_id, since, upper, raw, sync_filter, complete
        )
        if (
            since is not None
            and raw
            and not timeline
            and not state
            and any(is_hidden(e, ignored) for e in raw)
        ):
            return None
        event_format = sync_filter.event_format
        events = await self._formatter.format(
            requester, timeline, now_ms, include_room_id=False, event_format=event_format
        )
        state = await self._formatter.as_seen_by(requester.user_id, state)
        state_events = await self._formatter.render(
            state, now_ms, event_format, include_room_id=False
        )
        summary: dict[str, Any] = {}
        if sync_filter.state.lazy_load_members and (
            since is None
            or any(e.type == "m.room.member" for e in timeline)
            or (limited and any(e.type == "m.room.member" for e in state))
        ):
            summary = await self._summary(requester.user_id, room_id, upper)
        return {
            "timeline": {"events": events, "limited": limited, "prev_batch": prev_batch},
            "state": {"events": state_events},
            "ephemeral": {"events": []},
            "account_data": {"events": []},
            "unread_notifications": {},
            "summary": summary,
        }

    async def _summary(self, user_id: str, room_id: str, upper: RoomStreamToken) -> dict[str, Any]:
        """The room summary (sent with lazy-loading members, when the client
        cannot count the members itself): member counts as of ``upper``,
        and when the room has neither name nor canonical alias, the heroes a
        client names it after: up to 5 other members (joined or invited, else
        former), by user id."""
        state = await self._store.get_state_at(room_id, upper)
        members = [
            (e.state_key, e.membership)
            for e in state
            if e.type == "m.room.member" and e.state_key is not None
        ]
        summary: dict[str, Any] = {
            "m.joined_member_count": sum(1 for _, m in members if m == "join"),
            "m.invited_member_count": sum(1 for _, m in members if m == "invite"),
        }
        named = any(
            (e.type == "m.room.name" and e.content.get("name"))
            or (e.type == "m.room.canonical_alias" and e.content.get("alias"))
            for e in state
            if e.state_key == ""
        )
        if not named:
            others = sorted(u for u, m in members if m in ("join", "invite") and u != user_id)
            if not others:
                others = sorted(u for u, m in members if m in ("leave", "ban") and u != user_id)
            summary["m.heroes"] = others[:HEROES]
        return summary

    async def _state_block(
        self,
        requester: Requester,
        room_id: str,
        since: RoomStreamToken | None,
        upper: RoomStreamToken,
        timeline: list[Event],
        sync_filter: SyncFilter,
        complete: bool,
    ) -> list[Event]:
        """The ``state`` of a room entry: the room's state at the start of the
        timeline (in full when ``since`` is None, else what changed since
        ``since``), through the state filter. A key whose latest change up
        to ``upper`` is not in the timeline (the timeline filter left it
        out) is given at that latest value: the client would not learn it
        otherwise. ``complete``: the timeline holds every event after
        ``since``. With ``lazy_load_members`` see ``_lazy_members``."""
        lazy = sync_filter.state.lazy_load_members
        in_timeline = {e.event_id for e in timeline}
        chosen: list[Event] = []
        if since is None or not complete:
            chosen = await self._state_changes(room_id, since, upper, timeline, in_timeline)
        if lazy:
            chosen = await self._lazy_members(
                requester, room_id, since, upper, timeline, in_timeline, chosen, sync_filter
            )
        chosen = [
            e for e in chosen if sync_filter.state.matches(e.type, e.sender, e.room_id, e.content)
        ]
        if lazy:
            self._lazy_sent.record(requester, room_id, chosen, reset=since is None)
        chosen.sort(key=lambda e: e.stream_ordering)
        return chosen

    async def _state_changes(
        self,
        room_id: str,
        since: RoomStreamToken | None,
        upper: RoomStreamToken,
        timeline: list[Event],
        in_timeline: set[str],
    ) -> list[Event]:
        """The state block before filtering (see ``_state_block``)."""
        start = timeline[0].stream_ordering if timeline else None
        if since is None:
            latest = {
                (e.type, e.state_key): e for e in await self._store.get_state_at(room_id, upper)
            }
            if not any(e.event_id in in_timeline for e in latest.values()):
                before = latest
            else:
                assert timeline
                before = {
                    (e.type, e.state_key): e
                    for e in await self._store.get_state_at(room_id, _before(timeline[0]))
                }
        else:
            latest, before = {}, {}
            for event in await self._store.get_state_events_between(room_id, since, upper):
                key = (event.type, event.state_key)
                latest[key] = event
                if start is None or event.stream_ordering < start:
                    before[key] = event
        chosen: list[Event] = []
        for key, event in latest.items():
            if event.event_id in in_timeline:
                earlier = before.get(key)
                if earlier is None or earlier.event_id in in_timeline:
                    continue
                event = earlier
            chosen.append(event)
        return chosen

    async def _lazy_members(
        self,
        requester: Requester,
        room_id: str,
        since: RoomStreamToken | None,
        upper: RoomStreamToken,
        timeline: list[Event],
        in_timeline: set[str],
        chosen: list[Event],
        sync_filter: SyncFilter,
    ) -> list[Event]:
        """Lazy-loading members: the member events the client needs to show
        the timeline, and no others. In full: only the members of the
        timeline's senders and the user's own. Incrementally: the member
        changes since ``since`` (those are news: a gap's joins and leaves
        too, which the spec allows as redundant members and clients rely
        on to keep their member lists) plus the members of the timeline's
        senders this device was not sent yet (all of them, but the user's
        own, with ``include_redundant_members``)."""
        senders = {e.sender for e in timeline}
        if since is None:
            senders.add(requester.user_id)
            return [e for e in chosen if e.type != "m.room.member" or e.state_key in senders]
        have = {e.state_key for e in chosen if e.type == "m.room.member"}
        redundant = sync_filter.state.include_redundant_members
        wanted = {
            user
            for user in senders - have
            if not self._lazy_sent.was_sent(requester, room_id, user)
            or (redundant and user != requester.user_id)
        }
        if not wanted:
            return chosen
        at = _before(timeline[0]) if timeline else upper
        extra = [
            e
            for e in await self._store.get_state_at(room_id, at)
            if e.type == "m.room.member" and e.state_key in wanted and e.event_id not in in_timeline
        ]
        return chosen + extra

    async def _invited_rooms(
        self,
        memberships: _Memberships,
        since: StreamToken | None,
        ignored: frozenset[str],
        membership: str = "invite",
    ) -> dict[str, Any]:
        """Rooms the user is invited to (``membership`` invite: the
        ``invite`` section, but for invites from users ignored) or knocking
        on (knock: the ``knock`` section), new since ``since`` (all when
        None), each with its stripped state and the membership event."""
        section = "invite_state" if membership == "invite" else "knock_state"
        rooms: dict[str, Any] = {}
        for room_id in memberships.rooms(membership):
            if since is not None and (
                room_id not in memberships.changed
                or memberships.at_since.get(room_id) == membership
            ):
                continue
            state_ids = await self._store.get_current_state_ids(room_id)
            wanted = [state_ids[(t, "")] for t in INVITE_STATE_TYPES if (t, "") in state_ids]
            member_id = memberships.now[room_id][2]
            wanted.append(member_id)
            events = await self._store.get_events(wanted)
            member_event = events.get(member_id)
            if member_event is not None and member_event.sender in ignored:
                continue
            rooms[room_id] = {
                section: {
                    "events": [
                        {
                            "type": e.type,
                            "state_key": e.state_key,
                            "sender": e.sender,
                            "content": e.content,
                        }
                        for e in events.values()
                    ]
                }
            }
        return rooms

    async def _left_rooms(
        self,
        requester: Requester,
        memberships: _Memberships,
        since: StreamToken | None,
        full_state: bool,
        sync_filter: SyncFilter,
        now_ms: int,
        ignored: frozenset[str],
    ) -> dict[str, Any]:
        """Rooms the user left or was banned from: in an incremental sync
        those left since ``since``; in a full one (initial, or
        ``full_state``) every such room if the filter's ``include_leave``
        asks. Each with its timeline and state up to the leave; a room the
        user was not joined to at ``since`` comes in full."""
        leave: dict[str, Any] = {}
        limit = sync_filter.timeline_limit
        for room_id in sorted(memberships.now):
            row = memberships.now[room_id]
            if row[1] not in ("leave", "ban") or not sync_filter.allows_room(room_id):
                continue
            newly_left = (
                since is not None
                and room_id in memberships.changed
                and memberships.at_since.get(room_id) not in ("leave", "ban")
            )
            if not newly_left and not (sync_filter.include_leave and (since is None or full_state)):
                continue
            room_since = None
            if newly_left and not full_state and memberships.at_since.get(room_id) == "join":
                assert since is not None
                room_since = since.room_key
            until = RoomStreamToken(row[3])  # up to and including their leave
            events = await self._timeline_events(
                room_id, room_since, until, sync_filter.timeline, limit
            )
            entry = await self._room_entry(
                requester, room_id, events, room_since, until, sync_filter, now_ms, ignored
            )
            if entry is None:
                continue
            del entry["ephemeral"], entry["unread_notifications"], entry["summary"]
            entry["timeline"]["prev_batch"] = await self._store.room_token_to_string(
                entry["timeline"]["prev_batch"]
            )
            leave[room_id] = entry
        return leave

    async def _receipts(
        self, user_id: str, joined: list[str], since: StreamToken | None, now: StreamToken
    ) -> dict[str, dict[str, Any]]:
        if not joined or (since is not None and since.get("receipts") >= now.get("receipts")):
            return {}
        rows = await self._store.get_receipts_for_rooms(
            joined, None if since is None else since.get("receipts"), now.get("receipts")
        )
        contents: dict[str, dict[str, Any]] = {}
        for room_id, receipt_type, receipt_user, event_id, data in rows:
            if receipt_type == "m.read.private" and receipt_user != user_id:
                continue
            content = contents.setdefault(room_id, {})
            content.setdefault(event_id, {}).setdefault(receipt_type, {})[receipt_user] = data
        return {r: {"type": "m.receipt", "content": c} for r, c in contents.items()}

    async def _account_data(
        self, user_id: str, since: StreamToken | None, now: StreamToken
    ) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
        """Global and per-room account data that changed (all of it, initially),
        with the user's push rules as ``m.push_rules`` when they changed."""
        push_rules = await self._push_rules_data(user_id, since, now)
        if since is not None and since.get("account_data") >= now.get("account_data"):
            return push_rules, {}
        changed_global: set[str] | None = None
        changed_rooms: set[tuple[str, str]] | None = None
        if since is not None:
            changes = await self._store.get_account_data_changes(
                user_id, since.get("account_data"), now.get("account_data")
            )
            if not changes:
                return push_rules, {}
            changed_global = {t for _, r, t in changes if r is None}
            changed_rooms = {(r, t) for _, r, t in changes if r is not None}
        global_data = push_rules + [
            {"type": t, "content": c}
            for t, c in (await self._store.get_global_account_data(user_id)).items()
            if changed_global is None or t in changed_global
        ]
        room_data: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for room_id, types in (await self._store.get_room_account_data(user_id)).items():
            for data_type, content in types.items():
                if changed_rooms is None or (room_id, data_type) in changed_rooms:
                    room_data[room_id].append({"type": data_type, "content": content})
        if changed_rooms is None or any(t == TAG_DATA_TYPE for _, t in changed_rooms):
            all_tags = await self._store.get_tags_for_user(user_id)
            if changed_rooms is not None:
                # A room whose last tag was deleted has no rows left: it is
                # sent with no tags, so clients drop the deleted one.
                for room_id, data_type in changed_rooms:
                    if data_type == TAG_DATA_TYPE:
                        all_tags.setdefault(room_id, {})
            for room_id, tags in all_tags.items():
                if changed_rooms is None or (room_id, TAG_DATA_TYPE) in changed_rooms:
                    room_data[room_id].append({"type": TAG_DATA_TYPE, "content": {"tags": tags}})
        return global_data, room_data

    async def _push_rules_data(
        self, user_id: str, since: StreamToken | None, now: StreamToken
    ) -> list[dict[str, Any]]:
        """``m.push_rules`` (the spec's ``{"global": ruleset}``) initially and
        when the push_rules stream changed the user's rules."""
        if since is not None:
            if since.get("push_rules") >= now.get("push_rules"):
                return []
            if not await self._store.push_rules_changed(
                user_id, since.get("push_rules"), now.get("push_rules")
            ):
                return []
        doc = await self._store.get_push_rules_doc(user_id)
        return [{"type": "m.push_rules", "content": {"global": doc.ruleset(user_id)}}]

    async def _to_device(
        self, requester: Requester, since: StreamToken | None, now: StreamToken
    ) -> tuple[list[dict[str, Any]], int]:
        from_key = 0 if since is None else since.get("to_device")
        if since is not None and from_key >= now.get("to_device"):
            return [], now.get("to_device")
        messages, upto = await self._store.get_messages_for_device(
            requester.user_id, requester.device_id, from_key, now.get("to_device"), TO_DEVICE_LIMIT
        )
        return messages, upto

    async def _users_sharing_rooms(self, user_id: str, joined: list[str]) -> set[str]:
        users = {user_id}
        for room_id in joined:
            users |= await self._store.get_users_in_room(room_id)
        return users

    async def _newly_seen_users(
        self,
        user_id: str,
        memberships: _Memberships,
        since: StreamToken | None,
        join: dict[str, dict[str, Any]],
    ) -> set[str]:
        """Users an incremental sync introduces: the members of rooms the user
        joined since ``since``, and whoever joins a room in this response.
        Their presence comes with it, changed or not: the client has none."""
        if since is None:
            return set()
        users: set[str] = set()
        for room_id in memberships.changed:
            if room_id in join and memberships.at_since.get(room_id) != "join":
                users |= await self._store.get_users_in_room(room_id)
        for entry in join.values():
            for event in entry["timeline"]["events"] + entry["state"]["events"]:
                if event.get("type") == "m.room.member" and (
                    event.get("content", {}).get("membership") == "join"
                ):
                    users.add(str(event.get("state_key")))
        users.discard(user_id)
        return users

    async def _presence(
        self,
        users: set[str],
        since: StreamToken | None,
        now: StreamToken,
        now_ms: int,
        newly_seen: set[str],
    ) -> list[dict[str, Any]]:
        """Presence of ``users`` that changed since ``since`` (all of it,
        initially), plus the current presence of ``newly_seen``."""
        if since is None:
            states = list((await self._store.get_presence_for_users(sorted(users))).values())
        else:
            states = []
            if since.get("presence") < now.get("presence"):
                states = await self._store.get_presence_changes(
                    sorted(users), since.get("presence"), now.get("presence")
                )
            missing = newly_seen & users - {s.user_id for s in states}
            if missing:
                found = await self._store.get_presence_for_users(sorted(missing))
                states.extend(found.get(u) or UserPresenceState.default(u) for u in sorted(missing))
        return [
            {"type": "m.presence", "sender": s.user_id, "content": s.to_client_content(now_ms)}
            for s in states
        ]
