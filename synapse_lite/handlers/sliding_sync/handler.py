"""Answers sliding sync requests (MSC4186): the connection's saved state in,
the rooms the lists and subscriptions select that are new or changed for
the connection out, with the extensions, and the new state saved under a new
``pos``. Tokens, catching up with a token from another process and waiting
for news are the /sync handler's and the notifier's, as for /sync."""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import attr
from twisted.internet import defer

from synapse_lite.api.errors import LimitExceededError, SynapseError
from synapse_lite.events import Event
from synapse_lite.handlers.filtering import SyncFilter
from synapse_lite.handlers.ignored_users import (
    IgnoredUsersStore,
    get_ignored_users,
    without_ignored,
)
from synapse_lite.handlers.sliding_sync.body import (
    ExtensionConfig,
    ListFilters,
    RoomConfig,
    SlidingSyncBody,
)
from synapse_lite.handlers.sliding_sync.connection import (
    ConnectionState,
    RoomSent,
    state_matches,
    wanted_state_keys,
)
from synapse_lite.handlers.sync_sections.account_data import AccountDataSection
from synapse_lite.handlers.sync_sections.builtin import BuiltInSectionsStore
from synapse_lite.handlers.sync_sections.device_lists import DeviceListsSection
from synapse_lite.handlers.sync_sections.e2e_keys import E2EKeysSection
from synapse_lite.handlers.sync_sections.ephemeral import EphemeralSection
from synapse_lite.handlers.sync_sections.request import (
    Memberships,
    MembershipStore,
    SyncRequest,
    SyncResponse,
    load_memberships,
    users_sharing_rooms,
)
from synapse_lite.handlers.sync_sections.rooms import INVITE_STATE_TYPES
from synapse_lite.handlers.sync_sections.to_device import ToDeviceSection
from synapse_lite.handlers.visibility import load_room_visibility, member_sees_everything
from synapse_lite.storage.databases.main.sliding_sync import SavedPosition
from synapse_lite.tokens import RoomStreamToken, StreamToken

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.config.homeserver import HomeServerConfig
    from synapse_lite.handlers.auth import Requester
    from synapse_lite.handlers.client_events import ClientEventFormatter
    from synapse_lite.handlers.presence import PresenceHandlerBase
    from synapse_lite.handlers.relations import RelationsHandler
    from synapse_lite.handlers.sync import SyncHandler
    from synapse_lite.handlers.typing import TypingHandlerBase
    from synapse_lite.notifier import Notifier
    from synapse_lite.storage.change_tracker import StreamChangeTracker

logger = logging.getLogger(__name__)

T = TypeVar("T")

UNKNOWN_POS = "M_UNKNOWN_POS"
#: A connection unused for this long is forgotten (its pos is then unknown).
POS_LIFETIME_MS = 7 * 24 * 3600 * 1000
#: Members named as heroes of a room without a name.
HEROES = 5
#: Rooms whose entries are read side by side.
CONCURRENT_ROOMS = 32
#: State that, when it changes, changes a room's name, avatar or heroes.
SUMMARY_TYPES = ("m.room.name", "m.room.avatar", "m.room.member")


class SlidingSyncStore(BuiltInSectionsStore, MembershipStore, IgnoredUsersStore, Protocol):
    """The store reads and writes of sliding sync."""

    async def get_sliding_sync_position(self, pos: str) -> SavedPosition | None: ...

    async def save_sliding_sync_position(
        self,
        pos: str,
        user_id: str,
        device_id: str,
        conn_id: str,
        stream_token: str,
        state: str,
        now_ms: int,
        used_pos: str | None,
        expire_before_ms: int | None = None,
    ) -> None: ...

    async def get_room_events_between_per_room(
        self,
        room_ids: list[str],
        from_token: RoomStreamToken | None,
        to_token: RoomStreamToken,
        limit: int,
    ) -> dict[str, list[Event]]: ...

    async def get_room_activity(
        self, room_ids: Sequence[str], upto: RoomStreamToken
    ) -> dict[str, tuple[int, int]]: ...

    async def get_room_kinds(
        self, room_ids: Sequence[str]
    ) -> dict[str, tuple[str | None, bool]]: ...

    async def get_member_counts(self, room_ids: Sequence[str]) -> dict[str, tuple[int, int]]: ...

    async def get_state_deletions_between(
        self, room_id: str, from_token: RoomStreamToken, to_token: RoomStreamToken
    ) -> set[tuple[str, str]]: ...

    async def get_state_at(self, room_id: str, token: RoomStreamToken) -> list[Event]: ...

    async def get_rooms_for_user(self, user_id: str) -> frozenset[str]: ...

    async def parse_room_token(self, string: str) -> RoomStreamToken: ...

    async def delete_messages_for_device(
        self, user_id: str, device_id: str, up_to_id: int
    ) -> int: ...


def unknown_pos(why: str) -> SynapseError:
    return SynapseError(
        400, f"Unknown pos ({why}): start the connection again without one", UNKNOWN_POS
    )


