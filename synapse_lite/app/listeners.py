"""A process's HTTP listeners: the resource tree of each, and the service that
listens and, when stopping, drains them.

Resources: ``client`` (the Matrix client API and the admin API beside it,
and the media paths, federation media included: served on the media
instance, refused elsewhere),
``federation`` and ``keys`` (server-server), ``replication`` (internal calls
from other processes), ``health`` and ``metrics``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, Protocol

import attr
from prometheus_client.twisted import MetricsResource
from twisted.application.service import Service
from twisted.internet import defer
from twisted.web.resource import Resource
from twisted.web.server import Request

from synapse_lite.clock import Clock
from synapse_lite.config.homeserver import ListenerConfig
from synapse_lite.endpoints import describe_listener, listen
from synapse_lite.http.server import JsonResource, ServingSite, UploadRoute, make_site
from synapse_lite.rest.client import ClientHandlers, register_servlets

logger = logging.getLogger(__name__)

#: Longest a stopping process waits for write requests under way to finish.
DRAIN_SECONDS = 10.0


class HealthResource(Resource):
    """``GET /health``: 200 ``{"status": "ok"}`` while the process serves; with
    ``"degraded"`` and the ``reasons`` when something needs an operator (a
    stalled stream) though it still serves. ``details``: more fields that do
    not change the status (a federation sender's stalled destinations)."""

    isLeaf = True

    def __init__(
        self,
        instance_name: str,
        problems: Callable[[], list[str]] | None = None,
        details: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        self._instance_name = instance_name
        self._problems = problems
        self._details = details

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"Content-Type", b"application/json")
        reasons = self._problems() if self._problems is not None else []
        body: dict[str, object] = {
            "status": "degraded" if reasons else "ok",
            "instance": self._instance_name,
        }
        if reasons:
            body["reasons"] = reasons
        if self._details is not None:
            body.update(self._details())
        return json.dumps(body).encode("utf-8")


class MediaEndpoints(Protocol):
    """The media paths of a client listener: served (the media instance,
    ``synapse_lite/media/servlets.py``'s ``MediaServlets``) or refused
    (``MediaElsewhere``)."""

    def register(self, resource: JsonResource) -> None: ...

    def register_federation(self, resource: JsonResource) -> None:
        """The federation media paths alone, on a listener without ``client``."""

    def upload_routes(self) -> list[UploadRoute]: ...


@attr.s(slots=True, frozen=True, auto_attribs=True, kw_only=True)
class ListenerResources:
    """What a process can serve; each listener picks by its ``resources``."""

    instance_name: str
    client: ClientHandlers
    #: The internal calls this process serves (``/_synapse/replication``).
    replication: Callable[[], JsonResource]
    #: Registers the ``federation``/``keys`` APIs on a resource, where this
    #: process serves them.
    federation: Callable[[JsonResource, tuple[str, ...]], None] | None
    media: MediaEndpoints
    #: What /health reports as wrong (stalled streams), if anything.
    problems: Callable[[], list[str]] | None = None
    #: What else /health says (``HealthResource``).
    health_details: Callable[[], dict[str, Any]] | None = None
    #: ``/.well-known/matrix/*`` where configured, on client and federation
    #: listeners.
    well_known: Resource | None = None

    def upload_routes(self, resources: tuple[str, ...]) -> list[UploadRoute]:
        """The paths of a listener whose request bodies may be large."""
        return self.media.upload_routes() if "client" in resources else []

    def tree(self, resources: tuple[str, ...]) -> Resource:
        """The resource tree of one listener."""
        root = Resource()
        # /_synapse holds both the admin API (served with the client API) and
        # the internal replication endpoints; each JsonResource matches whole paths.
        synapse_root = Resource()
        # /_matrix holds the client, federation and key APIs, on one JsonResource.
        matrix: JsonResource | None = None
        if "client" in resources:
            matrix = JsonResource("client")
            register_servlets(self.client, matrix)
            self.media.register(matrix)
            synapse_root.putChild(b"admin", matrix)
        if self.federation is not None and {"federation", "keys"} & set(resources):
            matrix = matrix or JsonResource("federation")
            self.federation(matrix, resources)
            if "client" not in resources and "federation" in resources:
                # Federation media: served by the media instance, refused elsewhere.
                self.media.register_federation(matrix)
        if matrix is not None:
            root.putChild(b"_matrix", matrix)
        if self.well_known is not None and {"client", "federation"} & set(resources):
            root.putChild(b".well-known", self.well_known)
        if "replication" in resources:
            synapse_root.putChild(b"replication", self.replication())
        if synapse_root.children:
            root.putChild(b"_synapse", synapse_root)
        if "health" in resources:
            health = HealthResource(self.instance_name, self.problems, self.health_details)
            root.putChild(b"health", health)
        if "metrics" in resources:
            root.putChild(b"metrics", MetricsResource())
        return root


class ListenersService(Service):
    """Listens on a process's HTTP ports; when stopping, stops accepting
    requests and lets the write requests under way finish (bounded)."""

    def __init__(
        self,
        *,
        reactor: Any,
        clock: Clock,
        listeners: tuple[ListenerConfig, ...],
        resources: ListenerResources,
        max_body_bytes: int,
        router_proof: str | None = None,
    ) -> None:
        """``router_proof``: requests carrying it are believed about the
        client's address (``http/forwarded.py``)."""
        self.setName("listeners")
        self._reactor = reactor
        self._clock = clock
        self._listeners = listeners
        self.resources = resources
        self._max_body_bytes = max_body_bytes
        self._router_proof = router_proof
        self.sites: list[ServingSite] = []
        self.ports: list[Any] = []

    def startService(self) -> None:
        super().startService()
        for listener in self._listeners:
            site = make_site(
                self.resources.tree(listener.resources),
                self._max_body_bytes,
                self.resources.upload_routes(listener.resources),
                self._router_proof,
            )
            port = listen(self._reactor, listener.port, listener.bind_address, listener.tls, site)
            self.sites.append(site)
            self.ports.append(port)
            logger.info(
                "Listening on %s",
                describe_listener(port, listener.bind_address, listener.resources, listener.tls),
            )

    def stopService(self) -> defer.Deferred[None]:
        super().stopService()
        return defer.ensureDeferred(self._drain())

    async def _drain(self) -> None:
        for port in self.ports:
            await port.stopListening()
        pending = sum(site.writes_in_flight for site in self.sites)
        if not pending:
            return
        logger.info("Waiting for %d write request(s) to finish", pending)
        waiting = defer.gatherResults([site.wait_for_writes() for site in self.sites])
        try:
            await self._clock.timeout(waiting, DRAIN_SECONDS)
        except defer.TimeoutError:
            logger.warning(
                "%d write request(s) still unfinished after %.0f s; stopping anyway",
                sum(site.writes_in_flight for site in self.sites),
                DRAIN_SECONDS,
            )
