"""The Application Service API as the homeserver calls it: transactions,
user and room alias queries, and pings, each with ``Authorization: Bearer
<hs_token>``, each bounded by a timeout. Answers are reduced to what the
caller decides on; nothing here retries (the sender does), except the one
fall back to a route's legacy path (the spec's "legacy routes",
:func:`legacy_path`) for services that do not serve the versioned one."""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import Callable
from typing import Any

import attr
import treq
from twisted.internet import defer
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IPolicyForHTTPS

from synapse_lite.appservice.registration import ApplicationService

logger = logging.getLogger(__name__)

#: How long a service may take to answer one request.
REQUEST_TIMEOUT_SECONDS = 30.0
#: The longest answer body read (queries and pings answer ``{}``).
_MAX_ANSWER_BYTES = 64 * 1024

PREFIX = "/_matrix/app/v1"
#: How long a service found answering on the legacy routes only is sent
#: there first, before the versioned routes are tried again (the spec: "try
#: again for the newer endpoints periodically"; the service may have been
#: updated).
LEGACY_RECHECK_SECONDS = 300.0
#: The status of an answer that never came: the connection failed.
NO_ANSWER = 0
#: The status of an answer that did not come in time.
TIMED_OUT = -1


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ServiceAnswer:
    """What a service answered: its status (:data:`NO_ANSWER`: the
    connection failed; :data:`TIMED_OUT`) and body."""

    status: int
    body: bytes = b""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def route_known(self) -> bool:
        """Whether the answer shows the service serves the route it was sent
        to: a success, or a JSON ``M_NOT_FOUND`` (the spec's answer for an
        unknown user, alias or protocol, given by a route that exists)."""
        if self.ok:
            return True
        try:
            body = json.loads(self.body)
        except ValueError:
            return False
        return (
            self.status == 404 and isinstance(body, dict) and body.get("errcode") == "M_NOT_FOUND"
        )


def legacy_path(path: str) -> str | None:
    """The legacy route of the versioned route ``PREFIX + path`` (the spec's
    table: ``/transactions``, ``/users`` and ``/rooms`` unprefixed,
    ``/thirdparty`` under ``/_matrix/app/unstable``), or None (``/ping``
    has none)."""
    for versioned in ("/transactions/", "/users/", "/rooms/"):
        if path.startswith(versioned):
            return path
    if path.startswith("/thirdparty/"):
        return "/_matrix/app/unstable" + path
    return None