@attr.s(slots=True, auto_attribs=True)
class Computed:
    """One computation of a response: the body, the token and connection
    state to save with its pos, and whether it holds news."""

    body: dict[str, Any]
    now: StreamToken
    state: ConnectionState
    news: bool


@attr.s(slots=True, frozen=True, auto_attribs=True)
class TimelineRead:
    """A read of rooms' timelines: each room's newest ``limit`` events
    after ``lower`` (from the start: None) up to ``upper``."""

    lower: RoomStreamToken | None
    upper: RoomStreamToken
    limit: int


@attr.s(slots=True, auto_attribs=True)
class Selection:
    """The rooms the lists and subscriptions select, with their configs."""

    configs: dict[str, RoomConfig] = attr.Factory(dict)
    lists: dict[str, list[str]] = attr.Factory(dict)
    list_rooms: dict[str, list[str]] = attr.Factory(dict)
    counts: dict[str, int] = attr.Factory(dict)
    subscribed: list[str] = attr.Factory(list)
    #: Joined room -> (latest event's position, bump stamp).
    activity: dict[str, tuple[int, int]] = attr.Factory(dict)

    def add(self, room_id: str, config: RoomConfig) -> None:
        known = self.configs.get(room_id)
        self.configs[room_id] = config if known is None else known.combined(config)


class PerRoomCache(Generic[T]):
    """Facts about rooms (their type, their latest activity) read up to a
    room token, kept until the room may have had events after it (the
    room-changes tracker says so, conservatively). Per process, bounded."""

    MAX_ROOMS = 200_000

    def __init__(self, default: T) -> None:
        """``default``: the fact of a room the read does not return."""
        self._default = default
        self._entries: dict[str, tuple[T, RoomStreamToken]] = {}

    async def get(
        self,
        rooms: Sequence[str],
        now: RoomStreamToken,
        changes: StreamChangeTracker,
        read: Callable[[list[str]], Awaitable[Mapping[str, T]]],
    ) -> dict[str, T]:
        """The facts of ``rooms`` as of ``now``: cached, or read (``read``)
        for the rooms not cached or changed since."""
        entries = self._entries
        cached = {r: e for r in rooms if (e := entries.get(r)) is not None}
        changed = changes.changed_among({r: e[1] for r, e in cached.items()})
        result: dict[str, T] = {}
        stale: list[str] = []
        for room_id in rooms:
            entry = cached.get(room_id)
            if entry is None or room_id in changed:
                stale.append(room_id)
            else:
                result[room_id] = entry[0]
        if stale:
            found = await read(stale)
            if len(self._entries) + len(stale) > self.MAX_ROOMS:
                self._entries.clear()
            for room_id in stale:
                result[room_id] = found.get(room_id, self._default)
                self._entries[room_id] = (result[room_id], now)
        return result


async def _together(*reads: Coroutine[Any, Any, Any]) -> list[Any]:
    """The results of ``reads``, run side by side (each is a round trip to
    the database: one hop's wait instead of one after another); the first
    failure is raised as itself, the others' are consumed."""
    started = [defer.ensureDeferred(r) for r in reads]
    try:
        return [await read for read in started]
    finally:
        for read in started:
            read.addErrback(lambda _: None)


def _before(event: Event) -> RoomStreamToken:
    return RoomStreamToken(event.stream_ordering - 1)


def _stripped(events: Iterable[Event]) -> list[dict[str, Any]]:
    return [
        {"type": e.type, "state_key": e.state_key, "sender": e.sender, "content": e.content}
        for e in events
    ]


