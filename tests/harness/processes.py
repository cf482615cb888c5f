"""Real homeserver processes for end-to-end tests.

:class:`ServerProcesses` writes a config for a layout into a temporary directory,
starts ``python -m synapse_lite.app.homeserver`` and ``...generic_worker`` as OS
processes, waits for their ``/health``, and stops, kills or restarts them.
Each process's output goes to ``<name>.log`` in the directory; the tail of it is
shown when a process fails to come up.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, Protocol

import attr
import treq
import yaml
from twisted.internet import defer, protocol, reactor, task
from twisted.web.client import HTTPConnectionPool

from synapse_lite.app.pid_files import pid_file_path, read_pid_file
from tests.harness.databases import TestDatabase

#: The directory holding the synapse_lite package (trial runs tests elsewhere).
SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: How long a process may take to answer /health after being started.
START_TIMEOUT_SECONDS = 30.0


#: Test HTTP requests do not keep connections open past the test.
NO_KEEPALIVE = HTTPConnectionPool(reactor, persistent=False)


_configs = itertools.count()

#: Every port :func:`free_port` has handed out in this process.
_handed_out: set[int] = set()


#: How many stripes :func:`ports_to_choose_from` cuts its range into: one
#: per trial worker of ``trial -jN``, for N up to this.
PORT_STRIPES = 8


def trial_worker_number() -> int | None:
    """Which worker of ``trial -jN`` this process is, or None outside ``-j``:
    trial runs worker k in ``<temp directory>/k`` (no test changes
    directory)."""
    name = os.path.basename(os.getcwd())
    return int(name) if name.isdigit() else None


def ports_to_choose_from() -> tuple[int, int]:
    """Ports below the kernel's ephemeral range: an outgoing connection (to
    PostgreSQL, another process) never takes one of them between the check
    here and the process that listens on it, seconds later (the router
    starts last; a Synapse peer takes seconds to listen).

    Under ``trial -jN`` each worker gets a stripe of its own: the workers
    are separate processes, and CI once saw one worker's server fail to
    listen on a port another worker had checked free and listened on
    first."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    first, last = (10000, low) if low > 12000 else (20000, 60000)
    worker = trial_worker_number()
    if worker is None:
        return first, last
    width = (last - first) // PORT_STRIPES
    first += (worker % PORT_STRIPES) * width
    return first, first + width


def free_port() -> int:
    """A TCP port nothing listens on right now, below the kernel's
    ephemeral range (:func:`ports_to_choose_from`; CI once saw a Synapse
    peer's port, picked from that range, taken by an outgoing connection
    before Synapse listened), and never one this process handed out
    before: two listeners of one test given one port make the second
    process's /health answered by the first."""
    return free_port_block(1)