class ApplicationServiceApi:
    """Requests to application services."""

    def __init__(
        self,
        reactor: Any,
        tls_policy: IPolicyForHTTPS,
        timeout: float = REQUEST_TIMEOUT_SECONDS,
        seconds: Callable[[], float] | None = None,
    ) -> None:
        """``seconds``: the clock the legacy routes' recheck is timed by
        (default: the reactor's)."""
        self._reactor = reactor
        self._seconds: Callable[[], float] = seconds or reactor.seconds
        self._timeout = timeout
        # One connection per request: nothing stays open between sends.
        self._pool = HTTPConnectionPool(reactor, persistent=False)
        self._agent = Agent(reactor, contextFactory=tls_policy, pool=self._pool)
        #: Requests under way, cancelled by :meth:`stop`.
        self._in_flight: set[defer.Deferred[Any]] = set()
        self._stopped = False
        #: Service id -> when it last answered on a legacy route after its
        #: versioned one failed: it is sent to the legacy routes first until
        #: LEGACY_RECHECK_SECONDS later.
        self._on_legacy_since: dict[str, float] = {}

    def on_legacy_routes(self, service_id: str) -> bool:
        """Whether requests to the service go to the legacy routes first."""
        since = self._on_legacy_since.get(service_id)
        return since is not None and self._seconds() - since < LEGACY_RECHECK_SECONDS

    async def request(
        self,
        service: ApplicationService,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, list[str]] | None = None,
    ) -> ServiceAnswer:
        """One request to ``service`` (which must have a ``url``) on the
        versioned route ``PREFIX + path``, with the query string ``query``
        if given.

        Legacy routes (the spec): when the service answers the versioned
        route with an error that does not show it serves the route
        (:attr:`ServiceAnswer.route_known`) and the route has a legacy path,
        the same request goes there (and the other way round while the
        service is on the legacy routes); a success there sends the service's
        next requests to the legacy routes first for
        :data:`LEGACY_RECHECK_SECONDS`, after which the versioned ones are
        tried first again. No fall back when the service could not be
        reached or did not answer in time (the other path is on the same
        server). The answer returned is the one that succeeded, else the
        first one."""
        legacy = legacy_path(path)
        if legacy is None:
            return await self._send(service, method, PREFIX + path, body, query, False)
        legacy_first = self.on_legacy_routes(service.id)
        first = await self._send(
            service, method, legacy if legacy_first else PREFIX + path, body, query, legacy_first
        )
        if first.status <= 0 or first.route_known:
            return first
        second = await self._send(
            service,
            method,
            PREFIX + path if legacy_first else legacy,
            body,
            query,
            not legacy_first,
        )
        if not second.ok:
            return first
        if legacy_first:
            self._on_legacy_since.pop(service.id, None)
            logger.info("Application service %r answers on the versioned routes again", service.id)
        else:
            self._on_legacy_since[service.id] = self._seconds()
            logger.info(
                "Application service %r answers on the legacy routes only (%s %s): using them",
                service.id,
                method,
                legacy,
            )
        return second

    async def _send(
        self,
        service: ApplicationService,
        method: str,
        path: str,
        body: Any,
        query: dict[str, list[str]] | None,
        legacy: bool,
    ) -> ServiceAnswer:
        """One HTTP request to ``service.url + path``. A legacy route also
        gets the ``hs_token`` as the ``access_token`` query parameter (the
        spec's note: services of that era read it there; the header is sent
        too)."""
        assert service.url is not None
        if legacy:
            query = {**(query or {}), "access_token": [service.hs_token]}
        # The path alone is logged: a legacy query string holds the token.
        url = service.url + path
        if query:
            url += "?" + urllib.parse.urlencode(query, doseq=True)
        headers: dict[bytes | str, list[bytes | str]] = {
            b"Authorization": [b"Bearer " + service.hs_token.encode("utf-8")],
            b"Content-Type": [b"application/json"],
        }
        data = None if body is None else json.dumps(body).encode("utf-8")
        try:
            response = await treq.request(
                method,
                url,
                data=data,
                headers=headers,
                timeout=self._timeout,
                agent=self._agent,
                reactor=self._reactor,
            )
            content = await treq.content(response)
        except Exception as e:  # down, refused, reset, timed out: the caller decides
            timed_out = (
                "timeout" in type(e).__name__.lower() or "cancel" in type(e).__name__.lower()
            )
            logger.info("Application service %r: %s %s failed: %r", service.id, method, path, e)
            return ServiceAnswer(-1 if timed_out else 0)
        return ServiceAnswer(response.code, content[:_MAX_ANSWER_BYTES])

    async def push_transaction(
        self,
        service: ApplicationService,
        txn_id: int,
        events: list[dict[str, Any]],
        ephemeral: list[dict[str, Any]] | None,
        extensions: dict[str, Any] | None = None,
    ) -> bool:
        """``PUT /transactions/{txnId}``: whether the service acknowledged it.
        ``extensions``: the unstable fields (to-device, MSC3202), as named."""
        body: dict[str, Any] = {"events": events, **(extensions or {})}
        if ephemeral is not None:
            body["ephemeral"] = ephemeral
            # The unstable name (MSC2409) bridges still read.
            body["de.sorunome.msc2409.ephemeral"] = ephemeral
        answer = await self.request(service, "PUT", f"/transactions/{txn_id}", body)
        if not answer.ok:
            logger.info(
                "Application service %r did not take transaction %d (status %d)",
                service.id,
                txn_id,
                answer.status,
            )
        return answer.ok

    async def query_user(self, service: ApplicationService, user_id: str) -> bool:
        """``GET /users/{userId}``: whether the service says it made the user."""
        answer = await self.request(service, "GET", "/users/" + _segment(user_id))
        return answer.ok

    async def query_alias(self, service: ApplicationService, alias: str) -> bool:
        """``GET /rooms/{roomAlias}``: whether the service says it made the alias."""
        answer = await self.request(service, "GET", "/rooms/" + _segment(alias))
        return answer.ok

    def stop(self) -> None:
        """Cancel the requests under way (their callers see no answer)."""
        self._stopped = True
        for d in list(self._in_flight):
            d.cancel()


def track_until_done(under_way: set[defer.Deferred[Any]], d: defer.Deferred[Any]) -> None:
    """Keep ``d`` in ``under_way`` until it fires (what a stop cancels or
    waits for)."""
    under_way.add(d)

    def done(result: Any) -> Any:
        under_way.discard(d)
        return result

    d.addBoth(done)


def _segment(value: str) -> str:
    return urllib.parse.quote(value, safe="")
