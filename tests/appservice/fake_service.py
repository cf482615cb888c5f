"""An application service on a real socket, behaving as the spec asks of
one: it checks the hs_token, processes each transaction id once, and
answers queries from what it was told to know. Switches make it fail."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet import reactor
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

PREFIX = b"/_matrix/app/v1/"
#: Where a service of the era before the versioned API served each kind of
#: request (the spec's "legacy routes").
LEGACY_PREFIXES = {b"/transactions/": b"/", b"/users/": b"/", b"/rooms/": b"/"}
LEGACY_THIRDPARTY = b"/_matrix/app/unstable/"


class FakeApplicationService(Resource):
    isLeaf = True

    def __init__(self, hs_token: str = "irc-hs-token") -> None:
        super().__init__()
        self.hs_token = hs_token
        #: Every transaction id tried, in order (repeats included).
        self.attempts: list[str] = []
        #: Transaction ids processed, and the events they carried, once each.
        self.processed: dict[str, list[dict[str, Any]]] = {}
        self.ephemeral: list[dict[str, Any]] = []
        #: Every transaction's body, in arrival order (the first of each id).
        self.transactions: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        #: "ok"; "error": 500 without processing; "lost_ack": processed,
        #: then 500 (as if the answer was lost).
        self.mode = "ok"
        self.known_users: set[str] = set()
        self.known_aliases: set[str] = set()
        #: Queries received: ("users" | "rooms", id).
        self.queries: list[tuple[str, str]] = []
        self.pings: list[Any] = []
        #: Protocol -> its description (``/thirdparty/protocol/{protocol}``).
        self.protocols: dict[str, Any] = {}
        #: (kind, protocol) -> the list ``/thirdparty/{kind}/{protocol}``
        #: answers; each such request's query string is kept in
        #: ``thirdparty_queries``.
        self.thirdparty: dict[tuple[str, str], list[Any]] = {}
        self.thirdparty_queries: list[dict[bytes, list[bytes]]] = []
        #: Called with (kind, id) on a query before answering (may return a
        #: Deferred: the answer waits for it).
        self.on_query: Any = None
        self.port: Any = None
        #: "v1": the versioned routes only; "legacy": the unprefixed and
        #: unstable routes only (and ``access_token`` in the query string
        #: instead of the header); "both".
        self.routes = "v1"
        #: Every request's (method, path without query), in order.
        self.requests: list[tuple[str, str]] = []
        #: The ``access_token`` query parameter of each request (None if absent).
        self.access_tokens: list[str | None] = []

    def listen(self) -> str:
        any_reactor: Any = reactor
        self.port = any_reactor.listenTCP(0, Site(self), interface="127.0.0.1")
        return f"http://127.0.0.1:{self.port.getHost().port}"

    def bodies(self) -> list[str]:
        return [e["content"].get("body", "") for e in self.events if e["type"] == "m.room.message"]

    def _route(self, full_path: bytes) -> bytes | None:
        """The path under the versioned prefix that ``full_path`` serves,
        given ``routes``; None: no such route here."""
        if full_path.startswith(PREFIX):
            return full_path[len(PREFIX) :] if self.routes != "legacy" else None
        if self.routes == "v1":
            return None
        if full_path.startswith(LEGACY_THIRDPARTY + b"thirdparty/"):
            return full_path[len(LEGACY_THIRDPARTY) :]
        if any(full_path.startswith(legacy) for legacy in LEGACY_PREFIXES):
            return full_path[1:]
        return None

    def render(self, request: Request) -> bytes:
        request.setHeader(b"Content-Type", b"application/json")
        full_path = request.path or b""
        self.requests.append((request.method.decode(), full_path.decode()))
        token = (request.args or {}).get(b"access_token")
        self.access_tokens.append(token[0].decode() if token else None)
        route = self._route(full_path)
        if route is None:
            # What a web framework answers for a route it does not have.
            request.setResponseCode(404)
            request.setHeader(b"Content-Type", b"text/html")
            return b"<html>404 Not Found</html>"
        auth = request.getHeader(b"Authorization")
        if self.routes == "legacy" and not full_path.startswith(PREFIX):
            # Services of that era read the token from the query string.
            auth = b"Bearer " + token[0] if token else None
        if auth != f"Bearer {self.hs_token}".encode():
            request.setResponseCode(403)
            return b'{"errcode": "M_FORBIDDEN"}'
        path = route.decode()
        kind, _, rest = path.partition("/")
        from urllib.parse import unquote

        rest = unquote(rest)
        if kind == "transactions" and request.method == b"PUT":
            return self._transaction(request, rest)
        if kind in ("users", "rooms"):
            self.queries.append((kind, rest))
            known = self.known_users if kind == "users" else self.known_aliases
            if self.on_query is not None:
                from twisted.internet import defer

                d = defer.maybeDeferred(self.on_query, kind, rest)

                def answer(_: Any) -> None:
                    request.setResponseCode(200 if rest in known else 404)
                    request.write(b"{}" if rest in known else b'{"errcode": "M_NOT_FOUND"}')
                    request.finish()

                d.addBoth(answer)
                from twisted.web.server import NOT_DONE_YET

                return NOT_DONE_YET  # type: ignore[return-value]
            if rest in known:
                return b"{}"
            request.setResponseCode(404)
            return b'{"errcode": "M_NOT_FOUND"}'
        if kind == "thirdparty" and rest.startswith("protocol/"):
            described = self.protocols.get(rest[len("protocol/") :])
            if described is None:
                request.setResponseCode(404)
                return b'{"errcode": "M_NOT_FOUND"}'
            return json.dumps(described).encode()
        if kind == "thirdparty" and rest.partition("/")[0] in ("user", "location"):
            self.thirdparty_queries.append(dict(request.args or {}))
            listed = self.thirdparty.get(tuple(rest.split("/", 1)))  # type: ignore[arg-type]
            if listed is None:
                request.setResponseCode(404)
                return b'{"errcode": "M_NOT_FOUND"}'
            return json.dumps(listed).encode()
        if kind == "ping" and request.method == b"POST":
            self.pings.append(json.loads(request.content.read() or b"{}"))  # type: ignore[union-attr]
            if self.mode != "ok":
                request.setResponseCode(500)
                return b'{"errcode": "M_UNKNOWN"}'
            return b"{}"
        request.setResponseCode(404)
        return b'{"errcode": "M_UNRECOGNIZED"}'

    def _transaction(self, request: Request, txn_id: str) -> bytes:
        self.attempts.append(txn_id)
        if self.mode == "error":
            request.setResponseCode(500)
            return b'{"errcode": "M_UNKNOWN"}'
        body = json.loads(request.content.read())  # type: ignore[union-attr]
        if txn_id not in self.processed:
            self.processed[txn_id] = body["events"]
            self.events.extend(body["events"])
            self.ephemeral.extend(body.get("ephemeral", []))
            self.transactions.append(body)
        if self.mode == "lost_ack":
            request.setResponseCode(500)
            return b'{"errcode": "M_UNKNOWN"}'
        return b"{}"
