"""Serving JSON over HTTP: routing, request bodies, errors, limits and metrics.

Every servlet answers through :class:`JsonResource`, so no request, however
malformed, gets a traceback: a :class:`SynapseError` becomes its Matrix error,
anything else is logged and answered ``500 M_UNKNOWN`` with no details. A
servlet may answer with a :class:`StreamedResponse` (media downloads) instead
of JSON.

Request bodies are capped at the site's limit, except on the paths of an
:class:`UploadRoute` (media uploads), whose bodies go straight into a file
of the route's making, up to the route's own limit.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import IO, Any

import attr
from twisted.internet import defer
from twisted.web import http, server
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from synapse_lite.api.errors import Codes, InteractiveAuthIncomplete, SynapseError
from synapse_lite.http.forwarded import FORWARDED_FOR, ROUTER_PROOF, forwarded_address
from synapse_lite.http.path_alternation import PathAlternation, group_prefix
from synapse_lite.metrics import HTTP_REQUEST_DURATION, HTTP_REQUESTS

logger = logging.getLogger(__name__)

ServletCallback = Callable[..., Awaitable[tuple[int, Any]]]

#: Nesting deeper than this in a request body is refused (it only serves to
#: exhaust the parser).
MAX_JSON_DEPTH = 64


@attr.s(slots=True, frozen=True, auto_attribs=True)
class UploadRoute:
    """Requests whose bodies may be large (uploads): ``method`` on a path
    fully matching ``path``; the body, up to ``max_bytes``, is received into
    ``open_file()`` and ``discard(file)`` is called once the request is over
    (the servlet may have moved the file meanwhile)."""

    method: bytes
    path: re.Pattern[str]
    max_bytes: int
    open_file: Callable[[], IO[bytes]]
    discard: Callable[[IO[bytes]], None]

    def matches(self, method: bytes, uri: bytes) -> bool:
        path = uri.split(b"?", 1)[0].decode("ascii", errors="replace")
        return method == self.method and self.path.fullmatch(path) is not None


class LimitedRequest(Request):
    """A request whose body is capped: beyond the limit it is discarded and the
    request is answered 413 instead of being dispatched."""

    max_body_bytes = 1_048_576
    upload_routes: Sequence[UploadRoute] = ()
    #: The router's proof (``http/forwarded.py``); None: no forwarded address
    #: is believed.
    router_proof: bytes | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._body_bytes = 0
        self.body_too_large = False

    def _upload_route(self) -> UploadRoute | None:
        # The request line has been read but ``self.method``/``self.uri`` are
        # only set once the whole body has arrived; the channel holds them
        # until then (twisted.web.http.HTTPChannel, since Twisted 16).
        method = getattr(self.channel, "_command", None)
        uri = getattr(self.channel, "_path", None)
        if not isinstance(method, bytes) or not isinstance(uri, bytes):
            return None
        for route in self.upload_routes:
            if route.matches(method, uri):
                return route
        return None

    def gotLength(self, length: int | None) -> None:
        route = self._upload_route() if self.upload_routes else None
        if route is not None:
            self.max_body_bytes = route.max_bytes
        if length is not None and length > self.max_body_bytes:
            self.body_too_large = True
        if route is not None and not self.body_too_large:
            body = route.open_file()
            self.content = body
            self.notifyFinish().addBoth(lambda _: route.discard(body))
            return
        super().gotLength(length if not self.body_too_large else 0)

    def handleContentChunk(self, data: bytes) -> None:
        if self.body_too_large:
            return
        self._body_bytes += len(data)
        if self._body_bytes > self.max_body_bytes:
            self.body_too_large = True
            if self.content is not None:
                self.content.seek(0)
                self.content.truncate()
            return
        super().handleContentChunk(data)

    def getClientAddress(self) -> Any:
        """The client's address: the one the router forwarded, when the
        request proves it came from the router; else the peer's."""
        headers = self.requestHeaders
        forwarded = forwarded_address(
            headers.getRawHeaders(ROUTER_PROOF, [None])[-1],
            headers.getRawHeaders(FORWARDED_FOR, [None])[-1],
            self.router_proof,
        )
        return forwarded if forwarded is not None else super().getClientAddress()

    def process(self) -> None:
        site = getattr(self.channel, "site", None)
        if self.method not in _READ_METHODS and isinstance(site, ServingSite):
            site.track_write(self)
        super().process()


#: Requests that change nothing; a stopping process does not wait for them
#: (a /sync long-poll may take its whole timeout).
_READ_METHODS = (b"GET", b"HEAD", b"OPTIONS")
_UNLOGGED_PATHS = (b"/health", b"/metrics")


