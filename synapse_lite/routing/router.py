"""Choosing the process for one request, and the router's own pages.

:meth:`Router.decide` matches the request against the routing table, then
picks among the route's processes that are up:

* ``user``: the reader a hash of the user id gives (rendezvous hashing over
  the readers that are up, so a reader going down moves only its users). The
  user comes from the access token's routing hint (``api/access_tokens.py``);
  a token without one is hashed whole, a request without a token by address;
* ``origin``: the federation reader a hash of the requesting server (the
  X-Matrix origin) gives, the same way; a request without one by address;
* ``room``: the room's events writer (``room_writers.py``); a room it does
  not know goes to the main process, which answers as it should;
* ``single``: the one process.

A role with no process up is a 503 with ``Retry-After``.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import attr
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from twisted.internet import defer

from synapse_lite.api.access_tokens import localpart_of_token
from synapse_lite.config.homeserver import MAIN_PROCESS, ROUTER_PROCESS
from synapse_lite.federation.auth import AuthHeaderError, parse_auth_header
from synapse_lite.routing.backends import Backend, HealthChecks, rendezvous
from synapse_lite.routing.exchange import LocalAnswer
from synapse_lite.routing.http1 import RequestHead
from synapse_lite.routing.room_writers import RoomWriters
from synapse_lite.routing.table import (
    BALANCE_ORIGIN,
    BALANCE_ROOM,
    BALANCE_USER,
    FEDERATION_PATH_PREFIXES,
    INTERNAL_PATH_PREFIXES,
    Route,
    RoutingTable,
)

#: Served on a ``federation`` listener besides the federation paths (by the
#: main process: other servers find us there).
WELL_KNOWN_PREFIX = "/.well-known/matrix/"

#: What a 503 tells the client to wait before trying again, in seconds.
RETRY_AFTER_SECONDS = 5


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Decision:
    """Where a request goes: a backend, or a refusal the router sends itself."""

    route_name: str
    backend: Backend | None = None
    refusal: LocalAnswer | None = None


class Router:
    """Decides where each request goes (see the module docstring)."""

    def __init__(
        self,
        table: RoutingTable,
        backends: dict[str, Backend],
        room_writers: RoomWriters,
    ) -> None:
        self.table = table
        self.backends = backends
        self.room_writers = room_writers
        self.health: HealthChecks | None = None
        self._server_name = table.config.server_name

    # Deciding

    def decide(self, head: RequestHead, client_ip: str) -> Decision | defer.Deferred[Decision]:
        method = head.method.decode("ascii")
        route, match = self.table.match(method, head.path)
        if route.balance in (BALANCE_USER, BALANCE_ORIGIN):
            key = (
                self._user_key(head) if route.balance == BALANCE_USER else _origin_key(head)
            ) or client_ip.encode("utf-8")
            up = [self.backends[n] for n in route.instances if self.backends[n].up]
            if not up:
                return self._none_up(route)
            return Decision(route.served_by.name, rendezvous(up, key))
        if route.balance == BALANCE_ROOM:
            assert match is not None
            room_id = urllib.parse.unquote(match.group("room_id"))
            if not room_id.startswith("!"):
                return self._single(self.table.default)  # an alias: main says what it is
            known, writer = self.room_writers.cached(room_id)
            if known:
                return self._room_writer(route, writer)
            d = defer.ensureDeferred(self.room_writers.writer_of(room_id))
            return d.addCallback(lambda w: self._room_writer(route, w))
        return self._single(route)

    def _single(self, route: Route) -> Decision:
        backend = self.backends[route.instances[0]]
        if not backend.up:
            return self._none_up(route)
        return Decision(route.served_by.name, backend)

    def _room_writer(self, route: Route, writer: str | None) -> Decision:
        if writer is None or writer not in self.backends:
            # No such room (main answers 404), or a writer this router's config
            # does not know (added since it started: main forwards to it).
            return self._single(self.table.default)
        backend = self.backends[writer]
        if not backend.up:
            return self._none_up(route, f"the room's events writer ({writer}) is down")
        return Decision(route.served_by.name, backend)

    def _none_up(self, route: Route, why: str | None = None) -> Decision:
        why = why or f"no process serving {route.served_by.name} is up"
        return Decision(
            route.served_by.name,
            refusal=LocalAnswer.error(503, f"{why}; try again", RETRY_AFTER_SECONDS),
        )

    def _user_key(self, head: RequestHead) -> bytes | None:
        """The user the request is for, from its access token (hashed whole
        when it names none)."""
        token: bytes | None = None
        authorization = head.header(b"authorization")
        if authorization is not None:
            scheme, _, value = authorization.partition(b" ")
            if scheme.lower() == b"bearer":
                token = value.strip()
        elif b"access_token=" in head.query:
            values = urllib.parse.parse_qs(head.query).get(b"access_token")
            token = values[0] if values else None
        if not token:
            return None
        localpart = localpart_of_token(token.decode("ascii", "replace"))
        if localpart is None:
            return token
        return f"@{localpart}:{self._server_name}".encode()

    def report_unreachable(self, backend: Backend, reason: str) -> None:
        """A connection to ``backend`` failed: it is down until it answers again."""
        if self.health is not None:
            self.health.mark(backend, False, f"connection failed: {reason}")
        else:
            backend.up = False

    # The router's own pages

    def local_page(self, head: RequestHead, resources: tuple[str, ...]) -> LocalAnswer | None:
        """What the router answers itself on a listener serving ``resources``;
        None for a request to relay."""
        path = head.path
        if path == "/health" and "health" in resources:
            return self.health_page()
        if path == "/metrics" and "metrics" in resources:
            return LocalAnswer(200, generate_latest(), CONTENT_TYPE_LATEST.encode("ascii"))
        if path in ("/health", "/metrics"):
            return LocalAnswer.error(404, "Not served on this port")
        if "client" not in resources and not (
            "federation" in resources
            and (path.startswith(FEDERATION_PATH_PREFIXES) or path.startswith(WELL_KNOWN_PREFIX))
        ):
            return LocalAnswer.error(404, "Not served on this port")
        if path.startswith(INTERNAL_PATH_PREFIXES):
            return LocalAnswer.error(404, "Unrecognized request")
        return None

    def health_page(self) -> LocalAnswer:
        """``ok`` when every role has a process up, else ``degraded`` with why."""
        reasons = []
        for route in {
            r.served_by.name: r for r in [self.table.default, *self.table.routes]
        }.values():
            if not any(self.backends[n].up for n in route.instances):
                reasons.append(f"no process serving {route.served_by.name} is up")
        backends: dict[str, Any] = {}
        for name, backend in self.backends.items():
            state = "up" if backend.up else f"down ({backend.down_reason})"
            if backend.up and backend.degraded:
                state = f"up, degraded ({backend.degraded})"
            backends[name] = state
        body: dict[str, Any] = {
            "status": "degraded" if reasons else "ok",
            "instance": ROUTER_PROCESS,
            "backends": backends,
        }
        if reasons:
            body["reasons"] = reasons
        return LocalAnswer(200, json.dumps(body).encode("utf-8"))


def _origin_key(head: RequestHead) -> bytes | None:
    """The requesting server of a federation request (its X-Matrix origin),
    so that one server's requests stay on one federation reader; None for a
    request without one (keys, or a malformed header: the reader refuses it)."""
    authorization = head.header(b"authorization")
    if authorization is None:
        return None
    try:
        return parse_auth_header(authorization).origin.encode("utf-8")
    except AuthHeaderError:
        return None


__all__ = ["MAIN_PROCESS", "Decision", "Router"]
