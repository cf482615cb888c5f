"""Several "hosts" on one machine: network namespaces joined by a bridge.

:class:`Network` creates, for one test, a Linux bridge in the root namespace
with an address of a private /24, and one network namespace per host name,
each joined to the bridge by a veth pair and given the next address. A
process started with :meth:`Network.spawn` runs inside its host's namespace
(``ip netns exec``), so it can reach the others only over that network, by
their addresses. Services that listen only on the root namespace's loopback
(the test PostgreSQL and Redis) are reached through :meth:`forward`, a TCP
relay on the bridge's address. Everything is removed at the end of the test.

It needs root (CAP_NET_ADMIN) and the ``ip`` command: :func:`require_netns`
skips the test with the reason where they are missing, except under
``CI=true``, where that is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.protocols import portforward
from twisted.trial import unittest

from tests.harness.processes import SOURCE_ROOT
from tests.harness.services import ServiceMissing, in_ci

reactor: Any = _reactor


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def require_netns() -> None:
    """Skip (or, under CI, fail) unless this process may create namespaces."""
    problem = None
    if shutil.which("ip") is None:
        problem = "the ip command (iproute2) is not installed"
    elif os.geteuid() != 0:
        problem = "creating network namespaces needs root"
    else:
        probe = f"slprobe{os.getpid()}"
        result = _ip("netns", "add", probe, check=False)
        if result.returncode != 0:
            problem = f"ip netns add failed: {result.stderr.strip()}"
        else:
            _ip("netns", "del", probe, check=False)
    if problem is None:
        return
    message = f"network namespaces are not available here: {problem}"
    if in_ci():
        raise ServiceMissing(message + " (CI=true: CI runs as root and must run this)")
    raise unittest.SkipTest(message)


class Network:
    """A bridge and one namespace per host (see the module docstring)."""

    def __init__(self, testcase: unittest.TestCase, hosts: list[str]) -> None:
        tag = os.getpid() % 100000
        self._prefix = self._free_prefix()
        self.bridge = f"slb{tag}"
        self.bridge_address = f"{self._prefix}.1"
        self.namespaces: dict[str, str] = {}
        self.addresses: dict[str, str] = {}
        self._veths: list[str] = []
        testcase.addCleanup(self.remove)
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, host in enumerate(hosts):
            namespace = f"synapse-lite-{tag}-{host}"
            outside, inside = f"slv{tag}{i}", f"slp{tag}{i}"
            address = f"{self._prefix}.{i + 2}"
            _ip("netns", "add", namespace)
            self.namespaces[host] = namespace
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            self._veths.append(outside)
            _ip("link", "set", inside, "netns", namespace)
            _ip("link", "set", outside, "master", self.bridge)
            _ip("link", "set", outside, "up")
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", inside)
            _ip("-n", namespace, "link", "set", inside, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            _ip("-n", namespace, "route", "add", "default", "via", self.bridge_address)
            self.addresses[host] = address
        self._forwarders: list[Any] = []

    @staticmethod
    def _free_prefix() -> str:
        """A 10.x.y.0/24 no interface here uses (parallel runs pick by pid)."""
        used = _ip("-o", "addr").stdout
        pid = os.getpid()
        for attempt in range(200):
            prefix = f"10.{200 + (pid + attempt) % 50}.{(pid // 50 + attempt) % 250}"
            if f" {prefix}." not in used:
                return prefix
        raise RuntimeError("no free 10.x.y.0/24 for the test network")

    def forward(self, host: str, port: int) -> tuple[str, int]:
        """Relay a service of the root namespace (``host:port``) onto the
        bridge; the address the namespaces reach it at."""
        factory = portforward.ProxyFactory(host, port)
        factory.noisy = False
        listening = reactor.listenTCP(0, factory, interface=self.bridge_address)
        self._forwarders.append(listening)
        return self.bridge_address, listening.getHost().port

    def spawn(self, host: str, protocol: Any, args: list[str], cwd: str) -> Any:
        """Run ``python args...`` in ``host``'s namespace; its process transport."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [SOURCE_ROOT, env.get("PYTHONPATH")]))
        argv = ["ip", "netns", "exec", self.namespaces[host], sys.executable, *args]
        return reactor.spawnProcess(protocol, "/usr/bin/env", ["env", *argv], env=env, path=cwd)

    async def remove(self) -> None:
        for listening in self._forwarders:
            await listening.stopListening()
        for veth in self._veths:
            _ip("link", "del", veth, check=False)
        for namespace in self.namespaces.values():
            _ip("netns", "del", namespace, check=False)
        _ip("link", "del", self.bridge, check=False)
