"""The router process: ``python -m synapse_lite.app.router -c homeserver.yaml``.

It listens on the ``router`` listeners of the config (the client port) and
relays every request to the process serving it (``synapse_lite/routing/``).
It opens the database only to read rooms' events writers, follows
replication only for changes to them, and polls each process's ``/health``.
``synapse-lite run`` starts it last and stops it first.

Stopping: it stops accepting connections, lets the write requests under way
finish (bounded), then closes everything; clients' long-polls end and they
poll again, at the router that replaces it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from twisted.internet import defer
from twisted.internet.error import CannotListenError

from synapse_lite.app.logs import setup_logging
from synapse_lite.app.pid_files import pid_file_path, remove_pid_file, write_pid_file
from synapse_lite.app.process import detach_from_terminal_signals, stop_when_launcher_goes
from synapse_lite.app.services import CallbackService, ProcessService
from synapse_lite.clock import Clock
from synapse_lite.config.homeserver import ROUTER_PROCESS, HomeServerConfig, load_config
from synapse_lite.config.validation import ConfigError
from synapse_lite.endpoints import describe_listener, listen
from synapse_lite.http.forwarded import router_proof
from synapse_lite.http.tls import InternalTlsClient, TlsSetupError
from synapse_lite.routing.backends import HealthChecks, backends_of
from synapse_lite.routing.relay import Relay
from synapse_lite.routing.room_writers import ReplicationFollower, RoomWriters
from synapse_lite.routing.router import Router
from synapse_lite.routing.table import RoutingError, RoutingTable

logger = logging.getLogger("synapse_lite.app.router")

#: Beyond the longest /sync the processes allow, how long a request may wait
#: for its response to begin before the router answers 504.
RESPONSE_MARGIN_SECONDS = 60.0
#: Longest a stopping router waits for write requests under way.
DRAIN_SECONDS = 10.0
_WRITE_METHODS = (b"PUT", b"POST", b"DELETE")


class RouterProcess:
    """The router's parts, built from the config, and their lifecycle."""

    def __init__(self, config: HomeServerConfig, reactor: Any) -> None:
        router_config = config.router
        if router_config is None:
            raise RoutingError(f"{config.config_files[0]} has no 'router' section")
        if not config.worker_replication_secret:
            raise RoutingError("the router needs worker_replication_secret")
        self.config = config
        self.reactor = reactor
        self.table = RoutingTable.build(config)
        tls = InternalTlsClient(config.internal_tls.ca_path)
        self.backends = backends_of(config, self.table.instances())
        self.room_writers = RoomWriters.from_config(config, reactor)
        self.router = Router(self.table, self.backends, self.room_writers)
        self.relay = Relay(
            reactor,
            self.router,
            tls,
            router_proof(config.worker_replication_secret),
            config.limits.max_sync_timeout_ms / 1000 + RESPONSE_MARGIN_SECONDS,
            self.router.local_page,
        )
        self.health = HealthChecks(reactor, list(self.backends.values()), tls, self._changed)
        self.router.health = self.health
        self.follower = ReplicationFollower(config, self.room_writers, reactor)
        self.ports: list[Any] = []
        self.service = ProcessService(Clock(reactor), ROUTER_PROCESS)
        for child in (
            CallbackService("database", stop=self.room_writers.close),
            CallbackService("replication", start=self.follower.start, stop=self.follower.stop),
            CallbackService("health checks", start=self.health.start, stop=self.health.stop),
            CallbackService("listeners", start=self._listen, stop=self._drain),
        ):
            child.setServiceParent(self.service)

    def _changed(self, backend: Any) -> None:
        if not backend.up:
            self.relay.backend_down(backend)

    def _listen(self) -> None:
        assert self.config.router is not None
        for listener in self.config.router.listeners:
            factory = self.relay.factory(listener.resources, listener.tls is not None)
            port = listen(
                self.reactor, listener.port, listener.bind_address, listener.tls, factory
            )
            self.ports.append(port)
            logger.info(
                "Listening on %s",
                describe_listener(port, listener.bind_address, listener.resources, listener.tls),
            )

    async def _drain(self) -> None:
        for port in self.ports:
            await port.stopListening()
        clock = Clock(self.reactor)
        deadline = time.monotonic() + DRAIN_SECONDS
        while time.monotonic() < deadline:
            writes = [
                e
                for waiting in self.relay.waiting.values()
                for e in waiting
                if e.head.method in _WRITE_METHODS
            ]
            if not writes:
                break
            await clock.sleep(0.05)
        self.relay.close_clients()
        self.relay.pool.close_all()

    def describe(self) -> str:
        routes = ", ".join(
            f"{name}: {', '.join(instances)}"
            for name, instances in {
                r.served_by.name: r.instances for r in [self.table.default, *self.table.routes]
            }.items()
        )
        return f"routes {routes}"


def main(argv: list[str] | None = None) -> int:
    launcher_pid = detach_from_terminal_signals()
    parser = argparse.ArgumentParser(prog="python -m synapse_lite.app.router")
    parser.add_argument("-c", "--config", required=True, help="homeserver.yaml")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    from twisted.internet import reactor

    setup_logging(ROUTER_PROCESS, config.log_level)
    logging.getLogger("twisted").setLevel(logging.WARNING)
    start = time.monotonic()
    try:
        process = RouterProcess(config, reactor)
    except (RoutingError, TlsSetupError) as e:
        logger.error("The router cannot start: %s", e)
        return 2
    pid_path = pid_file_path(config.data_dir, ROUTER_PROCESS)
    service = ProcessService(Clock(reactor), ROUTER_PROCESS)
    CallbackService(
        "pid file", start=lambda: write_pid_file(pid_path), stop=lambda: remove_pid_file(pid_path)
    ).setServiceParent(service)
    process.service.setServiceParent(service)
    try:
        service.startService()
    except CannotListenError as e:
        logger.error(
            "The router cannot listen on %s:%d: %s. Is another program using the port?",
            e.interface or "*",
            e.port,
            getattr(e.socketError, "strerror", None) or e.socketError,
        )
        d = service.stopService()
        if not d.called:  # stopping has to wait: run the reactor until it is done
            d.addBoth(lambda _: reactor.stop())
            reactor.run()
        return 1
    logger.info("router started in %.3f s: %s", time.monotonic() - start, process.describe())

    def stop() -> defer.Deferred[None]:
        logger.info("Shutting down the router")
        return service.stopService()

    reactor.addSystemEventTrigger("before", "shutdown", stop)
    if launcher_pid is not None:
        stop_when_launcher_goes(launcher_pid)
    reactor.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
