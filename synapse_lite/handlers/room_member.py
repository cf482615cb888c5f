"""Joining, knocking, inviting, leaving and kicking: membership events,
checked and persisted by the room's writer like any event (which also vouches
for joins a restricted join rule admits, see ``message.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from synapse_lite.api.errors import AuthError, Codes, NotFoundError, SynapseError
from synapse_lite.api.identifiers import is_mine_id, server_of
from synapse_lite.events import Event, EventSpec
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.profile import (
    PROFILE_FIELDS,
    ProfileReader,
    check_profile_value,
    member_content,
    profile_of,
)

if TYPE_CHECKING:
    from synapse_lite.appservice.queries import AppServiceQueries
    from synapse_lite.clock import Clock
    from synapse_lite.handlers.federation_join import FederationJoinHandler
    from synapse_lite.handlers.message import EventCreationHandler
    from synapse_lite.handlers.room_upgrade import UpgradedRoomUserState

#: action -> the membership it sets
ACTIONS = {
    "join": "join",
    "knock": "knock",
    "invite": "invite",
    "leave": "leave",
    "kick": "leave",
    "ban": "ban",
    "unban": "leave",
}
#: Actions a user takes on themself.
SELF_ACTIONS = ("join", "knock", "leave")
#: Keys of a join request's body that are the request's, not the member
#: event's content.
JOIN_REQUEST_KEYS = ("third_party_signed", "membership")


def with_join_request(content: dict[str, Any], join_content: dict[str, Any]) -> dict[str, Any]:
    """A join's member ``content`` with what the join request's body adds:
    extra keys are the client's to add (the spec leaves them to the server;
    the reference server keeps them too), and a per-room ``displayname`` or
    ``avatar_url`` replaces the profile's (an empty one removes it)."""
    extra = {k: v for k, v in join_content.items() if k not in JOIN_REQUEST_KEYS}
    content = {**extra, **content}
    for field in PROFILE_FIELDS:
        if field in join_content:
            value = check_profile_value(field, join_content[field])
            content.pop(field, None)
            if value:
                content[field] = value
    return content


class RoomMemberStore(ProfileReader, Protocol):
    """The store reads of :class:`RoomMemberHandler`."""

    async def forget_room(self, user_id: str, room_id: str) -> None: ...

    async def get_event(self, event_id: str) -> Event | None: ...

    async def get_membership_in_room(
        self, user_id: str, room_id: str
    ) -> tuple[str, str] | None: ...

    async def get_rooms_for_user(self, user_id: str) -> frozenset[str]: ...

    async def get_user(self, user_id: str) -> dict[str, Any] | None: ...

    async def get_users_in_room(self, room_id: str) -> frozenset[str]: ...

    async def is_room_blocked(self, room_id: str) -> bool: ...

    async def room_exists(self, room_id: str) -> bool: ...

    async def unforget_room(self, user_id: str, room_id: str) -> None: ...


