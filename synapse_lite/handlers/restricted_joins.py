"""Who vouches for a join that only a restricted join rule admits (room
versions 8 on, docs/rooms.md and docs/federation.md "Restricted joins"): a
member of ours who may invite, named in ``join_authorised_via_users_server``
when the joining user is joined to one of the rooms of the rule's ``allow``
conditions. One decision for a local user's join (the events writer) and a
remote user's (``make_join``/``send_join``, we being the resident server)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from synapse_lite.api.errors import AuthError
from synapse_lite.api.identifiers import server_of
from synapse_lite.event_graph.pdu import StateKey
from synapse_lite.handlers.event_auth import AUTH_STATE_TYPES, RoomAuthState, allowed_rooms

if TYPE_CHECKING:
    from collections.abc import Mapping

    from synapse_lite.storage.databases.main import GenericWorkerStore


class UnableToAuthoriseJoin(AuthError):
    """The user is in none of the allowed rooms we hold, and we are in none
    of those rooms to tell (over federation: 400 ``M_UNABLE_TO_AUTHORISE_JOIN``)."""


class UnableToGrantJoin(AuthError):
    """No member of ours may invite (over federation: 400
    ``M_UNABLE_TO_GRANT_JOIN``, so the joining server tries another)."""


async def load_auth_state(
    store: GenericWorkerStore, room_id: str, users: Iterable[str]
) -> tuple[RoomAuthState, Mapping[StateKey, str]]:
    """What the rules need of the room's current state (its auth state
    events and the member events of ``users``), and the ids of that state."""
    state_ids = await store.get_current_state_ids(room_id)
    wanted = [state_ids[(t, "")] for t in AUTH_STATE_TYPES if (t, "") in state_ids]
    wanted += [state_ids[("m.room.member", u)] for u in users if ("m.room.member", u) in state_ids]
    events = await store.get_events(wanted)
    return RoomAuthState.from_events(room_id, events.values()), state_ids


async def restricted_join_authoriser(
    store: GenericWorkerStore, server_name: str, room_id: str, user_id: str, state: RoomAuthState
) -> str | None:
    """The member of ours who vouches for ``user_id``'s join to ``room_id``
    (``state``: its current auth state, with ``user_id``'s membership);
    None when the join needs none (the rule is not restricted, or the user
    is invited, joined or banned: the rules decide). The most powerful
    member of ours who may invite, then by id (the same choice every time).
    :class:`UnableToAuthoriseJoin` when the user is in none of the allowed
    rooms and we are in none of them either, 403 when we are in one and
    the user is not, :class:`UnableToGrantJoin` when no member of ours may
    invite. ``state.members`` gets the room's joined members."""
    version = state.version
    if state.join_rule not in version.restricted_rules or state.members.get(user_id) in (
        "invite",
        "join",
        "ban",
    ):
        return None
    resident = False
    for allowed_room in allowed_rooms(state.join_rule_allow):
        membership = await store.get_membership_in_room(user_id, allowed_room)
        if membership is not None and membership[0] == "join":
            break
        joined = await store.get_users_in_room(allowed_room)
        resident = resident or any(server_of(m) == server_name for m in joined)
    else:
        hint = " (or knock)" if state.join_rule in version.knock_rules else ""
        message = (
            "You are not in any of the rooms whose members may join this room:"
            f" ask for an invite{hint}"
        )
        if not resident and server_of(user_id) != server_name:
            raise UnableToAuthoriseJoin(403, message)
        raise AuthError(403, message)
    members = await store.get_users_in_room(room_id)
    for member in members:
        state.members.setdefault(member, "join")
    candidates = [m for m in members if server_of(m) == server_name and state.can_invite(m)]
    if not candidates:
        raise UnableToGrantJoin(403, "No member of this room may authorise your join")
    return min(candidates, key=lambda m: (-state.user_level(m), m))