class ServingSite(server.Site):
    """A Site that knows which write requests it is still answering, so a
    stopping process can let them finish (:meth:`wait_for_writes`)."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource)
        self._writes_in_flight: set[Request] = set()
        self._idle_waiters: list[defer.Deferred[None]] = []

    def track_write(self, request: Request) -> None:
        self._writes_in_flight.add(request)

        def over(_: object) -> None:
            # Answered or client gone: either way the request is over.
            self._writes_in_flight.discard(request)
            if not self._writes_in_flight:
                waiters, self._idle_waiters = self._idle_waiters, []
                for waiter in waiters:
                    if not waiter.called:
                        waiter.callback(None)

        request.notifyFinish().addBoth(over)

    def log(self, request: http.Request) -> None:
        # Health checks and metric scrapes come every few seconds: not worth a line.
        if request.path not in _UNLOGGED_PATHS:
            super().log(request)

    @property
    def writes_in_flight(self) -> int:
        return len(self._writes_in_flight)

    def wait_for_writes(self) -> defer.Deferred[None]:
        """Fires once no write request is under way."""
        if not self._writes_in_flight:
            return defer.succeed(None)
        waiter: defer.Deferred[None] = defer.Deferred()
        self._idle_waiters.append(waiter)
        return waiter


def make_site(
    resource: Resource,
    max_body_bytes: int,
    upload_routes: Sequence[UploadRoute] = (),
    router_proof: str | None = None,
) -> ServingSite:
    """A Site whose requests refuse bodies larger than ``max_body_bytes``
    (except on ``upload_routes``) and believe the client address the router
    forwards (``router_proof``)."""

    class _Request(LimitedRequest):
        pass

    _Request.max_body_bytes = max_body_bytes
    _Request.upload_routes = tuple(upload_routes)
    _Request.router_proof = router_proof.encode("ascii") if router_proof else None
    site = ServingSite(resource)
    site.requestFactory = _Request
    site.displayTracebacks = False
    site.noisy = False
    return site


def respond_json(request: Request, code: int, body: Any) -> None:
    """Send a JSON response (unless the client has gone)."""
    if request._disconnected or request.finished:
        return
    data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    request.setResponseCode(code)
    request.setHeader(b"Content-Type", b"application/json")
    request.setHeader(b"Content-Length", str(len(data)).encode("ascii"))
    request.setHeader(b"Access-Control-Allow-Origin", b"*")
    request.setHeader(b"Access-Control-Allow-Methods", b"GET, POST, PUT, DELETE, OPTIONS")
    request.setHeader(
        b"Access-Control-Allow-Headers", b"X-Requested-With, Content-Type, Authorization"
    )
    request.setHeader(b"Cache-Control", b"no-cache, no-store, must-revalidate")
    request.write(data)
    request.finish()


def _check_depth(value: Any, depth: int = 0) -> None:
    if depth > MAX_JSON_DEPTH:
        raise SynapseError(400, "Content is nested too deeply", Codes.BAD_JSON)
    if isinstance(value, dict):
        for v in value.values():
            _check_depth(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _check_depth(v, depth + 1)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _request_body(request: Request) -> bytes:
    return request.content.read() if request.content is not None else b""


def _decode_json(content: bytes) -> Any:
    try:
        text = content.decode("utf-8")
        value = json.loads(text, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise SynapseError(400, "Content not JSON.", Codes.NOT_JSON) from None
    _check_depth(value)
    return value


def parse_json_object_from_request(request: Request, allow_empty: bool = False) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 (``M_NOT_JSON``/``M_BAD_JSON``).
    With ``allow_empty`` an empty body is ``{}``; a JSON ``null`` is still refused."""
    content = _request_body(request)
    if not content and allow_empty:
        return {}
    # Only an empty body stands for {}: a JSON ``null`` is not an object.
    value = _decode_json(content)
    if not isinstance(value, dict):
        raise SynapseError(400, "Content must be a JSON object.", Codes.BAD_JSON)
    return value


def query_string(request: Request, name: str, default: str | None = None) -> str | None:
    """A query parameter as text (the first, if repeated), or a 400 if it is not UTF-8."""
    values = request.args.get(name.encode("ascii")) if request.args else None
    if not values:
        return default
    try:
        value = values[0].decode("utf-8")
    except UnicodeDecodeError:
        raise SynapseError(
            400, f"Query parameter {name!r} is not UTF-8", Codes.INVALID_PARAM
        ) from None
    if "\x00" in value:
        # PostgreSQL cannot store or compare text containing NUL.
        raise SynapseError(400, f"Query parameter {name!r} contains NUL", Codes.INVALID_PARAM)
    return value


