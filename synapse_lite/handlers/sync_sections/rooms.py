"""The ``rooms`` part of /sync: the rooms the user is joined to (timeline,
state, summary, unread counts), invited to, knocking on and has left."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet import defer

from synapse_lite.events import Event
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.filtering import EventFilter, SyncFilter
from synapse_lite.handlers.ignored_users import is_hidden, without_ignored
from synapse_lite.handlers.sync_sections.request import (
    Memberships,
    SyncRequest,
    SyncResponse,
)
from synapse_lite.handlers.visibility import (
    VisibilityStore,
    load_room_visibility,
    member_sees_everything,
)
from synapse_lite.tokens import RoomStreamToken, StreamToken

if TYPE_CHECKING:
    from synapse_lite.handlers.client_events import ClientEventFormatter
    from synapse_lite.handlers.relations import RelationsHandler
    from synapse_lite.storage.change_tracker import StreamChangeTracker
    from synapse_lite.storage.databases.main import GenericWorkerStore

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


async def stripped_state(
    store: GenericWorkerStore, room_id: str, event_ids: Sequence[str]
) -> list[dict[str, Any]]:
    """The room's stripped state an invite or a knock carries: its current
    create, join rules, name, topic, avatar, canonical alias and encryption
    events (:data:`INVITE_STATE_TYPES`), then the events ``event_ids`` (a
    member event), each as type, state key, sender and content."""
    state_ids = await store.get_current_state_ids(room_id)
    wanted = [state_ids[(t, "")] for t in INVITE_STATE_TYPES if (t, "") in state_ids]
    wanted += [e for e in event_ids if e not in wanted]
    events = await store.get_events(wanted)
    return [
        {"type": e.type, "state_key": e.state_key, "sender": e.sender, "content": e.content}
        for e in (events[i] for i in wanted if i in events)
    ]


class RoomTimelineStore(Protocol):
    """The reads of a room's events and state up to a token (the rooms
    section's, and the legacy event stream's)."""

    async def get_room_events_between(
        self,
        room_ids: list[str],
        from_token: RoomStreamToken | None,
        to_token: RoomStreamToken,
        limit: int,
        newest_first: bool = True,
    ) -> list[Event]: ...

    async def get_state_at(self, room_id: str, token: RoomStreamToken) -> list[Event]: ...

    async def room_token_to_string(self, token: RoomStreamToken) -> str: ...


class RoomsStore(RoomTimelineStore, VisibilityStore, Protocol):
    """The store reads of the rooms section."""

    @property
    def room_changes(self) -> StreamChangeTracker: ...

    async def get_state_events_between(
        self, room_id: str, from_token: RoomStreamToken, to_token: RoomStreamToken
    ) -> list[Event]: ...

    async def get_current_state_ids(self, room_id: str) -> dict[tuple[str, str], str]: ...

    async def get_events(self, event_ids: Iterable[str]) -> dict[str, Event]: ...

    async def get_received_pdus(self, event_ids: Sequence[str]) -> dict[str, dict[str, Any]]: ...

    async def get_unread_counts(
        self, user_id: str, room_ids: list[str], upto: int
    ) -> dict[str, tuple[int, int]]: ...


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


def _is_limited(entry: dict[str, Any]) -> bool:
    return bool(entry["timeline"].get("limited"))


def _before(event: Event) -> RoomStreamToken:
    """A room token covering exactly the room's events before ``event`` (a
    room's events are persisted in stream order by its one writer)."""
    return RoomStreamToken(event.stream_ordering - 1)


def _empty_joined_room(now: StreamToken) -> dict[str, Any]:
    return {
        "timeline": {"events": [], "limited": False, "prev_batch": now.room_key},
        "state": {"events": []},
        "ephemeral": {"events": []},
        "account_data": {"events": []},
        "unread_notifications": {},
        "summary": {},
    }


