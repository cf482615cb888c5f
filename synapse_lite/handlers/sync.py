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
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attr
from twisted.internet import defer

from synapse_lite.api.errors import Codes, LimitExceededError, SynapseError
from synapse_lite.events import Event
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.filtering import SyncFilter
from synapse_lite.handlers.visibility import get_history_visibility, load_room_visibility
from synapse_lite.metrics import OPEN_SYNC_REQUESTS
from synapse_lite.storage.databases.main.account_data import TAG_DATA_TYPE
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


def _client_event(event: Event, now_ms: int) -> dict[str, Any]:
    return event.to_client_dict(now_ms, include_room_id=False)


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
        relations: RelationsHandler | None = None,
    ) -> None:
        """``streams``: this process's streams (their positions make the
        token); ``event_writers()``: the events writers known now;
        ``sections``: the parts of the response that streams other than the
        built-in ones feed, by stream name; ``relations``: adds the bundled
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
            writers = self._config.writers_of_stream(stream.definition)
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
        now_ms = self._clock.time_msec()
        memberships = await self._memberships(user_id, since, now.room_key)
        joined = memberships.rooms("join")

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

        global_data, room_data = await self._account_data(user_id, since, now)
        join = await self._joined_rooms(
            user_id, joined, memberships, since, now, full_state, sync_filter, now_ms
        )
        for room_id in joined:
            if ephemeral.get(room_id) or room_data.get(room_id):
                entry = join.setdefault(room_id, self._empty_joined_room(now))
                entry["ephemeral"]["events"] = ephemeral.get(room_id, [])
                entry["account_data"]["events"] = room_data.get(room_id, [])
        for entry in join.values():
            if isinstance(entry["timeline"].get("prev_batch"), RoomStreamToken):
                entry["timeline"]["prev_batch"] = await self._store.room_token_to_string(
                    entry["timeline"]["prev_batch"]
                )
        invite = await self._invited_rooms(memberships, since, now_ms)
        leave = await self._left_rooms(user_id, memberships, since, sync_filter, now_ms)

        to_device, to_device_key = await self._to_device(requester, since, now)
        now = now.with_positions(to_device=to_device_key)
        sharing = await self._users_sharing_rooms(user_id, joined)
        presence = [
            event
            for event in await self._presence(sharing, since, now, now_ms)
            if sync_filter.presence.allows(event)
        ]
        changed_devices: list[str] = []
        if since is not None and since.get("device_lists") < now.get("device_lists"):
            changed = await self._store.get_users_whose_devices_changed(
                since.get("device_lists"), now.get("device_lists")
            )
            changed_devices = sorted(changed & sharing)

        extra = await self._sections_of(user_id, since, now)
        response: dict[str, Any] = {
            "rooms": {"join": join, "invite": invite, "leave": leave},
            "account_data": {"events": global_data},
            "to_device": {"events": to_device},
            "presence": {"events": presence},
            "device_lists": {"changed": changed_devices, "left": []},
            "device_one_time_keys_count": {},
        }
        response.update(extra)
        empty = not (
            join
            or invite
            or leave
            or global_data
            or to_device
            or presence
            or changed_devices
            or extra
        )
        return response, now, empty

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
        user_id: str,
        joined: list[str],
        memberships: _Memberships,
        since: StreamToken | None,
        now: StreamToken,
        full_state: bool,
        sync_filter: SyncFilter,
        now_ms: int,
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
            events = await self._store.get_room_events_between(
                [room_id], None, now.room_key, limit + 1
            )
            result[room_id] = await self._room_entry(
                user_id, room_id, events, limit, None, now, full=True, now_ms=now_ms
            )
        if since is not None:
            # Only rooms that may have events after the token need a query.
            room_changes = self._store.room_changes
            incremental = [
                r for r in incremental if room_changes.may_have_changed(r, since.room_key)
            ]
        if incremental and since is not None and since.room_key != now.room_key:
            by_room = await self._events_by_room(incremental, since.room_key, now.room_key, limit)
            for room_id, events in by_room.items():
                result[room_id] = await self._room_entry(
                    user_id, room_id, events, limit, since.room_key, now, full=False, now_ms=now_ms
                )
        if self._relations is not None:
            # One pass over every room's timeline: the user is joined to each,
            # and the timelines are already what they may see.
            await self._relations.add_bundles_to(
                [e for entry in result.values() for e in entry["timeline"]["events"]], user_id
            )
        return result

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
        user_id: str,
        room_id: str,
        newest_first: list[Event],
        limit: int,
        since: RoomStreamToken | None,
        now: StreamToken,
        full: bool,
        now_ms: int,
    ) -> dict[str, Any]:
        """One room's timeline (``newest_first`` holds up to ``limit + 1``
        events) and state."""
        limited = len(newest_first) > limit
        raw = list(reversed(newest_first[:limit]))
        visibility_name = await get_history_visibility(self._store, room_id)
        if visibility_name in ("shared", "world_readable"):
            timeline = raw  # the user is joined now: shared history shows it all
        else:
            visibility = await load_room_visibility(self._store, user_id, room_id)
            timeline = visibility.filter(raw)
        prev_batch = _before(raw[0]) if raw else (since or now.room_key)
        in_timeline = {e.event_id for e in timeline}
        state: list[Event] = []
        if full:
            state = [
                e
                for e in await self._store.get_state_at(room_id, now.room_key)
                if e.event_id not in in_timeline
            ]
        elif limited and raw and since is not None:
            latest: dict[tuple[str, str | None], Event] = {}
            for event in await self._store.get_state_events_between(
                room_id, since, _before(raw[0])
            ):
                latest[(event.type, event.state_key)] = event
            state = list(latest.values())
        entry = self._empty_joined_room(now)
        entry["timeline"] = {
            "events": [_client_event(e, now_ms) for e in timeline],
            "limited": limited,
            "prev_batch": prev_batch,
        }
        entry["state"]["events"] = [_client_event(e, now_ms) for e in state]
        members_changed = any(e.type == "m.room.member" for e in (*timeline, *state))
        if full or members_changed:
            entry["summary"] = await self._summary(user_id, room_id)
        return entry

    async def _summary(self, user_id: str, room_id: str) -> dict[str, Any]:
        """The room ``summary``: member counts and, for a room without a name
        or canonical alias, up to 5 heroes (the other members, joined or
        invited, in user id order; those who left when nobody else is left),
        for clients to name it. Sent with whole rooms and whenever the
        membership changed."""
        members = await self._store.get_current_memberships(room_id)
        joined = [u for u, m in members if m == "join"]
        invited = [u for u, m in members if m == "invite"]
        summary: dict[str, Any] = {
            "m.joined_member_count": len(joined),
            "m.invited_member_count": len(invited),
        }
        state_ids = await self._store.get_current_state_ids(room_id)
        naming = [
            state_ids[key]
            for key in (("m.room.name", ""), ("m.room.canonical_alias", ""))
            if key in state_ids
        ]
        named = any(
            e.content.get("name") or e.content.get("alias")
            for e in (await self._store.get_events(naming)).values()
        )
        if not named:
            # Heroes are for naming a room that has no name of its own.
            heroes = [u for u in (*joined, *invited) if u != user_id]
            if not heroes:
                heroes = [u for u, m in members if m in ("leave", "ban") and u != user_id]
            summary["m.heroes"] = sorted(heroes)[:5]
        return summary

    async def _invited_rooms(
        self, memberships: _Memberships, since: StreamToken | None, now_ms: int
    ) -> dict[str, Any]:
        invite: dict[str, Any] = {}
        for room_id in memberships.rooms("invite"):
            if since is not None and (
                room_id not in memberships.changed or memberships.at_since.get(room_id) == "invite"
            ):
                continue
            state_ids = await self._store.get_current_state_ids(room_id)
            wanted = [state_ids[(t, "")] for t in INVITE_STATE_TYPES if (t, "") in state_ids]
            wanted.append(memberships.now[room_id][2])
            events = await self._store.get_events(wanted)
            invite[room_id] = {
                "invite_state": {
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
        return invite

    async def _left_rooms(
        self,
        user_id: str,
        memberships: _Memberships,
        since: StreamToken | None,
        sync_filter: SyncFilter,
        now_ms: int,
    ) -> dict[str, Any]:
        if since is None:
            return {}
        leave: dict[str, Any] = {}
        limit = sync_filter.timeline_limit
        for room_id in sorted(memberships.changed):
            row = memberships.now.get(room_id)
            if row is None or row[1] not in ("leave", "ban"):
                continue
            if memberships.at_since.get(room_id) in ("leave", "ban"):
                continue
            until = RoomStreamToken(row[3])  # up to and including their leave
            events = await self._store.get_room_events_between(
                [room_id], since.room_key, until, limit + 1
            )
            visibility = await load_room_visibility(self._store, user_id, room_id)
            raw = list(reversed(events[:limit]))
            timeline = visibility.filter(raw)
            entry: dict[str, Any] = {
                "timeline": {"events": [_client_event(e, now_ms) for e in timeline]},
                "state": {"events": []},
                "account_data": {"events": []},
            }
            entry["timeline"]["limited"] = len(events) > limit
            prev = _before(raw[0]) if raw else since.room_key
            entry["timeline"]["prev_batch"] = await self._store.room_token_to_string(prev)
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
        """Global and per-room account data that changed (all of it, initially)."""
        if since is not None and since.get("account_data") >= now.get("account_data"):
            return [], {}
        changed_global: set[str] | None = None
        changed_rooms: set[tuple[str, str]] | None = None
        if since is not None:
            changes = await self._store.get_account_data_changes(
                user_id, since.get("account_data"), now.get("account_data")
            )
            if not changes:
                return [], {}
            changed_global = {t for _, r, t in changes if r is None}
            changed_rooms = {(r, t) for _, r, t in changes if r is not None}
        global_data = [
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

    async def _presence(
        self, users: set[str], since: StreamToken | None, now: StreamToken, now_ms: int
    ) -> list[dict[str, Any]]:
        if since is None:
            states = list((await self._store.get_presence_for_users(sorted(users))).values())
        elif since.get("presence") < now.get("presence"):
            states = await self._store.get_presence_changes(
                sorted(users), since.get("presence"), now.get("presence")
            )
        else:
            return []
        return [
            {"type": "m.presence", "sender": s.user_id, "content": s.to_client_content(now_ms)}
            for s in states
        ]