class RoomMemberHandler:
    """Membership changes requested by clients."""

    def __init__(
        self,
        store: RoomMemberStore,
        clock: Clock,
        server_name: str,
        events: EventCreationHandler,
        upgraded_rooms: UpgradedRoomUserState | None,
        app_service_queries: AppServiceQueries,
        remote: FederationJoinHandler | None = None,
    ) -> None:
        """``upgraded_rooms``: carries a user's settings into a room that
        replaces one they were in, when they join it. ``app_service_queries``:
        asks application services about invited users nobody has yet.
        ``remote``: joins and leaves in rooms of other servers (None: none)."""
        self._remote = remote
        self._app_service_queries = app_service_queries
        self._store = store
        self._clock = clock
        self._server_name = server_name
        self._events = events
        self._upgraded_rooms = upgraded_rooms

    # Reads of the servlets (they go through handlers, not to the store).

    async def joined_rooms(self, user_id: str) -> frozenset[str]:
        """The rooms a local user is joined to now."""
        return await self._store.get_rooms_for_user(user_id)

    async def share_a_room(self, user_id: str, other_user_id: str) -> bool:
        """Whether two local users are joined to a room together now."""
        mine = await self._store.get_rooms_for_user(user_id)
        return bool(mine & await self._store.get_rooms_for_user(other_user_id))

    async def check_joined(self, user_id: str, room_id: str) -> None:
        """403 unless ``user_id`` is joined to the room now."""
        if user_id not in await self._store.get_users_in_room(room_id):
            raise AuthError(403, "You are not in this room")

    async def forget(self, user_id: str, room_id: str) -> None:
        """``POST /rooms/{roomId}/forget``: 404 for a room the user was never
        in, 400 while they are still joined or invited."""
        current = await self._store.get_membership_in_room(user_id, room_id)
        if current is None:
            raise SynapseError(404, "You were never in this room", Codes.NOT_FOUND)
        if current[0] in ("join", "invite"):
            raise SynapseError(400, "Leave the room before forgetting it", Codes.UNKNOWN)
        await self._store.forget_room(user_id, room_id)

    async def update_membership(
        self,
        requester: Requester,
        room_id: str,
        action: str,
        target: str | None = None,
        reason: str | None = None,
        join_content: dict[str, Any] | None = None,
        servers: Sequence[str] = (),
    ) -> str:
        """Apply ``action`` to ``target`` (the requester for join and leave);
        returns the membership event's id. ``join_content``: what a join
        request's body adds to the member event's content (per-room
        ``displayname`` and ``avatar_url`` too; not ``membership``).
        ``servers``: where to join a room of other servers through (the
        request's ``via``, a remote alias's servers)."""
        user_id = requester.user_id
        membership = ACTIONS[action]
        target = user_id if action in SELF_ACTIONS else target
        assert target is not None
        if action == "invite" and target == user_id:
            # Whoever can ask is in the room already (or may not invite).
            raise AuthError(403, "You cannot invite yourself")
        if action in ("kick", "ban") and target == user_id:
            raise SynapseError(400, f"You cannot {action} yourself", Codes.INVALID_PARAM)
        if action == "invite" and not is_mine_id(target, self._server_name):
            return await self._invite_remote(requester, room_id, target, reason)
        if action == "invite":
            if not await self._app_service_queries.user_exists(target):
                raise NotFoundError(f"Unknown user {target}")
        if action == "knock" and self._remote is not None:
            knocked = await self._remote_knock(user_id, room_id, reason, servers)
            if knocked is not None:
                return knocked
        if action in ("join", "leave") and self._remote is not None:
            remote = await self._remote_membership(
                requester, room_id, action, reason, join_content, servers
            )
            if remote is not None:
                return remote
        if not await self._store.room_exists(room_id):
            raise NotFoundError("Unknown room")
        if action in ("join", "knock", "invite") and await self._store.is_room_blocked(room_id):
            # An admin blocked it (the admin API's room deletion).
            raise AuthError(403, "This room has been blocked on this server")
        current = await self._store.get_membership_in_room(target, room_id)
        current_membership = current[0] if current is not None else None
        if action == "join" and current is not None and current[0] == "join":
            # Joining twice changes nothing: no new event.
            return current[1]
        # Both set "leave": a kick is of a member (a banned user is unbanned,
        # not kicked), an unban of a banned user.
        if action == "kick" and current_membership not in ("join", "invite", "knock"):
            state = "banned: unban them instead" if current_membership == "ban" else "not in it"
            raise AuthError(403, f"Cannot kick {target} from the room: they are {state}")
        if action == "unban" and current_membership != "ban":
            raise AuthError(403, f"{target} is not banned from the room")
        content: dict[str, Any] = {"membership": membership}
        if membership in ("join", "invite", "knock"):
            # The member list shows names: a join (or invite, or knock)
            # carries the target's profile.
            content = member_content(membership, await profile_of(self._store, target))
        if action == "join" and join_content:
            content = with_join_request(content, join_content)
        if reason is not None:
            content["reason"] = reason
        spec = EventSpec(
            type="m.room.member",
            state_key=target,
            sender=user_id,
            content=content,
            origin_server_ts=self._clock.time_msec(),
        )
        [(event_id, _)] = await self._events.send_events(room_id, [spec])
        if membership in ("join", "invite", "knock"):
            # Back in the room: it is not forgotten any more.
            await self._store.unforget_room(target, room_id)
        if membership == "join" and self._upgraded_rooms is not None:
            await self._upgraded_rooms.on_join(target, room_id)
        return event_id

    async def _remote_membership(
        self,
        requester: Requester,
        room_id: str,
        action: str,
        reason: str | None,
        join_content: dict[str, Any] | None,
        servers: Sequence[str],
    ) -> str | None:
        """A join or leave made through another server (the room is not
        ours, or no user of ours is joined to it and another server's is);
        None when it is a local change."""
        assert self._remote is not None
        user_id = requester.user_id
        leaving = user_id if action == "leave" else None
        if not await self._remote.is_remote_room(room_id, leaving):
            return None
        current = await self._store.get_membership_in_room(user_id, room_id)
        # An invite of another server's: joined, or rejected, through the
        # inviter's server first.
        inviter = None
        if current is not None and current[0] == "invite":
            invite = await self._store.get_event(current[1])
            inviter = invite.sender if invite is not None else None
        if action == "leave":
            if current is None or current[0] not in ("join", "invite", "knock"):
                return None
            content: dict[str, Any] = {}
            if reason is not None:
                content["reason"] = reason
            return await self._remote.leave(user_id, room_id, content, inviter)
        if current is not None and current[0] == "join":
            return current[1]
        if inviter is not None:
            servers = [server_of(inviter), *servers]
        if await self._store.is_room_blocked(room_id):
            raise AuthError(403, "This room has been blocked on this server")
        content = member_content("join", await profile_of(self._store, user_id))
        if join_content:
            content = with_join_request(content, join_content)
        if reason is not None:
            content["reason"] = reason
        event_id = await self._remote.join(user_id, room_id, servers, content)
        await self._store.unforget_room(user_id, room_id)
        return event_id

    async def _remote_knock(
        self, user_id: str, room_id: str, reason: str | None, servers: Sequence[str]
    ) -> str | None:
        """A knock made through another server (as a join would be: the room
        is not ours, or no user of ours is joined to it and another
        server's is); None when it is a local knock."""
        assert self._remote is not None
        if not await self._remote.is_remote_room(room_id):
            return None
        if await self._store.is_room_blocked(room_id):
            raise AuthError(403, "This room has been blocked on this server")
        content = member_content("knock", await profile_of(self._store, user_id))
        if reason is not None:
            content["reason"] = reason
        event_id = await self._remote.knock(user_id, room_id, servers, content)
        await self._store.unforget_room(user_id, room_id)
        return event_id

    async def _invite_remote(
        self, requester: Requester, room_id: str, target: str, reason: str | None
    ) -> str:
        """Invite a user of another server (``/v2/invite`` to their server)."""
        if self._remote is None:
            raise SynapseError(
                400, "This server does not federate: invite local users", Codes.INVALID_PARAM
            )
        if not await self._store.room_exists(room_id):
            raise NotFoundError("Unknown room")
        if await self._store.is_room_blocked(room_id):
            raise AuthError(403, "This room has been blocked on this server")
        content: dict[str, Any] = {"membership": "invite"}
        if reason is not None:
            content["reason"] = reason
        return await self._remote.invite(requester.user_id, room_id, target, content)