def query_strings(request: Request, name: str) -> list[str]:
    """Every value of a repeated query parameter (``via``, ``v``, ``ver``), as
    text; a 400 if one is not UTF-8."""
    values = request.args.get(name.encode("ascii"), []) if request.args else []
    try:
        return [v.decode("utf-8") for v in values]
    except UnicodeDecodeError:
        raise SynapseError(
            400, f"Query parameter {name!r} is not UTF-8", Codes.INVALID_PARAM
        ) from None


def query_bool(request: Request, name: str, default: bool | None) -> bool | None:
    """A ``true``/``false`` query parameter, or a 400."""
    value = query_string(request, name)
    if value is None:
        return default
    if value not in ("true", "false"):
        raise SynapseError(
            400, f"Query parameter {name!r} must be true or false", Codes.INVALID_PARAM
        )
    return value == "true"


def query_int(
    request: Request, name: str, default: int | None = None, minimum: int = 0, maximum: int = 2**62
) -> int | None:
    """A non-negative integer query parameter, or a 400."""
    value = query_string(request, name)
    if value is None:
        return default
    if not value.isascii() or not value.isdigit() or len(value) > 18:
        raise SynapseError(400, f"Query parameter {name!r} must be an integer", Codes.INVALID_PARAM)
    number = int(value)
    if not minimum <= number <= maximum:
        raise SynapseError(
            400,
            f"Query parameter {name!r} must be between {minimum} and {maximum}",
            Codes.INVALID_PARAM,
        )
    return number


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ServletMatch:
    """The servlet a request was routed to, and its path parameters."""

    name: str
    path_args: Mapping[str, str]


_SERVLET_MATCH = "_synapse_lite_servlet_match"


def matched_servlet(request: Request) -> ServletMatch | None:
    """What :class:`JsonResource` routed ``request`` to (None for a request
    that did not come through one, as in some tests)."""
    found = getattr(request, _SERVLET_MATCH, None)
    return found if isinstance(found, ServletMatch) else None


class StreamedResponse:
    """A servlet's answer that is not JSON: it writes the response itself
    (status, headers, body, ``finish``), e.g. a file streamed with a producer."""

    code = 200

    async def send(self, request: Request) -> None:
        raise NotImplementedError


@attr.s(slots=True, frozen=True, auto_attribs=True)
class MethodRoutes:
    """One method's routes as one regex (:class:`PathAlternation`), in the
    order registered: a full match is the first route whose pattern fully
    matches, as trying the patterns one by one finds, in one call into the
    regex engine (a request used to try some 50 patterns in Python before
    /sync's; ``bench/route_matching.py``)."""

    alternation: PathAlternation
    #: In the alternation's order: (callback, servlet name, its named groups).
    routes: Sequence[tuple[ServletCallback, str, tuple[str, ...]]]

    @classmethod
    def of(cls, routes: Sequence[tuple[re.Pattern[str], ServletCallback, str]]) -> MethodRoutes:
        return cls(
            PathAlternation.of([(pattern.pattern, True) for pattern, _, _ in routes]),
            [(callback, name, tuple(pattern.groupindex)) for pattern, callback, name in routes],
        )

    def match(self, path: str) -> tuple[ServletCallback, str, dict[str, str]] | None:
        """The first route fully matching ``path``: its callback, servlet
        name and named groups' raw values; None if none does."""
        found = self.alternation.match(path)
        if found is None:
            return None
        position, match = found
        callback, name, groups = self.routes[position]
        prefix = group_prefix(position)
        return callback, name, {g: match.group(prefix + g) for g in groups}


