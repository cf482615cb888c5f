"""``GET /_matrix/client/versions`` and ``GET /capabilities``.

Discovery tells the truth: a spec version is listed only when every endpoint
that version needs a client to find is routed by this server. The check is
made against the routes actually registered (not a list kept by hand), so a
module landing later (push rules, end-to-end keys) turns the versions on by
itself, and one going missing turns them off. See docs/client-api.md.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.room_versions import DEFAULT_ROOM_VERSION, KNOWN_ROOM_VERSIONS
from synapse_lite.http.server import JsonResource
from synapse_lite.rest.client.sliding_sync import PATH as SLIDING_SYNC_PATH
from synapse_lite.rest.client.sliding_sync import UNSTABLE_FEATURE

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers

#: A client-server path the spec has every server of a version serve, as
#: ``(method, example path)``: the server claims the version only when each
#: is routed. Media is served by the media instance (always configured), so
#: it is not looked up here.
_BASE_MODULES: tuple[tuple[str, str], ...] = (
    ("GET", "/_matrix/client/v3/sync"),
    ("GET", "/_matrix/client/v3/profile/@u:h"),
    ("PUT", "/_matrix/client/v3/profile/@u:h/displayname"),
    ("GET", "/_matrix/client/v3/rooms/!r:h/event/$e"),
    ("GET", "/_matrix/client/v3/rooms/!r:h/context/$e"),
    ("PUT", "/_matrix/client/v3/rooms/!r:h/redact/$e/t"),
    ("GET", "/_matrix/client/v3/user/@u:h/rooms/!r:h/tags"),
    ("GET", "/_matrix/client/v3/directory/room/%23a:h"),
    ("GET", "/_matrix/client/v3/publicRooms"),
    ("POST", "/_matrix/client/v3/user_directory/search"),
    ("GET", "/_matrix/client/v3/pushrules/"),
    ("POST", "/_matrix/client/v3/keys/upload"),
    ("POST", "/_matrix/client/v3/keys/query"),
)

#: Each version with what it adds to the one before (cumulative).
VERSION_MODULES: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("r0.6.1", _BASE_MODULES),
    ("v1.1", ()),
    ("v1.2", (("GET", "/_matrix/client/v1/rooms/!r:h/hierarchy"),)),
    ("v1.3", (("GET", "/_matrix/client/v1/rooms/!r:h/relations/$e"),)),
    ("v1.4", (("GET", "/_matrix/client/v1/rooms/!r:h/threads"),)),
    ("v1.5", ()),
    ("v1.6", ()),
)


def _routed(resource: JsonResource, method: str, path: str) -> bool:
    return any(
        m == method and re.fullmatch(pattern, path) for m, pattern, _ in resource.registered()
    )


def supported_versions(resource: JsonResource) -> list[str]:
    """The spec versions whose required endpoints ``resource`` routes, in order;
    a version is only claimed with every one before it."""
    versions = []
    for version, added in VERSION_MODULES:
        if not all(_routed(resource, method, path) for method, path in added):
            break
        versions.append(version)
    return versions


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    # Worked out on first use: every module has registered its routes by then.
    computed: list[list[str]] = []

    async def on_get(request: Request) -> tuple[int, Any]:
        if not computed:
            computed.append(supported_versions(resource))
        return 200, {
            "versions": computed[0],
            "unstable_features": {UNSTABLE_FEATURE: _routed(resource, "POST", SLIDING_SYNC_PATH)},
        }

    async def capabilities(request: Request) -> tuple[int, Any]:
        await handlers.auth.get_user_by_req(request)
        return 200, {
            "capabilities": {
                "m.change_password": {"enabled": True},
                "m.set_displayname": {"enabled": True},
                "m.set_avatar_url": {"enabled": True},
                # No identity server: 3PIDs can be neither added nor removed.
                "m.3pid_changes": {"enabled": False},
                "m.room_versions": {
                    "default": DEFAULT_ROOM_VERSION.identifier,
                    "available": {v: "stable" for v in KNOWN_ROOM_VERSIONS},
                },
            }
        }

    resource.register_paths("GET", "/_matrix/client/versions", on_get, "versions")
    resource.register_paths(
        "GET", "/_matrix/client/(?:r0|v3)/capabilities", capabilities, "capabilities"
    )