class RoomsSection:
    """``rooms``: ``join``, ``invite``, ``leave`` and ``knock``. Runs after
    the sections that add per-room events (``SyncResponse.room_events``),
    which it places in the rooms' entries."""

    independent = False

    def __init__(
        self,
        store: RoomsStore,
        formatter: ClientEventFormatter,
        relations: RelationsHandler | None,
    ) -> None:
        """``formatter``: serves the room events; ``relations``: adds the
        bundled aggregations to timeline events."""
        self._store = store
        self._formatter = formatter
        self._relations = relations
        self._lazy_sent = LazyMembersSent()

    async def add_to(self, request: SyncRequest, response: SyncResponse) -> None:
        requester, since, now = request.requester, request.since, response.now
        sync_filter, memberships, now_ms = request.filter, request.memberships, request.now_ms
        ignored = await request.ignored
        whole, incremental = self._split_joined(request, now.room_key)
        with_room_events = [
            r
            for r in request.joined
            if response.room_events_of(r, "ephemeral") or response.room_events_of(r, "account_data")
        ]
        # The unread counts of every room that can be in ``join`` are read
        # beside the timelines, not after them: one round trip less for a
        # woken /sync (a room read for nothing costs a few rows, no query).
        counts_read = defer.ensureDeferred(
            self._store.get_unread_counts(
                request.user_id,
                sorted({*whole, *incremental, *with_room_events}),
                now.room_key.get_max_position(),
            )
        )
        try:
            join = await self._joined_rooms(
                requester, whole, incremental, since, now, sync_filter, now_ms, ignored
            )
        except BaseException:
            # Never awaited when the timelines failed first: its failure must
            # not be logged as unhandled.
            counts_read.addErrback(lambda _: None)
            raise
        for room_id in with_room_events:
            entry = join.setdefault(room_id, _empty_joined_room(now))
            entry["ephemeral"]["events"] = response.room_events_of(room_id, "ephemeral")
            entry["account_data"]["events"] = response.room_events_of(room_id, "account_data")
        counts = await counts_read
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
        for membership, part in (("invite", invite), ("knock", knock)):
            rooms = await self._invited_rooms(memberships, since, ignored, membership)
            part.update((r, e) for r, e in rooms.items() if sync_filter.allows_room(r))
        leave = await self._left_rooms(
            requester, memberships, since, request.full_state, sync_filter, now_ms, ignored
        )
        for room_id, entry in leave.items():
            # A left room carries the user's account data for it (the spec's
            # LeftRoom), as changed since the token (all of it in full).
            entry["account_data"]["events"] = response.room_events_of(room_id, "account_data")
        response.joined_rooms = join
        response.put(
            "rooms",
            {"join": join, "invite": invite, "leave": leave, "knock": knock},
            news=bool(join or invite or knock or leave),
        )

    def _split_joined(
        self, request: SyncRequest, now: RoomStreamToken
    ) -> tuple[list[str], list[str]]:
        """The joined rooms given in full (initial sync, ``full_state``,
        joined since the token), and those that may have events after the
        token (the room change tracker's answer; none when the events stream
        did not move)."""
        since, memberships = request.since, request.memberships
        whole: list[str] = []
        incremental: list[str] = []
        for room_id in request.joined:
            newly_joined = room_id in memberships.changed and (
                memberships.at_since.get(room_id) != "join"
            )
            if since is None or request.full_state or newly_joined:
                whole.append(room_id)
            else:
                incremental.append(room_id)
        if since is None or not incremental or since.room_key == now:
            return whole, []
        # Only rooms that may have events after the token need a query.
        room_changes = self._store.room_changes
        return whole, [r for r in incremental if room_changes.may_have_changed(r, since.room_key)]

    async def _joined_rooms(
        self,
        requester: Requester,
        whole: list[str],
        incremental: list[str],
        since: StreamToken | None,
        now: StreamToken,
        sync_filter: SyncFilter,
        now_ms: int,
        ignored: frozenset[str],
    ) -> dict[str, dict[str, Any]]:
        """The entries of ``whole`` rooms, and of the ``incremental`` ones
        with something new (see :meth:`_split_joined`)."""
        limit = sync_filter.timeline_limit
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
        if incremental and since is not None:
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
        memberships: Memberships,
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
            stripped = [
                {"type": e.type, "state_key": e.state_key, "sender": e.sender, "content": e.content}
                for e in events.values()
            ]
            if ("m.room.create", "") not in state_ids:
                # Another server's room we are invited to: the stripped state
                # its invite came with (docs/federation.md).
                stripped = await self._remote_invite_state(member_id) + stripped
            rooms[room_id] = {section: {"events": stripped}}
        return rooms

    async def _remote_invite_state(self, invite_id: str) -> list[dict[str, Any]]:
        """The ``invite_room_state`` another server's invite came with (as
        checked when it was received: objects with type, state key, sender
        and content), but the invite itself, which the caller adds."""
        received = (await self._store.get_received_pdus([invite_id])).get(invite_id, {})
        unsigned = received.get("unsigned")
        stripped = unsigned.get("invite_room_state") if isinstance(unsigned, dict) else None
        own = ("m.room.member", received.get("state_key"))
        return [
            {k: e.get(k) for k in ("type", "state_key", "sender", "content")}
            for e in (stripped if isinstance(stripped, list) else [])
            if isinstance(e, dict) and (e.get("type"), e.get("state_key")) != own
        ]

    async def _left_rooms(
        self,
        requester: Requester,
        memberships: Memberships,
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
