"""Spaces: the rooms below a space, walked through its ``m.space.child``
state (client-server API "Spaces", ``GET /_matrix/client/v1/rooms/{roomId}/hierarchy``;
server-server API "Spaces", ``GET /_matrix/federation/v1/hierarchy/{roomId}``).

A **child** is an ``m.space.child`` state event of the space whose state key
is a room id and whose ``content.via`` is a non-empty list of server names
(anything else is no child). Children are taken in the spec's order: those
with a valid ``order`` (at most 50 characters of ``\\x20``-``\\x7E``) first,
by ``order``; then by the child event's ``origin_server_ts``; then by room id.

**Walk** (for a client): breadth first from the space, each room once, to
``max_depth`` (the space is depth 0), paginated by offset into that walk
(``from``: ``<offset>_<max_depth>_<suggested 0/1>``, so a page asked with
another ``max_depth`` or ``suggested_only`` is a 400). A room is **ours** to
describe when a user of ours is joined to it (its state here is current);
else its summary is asked of the servers in the child's ``via`` (then the
room id's server) over federation, and cached (:data:`REMOTE_CACHE_MS`).
A room the user may not see is left out, and so are its children; it is
seen when the user is joined or invited, its join rule is ``public``,
``knock`` or ``knock_restricted``, it is ``restricted`` to a room the user is
joined to, or it is ``world_readable``.

**Served** to other servers: the space (ours, a user of ours joined) when
its server ACL allows the server and the server may see it (a user of it
joined or invited, a join rule other than ``invite``/``private``, or
``world_readable``), else 404; its children that are ours: those it may see
as ``children``, the others as ``inaccessible_children``. Children that are
not ours are left out (the requesting server asks their servers).

The admin API's hierarchy is the walk with no user: every room of ours,
nothing asked of other servers.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.api.errors import AuthError, Codes, NotFoundError, SynapseError
from synapse_lite.api.identifiers import is_valid_room_id, server_of
from synapse_lite.federation.server_acl import room_allows_server

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.events import Event
    from synapse_lite.federation.queries import FederationQueries, RemoteHierarchy
    from synapse_lite.handlers.directory import DirectoryHandler
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

SPACE_CHILD = "m.space.child"
#: ``limit`` when none is given, and the most one page returns.
DEFAULT_LIMIT = 50
MAX_LIMIT = 100
#: ``max_depth`` when none is given; larger ones are cut to it.
MAX_DEPTH = 10
#: The most rooms one walk looks at (pages included), and the most other
#: servers' answers it asks for (cached ones are free).
MAX_WALK = 1000
MAX_REMOTE_QUERIES = 10
#: How long another server's answer (or failure) about a space is kept.
REMOTE_CACHE_MS = 5 * 60 * 1000
MAX_REMOTE_CACHE = 1000
#: The most ``via`` servers asked about one room.
MAX_VIA = 3
MAX_ORDER_LENGTH = 50
#: Join rules under which anyone may see a room's summary.
OPEN_JOIN_RULES = frozenset({"public", "knock", "knock_restricted"})
RESTRICTED_JOIN_RULES = frozenset({"restricted", "knock_restricted"})


@attr.s(slots=True, frozen=True, auto_attribs=True)
class SpaceChild:
    """One valid ``m.space.child`` of a space."""

    room_id: str
    via: tuple[str, ...]
    suggested: bool
    order: str | None
    origin_server_ts: int


def space_child(stripped: Mapping[str, Any]) -> SpaceChild | None:
    """The child a stripped ``m.space.child`` event (with
    ``origin_server_ts``) names, or None when it names none (no room id, no
    ``via``: a removed or malformed child)."""
    room_id = stripped.get("state_key")
    content = stripped.get("content")
    ts = stripped.get("origin_server_ts", 0)
    if stripped.get("type") != SPACE_CHILD or not is_valid_room_id(room_id):
        return None
    if not isinstance(content, dict) or not isinstance(content.get("via"), list):
        return None
    via = tuple(v for v in content["via"] if isinstance(v, str) and v)
    if not via:
        return None
    order = content.get("order")
    valid_order = (
        isinstance(order, str)
        and len(order) <= MAX_ORDER_LENGTH
        and all(0x20 <= ord(c) <= 0x7E for c in order)
    )
    return SpaceChild(
        room_id=str(room_id),
        via=via,
        suggested=content.get("suggested") is True,
        order=order if valid_order else None,
        origin_server_ts=ts if isinstance(ts, int) and not isinstance(ts, bool) else 0,
    )


def ordered_children(
    children_state: Iterable[Mapping[str, Any]], suggested_only: bool
) -> list[SpaceChild]:
    """The valid children of ``children_state`` in the spec's order (only
    the suggested ones with ``suggested_only``)."""
    children = [c for c in map(space_child, children_state) if c is not None]
    if suggested_only:
        children = [c for c in children if c.suggested]
    return sorted(
        children,
        key=lambda c: (c.order is None, c.order or "", c.origin_server_ts, c.room_id),
    )


@attr.s(slots=True, frozen=True, auto_attribs=True)
class WalkToken:
    """Where a paginated walk stands (``from``/``next_batch``)."""

    offset: int
    max_depth: int
    suggested_only: bool

    def encode(self) -> str:
        return f"{self.offset}_{self.max_depth}_{int(self.suggested_only)}"

    @classmethod
    def parse(cls, token: str) -> WalkToken:
        """The token ``encode`` made; 400 ``M_INVALID_PARAM`` otherwise."""
        parts = token.split("_")
        if len(parts) != 3 or not all(p.isascii() and p.isdigit() and len(p) < 10 for p in parts):
            raise SynapseError(400, "Unknown 'from' token", Codes.INVALID_PARAM)
        if parts[2] not in ("0", "1"):
            raise SynapseError(400, "Unknown 'from' token", Codes.INVALID_PARAM)
        return cls(int(parts[0]), int(parts[1]), parts[2] == "1")


def may_see(
    summary: Mapping[str, Any], membership: str | None, joined_rooms: frozenset[str]
) -> bool:
    """Whether a user with ``membership`` of the room, joined to
    ``joined_rooms``, may see the room ``summary`` describes (the spec's
    list; see the module docstring)."""
    if membership in ("join", "invite"):
        return True
    join_rule = summary.get("join_rule")
    if join_rule in OPEN_JOIN_RULES or summary.get("world_readable") is True:
        return True
    allowed = summary.get("allowed_room_ids") or ()
    return join_rule in RESTRICTED_JOIN_RULES and any(r in joined_rooms for r in allowed)


@attr.s(slots=True, auto_attribs=True)
class _Walk:
    """One walk's budget of rooms and remote questions."""

    remote_queries: int = 0
    #: Rooms a remote space's server said we cannot peek or join: not asked about.
    inaccessible: set[str] = attr.ib(factory=set)


