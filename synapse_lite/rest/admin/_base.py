"""What the admin servlets share: path patterns and query parameters."""

from __future__ import annotations

from twisted.web.server import Request

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.http.server import query_string

ADMIN_PREFIX = "/_synapse/admin"

#: Largest page a listing returns.
MAX_PAGE = 1000


def admin_path(version: str, pattern: str) -> str:
    """An admin API path pattern (``version``: ``v1``, ``v2``, or a regex
    alternative such as ``v[23]``)."""
    return f"{ADMIN_PREFIX}/{version}{pattern}"


def query_choice(
    request: Request, name: str, choices: tuple[str, ...] | list[str], default: str
) -> str:
    """A query parameter that must be one of ``choices``, or a 400."""
    value = query_string(request, name, default)
    assert value is not None
    if value not in choices:
        raise SynapseError(
            400,
            f"Query parameter {name!r} must be one of {', '.join(sorted(choices))}",
            Codes.INVALID_PARAM,
        )
    return value


def query_descending(request: Request) -> bool:
    """``dir``: ``f`` (forwards, the default) or ``b`` (backwards)."""
    return query_choice(request, "dir", ("f", "b"), "f") == "b"