def free_port_block(count: int) -> int:
    """A base port such that ``count`` consecutive ports are free now, as
    :func:`free_port` hands out one; none of them is handed out again."""
    first, last = ports_to_choose_from()
    for _ in range(1000):
        base = random.randrange(first, last - count + 1)
        block = range(base, base + count)
        if not _handed_out.isdisjoint(block):
            continue
        try:
            for port in block:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        _handed_out.update(block)
        return base
    raise RuntimeError(f"no block of {count} free ports")


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds a socket listening on TCP ``port``
    (IPv4 or IPv6); None where ``/proc`` cannot say (not Linux). A process
    that is gone listens on nothing: False, not None."""
    if not os.path.isdir("/proc/self/fd"):
        return None
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            # sl local_address rem_address st ... uid timeout inode
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


class _ProcessProtocol(protocol.ProcessProtocol):
    def __init__(self, log_path: str) -> None:
        self._log = open(log_path, "ab")
        self.ended: defer.Deferred[int | None] = defer.Deferred()
        self.exit_code: int | None = None
        self.running = True

    def outReceived(self, data: bytes) -> None:
        self._log.write(data)
        self._log.flush()

    errReceived = outReceived

    def processEnded(self, reason: Any) -> None:
        self.running = False
        self.exit_code = getattr(reason.value, "exitCode", None)
        self._log.close()
        self.ended.callback(self.exit_code)


@attr.s(auto_attribs=True)
class ServerProcess:
    name: str
    args: list[str]
    health_url: str | None
    log_path: str
    transport: Any = None
    proto: _ProcessProtocol | None = None


#: The end-to-end layout: main, a /sync worker, two events writers and a
#: typing writer (the client end-to-end test and the fault suite).
SPLIT_WORKERS = {
    "sync1": ["client", "replication", "health"],
    "persister1": ["replication", "health"],
    "persister2": ["replication", "health"],
    "typing1": ["replication", "health"],
}
SPLIT_WRITERS = {"events": ["persister1", "persister2"], "typing": "typing1"}


def layout_config(
    test_db: TestDatabase,
    workers: dict[str, list[str]],
    stream_writers: dict[str, Any],
    transport: str = "tcp",
    **extra: Any,
) -> dict[str, Any]:
    """A config dict: ``workers`` maps names to listener resources; every
    process gets one HTTP listener on a free port (main: client, replication,
    health, metrics)."""
    config: dict[str, Any] = {
        "server_name": "test.local",
        "database": test_db.config(),
        "worker_replication_secret": "e2e-secret",
        "enable_registration": True,
        "registration_shared_secret": "e2e-shared-secret",
        "log_level": "INFO",
        "position_log": True,
        "replication": {"transport": transport, "tcp": {"port": free_port()}},
        "listeners": [
            {"port": free_port(), "resources": ["client", "replication", "health", "metrics"]}
        ],
        "workers": {
            name: {"listeners": [{"port": free_port(), "resources": resources}]}
            for name, resources in workers.items()
        },
        "stream_writers": stream_writers,
        "rate_limiting": {"enabled": False},
    }
    if transport == "redis":
        from tests.harness.services import redis_address

        host, port = redis_address()
        # Parallel test runs share the Redis server: a channel per config.
        config["replication"]["redis"] = {
            "host": host,
            "port": port,
            "channel_prefix": f"test-{os.getpid()}-{next(_configs)}-",
        }
    config.update(extra)
    return config


class Cleanups(Protocol):
    """What :class:`ServerProcesses` needs of its owner: a test case, or any
    object that runs the callables it is given when it is done."""

    def addCleanup(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> None: ...


class ServerProcesses:
    """The processes of one homeserver config, started and stopped by a test
    (or by a benchmark, with its own ``addCleanup``)."""

    def __init__(
        self,
        testcase: Cleanups,
        config: dict[str, Any],
        worker_replication: dict[str, Any] | None = None,
    ) -> None:
        """``worker_replication``: a ``replication`` section for the workers'
        copy of the config (e.g. to reach the main process through a proxy);
        by default every process reads the same file."""
        self.dir = tempfile.mkdtemp(prefix="synapse_lite_e2e_")
        self.config = dict(config)
        self.config.setdefault("data_dir", os.path.join(self.dir, "data"))
        self.config_path = os.path.join(self.dir, "homeserver.yaml")
        with open(self.config_path, "w") as f:
            yaml.safe_dump(self.config, f, sort_keys=False)
        self.worker_config_path = self.config_path
        if worker_replication is not None:
            self.worker_config_path = os.path.join(self.dir, "homeserver-workers.yaml")
            with open(self.worker_config_path, "w") as f:
                yaml.safe_dump(
                    dict(self.config, replication=worker_replication), f, sort_keys=False
                )
        self.processes: dict[str, ServerProcess] = {}
        for name in ["main", *self.config.get("workers", {})]:
            self.processes[name] = self._describe(name)
        testcase.addCleanup(self.stop_all)

    def _describe(self, name: str) -> ServerProcess:
        if name == "main":
            listeners = self.config["listeners"]
            args = ["-m", "synapse_lite.app.homeserver", "-c", self.config_path]
        else:
            listeners = self.config["workers"][name]["listeners"]
            args = [
                "-m",
                "synapse_lite.app.generic_worker",
                "-c",
                self.worker_config_path,
                "--worker-name",
                name,
            ]
        health_url = None
        for listener in listeners:
            if "health" in listener.get("resources", []):
                health_url = f"http://127.0.0.1:{listener['port']}/health"
        return ServerProcess(name, args, health_url, os.path.join(self.dir, f"{name}.log"))

    def url(self, name: str, resource: str = "client") -> str:
        """Base URL of the listener of ``name`` serving ``resource``."""
        listeners = (
            self.config["listeners"]
            if name == "main"
            else self.config["workers"][name]["listeners"]
        )
        for listener in listeners:
            if resource in listener.get("resources", []):
                return f"http://127.0.0.1:{listener['port']}"
        raise KeyError(f"{name} has no {resource} listener")

    def log_tail(self, name: str, lines: int = 40) -> str:
        try:
            with open(self.processes[name].log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    async def start(self, *names: str) -> None:
        """Start processes (all, main first, if none named) and wait for /health."""
        for name in names or list(self.processes):
            await self._start_one(name)

    async def _start_one(self, name: str) -> None:
        process = self.processes[name]
        process.proto = _ProcessProtocol(process.log_path)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [SOURCE_ROOT, env.get("PYTHONPATH")]))
        process.transport = reactor.spawnProcess(
            process.proto, sys.executable, [sys.executable, *process.args], env=env, path=self.dir
        )
        await self.wait_healthy(name)

    async def wait_healthy(self, name: str, timeout: float = START_TIMEOUT_SECONDS) -> float:
        """Wait until ``name`` answers /health; the seconds it took.

        Its /health port may also be another process's (another test's, in
        a parallel run, that was handed the same free port): a 200 counts
        only once the process we started has written its pid file, which it
        does after preparing the database's schema, and (where ``/proc``
        says) holds the socket listening on that port. So a worker started
        next never finds the schema unprepared (seen once: "expects schema
        version N but found an empty database"); a process that cannot
        listen exits, and its log says why. Once Twisted has reaped the
        process its pid is None and its pid file removed: None == None must
        not pass for "its own pid file" (seen in CI: main reaped, its output
        pipes not yet closed, so still "running", and the foreign /health
        answered 200)."""
        process = self.processes[name]
        pid_path = pid_file_path(self.config["data_dir"], name)
        port = int(process.health_url.rsplit(":", 1)[1].split("/")[0]) if process.health_url else 0
        start = time.monotonic()
        while True:
            if process.proto is not None and not process.proto.running:
                raise AssertionError(
                    f"{name} exited with {process.proto.exit_code}:\n{self.log_tail(name)}"
                )
            if process.health_url is None:
                return 0.0
            try:
                response = await treq.get(process.health_url, timeout=1, pool=NO_KEEPALIVE)
                await treq.content(response)
                pid = process.transport.pid
                if (
                    response.code == 200
                    and pid is not None
                    and read_pid_file(pid_path) == pid
                    and listens_on(pid, port) is not False
                ):
                    return time.monotonic() - start
            except Exception:
                pass
            if time.monotonic() - start > timeout:
                raise AssertionError(f"{name} did not become healthy:\n{self.log_tail(name)}")
            await task.deferLater(reactor, 0.05, lambda: None)

    async def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        """Signal a process and wait for it to exit; its exit code."""
        process = self.processes[name]
        if process.proto is None or not process.proto.running:
            return process.proto.exit_code if process.proto else None
        process.transport.signalProcess(sig)
        ended = process.proto.ended
        try:
            return await ended.addTimeout(timeout, reactor)
        except defer.TimeoutError:
            process.transport.signalProcess(signal.SIGKILL)
            raise AssertionError(f"{name} did not stop within {timeout} s") from None

    async def kill(self, name: str) -> None:
        await self.stop(name, signal.SIGKILL)

    def pause(self, name: str) -> None:
        self.processes[name].transport.signalProcess(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.processes[name].transport.signalProcess(signal.SIGCONT)

    async def stop_all(self) -> None:
        """Workers first, then the main process."""
        for name in reversed(list(self.processes)):
            process = self.processes[name]
            if process.proto is not None and process.proto.running:
                try:
                    await self.stop(name)
                except AssertionError:
                    pass
