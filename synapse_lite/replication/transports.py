"""Starting and stopping the configured replication transport of a process.

* ``tcp``: the main process listens on ``replication.tcp``; workers connect to
  it and the main process relays between them.
* ``redis``: every process publishes and subscribes on the channel named after
  the server.

Either way the transport is the command handler's bus: what the handler sends
reaches every other process, encoded once.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from twisted.internet.interfaces import IStreamClientEndpoint

from synapse_lite.config.homeserver import MAIN_PROCESS, HomeServerConfig
from synapse_lite.endpoints import listen
from synapse_lite.http.tls import InternalTlsClient
from synapse_lite.replication.tcp.handler import ReplicationCommandHandler
from synapse_lite.replication.tcp.tcp_client import ReplicationClientFactory
from synapse_lite.replication.tcp.tcp_server import ReplicationServerFactory

if TYPE_CHECKING:
    from synapse_lite.replication.tcp.connection import ReplicationCommandReceiver
    from synapse_lite.replication.tcp.redis import RedisReplicationBus

logger = logging.getLogger(__name__)


def replication_endpoint(config: HomeServerConfig, reactor: Any) -> IStreamClientEndpoint:
    """Where workers (and the router) connect for TCP replication: the main
    process's listener, with TLS checked against ``internal_tls.ca_path``
    when it has TLS."""
    replication = config.replication
    return InternalTlsClient(config.internal_tls.ca_path).endpoint(
        reactor, replication.tcp_host, replication.tcp_port, replication.tcp_tls is not None
    )


def redis_bus(
    config: HomeServerConfig,
    instance_name: str,
    receiver: ReplicationCommandReceiver,
    reactor: Any,
    deployment_id: str,
    followed_streams: Collection[str] | None = None,
) -> RedisReplicationBus:
    """The Redis bus of one process (every process's, the router's
    included): on the configured Redis, naming the deployment in every
    message. ``followed_streams``: see :class:`RedisReplicationBus`."""
    # Imported here: txredisapi is an optional dependency.
    from synapse_lite.replication.tcp.redis import RedisReplicationBus

    return RedisReplicationBus.from_config(
        config.replication.redis,
        server_name=config.server_name,
        instance_name=instance_name,
        receiver=receiver,
        reactor=reactor,
        deployment_id=deployment_id,
        followed_streams=followed_streams,
        secret=config.worker_replication_secret,
    )


class ReplicationTransport:
    """The transport of one process (see the module docstring)."""

    def __init__(
        self,
        config: HomeServerConfig,
        instance_name: str,
        handler: ReplicationCommandHandler,
        reactor: Any,
        deployment_id: str = "none",
        followed_streams: Collection[str] | None = None,
    ) -> None:
        """``deployment_id``: the database's, named in every Redis message.
        ``followed_streams``: the streams this process reads (its role's
        subscription; None: every stream of the catalog, the main
        process's): a TCP worker sends them in SUBSCRIBE, a Redis bus
        subscribes to their channels alone."""
        self._config = config
        self._followed = (
            list(config.streams.names()) if followed_streams is None else list(followed_streams)
        )
        self._deployment_id = deployment_id
        self._me = instance_name
        self._handler = handler
        self._reactor = reactor
        self._transport: Any = None
        self._listening_port: Any = None

    def start(self) -> None:
        """Listen or connect, as the config says."""
        config = self._config
        replication = config.replication
        if replication.transport == "redis":
            bus = redis_bus(
                config,
                self._me,
                self._handler,
                self._reactor,
                self._deployment_id,
                followed_streams=self._followed,
            )
            bus.start()
            self._transport = bus
            logger.info(
                "Replicating over Redis at %s:%d", replication.redis.host, replication.redis.port
            )
        elif self._me == MAIN_PROCESS:
            server = ReplicationServerFactory(
                config.server_name,
                config.worker_replication_secret,
                self._handler,
                self._reactor,
                deployment_id=self._deployment_id,
                check_claim=self._handler.claims.check,
            )
            self._listening_port = listen(
                self._reactor,
                replication.tcp_port,
                replication.tcp_host,
                replication.tcp_tls,
                server,
            )
            self._transport = server
            logger.info(
                "Replication listener on %s:%d%s",
                replication.tcp_host,
                self._listening_port.getHost().port,
                " (TLS)" if replication.tcp_tls is not None else "",
            )
        else:
            client = ReplicationClientFactory(
                config.server_name,
                self._me,
                config.worker_replication_secret,
                self._handler,
                self._reactor,
                deployment_id=self._deployment_id,
                followed_streams=self._followed,
            )
            client.connect(replication_endpoint(config, self._reactor))
            self._transport = client
            logger.info(
                "Replicating over TCP with the main process at %s:%d%s",
                replication.tcp_host,
                replication.tcp_port,
                " (TLS)" if replication.tcp_tls is not None else "",
            )
        self._handler.set_bus(self._transport)

    def problems(self) -> list[str]:
        """Why ``/health`` should say degraded (another deployment on the
        Redis channel), if anything."""
        problems = getattr(self._transport, "problems", None)
        return list(problems()) if problems is not None else []

    async def stop(self) -> None:
        """Close the transport (after the last commands have been queued)."""
        self._handler.stop()
        transport, self._transport = self._transport, None
        if transport is None:
            return
        if self._listening_port is not None:
            await self._listening_port.stopListening()
            transport.close_all()
            return
        result = transport.stop()
        if result is not None:
            await result
