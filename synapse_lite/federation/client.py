"""HTTP requests to other homeservers (treq), signed with ``X-Matrix``.

Where a server is reached is :meth:`FederationConfig.base_url`: an explicit
``federation.destinations`` entry, else ``https://host:port``. Their
certificates must chain to the system's CAs or to ``federation.extra_ca_paths``
and name the host.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import treq
from treq.client import HTTPClient
from twisted.internet import defer
from twisted.web.client import Agent, HTTPConnectionPool

from synapse_lite.federation.auth import sign_request
from synapse_lite.http.tls import https_policy_trusting

if TYPE_CHECKING:
    from synapse_lite.config.federation import FederationConfig
    from synapse_lite.federation.crypto import SigningKey

logger = logging.getLogger(__name__)

#: Largest answer we read from another server.
MAX_RESPONSE_BYTES = 4 * 1024 * 1024


class FederationRequestError(Exception):
    """A request to another server failed: not reached, timed out, or
    answered with an error (``code`` and ``body`` then say which)."""

    def __init__(
        self, destination: str, message: str, code: int | None = None, body: Any = None
    ) -> None:
        super().__init__(f"{destination}: {message}")
        self.destination = destination
        self.code = code
        self.body = body


class FederationClient:
    """Signed requests to other servers, one connection pool per process."""

    def __init__(
        self, config: FederationConfig, reactor: Any, signing_key: SigningKey, server_name: str
    ) -> None:
        self._config = config
        self._signing_key = signing_key
        self._server_name = server_name
        self._pool = HTTPConnectionPool(reactor, persistent=True)
        self._pool.maxPersistentPerHost = 5
        # A request that failed on a reused connection must not be resent
        # behind our back: the sender decides about retries.
        self._pool.retryAutomatically = False
        policy = https_policy_trusting(config.extra_ca_paths)
        self._http = HTTPClient(Agent(reactor, contextFactory=policy, pool=self._pool))

    def close(self) -> defer.Deferred[None]:
        return self._pool.closeCachedConnections()

    async def get_json(self, destination: str, path: str, signed: bool = True) -> Any:
        """GET ``path`` on ``destination``; its JSON answer (200 only)."""
        return await self._request("GET", destination, path, None, signed)

    async def put_json(self, destination: str, path: str, content: dict[str, Any]) -> Any:
        """PUT signed JSON to ``path`` on ``destination``; its JSON answer (200 only)."""
        return await self._request("PUT", destination, path, content, True)

    async def _request(
        self, method: str, destination: str, path: str, content: Any, signed: bool
    ) -> Any:
        url = self._config.base_url(destination) + path
        headers: dict[bytes | str, list[bytes | str]] = {"Content-Type": ["application/json"]}
        data = None
        if content is not None:
            data = json.dumps(content, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if signed:
            headers["Authorization"] = [
                sign_request(
                    self._signing_key, self._server_name, destination, method, path, content
                )
            ]
        try:
            response = await self._http.request(
                method,
                url,
                data=data,
                headers=headers,
                timeout=self._config.request_timeout_seconds,
            )
            body = await treq.content(response)
        except Exception as e:
            raise FederationRequestError(destination, f"{method} {url} failed: {e!r}") from e
        if len(body) > MAX_RESPONSE_BYTES:
            raise FederationRequestError(destination, f"{url} answered too much", response.code)
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if response.code != 200:
            raise FederationRequestError(
                destination, f"{method} {url} answered {response.code}", response.code, answer
            )
        if answer is None:
            raise FederationRequestError(destination, f"{url} answered non-JSON", response.code)
        return answer
