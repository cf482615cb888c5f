"""The deprecated reads of the r0 client API, as the spec last described them:
``GET /events`` (the event stream; with ``room_id``, one room's events for
anyone who may read it, which is how a client peeks into a world-readable
room), ``GET /initialSync`` and ``GET /rooms/{roomId}/initialSync`` (a
snapshot: a departed room's up to the leave, a world-readable room's for
anyone).

Read-only, and served wherever /sync is: the tokens are /sync tokens (the
sync handler reads and prints them), so the ``end`` of an initial sync
starts an event stream, and an event stream token pages ``/messages``.
These endpoints deliver no to-device messages, so the tokens they hand out
claim none delivered (a /sync from one deletes nothing unseen). Every room
event goes through ``visibility.py``; events carry ``room_id`` and the v1
``user_id`` (their sender), presence events ``content.user_id``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from synapse_lite.api.errors import AuthError, Codes
from synapse_lite.events import Event
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.client_events import ClientEventFormatter
from synapse_lite.handlers.ignored_users import (
    IgnoredUsersStore,
    get_ignored_users,
    without_ignored,
)
from synapse_lite.handlers.sync_sections.request import MembershipStore
from synapse_lite.handlers.sync_sections.rooms import RoomTimelineStore
from synapse_lite.handlers.visibility import (
    RoomVisibility,
    VisibilityStore,
    load_room_visibility,
    member_sees_everything,
)
from synapse_lite.storage.databases.main.account_data import TAG_DATA_TYPE
from synapse_lite.storage.databases.main.presence import UserPresenceState
from synapse_lite.tokens import RoomStreamToken, StreamToken

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.config.homeserver import LimitsConfig
    from synapse_lite.handlers.pagination import PaginationHandler
    from synapse_lite.handlers.presence import PresenceHandlerBase
    from synapse_lite.handlers.sync import SyncHandler
    from synapse_lite.handlers.typing import TypingHandlerBase
    from synapse_lite.notifier import Notifier

#: Messages per room in an initial sync when the client names no limit.
DEFAULT_INITIAL_SYNC_LIMIT = 10
#: The most room events one answer holds (per room in an initial sync).
MAX_LIMIT = 1000
#: The push rules travel as account data in /sync only.
_NOT_ACCOUNT_DATA = ("m.push_rules",)


def _v1_event(event: dict[str, Any]) -> dict[str, Any]:
    """A client event with the v1 API's ``user_id`` (its sender)."""
    event["user_id"] = event["sender"]
    return event


