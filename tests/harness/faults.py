"""Things that break on purpose: private Redis and PostgreSQL servers that can be
restarted, and a TCP proxy whose connections can be dropped.

The shared Redis and PostgreSQL serve every test run on the machine, so a fault
test never restarts them: it starts a private server on a free port and
restarts that. Used by ``tests/e2e/test_faults.py`` and ``bench/soak.py``.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import tempfile
import time
from typing import Any, cast

from twisted.internet import defer, protocol, reactor, task, utils
from twisted.trial.unittest import SkipTest

from tests.harness.processes import free_port
from tests.harness.services import ServiceMissing, in_ci


def _missing(message: str) -> Exception:
    """Skip, or under CI=true fail: CI must run every fault."""
    if in_ci():
        return ServiceMissing(message + " (CI=true: a missing service is a failure)")
    return SkipTest(message)


async def _sleep(seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


async def _wait_port(port: int, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            await _sleep(0.05)
    raise AssertionError(f"{what} did not listen on port {port} within {timeout} s")


class _Child(protocol.ProcessProtocol):
    def __init__(self) -> None:
        self.ended: defer.Deferred[None] = defer.Deferred()
        self.output = bytearray()

    def outReceived(self, data: bytes) -> None:
        # Keep the tail only: enough to say why a server did not start.
        self.output = (self.output + data)[-4000:]

    errReceived = outReceived

    def processEnded(self, reason: Any) -> None:
        self.ended.callback(None)


class PrivateRedis:
    """A ``redis-server`` of our own on a free port, with no persistence, so
    that restarting it is exactly what a Redis failover does to us: every
    connection drops and pub/sub subscriptions are gone."""

    def __init__(self) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise _missing("redis-server is not installed: a private Redis cannot be started")
        self.port = free_port()
        self._child: _Child | None = None
        self._transport: Any = None

    async def start(self) -> None:
        assert self.binary is not None
        self._child = _Child()
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        self._transport = reactor.spawnProcess(self._child, self.binary, args, env=dict(os.environ))
        await _wait_port(self.port, 10.0, "private redis-server")

    async def stop(self) -> None:
        """SIGKILL: the way a crashed or fenced-off Redis goes, without a goodbye."""
        if self._child is None or self._child.ended.called:
            return
        self._transport.signalProcess(signal.SIGKILL)
        await self._child.ended

    async def restart(self, down_seconds: float) -> None:
        await self.stop()
        await _sleep(down_seconds)
        await self.start()


def _postgres_bin() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return os.path.dirname(found[-1])
    pg_ctl = shutil.which("pg_ctl")
    return os.path.dirname(pg_ctl) if pg_ctl else None


class PrivatePostgres:
    """A PostgreSQL cluster of our own (``initdb`` in a temporary directory),
    started and stopped with ``pg_ctl``. PostgreSQL refuses to run as root;
    as root the cluster is made and run as the ``postgres`` system user."""

    def __init__(self) -> None:
        self.bin = _postgres_bin()
        if self.bin is None:
            raise _missing("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="synapse_lite_pg_")
        self.data = os.path.join(self.dir, "data")
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            runuser = shutil.which("runuser")
            if runuser is None:
                raise _missing("running as root without runuser: cannot run a private PostgreSQL")
            try:
                shutil.chown(self.dir, "postgres")
            except LookupError:
                message = "running as root with no 'postgres' user to run PostgreSQL as"
                raise _missing(message) from None
            self._as_user = [runuser, "-u", "postgres", "--"]

    async def _run(self, *args: str) -> None:
        command = [*self._as_user, *args]
        out, err, code = await utils.getProcessOutputAndValue(
            command[0], command[1:], env=dict(os.environ), path=self.dir
        )
        if code != 0:
            raise AssertionError(f"{' '.join(args)} failed ({code}): {out!r} {err!r}")

    async def start(self) -> None:
        assert self.bin is not None
        if not os.path.exists(self.data):
            await self._run(
                os.path.join(self.bin, "initdb"), "-D", self.data, "-A", "trust", "-U",
                "postgres", "--no-sync",
            )  # fmt: skip
        # fsync off: this cluster is thrown away, and a soak on a shared
        # machine should measure us, not the disk.
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        await self._run(
            os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-o", options, "-l",
            os.path.join(self.dir, "postgres.log"), "-w", "start",
        )  # fmt: skip

    async def stop(self) -> None:
        """``-m immediate``: the server goes as if the machine lost power;
        every client connection breaks mid-conversation."""
        assert self.bin is not None
        await self._run(
            os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-m", "immediate", "-w", "stop"
        )

    async def restart(self, down_seconds: float) -> None:
        await self.stop()
        await _sleep(down_seconds)
        await self.start()

    def connect_args(self) -> dict[str, Any]:
        return {"host": "127.0.0.1", "port": self.port, "user": "postgres", "password": ""}

    async def destroy(self) -> None:
        try:
            await self.stop()
        except AssertionError:
            pass  # not running
        shutil.rmtree(self.dir, ignore_errors=True)


class _Relay(protocol.Protocol):
    """One side of a proxied connection: writes what it receives to its peer."""

    peer: _Relay | None = None
    pending: bytes = b""

    def peer_transport(self) -> Any:
        return None if self.peer is None else self.peer.transport

    def dataReceived(self, data: bytes) -> None:
        peer = self.peer_transport()
        if peer is not None:
            peer.write(data)
        else:
            self.pending += data

    def connectionLost(self, reason: Any = None) -> None:
        peer = self.peer_transport()
        if peer is not None:
            peer.loseConnection()


class _Inbound(_Relay):
    def __init__(self, proxy: TcpProxy) -> None:
        self.proxy = proxy

    def connectionMade(self) -> None:
        self.proxy.connections.append(self)
        self.proxy.accepted += 1
        inbound: Any = self.transport
        # Read nothing until the other side is connected.
        inbound.pauseProducing()
        outbound = _Relay()
        outbound.peer = self
        self.peer = outbound
        creator = protocol.ClientCreator(reactor, lambda: outbound)
        d = creator.connectTCP("127.0.0.1", self.proxy.target_port)

        def connected(_: object) -> None:
            if self.pending:
                cast(Any, outbound.transport).write(self.pending)
                self.pending = b""
            inbound.resumeProducing()

        d.addCallbacks(connected, lambda _: inbound.loseConnection())

    def connectionLost(self, reason: Any = None) -> None:
        if self in self.proxy.connections:
            self.proxy.connections.remove(self)
        super().connectionLost(reason)


class TcpProxy:
    """Listens on a free port and relays each connection to ``target_port``.
    :meth:`drop` aborts every relayed connection, both ways, the way a
    NAT timeout or a firewall reload does; new connections keep working."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.connections: list[_Inbound] = []
        #: connections accepted so far (reconnections included)
        self.accepted = 0
        factory = protocol.ServerFactory()
        factory.buildProtocol = lambda addr: _Inbound(self)  # type: ignore[method-assign]
        self._port: Any = cast(Any, reactor).listenTCP(0, factory, interface="127.0.0.1")
        self.port: int = self._port.getHost().port

    def drop(self) -> int:
        """Abort every connection relayed now; how many there were."""
        dropped = list(self.connections)
        for inbound in dropped:
            for transport in (inbound.transport, inbound.peer_transport()):
                if transport is not None:
                    cast(Any, transport).abortConnection()
        return len(dropped)

    async def close(self) -> None:
        self.drop()
        await self._port.stopListening()
