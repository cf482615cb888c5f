"""Starting the configured replication transport for a process.

* ``tcp``: the main process listens on ``replication.tcp``; workers connect to
  it and the main process relays between them.
* ``redis``: every process publishes and subscribes on the channel named after
  the server.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from synapse_lite.server import HomeServer

logger = logging.getLogger(__name__)


def start_replication(hs: HomeServer) -> None:
    """Listen or connect, as the config says; the command handler receives."""
    config = hs.config
    receiver = hs.replication
    transport: Any
    if config.replication.transport == "redis":
        from synapse_lite.replication.tcp.redis import RedisReplicationBus

        transport = RedisReplicationBus.from_config(
            config.replication.redis,
            server_name=config.server_name,
            instance_name=hs.instance_name,
            receiver=receiver,
            reactor=hs.reactor,
        )
        transport.start()
        logger.info(
            "Replicating over Redis at %s:%d",
            config.replication.redis.host,
            config.replication.redis.port,
        )
    elif hs.is_main_process:
        from synapse_lite.replication.tcp.tcp_server import ReplicationServerFactory

        transport = ReplicationServerFactory(
            config.server_name, config.worker_replication_secret, receiver, hs.reactor
        )
        port = hs.reactor.listenTCP(
            config.replication.tcp_port, transport, interface=config.replication.tcp_host
        )
        transport.listening_port = port
        logger.info(
            "Replication listener on %s:%d", config.replication.tcp_host, port.getHost().port
        )
    else:
        from synapse_lite.replication.tcp.tcp_client import ReplicationClientFactory

        transport = ReplicationClientFactory(
            config.server_name,
            hs.instance_name,
            config.worker_replication_secret,
            receiver,
            hs.reactor,
        )
        hs.reactor.connectTCP(config.replication.tcp_host, config.replication.tcp_port, transport)
        logger.info(
            "Replicating over TCP with the main process at %s:%d",
            config.replication.tcp_host,
            config.replication.tcp_port,
        )
    hs.replication_transport = transport  # type: ignore[attr-defined]


async def stop_replication(hs: HomeServer) -> None:
    """Close the transport (after the last commands have been queued)."""
    transport = getattr(hs, "replication_transport", None)
    if transport is None:
        return
    if hasattr(transport, "listening_port"):
        await transport.listening_port.stopListening()
        transport.close_all()
    elif hasattr(transport, "stop"):
        result = transport.stop()
        if result is not None:
            await result
