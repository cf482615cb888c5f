"""The Application Service API as the homeserver calls it: transactions,
user and room alias queries, and pings, each with ``Authorization: Bearer
<hs_token>``, each bounded by a timeout. Answers are reduced to what the
caller decides on; nothing here retries (the sender does)."""

from __future__ import annotations

import json
import logging
import urllib.parse
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


class ApplicationServiceApi:
    """Requests to application services."""

    def __init__(
        self,
        reactor: Any,
        tls_policy: IPolicyForHTTPS,
        timeout: float = REQUEST_TIMEOUT_SECONDS,
    ) -> None:
        self._reactor = reactor
        self._timeout = timeout
        # One connection per request: nothing stays open between sends.
        self._pool = HTTPConnectionPool(reactor, persistent=False)
        self._agent = Agent(reactor, contextFactory=tls_policy, pool=self._pool)
        #: Requests under way, cancelled by :meth:`stop`.
        self._in_flight: set[defer.Deferred[Any]] = set()
        self._stopped = False

    async def request(
        self,
        service: ApplicationService,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, list[str]] | None = None,
    ) -> ServiceAnswer:
        """One request to ``service`` (which must have a ``url``), with the
        query string ``query`` if given."""
        assert service.url is not None
        if query:
            path += "?" + urllib.parse.urlencode(query, doseq=True)
        headers: dict[bytes | str, list[bytes | str]] = {
            b"Authorization": [b"Bearer " + service.hs_token.encode("utf-8")],
            b"Content-Type": [b"application/json"],
        }
        data = None if body is None else json.dumps(body).encode("utf-8")
        try:
            response = await treq.request(
                method,
                service.url + PREFIX + path,
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
