"""What every /sync section reads and writes: the request, and the response
being built.

The sync handler (``handlers/sync.py``) fixes the token it will hand out,
reads the user's memberships once, and runs the sections in order over one
:class:`SyncRequest`; each section adds its parts to the one
:class:`SyncResponse`. See ``docs/architecture.md`` ("/sync sections").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attr
from twisted.internet import defer

from synapse_lite.storage.databases.main.roommember import MembershipRow
from synapse_lite.tokens import RoomStreamToken, StreamToken

if TYPE_CHECKING:
    from synapse_lite.handlers.auth import Requester
    from synapse_lite.handlers.filtering import SyncFilter
    from synapse_lite.storage.change_tracker import StreamChangeTracker


@attr.s(slots=True, auto_attribs=True)
class Memberships:
    """A user's rooms as of ``now`` and what changed since ``since``."""

    now: dict[str, MembershipRow]
    #: Rooms with a membership event of the user in (since, now].
    changed: set[str]
    #: For changed rooms: the membership as of ``since`` (None: none).
    at_since: dict[str, str | None]

    def rooms(self, membership: str) -> list[str]:
        return sorted(r for r, row in self.now.items() if row[1] == membership)


class MembershipStore(Protocol):
    """The store reads :func:`load_memberships` and
    :func:`users_sharing_rooms` make."""

    @property
    def membership_changes(self) -> StreamChangeTracker: ...

    async def get_local_memberships_with_positions(
        self, user_id: str
    ) -> tuple[MembershipRow, ...]: ...

    async def get_membership_at(
        self, user_id: str, room_id: str, token: RoomStreamToken
    ) -> MembershipRow | None: ...

    async def get_membership_changes_between(
        self, user_id: str, from_token: RoomStreamToken | None, to_token: RoomStreamToken
    ) -> list[MembershipRow]: ...

    async def get_users_in_room(self, room_id: str) -> frozenset[str]: ...


async def load_memberships(
    store: MembershipStore, user_id: str, since: StreamToken | None, now: RoomStreamToken
) -> Memberships:
    """``user_id``'s memberships as of ``now``, and which changed since ``since``."""
    current: dict[str, MembershipRow] = {}
    for row in await store.get_local_memberships_with_positions(user_id):
        room_id, _, _, position, instance = row
        if now.contains(instance, position):
            current[room_id] = row
        else:
            # Changed after our token: what it was as of the token.
            at_now = await store.get_membership_at(user_id, room_id, now)
            if at_now is not None:
                current[room_id] = at_now
    changed: set[str] = set()
    at_since: dict[str, str | None] = {}
    if (
        since is not None
        and since.room_key != now
        and store.membership_changes.may_have_changed(user_id, since.room_key)
    ):
        for row in await store.get_membership_changes_between(user_id, since.room_key, now):
            changed.add(row[0])
        for room_id in changed:
            before = await store.get_membership_at(user_id, room_id, since.room_key)
            at_since[room_id] = before[1] if before else None
    return Memberships(current, changed, at_since)


async def users_sharing_rooms(store: MembershipStore, user_id: str, joined: list[str]) -> set[str]:
    """``user_id`` and the users joined to any room of ``joined``."""
    users = {user_id}
    for room_id in joined:
        users |= await store.get_users_in_room(room_id)
    return users


@attr.s(slots=True, frozen=True, auto_attribs=True)
class SyncRequest:
    """One computation of a /sync response: the same for every section."""

    requester: Requester
    #: The client's token; None: an initial sync.
    since: StreamToken | None
    full_state: bool
    filter: SyncFilter
    now_ms: int
    memberships: Memberships
    #: The rooms the user is joined to that the filter lets through.
    joined: list[str]
    #: The users sharing a room with the user (the user too).
    sharing: set[str]
    #: Who the user ignores: read beside the first sections, awaited by
    #: those that need it.
    ignored: defer.Deferred[frozenset[str]]

    @property
    def user_id(self) -> str:
        return self.requester.user_id


@attr.s(slots=True, auto_attribs=True)
class SyncResponse:
    """The response as the sections build it."""

    #: The token the response will hand out; a section whose stream reads
    #: differently than the others advance (typing, to-device) moves it.
    now: StreamToken
    #: The top-level parts of the response, by key.
    body: dict[str, Any] = attr.Factory(dict)
    #: Whether any part is news (else a waiting /sync keeps waiting).
    news: bool = False
    #: Per-room events for the rooms' entries, room -> entry key
    #: (``ephemeral``, ``account_data``) -> events: written by the sections
    #: before the rooms section, which places them.
    room_events: dict[str, dict[str, list[dict[str, Any]]]] = attr.Factory(dict)
    #: The ``rooms.join`` entries, once the rooms section has run.
    joined_rooms: dict[str, dict[str, Any]] = attr.Factory(dict)

    def put(self, key: str, value: Any, *, news: bool) -> None:
        """Set the top-level part ``key``; ``news``: it holds something new."""
        self.body[key] = value
        self.news = self.news or news

    def add_room_events(self, room_id: str, key: str, events: list[dict[str, Any]]) -> None:
        self.room_events.setdefault(room_id, {})[key] = events

    def room_events_of(self, room_id: str, key: str) -> list[dict[str, Any]]:
        return self.room_events.get(room_id, {}).get(key, [])


class SyncSection(Protocol):
    """A part of the /sync response (rooms, presence, a new stream's part...)."""

    #: Whether the section reads only the request and writes only its own
    #: parts: such sections start first and run beside the others.
    independent: bool

    async def add_to(self, request: SyncRequest, response: SyncResponse) -> None:
        """Add the section's parts for ``request`` to ``response``, covering
        (``request.since``, ``response.now``]."""


async def run_sections(
    sections: Sequence[SyncSection], request: SyncRequest, response: SyncResponse
) -> None:
    """Run ``sections`` over ``request``: the independent ones started first,
    running beside the others, which run one after the other in order (a
    section sees what those before it wrote). When one fails, the reads still
    running are consumed, never logged as unhandled once they fail too."""
    started = [
        defer.ensureDeferred(section.add_to(request, response))
        for section in sections
        if section.independent
    ]
    try:
        for section in sections:
            if not section.independent:
                await section.add_to(request, response)
        for read in started:
            await read
    finally:
        for read in started:
            read.addErrback(lambda _: None)
