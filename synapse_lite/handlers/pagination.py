"""Reading a room: ``/messages`` pages, its state and its members, as far as
the reader may see (``visibility.py``).

Pagination tokens are room stream tokens (or a /sync ``next_batch``, whose
room part is used). A token stands for "the room's events up to here":
backwards from it returns events at or before it, forwards returns events
after it. A page's ``end`` is where the next page starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, NotFoundError, SynapseError
from synapse_lite.events import Event
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.client_events import ClientEventFormatter
from synapse_lite.handlers.filtering import EventFilter
from synapse_lite.handlers.ignored_users import get_ignored_users, without_ignored
from synapse_lite.handlers.visibility import RoomVisibility, load_room_visibility
from synapse_lite.tokens import InvalidToken, RoomStreamToken

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.storage.databases.main import GenericWorkerStore

MAX_PAGE = 1000


class PaginationHandler:
    """``/messages``, ``/state``, ``/members``."""

    def __init__(self, store: GenericWorkerStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._formatter = ClientEventFormatter(store)

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

    async def _visibility(self, requester: Requester, room_id: str) -> RoomVisibility:
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
    ) -> dict[str, Any]:
        visibility = await self._visibility(requester, room_id)
        limit = max(0, min(limit, MAX_PAGE))
        current = self._store.get_room_max_token()
        start = await self.parse_token(from_token) if from_token else current
        end_bound = await self.parse_token(to_token) if to_token else None
        now_ms = self._clock.time_msec()
        if direction == "b":
            upper = visibility.upper_bound(start)
            raw = await self._store.get_room_events_between(
                [room_id], end_bound, upper, limit, newest_first=True
            )
            next_token = RoomStreamToken(raw[-1].stream_ordering - 1) if raw else None
        else:
            upper = visibility.upper_bound(end_bound or current)
            raw = await self._store.get_room_events_between(
                [room_id], start, upper, limit, newest_first=False
            )
            if len(raw) < limit:
                next_token = upper if raw else None
            else:
                next_token = _advance(start, raw[-1])
        ignored = await get_ignored_users(self._store, requester.user_id)
        shown = without_ignored(visibility.filter(raw), ignored)
        response: dict[str, Any] = {
            "chunk": await self._formatter.format(requester, shown, now_ms),
            "start": from_token or await self._store.room_token_to_string(start),
            "state": [],
        }
        if next_token is not None:
            response["end"] = await self._store.room_token_to_string(next_token)
        return response

    async def get_event(self, requester: Requester, room_id: str, event_id: str) -> Event:
        """One event of the room the requester may see: 404 when it is not in
        this room, is hidden from them, or they may read nothing of the room
        (the spec's answer for all three)."""
        try:
            visibility = await self._visibility(requester, room_id)
        except SynapseError as e:
            # The spec's answer for an event one may not read is 404, in a
            # room one is not in too (and so for an unknown room).
            raise NotFoundError("Event not found") from e
        event = await self._store.get_event(event_id)
        if event is None or event.room_id != room_id or event.outlier:
            raise NotFoundError("Event not found")
        if event.stream_ordering <= 0 or not visibility.can_see(event):
            raise NotFoundError("Event not found")
        return event

    async def get_context(
        self,
        requester: Requester,
        room_id: str,
        event_id: str,
        limit: int,
        event_filter: EventFilter | None,
    ) -> dict[str, Any]:
        """``/context``: the event, up to ``limit`` events around it (half
        before, the rest after, each side only what the requester may see)
        and the room's state at the event."""
        # 403 for a room the requester may read nothing of (what the reference
        # server and SyTest expect of /context; the spec lists no errors here),
        # then 404 for an event they may not see.
        visibility = await self._visibility(requester, room_id)
        event = await self.get_event(requester, room_id, event_id)
        limit = max(0, min(limit, MAX_PAGE))
        before_limit = limit // 2
        before, after, start, end = await self.events_around(
            visibility, event, before_limit, limit - before_limit
        )
        now_ms = self._clock.time_msec()

        def shown(events: list[Event]) -> list[dict[str, Any]]:
            dicts = [e.to_client_dict(now_ms) for e in events]
            return [d for d in dicts if event_filter is None or event_filter.allows(d)]

        at = RoomStreamToken(event.stream_ordering)
        state = await self._store.get_state_at(room_id, at)
        return {
            "event": event.to_client_dict(now_ms),
            "events_before": shown(before),
            "events_after": shown(after),
            "start": await self._store.room_token_to_string(start),
            "end": await self._store.room_token_to_string(end),
            "state": [e.to_client_dict(now_ms) for e in state],
        }

    async def events_around(
        self, visibility: RoomVisibility, event: Event, before_limit: int, after_limit: int
    ) -> tuple[list[Event], list[Event], RoomStreamToken, RoomStreamToken]:
        """Up to ``before_limit`` events of the room just before ``event``
        (newest first) and ``after_limit`` just after it (oldest first), of
        those the reader may see, with the tokens where they start and end
        (``/context``, and the context of search results)."""
        room_id = event.room_id
        at = RoomStreamToken(event.stream_ordering)
        before = (
            await self._store.get_room_events_between(
                [room_id], None, RoomStreamToken(event.stream_ordering - 1), before_limit
            )
            if before_limit
            else []
        )
        upper = visibility.upper_bound(self._store.get_room_max_token())
        after = (
            await self._store.get_room_events_between(
                [room_id], at, upper, after_limit, newest_first=False
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
        return await self._store.get_state_at(room_id, token)

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
