"""What finding a request's servlet costs: ``python -m bench.route_matching``.

    python -m bench.route_matching [--calls 20000]

Builds the client API's ``JsonResource`` as every client-serving process
does (``register_servlets``, no handlers behind it) and times its routing
(``JsonResource._match``: one regex per method, ``MethodRoutes``) against
the baseline, trying every route's pattern in order in Python (what it did
before, :func:`one_by_one`), in the same run, for the requests a busy
client sends most: /sync, a send, a read receipt, /messages, and a path
no route has (a 404). Prints microseconds per call and the ratio; asserts
nothing.
"""

from __future__ import annotations

import argparse
import timeit
import urllib.parse
from typing import cast

from twisted.web.server import Request

from synapse_lite.http.server import JsonResource
from synapse_lite.rest.client import ClientHandlers, register_servlets
from synapse_lite.routing.table import _Unbuilt

REQUESTS = [
    (b"GET", "/_matrix/client/v3/sync"),
    (b"PUT", "/_matrix/client/v3/rooms/!abc:example.org/send/m.room.message/txn1"),
    (b"POST", "/_matrix/client/v3/rooms/!abc:example.org/receipt/m.read/$event"),
    (b"GET", "/_matrix/client/v3/rooms/!abc:example.org/messages"),
    (b"GET", "/_matrix/client/v3/no/such/thing"),
]


class _Request:
    def __init__(self, method: bytes, path: str) -> None:
        self.method = method
        self.path = path.encode("ascii")


def client_resource() -> JsonResource:
    """The client API's routes, as a client-serving process registers them."""
    resource = JsonResource("bench")
    register_servlets(cast(ClientHandlers, _Unbuilt()), resource)
    return resource


def one_by_one(
    resource: JsonResource, method: bytes, path: str
) -> tuple[str, dict[str, str], bool]:
    """The routing before ``MethodRoutes``: every pattern in registration
    order. (servlet name, URL-decoded arguments, whether any route's path
    matched); the name is "unrecognized" when no route of ``method`` matched."""
    path_matched = False
    for route_method, pattern, _, name in resource._routes:
        match = pattern.fullmatch(path)
        if not match:
            continue
        path_matched = True
        if route_method != method:
            continue
        args = {k: urllib.parse.unquote(v, errors="strict") for k, v in match.groupdict().items()}
        return name, args, True
    return "unrecognized", {}, path_matched


def timed(resource: JsonResource, method: bytes, path: str, calls: int) -> tuple[float, float]:
    """Microseconds per call: (this routing, :func:`one_by_one`)."""
    request = cast(Request, _Request(method, path))
    resource._match(request)  # builds the per-method regexes
    this = timeit.timeit(lambda: resource._match(request), number=calls)
    before = timeit.timeit(lambda: one_by_one(resource, method, path), number=calls)
    return this / calls * 1e6, before / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.route_matching", description=__doc__)
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args(argv)
    resource = client_resource()
    print(f"{len(resource._routes)} client API routes; microseconds per call, {args.calls} calls")
    print(f"{'request':<72} {'this':>6} {'one by one':>10} {'ratio':>6}")
    for method, path in REQUESTS:
        this_us, before_us = timed(resource, method, path, args.calls)
        label = f"{method.decode()} {path}"
        print(f"{label:<72} {this_us:6.1f} {before_us:10.1f} {this_us / before_us:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
