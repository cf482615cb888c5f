"""Profiles: a local user's display name and avatar, and their copies in the
member events of the rooms the user is in.

A user who never set a profile has their localpart as display name and no
avatar. A change is stored by the process that got the request (profiles are
no stream), answered, and then sent as a new ``m.room.member`` join event
into each room the user is joined to, through each room's events writer, in
the background: a user in many rooms does not wait for all of them.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet import defer

from synapse_lite.api.errors import AuthError, Codes, NotFoundError, SynapseError
from synapse_lite.api.identifiers import is_mine_id
from synapse_lite.events import EventSpec
from synapse_lite.handlers.auth import Requester

if TYPE_CHECKING:
    from synapse_lite.appservice.queries import AppServiceQueries
    from synapse_lite.clock import Clock
    from synapse_lite.federation.queries import FederationQueries
    from synapse_lite.handlers.message import EventCreationHandler

logger = logging.getLogger(__name__)

PROFILE_FIELDS = ("displayname", "avatar_url")
#: Longest value of each field accepted, in characters.
MAX_FIELD_LENGTH = {"displayname": 256, "avatar_url": 1000}


def localpart(user_id: str) -> str:
    return user_id[1:].split(":", 1)[0]


#: An RFC 3986 scheme and its colon.
_URI_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def check_profile_value(field: str, value: object) -> str | None:
    """A new value for ``field`` (None clears it), or a 400."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise SynapseError(400, f"'{field}' must be a string", Codes.BAD_JSON)
    if len(value) > MAX_FIELD_LENGTH[field]:
        raise SynapseError(400, f"'{field}' is too long", Codes.BAD_JSON)
    if "\x00" in value:
        raise SynapseError(400, f"'{field}' must not contain NUL", Codes.BAD_JSON)
    if field == "avatar_url" and value and not _URI_SCHEME.match(value):
        # The spec's format is a URI (clients show mxc:// ones; others they
        # may link to or ignore): a scheme is required, not mxc.
        raise SynapseError(
            400, "'avatar_url' must be a URI, e.g. mxc://server/media_id", Codes.BAD_JSON
        )
    return value


class ProfileReader(Protocol):
    async def get_profile(self, user_id: str) -> dict[str, str | None] | None: ...


async def profile_of(store: ProfileReader, user_id: str) -> dict[str, str | None]:
    """A local user's profile (the defaults when they never set one)."""
    stored = await store.get_profile(user_id)
    if stored is None:
        return {"displayname": localpart(user_id), "avatar_url": None}
    return stored


def member_content(membership: str, profile: dict[str, str | None]) -> dict[str, Any]:
    """An ``m.room.member`` content carrying a profile (unset fields left out)."""
    content: dict[str, Any] = {"membership": membership}
    for field in PROFILE_FIELDS:
        if profile.get(field):
            content[field] = profile[field]
    return content


class ProfileHandlerStore(ProfileReader, Protocol):
    """The store reads of :class:`ProfileHandler`."""

    async def get_membership_in_room(
        self, user_id: str, room_id: str
    ) -> tuple[str, str] | None: ...

    async def get_rooms_for_user(self, user_id: str) -> frozenset[str]: ...

    async def get_user(self, user_id: str) -> dict[str, Any] | None: ...

    async def set_profile_field(
        self, user_id: str, field: str, value: str | None, default_name: str
    ) -> None: ...


class ProfileHandler:
    """``GET /profile/{userId}[/{field}]``, ``PUT /profile/{userId}/{field}``."""

    def __init__(
        self,
        store: ProfileHandlerStore,
        clock: Clock,
        server_name: str,
        events: EventCreationHandler,
        app_service_queries: AppServiceQueries,
        remote: FederationQueries | None = None,
    ) -> None:
        """``app_service_queries``: asks application services about users
        nobody has yet; ``remote``: asks other servers about theirs (None:
        other servers' users have no profile here)."""
        self._app_service_queries = app_service_queries
        self._remote = remote
        self._store = store
        self._clock = clock
        self._server_name = server_name
        self._events = events
        #: Background updates of member events under way (tests wait on them).
        self.updates_in_flight: set[defer.Deferred[None]] = set()

    async def get_profile(self, user_id: str) -> dict[str, str | None]:
        """A user of ours, or another server's (asked of it: its 404 is
        ours, and so is one saying why when it cannot be asked); 404 for a
        user nobody has."""
        if not is_mine_id(user_id, self._server_name):
            if self._remote is None or ":" not in user_id:
                raise NotFoundError("Profile not found")
            try:
                return dict(await self._remote.profile(user_id))
            except NotFoundError:
                raise NotFoundError("Profile not found") from None
        if not await self._app_service_queries.user_exists(user_id):
            raise NotFoundError("Profile not found")
        return await profile_of(self._store, user_id)

    async def set_field(
        self, requester: Requester, user_id: str, field: str, value: str | None
    ) -> None:
        if user_id != requester.user_id:
            raise AuthError(403, "Cannot change another user's profile")
        await self._store.set_profile_field(user_id, field, value, localpart(user_id))
        profile = await profile_of(self._store, user_id)
        rooms = sorted(await self._store.get_rooms_for_user(user_id))
        if rooms:
            update = defer.ensureDeferred(self._update_rooms(user_id, rooms, profile))
            self.updates_in_flight.add(update)
            update.addBoth(lambda _: self.updates_in_flight.discard(update))

    async def _update_rooms(
        self, user_id: str, rooms: list[str], profile: dict[str, str | None]
    ) -> None:
        for room_id in rooms:
            current = await self._store.get_membership_in_room(user_id, room_id)
            if current is None or current[0] != "join":
                continue  # left meanwhile
            spec = EventSpec(
                type="m.room.member",
                state_key=user_id,
                sender=user_id,
                content=member_content("join", profile),
                origin_server_ts=self._clock.time_msec(),
            )
            try:
                await self._events.send_events(room_id, [spec])
            except Exception:
                # One room failing (it moved writer, the user was kicked just
                # now) must not stop the others.
                logger.warning(
                    "Could not update %s's profile in %s", user_id, room_id, exc_info=True
                )
