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
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any


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