class SpaceHierarchyHandler:
    def __init__(
        self,
        store: GenericWorkerStore,
        server_name: str,
        clock: Clock,
        directory: DirectoryHandler,
        remote: FederationQueries | None,
    ) -> None:
        """``remote``: asks other servers about spaces and rooms not ours
        (None: only our rooms are described)."""
        self._store = store
        self._server_name = server_name
        self._clock = clock
        self._directory = directory
        self._remote = remote
        #: (room id, suggested_only) -> (expiry, answer or None for a failure).
        self._cache: dict[tuple[str, bool], tuple[int, RemoteHierarchy | None]] = {}

    # Summaries of our rooms

    async def is_ours(self, room_id: str) -> bool:
        """Whether a user of ours is joined to the room (its state is current here)."""
        joined = await self._store.get_users_in_room(room_id)
        return any(server_of(u) == self._server_name for u in joined)

    async def local_summary(self, room_id: str) -> dict[str, Any]:
        """The spec's room summary of a room we hold, with its
        ``children_state`` (stripped ``m.space.child`` events with their
        ``origin_server_ts``), from the current state."""
        summary = await self._directory.room_entry(room_id)
        state_ids = await self._store.get_current_state_ids(room_id)
        wanted = [
            event_id
            for (event_type, _key), event_id in state_ids.items()
            if event_type == SPACE_CHILD
            or (event_type, _key) in {("m.room.encryption", ""), ("m.room.join_rules", "")}
        ]
        events = await self._store.get_events(wanted)
        children: list[dict[str, Any]] = []
        for event in sorted(events.values(), key=lambda e: e.state_key or ""):
            if event.type == SPACE_CHILD:
                children.append(_stripped(event))
            elif event.type == "m.room.encryption":
                algorithm = event.content.get("algorithm")
                if algorithm == "m.megolm.v1.aes-sha2":
                    summary["encryption"] = algorithm
            elif summary.get("join_rule") in RESTRICTED_JOIN_RULES:
                allow = event.content.get("allow")
                summary["allowed_room_ids"] = [
                    a["room_id"]
                    for a in (allow if isinstance(allow, list) else [])
                    if isinstance(a, dict)
                    and a.get("type") == "m.room_membership"
                    and isinstance(a.get("room_id"), str)
                ]
        summary["room_version"] = (await self._store.get_room_version(room_id)).identifier
        summary["children_state"] = children
        return summary

    async def _server_may_see(self, origin: str, room_id: str, summary: Mapping[str, Any]) -> bool:
        if not await room_allows_server(self._store, room_id, origin):
            return False
        if summary.get("world_readable") is True or summary.get("join_rule") not in (
            "invite",
            "private",
        ):
            return True
        state_ids = await self._store.get_current_state_ids(room_id)
        theirs = [
            event_id
            for (event_type, user_id), event_id in state_ids.items()
            if event_type == "m.room.member" and server_of(user_id) == origin
        ]
        events = await self._store.get_events(theirs)
        return any(e.content.get("membership") in ("join", "invite") for e in events.values())

    # Federation: served

    async def on_federation_hierarchy(
        self, origin: str, room_id: str, suggested_only: bool
    ) -> dict[str, Any]:
        """``GET /_matrix/federation/v1/hierarchy/{roomId}`` (module docstring)."""
        if not await self.is_ours(room_id):
            raise NotFoundError("Unknown room", Codes.NOT_FOUND)
        room = await self.local_summary(room_id)
        if not await self._server_may_see(origin, room_id, room):
            raise NotFoundError("Unknown room", Codes.NOT_FOUND)
        children: list[dict[str, Any]] = []
        inaccessible: list[str] = []
        for child in ordered_children(room["children_state"], suggested_only):
            if not await self.is_ours(child.room_id):
                continue
            summary = await self.local_summary(child.room_id)
            if await self._server_may_see(origin, child.room_id, summary):
                summary.pop("children_state")
                children.append(summary)
            else:
                inaccessible.append(child.room_id)
        return {"room": room, "children": children, "inaccessible_children": inaccessible}

    # Federation: used

    async def _remote_hierarchy(
        self, room_id: str, via: Iterable[str], suggested_only: bool, walk: _Walk
    ) -> RemoteHierarchy | None:
        """Another server's answer about ``room_id`` (cached), asking the
        ``via`` servers in turn; None when none answered (or no budget is left)."""
        if self._remote is None:
            return None
        now = self._clock.time_msec()
        cached = self._cache.get((room_id, suggested_only))
        if cached is not None and cached[0] > now:
            return cached[1]
        servers = [s for s in dict.fromkeys(via) if s != self._server_name][:MAX_VIA]
        answer: RemoteHierarchy | None = None
        for server in servers:
            if walk.remote_queries >= MAX_REMOTE_QUERIES:
                return None
            walk.remote_queries += 1
            try:
                answer = await self._remote.hierarchy(server, room_id, suggested_only)
                break
            except SynapseError as e:
                logger.info("No hierarchy of %s from %s: %s", room_id, server, e.msg)
        if len(self._cache) >= MAX_REMOTE_CACHE:
            self._cache.pop(next(iter(self._cache)))
        self._cache[(room_id, suggested_only)] = (now + REMOTE_CACHE_MS, answer)
        return answer

    # Clients (and the admin API)

    async def hierarchy(
        self,
        user_id: str | None,
        room_id: str,
        *,
        limit: int | None,
        max_depth: int | None,
        suggested_only: bool,
        from_token: str | None,
    ) -> dict[str, Any]:
        """A page of the walk from ``room_id`` as ``user_id`` may see it
        (``None``: the admin API's, every room of ours and nothing asked of
        other servers). 403 when the user may not see the space itself (or
        we know nothing of it; for the admin API a 404); 400 for a bad
        ``from`` or a ``limit`` of 0."""
        if limit is not None and limit < 1:
            raise SynapseError(400, "'limit' must be greater than zero", Codes.INVALID_PARAM)
        size = min(limit or DEFAULT_LIMIT, MAX_LIMIT)
        depth = MAX_DEPTH if max_depth is None else min(max_depth, MAX_DEPTH)
        offset = 0
        if from_token is not None:
            token = WalkToken.parse(from_token)
            if token.max_depth != depth or token.suggested_only != suggested_only:
                raise SynapseError(
                    400,
                    "suggested_only and max_depth cannot change on paginated requests",
                    Codes.INVALID_PARAM,
                )
            offset = token.offset
        joined_rooms = (
            await self._store.get_rooms_for_user(user_id) if user_id is not None else frozenset()
        )
        walk = _Walk()
        rooms: list[dict[str, Any]] = []
        more = False
        queue: deque[tuple[str, int, tuple[str, ...], dict[str, Any] | None]] = deque(
            [(room_id, 0, (server_of(room_id),) if server_of(room_id) else (), None)]
        )
        seen: set[str] = set()
        while queue and len(seen) < MAX_WALK:
            current, level, via, known = queue.popleft()
            if current in seen:
                continue
            seen.add(current)
            summary, children = await self._describe(
                user_id, joined_rooms, current, via, known, suggested_only, walk
            )
            if summary is None:
                if level == 0 and user_id is None:
                    raise NotFoundError("Unknown room", Codes.NOT_FOUND)
                if level == 0:
                    raise AuthError(403, "You are not allowed to view this room.")
                continue
            if len(rooms) >= offset + size:
                more = True
                break
            rooms.append(summary)
            if level < depth:
                for child in ordered_children(summary["children_state"], suggested_only):
                    if child.room_id not in seen and child.room_id not in walk.inaccessible:
                        queue.append(
                            (child.room_id, level + 1, child.via, children.get(child.room_id))
                        )
        result: dict[str, Any] = {"rooms": rooms[offset:]}
        if more:
            result["next_batch"] = WalkToken(offset + size, depth, suggested_only).encode()
        return result

    async def _describe(
        self,
        user_id: str | None,
        joined_rooms: frozenset[str],
        room_id: str,
        via: tuple[str, ...],
        known: dict[str, Any] | None,
        suggested_only: bool,
        walk: _Walk,
    ) -> tuple[dict[str, Any] | None, dict[str, dict[str, Any]]]:
        """The room's summary as ``user_id`` may see it (None when it may
        not, or nothing is known of it) and the summaries of its children
        its server gave (a remote space's answer)."""
        if user_id is None:
            if await self._store.get_room(room_id) is None:
                return None, {}
            return await self.local_summary(room_id), {}
        membership_row = await self._store.get_membership_in_room(user_id, room_id)
        membership = membership_row[0] if membership_row is not None else None
        if await self.is_ours(room_id):
            summary = await self.local_summary(room_id)
            return (summary if may_see(summary, membership, joined_rooms) else None), {}
        if known is not None and known.get("room_type") != "m.space":
            # A room (not a space) its parent's server described: no need to ask.
            summary = {**known, "children_state": []}
            return (summary if may_see(summary, membership, joined_rooms) else None), {}
        answer = await self._remote_hierarchy(room_id, via, suggested_only, walk)
        if answer is None:
            return None, {}
        if not may_see(answer.room, membership, joined_rooms):
            return None, {}
        walk.inaccessible.update(answer.inaccessible)
        return dict(answer.room), dict(answer.children)


def _stripped(event: Event) -> dict[str, Any]:
    return {
        "type": event.type,
        "state_key": event.state_key or "",
        "content": event.content,
        "sender": event.sender,
        "origin_server_ts": event.origin_server_ts,
    }
