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
from typing import Any

from synapse_lite.config.homeserver import MAIN_PROCESS, HomeServerConfig
from synapse_lite.replication.tcp.handler import ReplicationCommandHandler
from synapse_lite.replication.tcp.tcp_client import ReplicationClientFactory
from synapse_lite.replication.tcp.tcp_server import ReplicationServerFactory

logger = logging.getLogger(__name__)


class ReplicationTransport:
    """The transport of one process (see the module docstring)."""

    def __init__(
        self,
        config: HomeServerConfig,
        instance_name: str,
        handler: ReplicationCommandHandler,
        reactor: Any,
    ) -> None:
        self._config = config
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
            # Imported here: txredisapi is an optional dependency.
            from synapse_lite.replication.tcp.redis import RedisReplicationBus

            bus = RedisReplicationBus.from_config(
                replication.redis,
                server_name=config.server_name,
                instance_name=self._me,
                receiver=self._handler,
                reactor=self._reactor,
            )
            bus.start()
            self._transport = bus
            logger.info(
                "Replicating over Redis at %s:%d", replication.redis.host, replication.redis.port
            )
        elif self._me == MAIN_PROCESS:
            server = ReplicationServerFactory(
                config.server_name, config.worker_replication_secret, self._handler, self._reactor
            )
            self._listening_port = self._reactor.listenTCP(
                replication.tcp_port, server, interface=replication.tcp_host
            )
            self._transport = server
            logger.info(
                "Replication listener on %s:%d",
                replication.tcp_host,
                self._listening_port.getHost().port,
            )
        else:
            client = ReplicationClientFactory(
                config.server_name,
                self._me,
                config.worker_replication_secret,
                self._handler,
                self._reactor,
            )
            self._reactor.connectTCP(replication.tcp_host, replication.tcp_port, client)
            self._transport = client
            logger.info(
                "Replicating over TCP with the main process at %s:%d",
                replication.tcp_host,
                replication.tcp_port,
            )
        self._handler.set_bus(self._transport)

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
