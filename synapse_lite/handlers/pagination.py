"""Reading a room: ``/messages`` pages, its state and its members, as far as
the reader may see (``visibility.py``).

Pagination tokens are room stream tokens (or a /sync ``next_batch``, whose
room part is used). A token stands for "the room's events up to here":
backwards from it returns events at or before it, forwards returns events
after it. A page's ``end`` is where the next page starts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, NotFoundError, SynapseError
from synapse_lite.events import Event
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.client_events import ClientEventFormatter
from synapse_lite.handlers.filtering import CLIENT_FORMAT, EventFilter, EventFormat
from synapse_lite.handlers.ignored_users import get_ignored_users, without_ignored
from synapse_lite.handlers.visibility import RoomVisibility, load_room_visibility
from synapse_lite.tokens import InvalidToken, RoomStreamToken

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.handlers.federation_backfill import Backfiller
    from synapse_lite.storage.databases.main import GenericWorkerStore

MAX_PAGE = 1000
#: Events read per query while filling a filtered page, and the most pages
#: one request reads (a filter that matches little answers a short page with
#: an ``end`` to read on from, rather than reading a whole long room).
SCAN_PAGE = 100
MAX_SCAN_PAGES = 20


class PaginationHandler:
    """``/messages``, ``/state``, ``/members``."""

    def __init__(
        self,
        store: GenericWorkerStore,
        clock: Clock,
        formatter: ClientEventFormatter,
        backfiller: Callable[[], Backfiller | None] = lambda: None,
    ) -> None:
        """``backfiller``: where history before what we hold is asked of
        other servers (None on processes that cannot)."""
        self._store = store
        self._clock = clock
        self._formatter = formatter
        self._backfiller = backfiller

    async def parse_token(self, value: str) -> RoomStreamToken:
        """A room token, or the room part of a sync token; else a 400."""
        try:
            # A sync token starts with its room key.
            room, _, rest = value.partition("_")
            if rest and not all(part.isdigit() for part in rest.split("_")):
                raise InvalidToken(f"invalid stream token {value!r}")
            return await self._store.parse_room_token(room)
        except InvalidToken as e:
            raise SynapseError(400, str(e)[:300], Codes.INVALID_PARAM) from None

    async def room_visibility(self, requester: Requester, room_id: str) -> RoomVisibility:
        """The requester's view of a room; 403 when they may read none of it."""
        return await self._visibility(requester, room_id)

    async def _visibility(
        self, requester: Requester, room_id: str, as_admin: bool = False
    ) -> RoomVisibility:
        """``as_admin``: a server admin's view, every event (the admin API;
        the caller checked the requester is one), 404 for an unknown room."""
        if as_admin:
            if not await self._store.room_exists(room_id):
                raise NotFoundError("Room not found")
            return RoomVisibility.everything(requester.user_id)
        if not await self._store.room_exists(room_id):
            # Same answer as for a room the user is not in: no probing for ids.
            raise SynapseError(403, "You are not in this room", Codes.FORBIDDEN)
        visibility = await load_room_visibility(self._store, requester.user_id, room_id)
        visibility.check_can_read()
        return visibility

    async def get_messages(
        self,
        requester: Requester,
        room_id: str,
        from_token: str | None,
        to_token: str | None,
        direction: str,
        limit: int,
        event_filter: EventFilter | None = None,
        event_format: EventFormat = CLIENT_FORMAT,
        as_admin: bool = False,
    ) -> dict[str, Any]:
        """A page of ``/messages``: up to ``limit`` events passing
        ``event_filter`` (read until the page is full), ``end`` where the next
        page starts (absent once the history in that direction is
        exhausted), and with ``lazy_load_members`` the member events of the
        chunk's senders in ``state``; every event in ``event_format``.
        ``as_admin``: every event of the room (see :meth:`_visibility`)."""
        visibility = await self._visibility(requester, room_id, as_admin)
        limit = max(0, min(limit, MAX_PAGE))
        current = self._store.get_room_max_token()
        if from_token:
            start = await self.parse_token(from_token)
        else:
            # The spec: from the last visible event backwards, or from the
            # first one forwards.
            start = current if direction == "b" else RoomStreamToken(0)
        end_bound = await self.parse_token(to_token) if to_token else None
        now_ms = self._clock.time_msec()
        keep = None
        if event_filter is not None and not event_filter.allows_all:
            keep = event_filter
        next_token: RoomStreamToken | None
        if direction == "b":
            upper = visibility.upper_bound(start)
            raw, last, exhausted = await self._scan(room_id, end_bound, upper, limit, True, keep)
            if end_bound is None and await self._backfilled(room_id, raw, last, exhausted, upper):
                # History from other servers arrived where the page ran out.
                raw, last, exhausted = await self._scan(
                    room_id, end_bound, upper, limit, True, keep
                )
            next_token = None
            if last is not None and (raw or not exhausted):
                next_token = RoomStreamToken(last.stream_ordering - 1)
        else:
            upper = visibility.upper_bound(end_bound or current)
            raw, last, exhausted = await self._scan(room_id, start, upper, limit, False, keep)
            if exhausted or last is None:
                next_token = upper if raw else None
            else:
                next_token = _advance(start, last)
        ignored = await get_ignored_users(self._store, requester.user_id)
        shown = without_ignored(visibility.filter(raw), ignored)
        state: list[Event] = []
        if event_filter is not None and event_filter.lazy_load_members and shown:
            newest = max(shown, key=lambda e: e.stream_ordering)
            state = await self._members_of_senders(shown, RoomStreamToken(newest.stream_ordering))
        response: dict[str, Any] = {
            "chunk": await self._formatter.format(
                requester, shown, now_ms, event_format=event_format
            ),
            "start": from_token or await self._store.room_token_to_string(start),
            "state": await self._formatter.format(
                requester, state, now_ms, event_format=event_format
            ),
        }
        if next_token is not None:
            response["end"] = await self._store.room_token_to_string(next_token)
        return response

    async def _backfilled(
        self,
        room_id: str,
        read: list[Event],
        last: Event | None,
        exhausted: bool,
        upper: RoomStreamToken,
    ) -> bool:
        """Whether history around a backward page was fetched from other
        servers now (``handlers/federation_backfill.py``): where the page
        (``read``, and the event just after it) names parents we do not
        have, or where it ran out (``exhausted``; ``last``: the oldest event
        read) short of the room's create event (then its whole history is
        here)."""
        backfiller = self._backfiller()
        if backfiller is None or not await backfiller.servers_to_ask(room_id):
            return False
        after = await self._store.get_room_events_between(
            [room_id],
            upper,
            self._store.get_room_max_token(),
            1,
            newest_first=False,
            backfilled=True,
        )
        at_start = exhausted and (last is None or last.type != "m.room.create")
        ids = [e.event_id for e in [*after, *read]]
        return await backfiller.backfill(room_id, ids, at_start) > 0

    async def _scan(
        self,
        room_id: str,
        lower: RoomStreamToken | None,
        upper: RoomStreamToken,
        limit: int,
        newest_first: bool,
        event_filter: EventFilter | None,
    ) -> tuple[list[Event], Event | None, bool]:
        """Up to ``limit`` events of the room in ``(lower, upper]`` passing
        ``event_filter`` (all when None), in reading order; the last event
        read; whether the range was read to its end. A filter that matches
        little is read in pages, at most :data:`MAX_SCAN_PAGES` of them: the
        page may then come back short, with a token to read on from."""
        if event_filter is None:
            events = await self._store.get_room_events_between(
                [room_id], lower, upper, limit, newest_first=newest_first, backfilled=True
            )
            return events, events[-1] if events else None, len(events) < limit
        page = max(limit, SCAN_PAGE)
        found: list[Event] = []
        last: Event | None = None
        for _ in range(MAX_SCAN_PAGES):
            if len(found) >= limit:
                return found, last, False
            events = await self._store.get_room_events_between(
                [room_id], lower, upper, page, newest_first=newest_first, backfilled=True
            )
            for event in events:
                last = event
                if event_filter.matches(event.type, event.sender, event.room_id, event.content):
                    found.append(event)
                    if len(found) >= limit:
                        return found, last, False
            if len(events) < page:
                return found, last, True
            assert last is not None
            if newest_first:
                upper = RoomStreamToken(last.stream_ordering - 1)
            else:
                lower = _advance(lower or RoomStreamToken(0), last)
        return found, last, False

    async def _members_of_senders(self, events: list[Event], at: RoomStreamToken) -> list[Event]:
        """Lazy-loading members: the member events, as of ``at``, of the
        senders of ``events`` (requests are not remembered: every sender's
        member comes each time, which the spec allows)."""
        if not events:
            return []
        senders = {e.sender for e in events}
        return [
            e
            for e in await self._store.get_state_at(events[0].room_id, at)
            if e.type == "m.room.member" and e.state_key in senders
        ]

    async def get_event(
        self, requester: Requester, room_id: str, event_id: str, as_admin: bool = False
    ) -> Event:
        """One event of the room the requester may see: 404 when it is not in
        this room, is hidden from them, or they may read nothing of the room
        (the spec's answer for all three)."""
        try:
            visibility = await self._visibility(requester, room_id, as_admin)
        except SynapseError as e:
            # The spec's answer for an event one may not read is 404, in a
            # room one is not in too (and so for an unknown room).
            raise NotFoundError("Event not found") from e
        event = await self._store.get_event(event_id)
        if event is None or event.room_id != room_id or not event.served:
            raise NotFoundError("Event not found")
        if not visibility.can_see(event):
            raise NotFoundError("Event not found")
        [event] = await self._formatter.as_seen_by(requester.user_id, [event])
        return event

    async def get_context(
        self,
        requester: Requester,
        room_id: str,
        event_id: str,
        limit: int,
        event_filter: EventFilter | None,
        event_format: EventFormat = CLIENT_FORMAT,
        as_admin: bool = False,
    ) -> dict[str, Any]:
        """``/context``: the event, up to ``limit`` events around it (half
        before, the rest after, each side only what the requester may see
        and ``event_filter`` lets through) and the room's state at the
        event; every event in ``event_format``. ``as_admin``: as
        :meth:`get_messages`."""
        # 403 for a room the requester may read nothing of (what the reference
        # server and SyTest expect of /context; the spec lists no errors here),
        # then 404 for an event they may not see.
        visibility = await self._visibility(requester, room_id, as_admin)
        event = await self.get_event(requester, room_id, event_id, as_admin)
        limit = max(0, min(limit, MAX_PAGE))
        before_limit = limit // 2
        before, after, start, end = await self.events_around(
            visibility, event, before_limit, limit - before_limit
        )
        now_ms = self._clock.time_msec()
        before = await self._formatter.as_seen_by(requester.user_id, before)
        after = await self._formatter.as_seen_by(requester.user_id, after)
        if event_filter is not None:
            before = [e for e in before if event_filter.allows(e.to_client_dict())]
            after = [e for e in after if event_filter.allows(e.to_client_dict())]
        at = RoomStreamToken(event.stream_ordering)
        if event_filter is not None and event_filter.lazy_load_members:
            # The members of the senders of what is shown, as of the event.
            state = await self._members_of_senders([event, *before, *after], at)
        else:
            state = await self._store.get_state_at(room_id, at)
        state = await self._formatter.as_seen_by(requester.user_id, state)
        render = self._formatter.render
        [served] = await render([event], now_ms, event_format)
        return {
            "event": served,
            "events_before": await render(before, now_ms, event_format),
            "events_after": await render(after, now_ms, event_format),
            "start": await self._store.room_token_to_string(start),
            "end": await self._store.room_token_to_string(end),
            "state": await render(state, now_ms, event_format),
        }

    async def events_around(
        self, visibility: RoomVisibility, event: Event, before_limit: int, after_limit: int
    ) -> tuple[list[Event], list[Event], RoomStreamToken, RoomStreamToken]:
        """Up to ``before_limit`` events of the room just before ``event``
        (newest first) and ``after_limit`` just after it (oldest first), of
        those the reader may see, with the tokens where they start and end
        (``/context``, and the context of search results). Not yet as the
        reader sees them: ``ClientEventFormatter.as_seen_by`` does that."""
        room_id = event.room_id
        at = RoomStreamToken(event.stream_ordering)
        before = (
            await self._store.get_room_events_between(
                [room_id],
                None,
                RoomStreamToken(event.stream_ordering - 1),
                before_limit,
                backfilled=True,
            )
            if before_limit
            else []
        )
        upper = visibility.upper_bound(self._store.get_room_max_token())
        after = (
            await self._store.get_room_events_between(
                [room_id], at, upper, after_limit, newest_first=False, backfilled=True
            )
            if after_limit
            else []
        )
        start = (
            RoomStreamToken(before[-1].stream_ordering - 1)
            if before
            else RoomStreamToken(event.stream_ordering - 1)
        )
        end = RoomStreamToken(after[-1].stream_ordering) if after else at
        return visibility.filter(before), visibility.filter(after), start, end

    async def get_state(self, requester: Requester, room_id: str) -> list[Event]:
        """The room's state now, or when the requester left."""
        visibility = await self._visibility(requester, room_id)
        token = visibility.upper_bound(self._store.get_room_max_token())
        state = await self._store.get_state_at(room_id, token)
        return await self._formatter.as_seen_by(requester.user_id, state)

    async def get_state_event(
        self, requester: Requester, room_id: str, event_type: str, state_key: str
    ) -> Event:
        """One state event of the room now (or when the requester left)."""
        for event in await self.get_state(requester, room_id):
            if event.type == event_type and event.state_key == state_key:
                return event
        raise NotFoundError("Event not found")

    async def get_members(
        self,
        requester: Requester,
        room_id: str,
        membership: str | None,
        not_membership: str | None,
    ) -> list[Event]:
        return [
            e
            for e in await self.get_state(requester, room_id)
            if e.type == "m.room.member"
            and (membership is None or e.membership == membership)
            and (not_membership is None or e.membership != not_membership)
        ]


def _advance(token: RoomStreamToken, event: Event) -> RoomStreamToken:
    """``token`` moved forward to include ``event`` (and, in its room, every
    event before it)."""
    positions = dict(token.instance_map)
    positions[event.instance_name] = max(
        token.get_position(event.instance_name), event.stream_ordering
    )
    return RoomStreamToken.from_positions(token.stream, positions)
