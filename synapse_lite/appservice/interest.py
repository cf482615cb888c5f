"""Which events concern an application service: a pure function over the
event and what its room is (members, aliases), so it is tested without a
database and asked the same way everywhere.

An event concerns a service when its sender or (membership events) its
state key is one of the service's users, when its room id matches a rooms
namespace, when one of the room's aliases matches an aliases namespace, or
when a local user of the service is joined to the room (the spec: "is a
joined member of the room where the event occurred"). User namespaces only
ever cover local users: a remote user matching one is ignored.

What a user does outside rooms (presence, MSC2409; device list changes,
MSC3202) concerns a service when the user is one of its users or shares a
room with one of them.
"""

from __future__ import annotations

from collections.abc import Iterable

from synapse_lite.appservice.registration import ApplicationService


def is_local(user_id: str, server_name: str) -> bool:
    return user_id.endswith(":" + server_name)


def event_concerns_service(
    service: ApplicationService,
    server_name: str,
    *,
    room_id: str,
    sender: str,
    event_type: str,
    state_key: str | None,
    joined_members: Iterable[str],
    room_aliases: Iterable[str],
) -> bool:
    def ours(user_id: str) -> bool:
        return is_local(user_id, server_name) and service.is_user_in_namespace(user_id)

    if ours(sender):
        return True
    if event_type == "m.room.member" and state_key is not None and ours(state_key):
        return True
    if service.is_room_in_namespace(room_id):
        return True
    if any(service.is_alias_in_namespace(alias) for alias in room_aliases):
        return True
    return any(ours(member) for member in joined_members)


def user_concerns_service(
    service: ApplicationService,
    server_name: str,
    *,
    user_id: str,
    members_of_shared_rooms: Iterable[Iterable[str]],
) -> bool:
    """``members_of_shared_rooms``: the joined members of each room
    ``user_id`` is joined to."""

    def ours(member: str) -> bool:
        return is_local(member, server_name) and service.is_user_in_namespace(member)

    return ours(user_id) or any(any(ours(m) for m in room) for room in members_of_shared_rooms)
