"""The router's relay alone, in one process: ``python -m bench.router_loop``.

A stand-in process (answers every request with the same small JSON response
at once), the router's :class:`~synapse_lite.routing.relay.Relay` in front of
it, and a client sending one send (``PUT .../send/...``, 8 headers, a small
body) at a time over one kept-alive connection, all on loopback sockets in one
reactor. The process's CPU per request is measured through the router and
with the client talking to the stand-in directly; the difference is what
relaying one request costs (parsing, routing, the extra reactor turns and
socket calls), free of the database, the workers and the machine's other
load. Each measurement runs in a fresh child process; with ``--baseline DIR``
(another checkout) that code is measured too, alternating, and the ratios
are printed. ``bench/router_cost.py`` measures the router process itself in
the default layout.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any, cast

SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RESPONSE = (
    b"HTTP/1.1 200 OK\r\nServer: TwistedWeb/23\r\nDate: Sun, 29 Nov 2026 10:00:00 GMT\r\n"
    b"Content-Type: application/json\r\nCache-Control: no-cache, no-store, must-revalidate\r\n"
    b'Content-Length: 40\r\n\r\n{"event_id":"$abcdefghijklmnopqrstuvwx"}'
)
ROOM = "!room:bench"
WARMUP = 300


def child(requests: int, direct: bool) -> None:
    """Measure in this process; prints ``user_us system_us`` per request."""
    from twisted.internet import protocol
    from twisted.internet import reactor as _reactor

    from synapse_lite.api.access_tokens import generate_access_token
    from synapse_lite.config.homeserver import read_homeserver_config
    from synapse_lite.http.forwarded import router_proof
    from synapse_lite.http.tls import InternalTlsClient
    from synapse_lite.routing.backends import backends_of
    from synapse_lite.routing.relay import Relay
    from synapse_lite.routing.room_writers import RoomWriters
    from synapse_lite.routing.router import Router
    from synapse_lite.routing.table import RoutingTable

    reactor: Any = _reactor

    class StandIn(protocol.Protocol):
        def dataReceived(self, data: bytes) -> None:
            if b"\r\n\r\n" in data and self.transport is not None:
                # The head and the small body arrive together.
                self.transport.write(RESPONSE)

    ports = {}
    for name in ("main", "reader1", "writer1"):
        port = reactor.listenTCP(0, protocol.Factory.forProtocol(StandIn), interface="127.0.0.1")
        ports[name] = port.getHost().port

    def listener(port: int, *resources: str) -> dict[str, Any]:
        return {"port": port, "bind_address": "127.0.0.1", "resources": list(resources)}

    config = read_homeserver_config(
        {
            "server_name": "bench",
            "worker_replication_secret": "bench",
            "database": {"engine": "sqlite", "args": {"path": "unused.db"}},
            "replication": {"tcp": {"port": 0}},
            "listeners": [listener(ports["main"], "client", "replication", "health")],
            "router": {"listeners": [listener(1, "client", "health")]},
            "stream_writers": {"events": ["writer1"]},
            "workers": {
                "reader1": {"listeners": [listener(ports["reader1"], "client", "health")]},
                "writer1": {
                    "listeners": [listener(ports["writer1"], "client", "replication", "health")]
                },
            },
        },
        os.path.join(tempfile.mkdtemp(), "homeserver.yaml"),
    )
    table = RoutingTable.build(config)
    room_writers = RoomWriters(config, cast(Any, None))
    room_writers._writers[ROOM] = "writer1"  # known, as after the first send
    router = Router(table, backends_of(config, table.instances()), room_writers)
    relay = Relay(
        reactor, router, InternalTlsClient(None), router_proof("bench"), 30.0, router.local_page
    )
    listening = reactor.listenTCP(0, relay.factory(("client",), False), interface="127.0.0.1")
    body = b'{"msgtype":"m.text","body":"hello world"}'
    request = b"".join(
        [
            b"PUT /_matrix/client/v3/rooms/%21room:bench/send/m.room.message/t HTTP/1.1\r\n",
            b"Host: localhost\r\nUser-Agent: bench\r\nAccept: */*\r\n",
            b"Accept-Encoding: gzip, deflate\r\nContent-Type: application/json\r\n",
            b"Authorization: Bearer " + generate_access_token("alice").encode() + b"\r\n",
            b"Content-Length: %d\r\n\r\n" % len(body),
            body,
        ]
    )

    class Client(protocol.Protocol):
        def connectionMade(self) -> None:
            self.sent = 0
            self.buffer = b""
            self.before = resource.getrusage(resource.RUSAGE_SELF)
            self.send()

        def send(self) -> None:
            if self.sent == WARMUP:
                self.before = resource.getrusage(resource.RUSAGE_SELF)
            if self.sent == WARMUP + requests:
                after = resource.getrusage(resource.RUSAGE_SELF)
                user = (after.ru_utime - self.before.ru_utime) / requests * 1e6
                system = (after.ru_stime - self.before.ru_stime) / requests * 1e6
                print(f"{user:.1f} {system:.1f}")
                reactor.stop()
                return
            self.sent += 1
            assert self.transport is not None
            self.transport.write(request)

        def dataReceived(self, data: bytes) -> None:
            self.buffer += data
            if self.buffer.endswith(b"}"):
                self.buffer = b""
                self.send()

    target = ports["writer1"] if direct else listening.getHost().port
    protocol.ClientCreator(reactor, Client).connectTCP("127.0.0.1", target)
    reactor.run()


def measure(source: str, requests: int, direct: bool) -> tuple[float, float]:
    """(user, system) microseconds per request, from a child process."""
    # This file run as a script (the baseline has no copy of it), importing
    # synapse_lite from ``source``.
    args = [sys.executable, os.path.abspath(__file__), "--child", str(requests)]
    if direct:
        args.append("--direct")
    env = dict(os.environ, PYTHONPATH=source)
    out = subprocess.run(args, env=env, cwd=source, capture_output=True, check=True, text=True)
    imported, user, system = out.stdout.split()[-3:]
    if not imported.startswith(source):
        raise RuntimeError(f"the child imported synapse_lite from {imported}, not {source}")
    return float(user), float(system)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.router_loop", description=__doc__)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", metavar="DIR", help="another checkout, measured alike")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--direct", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        import synapse_lite

        print(os.path.dirname(os.path.dirname(os.path.abspath(synapse_lite.__file__))))
        child(args.child, args.direct)
        return 0
    sources = [("this code", SOURCE_ROOT)]
    if args.baseline:
        sources.append(("baseline", os.path.abspath(args.baseline)))
    relayed: dict[str, list[float]] = {name: [] for name, _ in sources}
    print(
        f"CPU us per request, {args.requests} requests one at a time; load {os.getloadavg()[0]:.1f}"
    )
    for round_ in range(args.rounds):
        order = sources if round_ % 2 == 0 else list(reversed(sources))
        for name, source in order:
            started = time.monotonic()
            via_user, via_system = measure(source, args.requests, direct=False)
            direct_user, direct_system = measure(source, args.requests, direct=True)
            relay = via_user + via_system - direct_user - direct_system
            relayed[name].append(relay)
            print(
                f"#{round_ + 1} {name}: through the router {via_user + via_system:.0f}"
                f" (user {via_user:.0f}, system {via_system:.0f}), direct"
                f" {direct_user + direct_system:.0f}; relaying {relay:.0f}"
                f" ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    for name, values in relayed.items():
        print(f"{name}: relaying one request {sorted(values)[len(values) // 2]:.0f} us (median)")
    if args.baseline:
        ratios = [a / b for a, b in zip(relayed["this code"], relayed["baseline"], strict=True)]
        print("this code / baseline, relaying: " + ", ".join(f"{r:.2f}" for r in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