class SlidingSyncHandler:
    """``POST /_matrix/client/unstable/org.matrix.simplified_msc3575/sync``."""

    def __init__(
        self,
        *,
        store: SlidingSyncStore,
        clock: Clock,
        config: HomeServerConfig,
        sync: SyncHandler,
        notifier: Notifier,
        presence: PresenceHandlerBase,
        typing: TypingHandlerBase,
        formatter: ClientEventFormatter,
        relations: RelationsHandler | None,
    ) -> None:
        """``relations``: adds the bundled aggregations to timeline events."""
        self._store = store
        self._relations = relations
        self._clock = clock
        self._limits = config.limits
        self._sync = sync
        self._notifier = notifier
        self._presence = presence
        self._formatter = formatter
        self._to_device = ToDeviceSection(store)
        self._e2e_keys = E2EKeysSection(store)
        self._device_lists = DeviceListsSection(store)
        self._account_data = AccountDataSection(store)
        self._ephemeral = EphemeralSection(store, typing)
        #: room -> (type, encrypted, room token read at): the type never
        #: changes, encryption is read again once the room's state may have.
        self._kinds: PerRoomCache[tuple[str | None, bool]] = PerRoomCache((None, False))
        #: Joined room -> (latest event's position, bump stamp): read again
        #: only for the rooms with events since (an incremental response
        #: then reads the few rooms that changed, not all the user's).
        self._activity: PerRoomCache[tuple[int, int]] = PerRoomCache((0, 0))
        #: user -> their requests open here (capped: ``limits.max_concurrent_syncs_per_user``).
        self._open: dict[str, int] = {}
        #: (user, device, conn_id) -> the marker of the connection's newest
        #: request here: an older one still waiting gives way to it.
        self._newest: dict[tuple[str, str, str], object] = {}

    async def sync(self, requester: Requester, body: SlidingSyncBody) -> dict[str, Any]:
        """Answer one request; raises 400 ``M_UNKNOWN_POS`` for a ``pos``
        that is not this connection's (or expired), 429 ``M_LIMIT_EXCEEDED``
        when the user already has ``limits.max_concurrent_syncs_per_user``
        sliding sync requests open on this process.

        A request of a connection that arrives while an older one of the
        same connection waits here ends the older one at once: it answers
        with the ``pos`` it was given and nothing new (a client that gave up
        on a long-poll, as clients do when their lists change, does not
        hold a slot until its timeout)."""
        user_id = requester.user_id
        connection = (user_id, requester.device_id or "", body.conn_id)
        # A request taking over from an older one of its connection takes
        # its slot too (the older ends at once).
        older_open = connection in self._newest
        if (
            not older_open
            and self._open.get(user_id, 0) >= self._limits.max_concurrent_syncs_per_user
        ):
            raise LimitExceededError(1000)
        self._open[user_id] = self._open.get(user_id, 0) + 1
        marker = object()
        self._newest[connection] = marker
        if older_open:
            self._notifier.notify(users=[user_id])
        try:
            # The pos first: a refused request changes nothing (presence included).
            since, saved_state = await self._load(requester, body)

            def superseded() -> bool:
                return self._newest.get(connection) is not marker

            await self._presence.apply_sync_presence(user_id, body.set_presence)
            if body.set_presence == "offline":
                return await self._answer(requester, body, since, saved_state, superseded)
            async with self._presence.user_syncing(user_id, requester.device_id):
                return await self._answer(requester, body, since, saved_state, superseded)
        finally:
            if self._newest.get(connection) is marker:
                del self._newest[connection]
            self._open[user_id] -= 1
            if self._open[user_id] <= 0:
                del self._open[user_id]

    async def _load(
        self, requester: Requester, body: SlidingSyncBody
    ) -> tuple[StreamToken | None, str | None]:
        if body.pos is None:
            return None, None
        saved = await self._store.get_sliding_sync_position(body.pos)
        device_id = requester.device_id or ""
        if saved is None:
            raise unknown_pos("not known, or replaced by a newer one")
        if (saved.user_id, saved.device_id, saved.conn_id) != (
            requester.user_id,
            device_id,
            body.conn_id,
        ):
            raise unknown_pos("not this device's connection")
        if saved.created_ts < self._clock.time_msec() - POS_LIFETIME_MS:
            raise unknown_pos("expired")
        try:
            since = await self._sync.parse_stream_token(saved.stream_token)
            ConnectionState.from_json(saved.state)
        except (SynapseError, ValueError, KeyError, TypeError, IndexError):
            logger.warning("Sliding sync pos %s has an unreadable row", body.pos)
            raise unknown_pos("unreadable") from None
        return since, saved.state

    async def _answer(
        self,
        requester: Requester,
        body: SlidingSyncBody,
        since: StreamToken | None,
        saved_state: str | None,
        superseded: Callable[[], bool],
    ) -> dict[str, Any]:
        timeout_ms = min(body.timeout_ms, self._limits.max_sync_timeout_ms)
        if since is None or timeout_ms <= 0:
            result = await self._compute(requester, body, since, saved_state)
        else:
            last: list[Computed] = []

            async def check() -> bool:
                if superseded():
                    return True
                last[:] = [await self._compute(requester, body, since, saved_state)]
                return last[0].news

            rooms = await self._store.get_rooms_for_user(requester.user_id)
            await self._notifier.wait_for_events(requester.user_id, rooms, timeout_ms, check)
            if superseded():
                # Saving a pos now could drop the newer request's: the
                # connection goes on from the pos this one was given.
                return {"pos": body.pos, "lists": {}, "rooms": {}, "extensions": {}}
            result = last[0]
        pos = secrets.token_urlsafe(12)
        now_ms = self._clock.time_msec()
        await self._store.save_sliding_sync_position(
            pos,
            requester.user_id,
            requester.device_id or "",
            body.conn_id,
            await self._sync.stream_token_string(result.now),
            result.state.to_json(),
            now_ms,
            body.pos,
            # A new connection: the user's connections unused too long go.
            expire_before_ms=now_ms - POS_LIFETIME_MS if body.pos is None else None,
        )
        return {"pos": pos, **result.body}

    # One response

    async def _compute(
        self,
        requester: Requester,
        body: SlidingSyncBody,
        since: StreamToken | None,
        saved_state: str | None,
    ) -> Computed:
        now = self._sync.current_stream_token(since)
        state = ConnectionState.from_json(saved_state) if saved_state else ConnectionState()
        user_id = requester.user_id
        memberships, ignored, dms = await _together(
            load_memberships(self._store, user_id, since, now.room_key),
            get_ignored_users(self._store, user_id),
            self._direct_rooms(user_id),
        )
        selection = await self._select(user_id, body, memberships, state, now, dms)
        rooms = await self._rooms(
            requester, selection, memberships, state, since, now, ignored, dms
        )
        news = bool(rooms)
        lists: dict[str, Any] = {}
        for name, count in selection.counts.items():
            lists[name] = {"count": count}
            news = news or state.list_counts.get(name) != count
        state.list_counts = dict(selection.counts)
        response = SyncResponse(now)
        extensions = await self._extensions(
            requester, body, selection, memberships, state, since, response, ignored
        )
        news = news or response.news
        result: dict[str, Any] = {"lists": lists, "rooms": rooms, "extensions": extensions}
        return Computed(result, response.now, state, news or since is None)

    # Which rooms

    async def _select(
        self,
        user_id: str,
        body: SlidingSyncBody,
        memberships: Memberships,
        state: ConnectionState,
        now: StreamToken,
        dms: set[str],
    ) -> Selection:
        rows = memberships.now
        gone = [r for r, row in rows.items() if row[1] in ("leave", "ban") and r not in state.rooms]
        # Rooms left are listed only once sent on this connection (the user
        # knows they left); those the user was kicked or banned from always.
        leaves = await self._store.get_events([rows[r][2] for r in gone]) if gone else {}
        kicked = {
            r for r in gone if (e := leaves.get(rows[r][2])) is not None and e.sender != user_id
        }
        candidates = [
            r
            for r, row in rows.items()
            if row[1] in ("join", "invite", "knock")
            or (row[1] in ("leave", "ban") and (r in state.rooms or r in kicked))
        ]
        joined = [r for r in candidates if rows[r][1] == "join"]

        async def no_facts() -> dict[str, Any]:
            return {}

        # The order and what the filters need, side by side.
        activity, facts = await _together(
            self._activity.get(
                joined,
                now.room_key,
                self._store.room_changes,
                lambda rooms: self._store.get_room_activity(rooms, now.room_key),
            ),
            self._facts(user_id, body, candidates, rows, now, dms) if body.lists else no_facts(),
        )
        stamps = {
            r: (rows[r][1] == "join" and activity.get(r, (0, 0))[0]) or int(rows[r][3])
            for r in candidates
        }
        ordered = sorted(candidates, key=lambda r: (-stamps[r], r))
        selection = Selection(activity=activity)
        if body.lists:
            for name, config in body.lists.items():
                matching = [r for r in ordered if self._passes(config.filters, r, rows, facts)]
                selection.counts[name] = len(matching)
                chosen: list[str] = []
                if config.ranges is None:
                    chosen = matching
                else:
                    seen: set[str] = set()
                    for start, end in config.ranges:
                        for room_id in matching[start : end + 1]:
                            if room_id not in seen:
                                seen.add(room_id)
                                chosen.append(room_id)
                selection.list_rooms[name] = chosen
                for room_id in chosen:
                    selection.add(room_id, config.config)
                    selection.lists.setdefault(room_id, []).append(name)
        for room_id, subscription in body.room_subscriptions.items():
            # Only rooms the user is or was in (or invited to, knocking on):
            # others are ignored, as the MSC says.
            if room_id in rows:
                selection.add(room_id, subscription)
                selection.subscribed.append(room_id)
        return selection

    async def _facts(
        self,
        user_id: str,
        body: SlidingSyncBody,
        rooms: list[str],
        rows: dict[str, Any],
        now: StreamToken,
        dms: set[str],
    ) -> dict[str, Any]:
        """What the lists' filters need, read only when a filter asks."""
        filters = [c.filters for c in body.lists.values()]
        facts: dict[str, Any] = {}
        if any(f.is_dm is not None for f in filters):
            facts["dm"] = dms
        if any(
            f.is_encrypted is not None or f.room_types is not None or f.not_room_types
            for f in filters
        ):
            facts["kinds"] = await self._kinds.get(
                rooms, now.room_key, self._store.room_changes, self._store.get_room_kinds
            )
        if any(f.tags is not None or f.not_tags for f in filters):
            tags = await self._store.get_tags_for_user(user_id)
            facts["tags"] = {r: set(t) for r, t in tags.items()}
        spaces = {s for f in filters for s in f.spaces or ()}
        if spaces:
            children: dict[str, set[str]] = {}
            for space in spaces:
                if rows.get(space, (None, None))[1] != "join":
                    continue  # the MSC: spaces the user is not joined to are ignored
                ids = await self._store.get_current_state_ids(space)
                child_ids = [i for (t, _), i in ids.items() if t == "m.space.child"]
                events = await self._store.get_events(child_ids)
                children[space] = {
                    e.state_key for e in events.values() if e.state_key and e.content.get("via")
                }
            facts["spaces"] = children
        return facts

    async def _direct_rooms(self, user_id: str) -> set[str]:
        """The rooms ``m.direct`` names (a malformed entry names none)."""
        direct = await self._store.get_global_account_data_of_type(user_id, "m.direct")
        rooms: set[str] = set()
        for value in (direct or {}).values():
            if isinstance(value, list):
                rooms.update(v for v in value if isinstance(v, str))
        return rooms

    @staticmethod
    def _passes(
        filters: ListFilters, room_id: str, rows: dict[str, Any], facts: dict[str, Any]
    ) -> bool:
        if filters.is_invite is not None and (rows[room_id][1] == "invite") != filters.is_invite:
            return False
        if filters.is_dm is not None and (room_id in facts["dm"]) != filters.is_dm:
            return False
        if "kinds" in facts:
            room_type, encrypted = facts["kinds"].get(room_id, (None, False))
            if filters.is_encrypted is not None and encrypted != filters.is_encrypted:
                return False
            if filters.room_types is not None and room_type not in filters.room_types:
                return False
            if room_type in filters.not_room_types:
                return False
        if "tags" in facts:
            tags = facts["tags"].get(room_id, set())
            if tags & set(filters.not_tags):
                return False
            if filters.tags is not None and not tags & set(filters.tags):
                return False
        if filters.spaces is not None:
            children = facts.get("spaces", {})
            if not any(room_id in children.get(s, set()) for s in filters.spaces):
                return False
        return True

    # The rooms part

    async def _rooms(
        self,
        requester: Requester,
        selection: Selection,
        memberships: Memberships,
        state: ConnectionState,
        since: StreamToken | None,
        now: StreamToken,
        ignored: frozenset[str],
        dms: set[str],
    ) -> dict[str, Any]:
        user_id = requester.user_id
        activity = selection.activity
        rows = memberships.now
        now_index: int | None = None
        tokens: dict[int, RoomStreamToken] = {}
        result: dict[str, Any] = {}
        joined_sent: list[str] = []
        live_since = since.room_key if since is not None else None
        planned: list[tuple[str, RoomConfig, bool, Coroutine[Any, Any, dict[str, Any] | None]]] = []
        #: The joined and left rooms' entries to build, their timelines
        #: read first, one query for all the rooms alike (below).
        timelines: list[
            tuple[
                str,
                RoomConfig,
                bool,
                TimelineRead,
                Callable[..., Coroutine[Any, Any, dict[str, Any] | None]],
            ]
        ] = []
        for room_id, config in selection.configs.items():
            row = rows[room_id]
            membership = row[1]
            sent = state.rooms.get(room_id)
            is_dm = room_id in dms
            initial = sent is None or sent.membership != membership
            rs_json = config.required_state.as_json()
            upper = now.room_key if membership == "join" else RoomStreamToken(int(row[3]))
            if membership in ("invite", "knock"):
                if initial:
                    planned.append(
                        (
                            room_id,
                            config,
                            initial,
                            self._invite_entry(room_id, row, membership, ignored),
                        )
                    )
                continue
            room_since: RoomStreamToken | None = None
            expanded = False
            if not initial:
                assert sent is not None
                if sent.at not in tokens:
                    tokens[sent.at] = await self._store.parse_room_token(state.tokens[sent.at])
                room_since = tokens[sent.at]
                expanded = config.timeline_limit > sent.timeline_limit
                nothing_new = (
                    not room_since.is_before_or_eq(upper)
                    or room_since == upper
                    or not self._store.room_changes.may_have_changed(room_id, room_since)
                )
                if (
                    nothing_new
                    and not expanded
                    and rs_json == sent.required_state
                    and is_dm == sent.is_dm
                ):
                    continue
            read = TimelineRead(
                None if initial or expanded else room_since, upper, config.timeline_limit + 1
            )
            entry_of = functools.partial(
                self._room_entry,
                requester=requester,
                room_id=room_id,
                config=config,
                sent=sent if not initial else None,
                room_since=room_since,
                upper=upper,
                expanded=expanded,
                required_changed=rs_json != (sent.required_state if sent else None),
                dm_changed=sent is not None and sent.is_dm != is_dm,
                live_since=live_since,
                ignored=ignored,
                joined=membership == "join",
            )
            timelines.append((room_id, config, initial, read, entry_of))
        # The timelines: one round trip for the rooms read alike (a first
        # room list's window: all of them), not one a room.
        groups: dict[TimelineRead, list[str]] = {}
        for room_id, _, _, read, _ in timelines:
            groups.setdefault(read, []).append(room_id)
        # The joined rooms' member and unread counts need no timeline: read
        # beside the timelines, not after them (a room whose entry turns out
        # to have nothing new has its counts read for nothing).
        counted = [room_id for room_id, *_ in timelines if rows[room_id][1] == "join"]
        count_reads: list[Coroutine[Any, Any, Any]] = []
        if counted:
            count_reads.append(self._store.get_member_counts(counted))
            count_reads.append(
                self._store.get_unread_counts(user_id, counted, now.room_key.get_max_position())
            )
        read_all = await _together(
            *count_reads,
            *(
                self._store.get_room_events_between_per_room(
                    group, read.lower, read.upper, read.limit
                )
                for read, group in groups.items()
            ),
        )
        counts: dict[str, tuple[int, int]] = read_all[0] if counted else {}
        unread: dict[str, tuple[int, int]] = read_all[1] if counted else {}
        found: dict[str, list[Event]] = {}
        for read_events in read_all[len(count_reads) :]:
            found.update(read_events)
        for room_id, config, initial, _, build in timelines:
            planned.append((room_id, config, initial, build(events=found[room_id])))
        # The rooms' other reads are round trips to the database: a batch
        # at a time runs them side by side instead of one room after another.
        entries: list[dict[str, Any] | None] = []
        for start in range(0, len(planned), CONCURRENT_ROOMS):
            entries += await _together(*(p[3] for p in planned[start : start + CONCURRENT_ROOMS]))
        for (room_id, config, initial, _), built in zip(planned, entries, strict=True):
            if built is None:
                continue
            entry = built
            row = rows[room_id]
            membership = row[1]
            sent = state.rooms.get(room_id)
            is_dm = room_id in dms
            if membership == "join":
                joined_sent.append(room_id)
            if now_index is None:
                now_index = state.add_token(await self._store.room_token_to_string(now.room_key))
            lazy = list(entry.pop("_lazy", []))
            record = RoomSent(
                now_index, config.timeline_limit, config.required_state.as_json(), membership, is_dm
            )
            if sent is not None and not initial:
                record.lazy = sent.lazy
            record.remember_lazy(lazy)
            state.rooms[room_id] = record
            if initial:
                entry["initial"] = True
            entry["membership"] = membership
            if initial or sent is None or sent.is_dm != is_dm:
                entry["is_dm"] = is_dm
            latest, bump = activity.get(room_id, (0, 0)) if membership == "join" else (0, 0)
            entry["bump_stamp"] = bump or latest or int(row[3])
            if room_id in selection.lists:
                entry["lists"] = selection.lists[room_id]
            result[room_id] = entry
        if self._relations is not None:
            # One query for every timeline (the rooms are the user's).
            await self._relations.add_bundles_to(
                [e for entry in result.values() for e in entry.get("timeline", [])],
                user_id,
            )
        if joined_sent:
            for room_id in joined_sent:
                joined_count, invited_count = counts.get(room_id, (0, 0))
                notifications, highlights = unread.get(room_id, (0, 0))
                result[room_id].update(
                    joined_count=joined_count,
                    invited_count=invited_count,
                    notification_count=notifications,
                    highlight_count=highlights,
                )
        # Rooms no longer the user's (forgotten, or left and out of every
        # list) stay remembered: coming back, they are sent as changed.
        state.prune_tokens()
        return result

    async def _invite_entry(
        self, room_id: str, row: Any, membership: str, ignored: frozenset[str]
    ) -> dict[str, Any] | None:
        """An invite's or knock's stripped state; None for an invite from an
        ignored user (left out, as /sync leaves it out)."""
        state_ids = await self._store.get_current_state_ids(room_id)
        wanted = [state_ids[(t, "")] for t in INVITE_STATE_TYPES if (t, "") in state_ids]
        member_id = row[2]
        wanted.append(member_id)
        events = await self._store.get_events(wanted)
        member = events.get(member_id)
        if membership == "invite" and member is not None and member.sender in ignored:
            return None
        stripped = _stripped(events[i] for i in wanted if i in events)
        entry: dict[str, Any] = {"stripped_state": stripped}
        if membership == "invite":
            # The shape Element X and matrix-rust-sdk read today.
            entry["invite_state"] = stripped
        else:
            entry["knock_state"] = stripped
        name = next(
            (e.content.get("name") for e in events.values() if e.type == "m.room.name"), None
        )
        if isinstance(name, str):
            entry["name"] = name
        return entry

    async def _room_entry(
        self,
        requester: Requester,
        room_id: str,
        config: RoomConfig,
        sent: RoomSent | None,
        room_since: RoomStreamToken | None,
        upper: RoomStreamToken,
        expanded: bool,
        required_changed: bool,
        dm_changed: bool,
        live_since: RoomStreamToken | None,
        ignored: frozenset[str],
        joined: bool,
        events: list[Event],
    ) -> dict[str, Any] | None:
        """A joined (or left: ``joined`` false) room's entry: in full when
        ``sent`` is None, else what changed since ``room_since``; None when
        nothing did. A left room's state is its state at ``upper`` (the
        leave), not what the room did afterwards. Incrementally, a state key
        the config asks for that the room's state lost (a state reset) is
        sent as a ``StateStub``: ``{"type", "state_key"}`` without content.
        ``events``: the room's newest ``timeline_limit + 1`` events after
        ``room_since`` (from the start when ``sent`` is None or
        ``expanded``) up to ``upper``, newest first (:class:`TimelineRead`)."""
        user_id = requester.user_id
        limit = config.timeline_limit
        lower = None if sent is None or expanded else room_since
        if events and not await member_sees_everything(self._store, user_id, room_id):
            visibility = await load_room_visibility(self._store, user_id, room_id)
            events = [e for e in events if visibility.can_see(e)]
        new_events = (
            events
            if room_since is None
            else [e for e in events if not room_since.contains(e.instance_name, e.stream_ordering)]
        )
        limited = len(events) > limit
        raw = list(reversed(events[:limit]))
        timeline = without_ignored(raw, ignored)
        state_changes: list[Event] = []
        deletions: set[tuple[str, str]] = set()
        if sent is not None and room_since is not None:
            state_changes, deletions = await _together(
                self._store.get_state_events_between(room_id, room_since, upper),
                self._store.get_state_deletions_between(room_id, room_since, upper),
            )
        if (
            sent is not None
            and not new_events
            and not state_changes
            and not deletions
            and not expanded
            and not required_changed
        ):
            # Only the DM flag may have changed (the caller adds it).
            return {} if dm_changed else None
        entry: dict[str, Any] = {}
        # State
        required = config.required_state
        if joined:
            state_ids = await self._store.get_current_state_ids(room_id)
        else:
            at_leave = await self._store.get_state_at(room_id, upper)
            state_ids = {(e.type, e.state_key or ""): e.event_id for e in at_leave}
        chosen_ids: set[str] = set()
        stubs: list[dict[str, str]] = []
        if sent is None or required_changed:
            for key in wanted_state_keys(required, state_ids.keys(), user_id):
                chosen_ids.add(state_ids[key])
        else:
            changed = {(e.type, e.state_key or "") for e in state_changes} | deletions
            for key in sorted(changed):
                # Lazy loading, no gap: every member change since the last
                # response, so the client's member cache stays right.
                if state_matches(required, key[0], key[1], user_id) or (
                    required.lazy_members and key[0] == "m.room.member" and not limited
                ):
                    if key in state_ids:
                        chosen_ids.add(state_ids[key])
                    else:
                        stubs.append({"type": key[0], "state_key": key[1]})
        lazy_sent: list[str] = []
        if required.lazy_members:
            wanted = {e.sender for e in timeline}
            wanted |= {e.state_key for e in timeline if e.type == "m.room.member" and e.state_key}
            already = set(sent.lazy) if sent is not None and not required_changed else set()
            for member in sorted(wanted - already):
                member_id = state_ids.get(("m.room.member", member))
                if member_id is not None:
                    chosen_ids.add(member_id)
                    lazy_sent.append(member)
        entry["_lazy"] = lazy_sent
        state_events = await self._store.get_events(chosen_ids) if chosen_ids else {}
        in_timeline = {e.event_id for e in timeline}
        state_list = sorted(
            (e for e in state_events.values() if e.event_id not in in_timeline or sent is None),
            key=lambda e: e.stream_ordering,
        )
        now_ms = self._clock.time_msec()
        state_list = await self._formatter.as_seen_by(user_id, state_list)
        entry["required_state"] = [
            *await self._formatter.render(
                state_list, now_ms, SyncFilter().event_format, include_room_id=True
            ),
            *stubs,
        ]
        entry["timeline"] = await self._formatter.format(requester, timeline, now_ms)
        if sent is None or expanded or new_events:
            entry["limited"] = limited
            if raw:
                prev = _before(raw[0])
            else:
                prev = lower or upper
            if lower is None and not limited:
                prev = upper
            entry["prev_batch"] = await self._store.room_token_to_string(prev)
            # Live: after the connection's previous response (none on a
            # new connection), even in a room new to the connection.
            entry["num_live"] = (
                0
                if live_since is None
                else sum(
                    1
                    for e in timeline
                    if not live_since.contains(e.instance_name, e.stream_ordering)
                )
            )
        if expanded:
            entry["expanded_timeline"] = True
            entry["unstable_expanded_timeline"] = True
        summary_changed = sent is None or any(e.type in SUMMARY_TYPES for e in state_changes)
        if summary_changed:
            await self._add_summary(entry, room_id, user_id, state_ids, full=sent is None)
        return entry

    async def _add_summary(
        self,
        entry: dict[str, Any],
        room_id: str,
        user_id: str,
        state_ids: dict[tuple[str, str], str],
        full: bool,
    ) -> None:
        """``name``, ``avatar`` and (without a name) ``heroes``: in full, or
        again after a change (null for a name or avatar now removed)."""
        keys = [("m.room.name", ""), ("m.room.avatar", ""), ("m.room.canonical_alias", "")]
        events = await self._store.get_events([state_ids[k] for k in keys if k in state_ids])
        by_type = {e.type: e for e in events.values()}
        name = by_type.get("m.room.name")
        name_value = name.content.get("name") if name is not None else None
        avatar = by_type.get("m.room.avatar")
        avatar_value = avatar.content.get("url") if avatar is not None else None
        if isinstance(name_value, str) and name_value:
            entry["name"] = name_value
        elif not full:
            entry["name"] = None
        if isinstance(avatar_value, str) and avatar_value:
            entry["avatar"] = avatar_value
        elif not full:
            entry["avatar"] = None
        if "name" in entry and entry["name"] is not None:
            return
        joined = sorted(await self._store.get_users_in_room(room_id) - {user_id})
        members = [k for t, k in state_ids if t == "m.room.member" and k != user_id]
        chosen = joined[:HEROES]
        if len(chosen) < HEROES:
            others = sorted(set(members) - set(joined))
            member_events = await self._store.get_events(
                [state_ids[("m.room.member", m)] for m in others]
            )
            invited = [
                e.state_key
                for e in member_events.values()
                if e.membership == "invite" and e.state_key
            ]
            left = [
                e.state_key
                for e in member_events.values()
                if e.membership != "invite" and e.state_key
            ]
            chosen += (sorted(invited) + sorted(left))[: HEROES - len(chosen)]
        hero_events = await self._store.get_events(
            [state_ids[("m.room.member", u)] for u in chosen if ("m.room.member", u) in state_ids]
        )
        heroes = []
        by_user = {e.state_key: e for e in hero_events.values()}
        for user in chosen:
            hero: dict[str, Any] = {"user_id": user}
            member = by_user.get(user)
            if member is not None:
                if isinstance(member.content.get("displayname"), str):
                    hero["displayname"] = member.content["displayname"]
                if isinstance(member.content.get("avatar_url"), str):
                    hero["avatar_url"] = member.content["avatar_url"]
            heroes.append(hero)
        entry["heroes"] = heroes

    # Extensions

    async def _extensions(
        self,
        requester: Requester,
        body: SlidingSyncBody,
        selection: Selection,
        memberships: Memberships,
        state: ConnectionState,
        since: StreamToken | None,
        response: SyncResponse,
        ignored: frozenset[str],
    ) -> dict[str, Any]:
        enabled = body.extensions
        previously = set(state.extensions)
        state.extensions = sorted(enabled)
        result: dict[str, Any] = {}
        if not enabled:
            return result
        user_id = requester.user_id
        joined = memberships.rooms("join")

        def since_of(name: str) -> StreamToken | None:
            return since if name in previously else None

        def request(ext_since: StreamToken | None, rooms: list[str]) -> SyncRequest:
            return SyncRequest(
                requester=requester,
                since=ext_since,
                full_state=False,
                filter=SyncFilter(),
                now_ms=self._clock.time_msec(),
                memberships=memberships,
                joined=rooms,
                sharing=set(),
                ignored=defer.succeed(ignored),
            )

        if "to_device" in enabled:
            await self._to_device_part(requester, enabled["to_device"], since, response, request)
            result["to_device"] = {
                "next_batch": str(response.now.get("to_device")),
                "events": response.body["to_device"]["events"],
            }
        if "e2ee" in enabled:
            e2ee_request = attr.evolve(
                request(since_of("e2ee"), joined),
                sharing=await users_sharing_rooms(self._store, user_id, joined),
            )
            await self._e2e_keys.add_to(e2ee_request, response)
            await self._device_lists.add_to(e2ee_request, response)
            result["e2ee"] = {
                "device_lists": response.body["device_lists"],
                "device_one_time_keys_count": response.body["device_one_time_keys_count"],
                "device_unused_fallback_key_types": response.body[
                    "device_unused_fallback_key_types"
                ],
            }
        if "account_data" in enabled:
            scope = self._scope(enabled["account_data"], selection, joined)
            await self._account_data.add_to(request(since_of("account_data"), scope), response)
            rooms = {
                r: response.room_events_of(r, "account_data")
                for r in scope
                if response.room_events_of(r, "account_data")
            }
            result["account_data"] = {
                "global": response.body["account_data"]["events"],
                "rooms": rooms,
            }
            response.news = response.news or bool(rooms)
        ephemeral = [n for n in ("typing", "receipts") if n in enabled]
        if ephemeral:
            scopes = {n: self._scope(enabled[n], selection, joined) for n in ephemeral}
            everything = sorted({r for rooms in scopes.values() for r in rooms})
            ext_since = since_of(ephemeral[0]) if len(ephemeral) == 1 else None
            if len(ephemeral) == 2 and since_of("typing") is not None and since_of("receipts"):
                ext_since = since
            await self._ephemeral.add_to(request(ext_since, everything), response)
            for name, event_type in (("typing", "m.typing"), ("receipts", "m.receipt")):
                if name not in scopes:
                    continue
                found = {}
                for room_id in scopes[name]:
                    for event in response.room_events_of(room_id, "ephemeral"):
                        if event["type"] == event_type:
                            found[room_id] = event
                result[name] = {"rooms": found}
                response.news = response.news or bool(found)
        return result

    async def _to_device_part(
        self,
        requester: Requester,
        config: ExtensionConfig,
        since: StreamToken | None,
        response: SyncResponse,
        request: Any,
    ) -> None:
        """To-device messages after the extension's ``since`` (the client's
        own position), deleting those it acknowledged by sending it."""
        position = config.since
        if position is None and since is not None:
            position = since.get("to_device")
        ext_since = None
        if position is not None:
            await self._store.delete_messages_for_device(
                requester.user_id, requester.device_id or "", position
            )
            ext_since = response.now.with_positions(to_device=position)
        await self._to_device.add_to(request(ext_since, []), response)

    @staticmethod
    def _scope(config: ExtensionConfig, selection: Selection, joined: list[str]) -> list[str]:
        """The joined rooms an extension covers: those of its ``lists`` and
        ``rooms`` (every list and every subscription when not named)."""
        member = set(joined)
        rooms: set[str] = set()
        names = selection.list_rooms.keys() if config.lists is None else config.lists
        for name in names:
            rooms.update(selection.list_rooms.get(name, []))
        rooms.update(selection.subscribed if config.rooms is None else config.rooms)
        return sorted(rooms & member)
