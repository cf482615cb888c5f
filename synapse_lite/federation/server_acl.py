"""``m.room.server_acl`` (client-server spec, "Server Access Control
Lists"): which servers a room lets take part. Pure: the event's content and
a server name in, allowed or not out.

In order: a server name is compared without its port; an IP literal
(``1.2.3.4``, ``[::1]``) is denied when ``allow_ip_literals`` is false
(default true); a name matching a ``deny`` glob is denied; a name matching
an ``allow`` glob is allowed; anything else is denied (so an ACL without
``allow`` denies every server). Globs have ``*`` (any run of characters)
and ``?`` (one character), compared case-insensitively; entries that are
not strings are ignored.

:func:`room_acl` reads a room's current ACL from the store (the one place
every inbound endpoint, the ``/send`` EDU filter and the outbound sender
read it).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Protocol


class _StateReader(Protocol):
    async def get_current_state_ids(self, room_id: str) -> Mapping[tuple[str, str], str]: ...

    async def get_event(self, event_id: str) -> Any: ...


def host_of(server_name: str) -> str:
    """A server name without its port (``[v6]`` keeps its brackets)."""
    if server_name.startswith("["):
        end = server_name.find("]")
        return server_name if end < 0 else server_name[: end + 1]
    return server_name.rsplit(":", 1)[0] if ":" in server_name else server_name


def is_ip_literal(host: str) -> bool:
    literal = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(literal)
    except ValueError:
        return False
    return True


@lru_cache(maxsize=1024)
def _glob(pattern: str) -> re.Pattern[str]:
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(body, re.IGNORECASE | re.DOTALL)


def _matches(patterns: Any, host: str) -> bool:
    if not isinstance(patterns, list):
        return False
    return any(isinstance(p, str) and _glob(p).fullmatch(host) for p in patterns)


def server_allowed(acl: Mapping[str, Any], server_name: str) -> bool:
    """Whether the ACL content ``acl`` lets ``server_name`` take part."""
    host = host_of(server_name)
    if acl.get("allow_ip_literals", True) is False and is_ip_literal(host):
        return False
    if _matches(acl.get("deny", []), host):
        return False
    return _matches(acl.get("allow", []), host)


async def room_acl(store: _StateReader, room_id: str) -> Mapping[str, Any] | None:
    """The content of ``room_id``'s current ``m.room.server_acl``, or None
    when it has none (or we do not have the room): every server allowed."""
    acl_id = (await store.get_current_state_ids(room_id)).get(("m.room.server_acl", ""))
    acl = await store.get_event(acl_id) if acl_id is not None else None
    return acl.content if acl is not None else None


async def room_allows_server(store: _StateReader, room_id: str, server_name: str) -> bool:
    """Whether ``room_id``'s current ACL lets ``server_name`` take part
    (true when the room has none)."""
    acl = await room_acl(store, room_id)
    return acl is None or server_allowed(acl, server_name)


#: Room EDUs whose room ACL applies (the server-server spec's "Server Access
#: Control Lists"): a typing notification names one room, a receipt EDU maps
#: room ids to receipts.
TYPING_EDU = "m.typing"
RECEIPT_EDU = "m.receipt"


async def acl_filtered_edu(
    store: _StateReader, origin: str, edu: dict[str, Any]
) -> dict[str, Any] | None:
    """``edu`` (an object with an object ``content``) as ``origin`` may
    send it: ``None`` for an ``m.typing`` about a room whose ACL denies
    ``origin``; an ``m.receipt`` without the rooms whose ACL denies it (None
    when none is left); any other EDU unchanged."""
    content = edu["content"]
    if edu.get("edu_type") == TYPING_EDU:
        room_id = content.get("room_id")
        if isinstance(room_id, str) and not await room_allows_server(store, room_id, origin):
            return None
        return edu
    if edu.get("edu_type") == RECEIPT_EDU:
        kept = {
            room_id: receipts
            for room_id, receipts in content.items()
            if await room_allows_server(store, room_id, origin)
        }
        if len(kept) == len(content):
            return edu
        return {**edu, "content": kept} if kept else None
    return edu
