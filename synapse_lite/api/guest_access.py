"""What a guest account may call: the spec's list (client-server API, "Guest
access", client behaviour), declared by servlet name like the routing
declarations (``rest/client/served_by.py``).

Every other servlet refuses a guest's token with ``403
M_GUEST_ACCESS_FORBIDDEN`` (``handlers/auth.py`` checks each authenticated
request against this table). Beyond the spec's list, a guest may also ask
who it is, keep /sync filters, log out and read the capabilities: what a
client needs to use the rest, and nothing anyone else could be harmed by.
"""

from __future__ import annotations

from collections.abc import Mapping

import attr


@attr.s(slots=True, frozen=True, auto_attribs=True)
class GuestRule:
    """The methods of one servlet a guest may call, and, where the spec
    allows only some paths of it, the path parameters those must have."""

    methods: frozenset[str]
    path: Mapping[str, str] = attr.ib(factory=dict)

    def allows(self, method: str, path_args: Mapping[str, str]) -> bool:
        return method in self.methods and all(
            path_args.get(name) == value for name, value in self.path.items()
        )


def _rule(*methods: str, **path: str) -> GuestRule:
    return GuestRule(frozenset(methods), path)


#: Servlet name -> what of it guests may call.
GUEST_SERVLETS: Mapping[str, GuestRule] = {
    # Retrieving events (and their media).
    "state": _rule("GET"),
    "context": _rule("GET"),
    "room_event": _rule("GET"),
    "messages": _rule("GET"),
    "members": _rule("GET"),
    "room_initial_sync": _rule("GET"),
    "sync": _rule("GET"),
    # "as used for room previews": a guest must name the room (the handler
    # refuses the global stream).
    "events": _rule("GET"),
    "media_download": _rule("GET"),
    "media_thumbnail": _rule("GET"),
    "media_config": _rule("GET"),
    # Sending events: joining (a room's own path, or by id or alias) and
    # leaving, messages, to-device messages.
    "join": _rule("POST"),
    "leave": _rule("POST"),
    "send": _rule("PUT", event_type="m.room.message"),
    "send_to_device": _rule("PUT"),
    # Their own account: the display name and their devices.
    "profile_update": _rule("PUT", field="displayname"),
    "devices": _rule("GET", "PUT"),
    # End-to-end encryption.
    "keys_upload": _rule("POST"),
    "keys_query": _rule("POST"),
    "keys_claim": _rule("POST"),
    # Beyond the spec's list: what a client needs to use the above.
    "whoami": _rule("GET"),
    "filter": _rule("GET", "POST"),
    "capabilities": _rule("GET"),
    "logout": _rule("POST"),
}


def guest_may_call(servlet: str, method: str, path_args: Mapping[str, str]) -> bool:
    """Whether a guest may call ``method`` on ``servlet`` with these path parameters."""
    rule = GUEST_SERVLETS.get(servlet)
    return rule is not None and rule.allows(method, path_args)
