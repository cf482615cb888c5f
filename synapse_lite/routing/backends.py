"""The processes the router relays to, and whether each is up.

Every process a route may send to is a :class:`Backend`: where its client API
listens and where its ``/health`` answers. :class:`HealthChecks` asks each
``/health`` every second; a process that refuses, times out (a frozen
process accepts the connection and says nothing) or answers other than 200
is down until it answers again. The relay also reports a backend down the
moment a connection to it is refused, so requests move at once; a frozen
backend is noticed by the check, within its interval plus its timeout.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet import defer, protocol, task
from twisted.internet.interfaces import IDelayedCall

from synapse_lite.config.homeserver import HomeServerConfig, InstanceLocation
from synapse_lite.http.tls import InternalTlsClient
from synapse_lite.metrics import ROUTER_BACKEND_UP
from synapse_lite.routing.table import relay_address

logger = logging.getLogger(__name__)

#: How often each backend's /health is asked, and how long it has to answer.
#: Together they bound how long a frozen process keeps its share: 1 + 2 < 5 s.
HEALTH_INTERVAL_SECONDS = 1.0
HEALTH_TIMEOUT_SECONDS = 2.0


class Backend:
    """One process behind the router; ``client``: the listener requests
    are relayed to (its client API's, or a federation reader's federation
    listener: ``table.relay_address``)."""

    def __init__(
        self, name: str, client: InstanceLocation, health: InstanceLocation | None
    ) -> None:
        self.name = name
        self.client = client
        self.health = health
        self.up = True
        #: Why it is down (for /health and logs).
        self.down_reason = ""
        #: What its own /health says is wrong while it serves (a stalled stream).
        self.degraded = ""
        #: Stable per-backend salt for rendezvous hashing.
        self._salt = name.encode("utf-8")

    def weight(self, key: bytes) -> bytes:
        return hashlib.blake2b(key, digest_size=8, key=self._salt[:64]).digest()

    def __repr__(self) -> str:
        return f"Backend({self.name} {self.client.base_url} {'up' if self.up else 'down'})"


def backends_of(config: HomeServerConfig, names: Sequence[str]) -> dict[str, Backend]:
    """A backend for each process named, from the config."""
    result = {}
    for name in names:
        address = relay_address(config, name)
        assert address is not None, name
        result[name] = Backend(name, address, config.http_address(name, "health"))
    return result


def rendezvous(candidates: Sequence[Backend], key: bytes) -> Backend:
    """The candidate ``key`` belongs to: the highest hash of (key, backend).
    Removing a backend moves only its own keys; adding one takes only keys
    that now hash highest to it."""
    return max(candidates, key=lambda b: b.weight(key))


class _HealthProbe(protocol.Protocol):
    """``GET /health`` on a fresh connection; the answer is read until close."""

    def __init__(self, done: defer.Deferred[tuple[int, bytes]], host: str) -> None:
        self._done = done
        self._host = host
        self._data = bytearray()

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(
            b"GET /health HTTP/1.0\r\nHost: " + self._host.encode("ascii") + b"\r\n\r\n"
        )

    def dataReceived(self, data: bytes) -> None:
        self._data += data
        if len(self._data) > 65536:
            assert self.transport is not None
            self.transport.loseConnection()

    def connectionLost(self, reason: Any = None) -> None:
        if self._done.called:
            return
        head, _, body = bytes(self._data).partition(b"\r\n\r\n")
        parts = head.split(b" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        self._done.callback((status, body))


class HealthChecks:
    """Polls every backend's /health; tells ``on_change`` when one goes down or up."""

    def __init__(
        self,
        reactor: Any,
        backends: Sequence[Backend],
        tls: InternalTlsClient,
        on_change: Callable[[Backend], None],
        interval: float = HEALTH_INTERVAL_SECONDS,
        timeout: float = HEALTH_TIMEOUT_SECONDS,
    ) -> None:
        self._reactor = reactor
        self._backends = list(backends)
        self._tls = tls
        self._on_change = on_change
        self._interval = interval
        self._timeout = timeout
        self._loop = task.LoopingCall(self._check_all)
        self._loop.clock = reactor
        self._running: dict[Backend, defer.Deferred[None]] = {}
        self._stopped = False
        for backend in self._backends:
            ROUTER_BACKEND_UP.labels(backend.name).set(1)

    def start(self) -> None:
        self._loop.start(self._interval, now=True)

    def stop(self) -> None:
        self._stopped = True
        if self._loop.running:
            self._loop.stop()
        for check in list(self._running.values()):
            check.cancel()

    def _check_all(self) -> None:
        for backend in self._backends:
            # A check still waiting (a frozen process) is not started twice.
            if backend.health is not None and backend not in self._running:
                d = defer.ensureDeferred(self.check(backend))
                self._running[backend] = d
                d.addBoth(self._checked, backend)

    def _checked(self, result: object, backend: Backend) -> None:
        self._running.pop(backend, None)

    async def check(self, backend: Backend) -> None:
        health = backend.health
        assert health is not None
        try:
            status, body = await self._probe(health)
        except Exception as e:
            if not self._stopped:
                self.mark(backend, False, f"/health did not answer: {e.__class__.__name__}")
            return
        if status != 200:
            self.mark(backend, False, f"/health answered {status or 'nothing'}")
            return
        self.mark(backend, True, "")
        try:
            answer = json.loads(body)
        except ValueError:
            return
        reasons = answer.get("reasons") if isinstance(answer, dict) else None
        degraded = isinstance(answer, dict) and answer.get("status") == "degraded"
        backend.degraded = "; ".join(map(str, reasons or ["degraded"])) if degraded else ""

    async def _probe(self, location: InstanceLocation) -> tuple[int, bytes]:
        """``(status, body)`` of ``GET /health``; a timeout raises."""
        endpoint = self._tls.endpoint(
            self._reactor, location.host, location.port, location.tls, timeout=self._timeout
        )
        done: defer.Deferred[tuple[int, bytes]] = defer.Deferred()
        factory = protocol.Factory.forProtocol(lambda: _HealthProbe(done, location.host))
        connecting: defer.Deferred[Any] = endpoint.connect(factory)
        connected: Any = None

        def time_out() -> None:
            if connected is not None:
                connected.transport.abortConnection()  # answers "nothing"
            else:
                connecting.cancel()

        timer: IDelayedCall = self._reactor.callLater(self._timeout, time_out)
        try:
            connected = await connecting
            return await done
        except BaseException:
            if connected is not None and connected.transport is not None:
                connected.transport.abortConnection()
            raise
        finally:
            if timer.active():
                timer.cancel()

    def mark(self, backend: Backend, up: bool, reason: str) -> None:
        """Record what a check (or the relay) found."""
        if up:
            backend.down_reason = ""
        if backend.up == up:
            if not up:
                backend.down_reason = reason
            return
        backend.up = up
        backend.down_reason = reason
        ROUTER_BACKEND_UP.labels(backend.name).set(1 if up else 0)
        if up:
            logger.info("%s is up again", backend.name)
        else:
            logger.warning("%s is down (%s): its requests go elsewhere", backend.name, reason)
        self._on_change(backend)