class JsonResource(Resource):
    """Routes requests by method and path regex to async servlet callbacks
    returning ``(code, json_body)``."""

    isLeaf = True

    def __init__(self, name: str = "json") -> None:
        super().__init__()
        self._name = name
        self._routes: list[tuple[bytes, re.Pattern[str], ServletCallback, str]] = []
        #: Built from ``_routes`` on the first request after a registration
        #: (``b""``: every method's routes, for telling 405 from 404).
        self._by_method: dict[bytes, MethodRoutes] | None = None

    def register_paths(
        self, method: str, pattern: str, callback: ServletCallback, servlet_name: str
    ) -> None:
        """Serve ``method`` requests whose path fully matches ``pattern``; named
        groups are passed to ``callback`` as URL-decoded keyword arguments."""
        self._routes.append((method.encode("ascii"), re.compile(pattern), callback, servlet_name))
        self._by_method = None

    def registered(self) -> list[tuple[str, str, str]]:
        """``(method, path pattern, servlet name)`` of every path served, in
        the order they are matched (the routing table reads them)."""
        return [(m.decode("ascii"), p.pattern, name) for m, p, _, name in self._routes]

    def render(self, request: Request) -> Any:
        defer.ensureDeferred(self._async_render(request))
        return NOT_DONE_YET

    def _match(self, request: Request) -> tuple[ServletCallback | None, dict[str, str], str, bool]:
        """The servlet of ``request``: (callback, its URL-decoded path
        arguments, servlet name, whether any route's path matched); no
        callback when none matches the path and the method."""
        raw_path = request.path.decode("ascii", errors="replace")
        if self._by_method is None:
            per_method: dict[bytes, list[tuple[re.Pattern[str], ServletCallback, str]]] = {}
            for method, pattern, callback, name in self._routes:
                per_method.setdefault(method, []).append((pattern, callback, name))
            self._by_method = {m: MethodRoutes.of(r) for m, r in per_method.items()}
            self._by_method[b""] = MethodRoutes.of([(p, c, n) for _, p, c, n in self._routes])
        routes = self._by_method.get(request.method) if request.method else None
        found = routes.match(raw_path) if routes is not None else None
        if found is None:
            # Another method's path (405) or none (404).
            path_matched = self._by_method[b""].match(raw_path) is not None
            return None, {}, "unrecognized", path_matched
        callback, name, raw = found
        kwargs = {k: urllib.parse.unquote(v, errors="strict") for k, v in raw.items()}
        if any("\x00" in v for v in kwargs.values()):
            raise SynapseError(400, "Path contains a NUL character", Codes.INVALID_PARAM)
        return callback, kwargs, name, True

    async def _async_render(self, request: Request) -> None:
        start = time.monotonic()
        servlet = "unrecognized"
        method = request.method.decode("ascii", errors="replace")
        code = 500
        body: Any
        try:
            if request.method == b"OPTIONS":
                code, body = 200, {}
            elif getattr(request, "body_too_large", False):
                limit = getattr(request, "max_body_bytes", 0)
                raise SynapseError(
                    413, f"Request body too large: the limit is {limit} bytes", Codes.TOO_LARGE
                )
            else:
                try:
                    callback, kwargs, servlet, path_matched = self._match(request)
                except UnicodeDecodeError:
                    raise SynapseError(400, "Path is not UTF-8", Codes.INVALID_PARAM) from None
                if callback is None:
                    if path_matched:
                        raise SynapseError(405, "Method not allowed", Codes.UNRECOGNIZED)
                    raise SynapseError(404, "Unrecognized request", Codes.UNRECOGNIZED)
                # Who may call what is decided by servlet (guests: api/guest_access.py).
                setattr(request, _SERVLET_MATCH, ServletMatch(servlet, kwargs))
                code, body = await callback(request, **kwargs)
                if isinstance(body, StreamedResponse):
                    await self._stream(request, body, method, servlet)
                    HTTP_REQUESTS.labels(servlet, method, str(body.code)).inc()
                    HTTP_REQUEST_DURATION.labels(servlet, method).observe(time.monotonic() - start)
                    return
        except SynapseError as e:
            code, body = e.code, e.error_dict()
            if code >= 500:
                logger.warning("%s %s: %s", method, request.path, e.msg)
        except InteractiveAuthIncomplete as e:
            # The spec's 401 of user-interactive auth: the flows, not an error.
            code, body = 401, e.response
        except defer.CancelledError:
            code, body = 499, {}
        except Exception:
            logger.exception("Error handling %s %s", method, request.path)
            code, body = 500, {"errcode": Codes.UNKNOWN, "error": "Internal server error"}
        respond_json(request, code, body)
        HTTP_REQUESTS.labels(servlet, method, str(code)).inc()
        HTTP_REQUEST_DURATION.labels(servlet, method).observe(time.monotonic() - start)

    @staticmethod
    async def _stream(
        request: Request, response: StreamedResponse, method: str, servlet: str
    ) -> None:
        try:
            await response.send(request)
        except Exception:
            # Headers may be out already: no error can be sent; end the
            # connection so the client sees the body is incomplete.
            logger.exception("Error streaming %s %s (%s)", method, request.path, servlet)
            if not request.finished and not request._disconnected:
                request.loseConnection()