def _v1_presence(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for event in events:
        event["content"]["user_id"] = event["sender"]
    return events


def _tags_first(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A room's account data with its ``m.tag`` first, where v1 clients look."""
    return sorted(events, key=lambda e: e["type"] != TAG_DATA_TYPE)


def _with_room(room_id: str, events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**e, "room_id": room_id} for e in events]


class LegacySyncStore(
    MembershipStore, RoomTimelineStore, VisibilityStore, IgnoredUsersStore, Protocol
):
    """The store reads of :class:`LegacySyncHandler`."""

    async def get_event(self, event_id: str) -> Event | None: ...

    async def is_room_in_directory(self, room_id: str) -> bool | None: ...


class LegacySyncHandler:
    """``GET /events``, ``GET /initialSync``, ``GET /rooms/{roomId}/initialSync``."""

    def __init__(
        self,
        *,
        store: LegacySyncStore,
        clock: Clock,
        limits: LimitsConfig,
        sync: SyncHandler,
        pagination: PaginationHandler,
        notifier: Notifier,
        typing: TypingHandlerBase,
        presence: PresenceHandlerBase,
        formatter: ClientEventFormatter,
    ) -> None:
        """``formatter``: serves the events (the client format only)."""
        self._store = store
        self._clock = clock
        self._limits = limits
        self._sync = sync
        self._pagination = pagination
        self._notifier = notifier
        self._typing = typing
        self._presence = presence
        self._formatter = formatter

    # Tokens

    async def _parse(self, value: str | None) -> StreamToken:
        if value is None:
            return self._now(None)
        return await self._sync.parse_stream_token(value)

    def _now(self, since: StreamToken | None) -> StreamToken:
        now = self._sync.current_stream_token(since)
        return now.with_positions(to_device=0 if since is None else since.get("to_device"))

    # GET /events

    async def get_events(
        self,
        requester: Requester,
        from_token: str | None,
        timeout_ms: int,
        room_id: str | None,
        limit: int | None,
    ) -> dict[str, Any]:
        """What happened after ``from_token`` (now, when None): room events in
        stream order, then typing, receipts, presence and (without
        ``room_id``) account data; waits up to ``timeout_ms`` for something.
        With ``room_id``, that room's only, for anyone who may read it; a
        guest must name one (the spec allows guests the stream "as used for
        room previews"). ``limit`` caps the room events: ``end`` then
        resumes right after the last one."""
        if room_id is None and requester.is_guest:
            raise AuthError(
                403,
                "Guests may only stream a room's events (room_id)",
                Codes.GUEST_ACCESS_FORBIDDEN,
            )
        if room_id is not None:
            # 403 now for a room the requester may read nothing of.
            await self._pagination.room_visibility(requester, room_id)
        since = await self._parse(from_token)
        timeout_ms = min(timeout_ms, self._limits.max_sync_timeout_ms)
        limit = MAX_LIMIT if limit is None else min(limit, MAX_LIMIT)
        found: list[tuple[list[dict[str, Any]], StreamToken]] = []

        async def check() -> bool:
            found[:] = [await self._stream_between(requester, since, room_id, limit)]
            return bool(found[0][0])

        if timeout_ms <= 0:
            await check()
        else:
            user_id = requester.user_id
            rooms = [room_id] if room_id else await self._store.get_rooms_for_user(user_id)
            if requester.is_guest:
                await self._notifier.wait_for_events(user_id, rooms, timeout_ms, check)
            else:
                # Listening to the stream is being online, as with /sync.
                async with self._presence.user_syncing(user_id, requester.device_id):
                    await self._notifier.wait_for_events(user_id, rooms, timeout_ms, check)
        chunk, end = found[0]
        start = from_token if from_token is not None else await self._string(since)
        return {"chunk": chunk, "start": start, "end": await self._string(end)}

    async def _stream_between(
        self, requester: Requester, since: StreamToken, room_id: str | None, limit: int
    ) -> tuple[list[dict[str, Any]], StreamToken]:
        """The events of ``(since, now]`` for the requester, and where the
        next request resumes."""
        user_id = requester.user_id
        now = self._now(since)
        now_ms = self._clock.time_msec()
        if room_id is not None:
            rooms, joined = [room_id], [room_id]
            presence_of = set(await self._store.get_users_in_room(room_id))
        else:
            joined = sorted(await self._store.get_rooms_for_user(user_id))
            rooms = sorted(set(joined) | await self._rooms_changed(user_id, since, now))
            presence_of = {user_id}
            for joined_room in joined:
                presence_of |= await self._store.get_users_in_room(joined_room)
        raw = (
            await self._store.get_room_events_between(
                rooms, since.room_key, now.room_key, limit, newest_first=False
            )
            if since.room_key != now.room_key
            else []
        )
        end = now
        if limit == 0:
            end = StreamToken(since.room_key, now.positions)
        elif len(raw) >= limit:
            end = StreamToken(
                since.room_key.advanced_through(now.room_key, raw[-1].stream_ordering),
                now.positions,
            )
        shown = await self._visible(requester, raw, now.room_key)
        chunk = [_v1_event(e) for e in await self._formatter.format(requester, shown, now_ms)]

        typing, typing_key = self._typing.get_typing_for_rooms(joined, since.get("typing"))
        end = end.with_positions(typing=typing_key)
        chunk += [
            {"type": "m.typing", "room_id": r, "content": {"user_ids": users}}
            for r, users in sorted(typing.items())
        ]
        receipts = await self._sync.receipt_events(user_id, joined, since, now)
        chunk += [{**receipt, "room_id": r} for r, receipt in sorted(receipts.items())]
        presence = await self._sync.presence_events(presence_of, since, now, now_ms)
        chunk += _v1_presence(presence)
        if room_id is None:
            global_data, room_data = await self._sync.account_data_events(user_id, since, now)
            chunk += [d for d in global_data if d["type"] not in _NOT_ACCOUNT_DATA]
            for data_room, events in sorted(room_data.items()):
                chunk += _with_room(data_room, events)
        return chunk, end

    async def _rooms_changed(self, user_id: str, since: StreamToken, now: StreamToken) -> set[str]:
        """Rooms where the user's membership changed in ``(since, now]``:
        invites, and rooms left (whose events are shown up to the leave)."""
        if since.room_key == now.room_key or not self._store.membership_changes.may_have_changed(
            user_id, since.room_key
        ):
            return set()
        rows = await self._store.get_membership_changes_between(
            user_id, since.room_key, now.room_key
        )
        return {row[0] for row in rows}

    async def _visible(
        self, requester: Requester, events: list[Event], upper: RoomStreamToken
    ) -> list[Event]:
        """``events`` (of several rooms) as far as the requester may see them,
        ignored users' messages left out."""
        by_room: dict[str, list[Event]] = {}
        for event in events:
            by_room.setdefault(event.room_id, []).append(event)
        hidden: set[str] = set()
        for room_id, room_events in by_room.items():
            if await member_sees_everything(self._store, requester.user_id, room_id):
                continue
            visibility = await load_room_visibility(self._store, requester.user_id, room_id)
            bound = visibility.upper_bound(upper)
            hidden.update(
                e.event_id
                for e in room_events
                if not bound.contains(e.instance_name, e.stream_ordering)
                or not visibility.can_see(e)
            )
        ignored = await get_ignored_users(self._store, requester.user_id)
        return without_ignored([e for e in events if e.event_id not in hidden], ignored)

    # GET /initialSync

    async def initial_sync(
        self, requester: Requester, limit: int | None, archived: bool
    ) -> dict[str, Any]:
        """Every room of the user (joined and invited; left and banned too
        with ``archived``): its latest ``limit`` messages, state and account
        data; their presence, receipts and global account data."""
        user_id = requester.user_id
        now = self._now(None)
        now_ms = self._clock.time_msec()
        limit = DEFAULT_INITIAL_SYNC_LIMIT if limit is None else min(limit, MAX_LIMIT)
        wanted = ("join", "invite", "leave", "ban") if archived else ("join", "invite")
        memberships = [
            row
            for row in await self._store.get_local_memberships_with_positions(user_id)
            if row[1] in wanted
        ]
        memberships.sort(key=lambda row: row[3], reverse=True)
        global_data, room_data = await self._sync.account_data_events(user_id, None, now)
        rooms: list[dict[str, Any]] = []
        for room_id, membership, event_id, _, _ in memberships:
            if membership == "invite":
                rooms.append(await self._invite(requester, room_id, event_id, now_ms))
                continue
            visibility = await load_room_visibility(self._store, user_id, room_id)
            room = await self._snapshot(requester, room_id, visibility, limit, now, now_ms)
            room["membership"] = membership
            room["account_data"] = _tags_first(room_data.get(room_id, []))
            rooms.append(room)
        joined = [r for r, m, *_ in memberships if m == "join"]
        receipts = await self._sync.receipt_events(user_id, joined, None, now)
        sharing = {user_id}
        for room_id in joined:
            sharing |= await self._store.get_users_in_room(room_id)
        return {
            "rooms": rooms,
            "presence": await self._presence_of(sharing, now, now_ms),
            "receipts": [{**receipt, "room_id": r} for r, receipt in sorted(receipts.items())],
            "account_data": [d for d in global_data if d["type"] not in _NOT_ACCOUNT_DATA],
            "end": await self._string(now),
        }

    async def _invite(
        self, requester: Requester, room_id: str, event_id: str, now_ms: int
    ) -> dict[str, Any]:
        invite = await self._store.get_event(event_id)
        entry: dict[str, Any] = {"room_id": room_id, "membership": "invite"}
        if invite is not None:
            [formatted] = await self._formatter.format(requester, [invite], now_ms)
            entry.update(invite=_v1_event(formatted), inviter=invite.sender)
        return entry

    # GET /rooms/{roomId}/initialSync

    async def room_initial_sync(
        self, requester: Requester, room_id: str, limit: int | None
    ) -> dict[str, Any]:
        """One room as its reader may see it: a member's (or former member's,
        up to the leave), or anyone's for a world-readable room; 403 for
        others. Presence and receipts (now) only for members and peekers."""
        user_id = requester.user_id
        visibility = await self._pagination.room_visibility(requester, room_id)
        now = self._now(None)
        now_ms = self._clock.time_msec()
        limit = DEFAULT_INITIAL_SYNC_LIMIT if limit is None else min(limit, MAX_LIMIT)
        room = await self._snapshot(requester, room_id, visibility, limit, now, now_ms)
        membership = visibility.history[-1][1] if visibility.ever_member else None
        if membership is not None:
            room["membership"] = membership
            _, room_data = await self._sync.account_data_events(user_id, None, now)
            room["account_data"] = _tags_first(room_data.get(room_id, []))
        if membership != "join" and not visibility.is_peeking:
            # Who is online and who read what now is for those in the room
            # (or reading it as anyone may): not for someone who left (it is
            # from after the leave), nor for an invitee.
            room["presence"], room["receipts"] = [], []
            return room
        members = set(await self._store.get_users_in_room(room_id))
        receipts = await self._sync.receipt_events(user_id, [room_id], None, now)
        room["presence"] = await self._presence_of(members, now, now_ms)
        room["receipts"] = [{**r, "room_id": room_id} for r in receipts.values()]
        return room

    async def _snapshot(
        self,
        requester: Requester,
        room_id: str,
        visibility: RoomVisibility,
        limit: int,
        now: StreamToken,
        now_ms: int,
    ) -> dict[str, Any]:
        """A room's latest ``limit`` events the reader may see, its state and
        its directory visibility, up to ``now`` or the reader's leave."""
        upper = visibility.upper_bound(now.room_key)
        raw = await self._store.get_room_events_between([room_id], None, upper, limit)
        ignored = await get_ignored_users(self._store, requester.user_id)
        shown = without_ignored(visibility.filter(reversed(raw)), ignored)
        chunk = [_v1_event(e) for e in await self._formatter.format(requester, shown, now_ms)]
        start = RoomStreamToken(raw[-1].stream_ordering - 1) if raw else upper
        end = now if upper == now.room_key else StreamToken(upper, now.positions)
        state = await self._store.get_state_at(room_id, upper)
        listed = await self._store.is_room_in_directory(room_id)
        return {
            "room_id": room_id,
            "messages": {
                "chunk": chunk,
                "start": await self._store.room_token_to_string(start),
                "end": await self._string(end),
            },
            "state": [_v1_event(e.to_client_dict(now_ms)) for e in state],
            "visibility": "public" if listed else "private",
        }

    # Shared

    async def _presence_of(
        self, users: set[str], now: StreamToken, now_ms: int
    ) -> list[dict[str, Any]]:
        """The presence of ``users`` now, ``offline`` for those who never had
        any: a snapshot names everyone it is about."""
        events = await self._sync.presence_events(users, None, now, now_ms)
        found = {e["sender"] for e in events}
        for user in sorted(users - found):
            content = UserPresenceState.default(user).to_client_content(now_ms)
            events.append({"type": "m.presence", "sender": user, "content": content})
        return _v1_presence(events)

    async def _string(self, token: StreamToken) -> str:
        return await self._sync.stream_token_string(token)
