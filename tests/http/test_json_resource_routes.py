"""How ``JsonResource`` picks a servlet (``MethodRoutes``, http/server.py):
one regex per method, whose first fully matching alternative is the route
trying the patterns one by one in registration order would find."""

from __future__ import annotations

import re
from typing import Any
from unittest import mock

from twisted.trial import unittest

from bench.route_matching import client_resource, one_by_one
from synapse_lite.api.errors import SynapseError
from synapse_lite.http.server import JsonResource, MethodRoutes

METHODS = (b"GET", b"PUT", b"POST", b"DELETE", b"PATCH")

#: Paths of the client API (and near misses), as clients send them.
PATHS = [
    "/_matrix/client/v3/sync",
    "/_matrix/client/r0/sync",
    "/_matrix/client/v3/rooms/!abc%3Atest/send/m.room.message/txn1",
    "/_matrix/client/v3/rooms/!abc:test/send/m.room.message/",
    "/_matrix/client/v3/rooms/!abc:test/state/m.room.name/",
    "/_matrix/client/v3/rooms/!abc:test/state/m.room.member/%40u%3Atest",
    "/_matrix/client/v3/rooms/!abc:test/state",
    "/_matrix/client/v3/rooms/!abc:test/messages",
    "/_matrix/client/v3/rooms/!abc:test/redact/$ev/t1",
    "/_matrix/client/v3/rooms/!abc:test/receipt/m.read/$ev",
    "/_matrix/client/v3/rooms/!abc:test/typing/@u:test",
    "/_matrix/client/v3/rooms/!abc:test/relations/$ev/m.annotation/m.reaction",
    "/_matrix/client/v3/rooms/%00/send/m.room.message/t",
    "/_matrix/client/v3/join/%23room%3Atest",
    "/_matrix/client/v3/createRoom",
    "/_matrix/client/v3/login",
    "/_matrix/client/v3/register",
    "/_matrix/client/v3/profile/@u:test/displayname",
    "/_matrix/client/v3/user/@u:test/filter",
    "/_matrix/client/v3/user/@u:test/filter/1",
    "/_matrix/client/v3/user/@u:test/account_data/m.direct",
    "/_matrix/client/v3/user/@u:test/rooms/!r:test/tags/u.work",
    "/_matrix/client/v3/pushrules/global/room/!r:test",
    "/_matrix/client/v3/pushrules/",
    "/_matrix/client/v3/keys/upload",
    "/_matrix/client/v3/sendToDevice/m.room_key/t1",
    "/_matrix/client/v3/directory/room/%23a%3Atest",
    "/_matrix/client/v3/presence/@u:test/status",
    "/_matrix/client/versions",
    "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync",
    "/_synapse/admin/v1/rooms/!r:test",
    "/_synapse/admin/v2/users/@u:test",
    "/_matrix/client/v3/nothing/here",
    "/",
    "",
]


def routed(resource: JsonResource, method: bytes, path: str) -> Any:
    request = mock.Mock(method=method, path=path.encode("ascii"))
    try:
        callback, args, name, path_matched = resource._match(request)
    except SynapseError as e:
        return ("error", e.code)
    if callback is None:
        return ("unrecognized", {}, path_matched) if not path_matched else ("405", {}, True)
    return name, args, True


class MethodRoutesTestCase(unittest.TestCase):
    def test_every_client_path_goes_where_trying_each_pattern_sent_it(self) -> None:
        resource = client_resource()
        self.assertGreater(len(resource._routes), 100)
        compared = found = 0
        for path in PATHS:
            for method in METHODS:
                name, args, path_matched = one_by_one(resource, method, path)
                want: Any = (name, args, True)
                if name == "unrecognized":
                    want = ("405", {}, True) if path_matched else ("unrecognized", {}, False)
                elif any("\x00" in v for v in args.values()):
                    want = ("error", 400)
                self.assertEqual(routed(resource, method, path), want, f"{method!r} {path}")
                compared += 1
                found += want[0] not in ("unrecognized", "405", "error")
        self.assertEqual(compared, len(PATHS) * len(METHODS))
        self.assertGreater(found, len(PATHS) // 2)

    def test_the_first_registered_of_several_matches_wins(self) -> None:
        async def servlet(request: Any, **kwargs: Any) -> tuple[int, Any]:
            return 200, {}

        routes = [
            (re.compile(r"^/rooms/(?P<room_id>[^/]*)/special$"), servlet, "special"),
            (re.compile(r"^/rooms/(?P<room_id>[^/]*)/(?P<what>[^/]*)$"), servlet, "any"),
            (re.compile(r"^/same/(?P<x>[a-z]+)/(?P=x)$"), servlet, "repeated"),
        ]
        table = MethodRoutes.of(routes)
        self.assertEqual(table.match("/rooms/!r/special"), (servlet, "special", {"room_id": "!r"}))
        self.assertEqual(
            table.match("/rooms/!r/other"), (servlet, "any", {"room_id": "!r", "what": "other"})
        )
        # A reference to a named group still refers to its own route's group.
        self.assertEqual(table.match("/same/ab/ab"), (servlet, "repeated", {"x": "ab"}))
        self.assertIsNone(table.match("/same/ab/cd"))
        self.assertIsNone(table.match("/rooms/!r/a/b"))

    def test_a_route_registered_after_a_request_is_served(self) -> None:
        resource = client_resource()
        self.assertEqual(routed(resource, b"GET", "/late")[0], "unrecognized")

        async def late(request: Any) -> tuple[int, Any]:
            return 200, {}

        resource.register_paths("GET", r"^/late$", late, "late")
        self.assertEqual(routed(resource, b"GET", "/late"), ("late", {}, True))
        self.assertEqual(routed(resource, b"PUT", "/late"), ("405", {}, True))
