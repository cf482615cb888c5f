"""What a followed line costs once the follower is awake: ``python -m bench.follower_lines``.

In this one process, builds ``synchrotron1`` of the default layout (a /sync
worker, no clients) on a fresh SQLite database the way ``synapse-lite run``
builds it (``build_homeserver``), and connects its replication handler
through a real :class:`ClientReplicationProtocol` (its role's subscription)
to an in-memory transport. The handshake is played as the main process
plays it (``SERVER``, ``PING``, a ``POSITION`` of every writer at its current
position, so no catch-up reads the database), then ``--lines`` lines go in,
``k`` lines per ``dataReceived`` call (one read of the socket), for each
``--chunk`` k (1 and 16 by default). The mix, in wire order:

* 85%: ``events`` rows of ``persister1`` (a message in one of 20 rooms by
  one of 50 users), each at its own token, as a writer sends one event per
  transaction; every 10th of these a state event (a member join): two lines,
  the event row with token ``batch`` and the current-state row with the
  token;
* 5% each: ``caches`` (an access-token invalidation of ``main``),
  ``receipts`` (a read receipt of ``main``), ``typing`` (one user typing,
  ``main``'s run).

Prints CPU microseconds per line (``time.process_time`` over the feeding,
the reactor turns in between included, every ``--turn-every`` reads) for
each k. Every line is applied (checked at the end against the stream
positions), none refused.

``--baseline DIR`` (a ``git archive`` of another commit): runs the same
measurement in child processes with DIR and with this tree as their source,
alternating, ``--rounds`` each, and prints each round, the medians and the
fastest rounds, and the ratios this / baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD_FLAG = "--child-source"

if CHILD_FLAG in sys.argv:
    # The source tree to measure comes first, whatever this file's own.
    sys.path.insert(0, sys.argv[sys.argv.index(CHILD_FLAG) + 1])
elif SOURCE_ROOT not in sys.path:
    sys.path.insert(0, SOURCE_ROOT)

FOLLOWER = "synchrotron1"
WRITER = "persister1"
ROOMS = 20
USERS = 50


def _rdata(stream: str, writer: str, token: int | None, row: list[Any]) -> bytes:
    from synapse_lite.replication.tcp.commands import RdataCommand, command_line

    return command_line(RdataCommand(stream, writer, token, row)).encode("utf-8") + b"\n"


class LineMaker:
    """Wire lines of the mix, with tokens continuing where the last left off."""

    def __init__(self, tokens: dict[str, int]) -> None:
        from synapse_lite.streams.catalog import BUILTIN_STREAMS

        self._streams = BUILTIN_STREAMS
        self.tokens = dict(tokens)
        self._n = 0

    def _next(self, stream: str) -> int:
        self.tokens[stream] += 1
        return self.tokens[stream]

    def _row(self, stream: str, fields: list[Any]) -> list[Any]:
        definition = self._streams[stream]
        return list(definition.encode_row(definition.parse_row(fields)))

    def lines(self, count: int) -> list[bytes]:
        """At least ``count`` lines (a state event's two lines stay together)."""
        out: list[bytes] = []
        while len(out) < count:
            n = self._n
            self._n += 1
            room = f"!room{n % ROOMS}:test.local"
            user = f"@user{n % USERS}:test.local"
            kind = n % 20
            if kind == 17:
                token = self._next("caches")
                row = self._row("caches", ["get_user_by_access_token", [f"syt_{n}"], 1_700_000])
                out.append(_rdata("caches", "main", token, row))
            elif kind == 18:
                token = self._next("receipts")
                row = self._row("receipts", [room, "m.read", user, f"$e{n}", None, {"ts": n}])
                out.append(_rdata("receipts", "main", token, row))
            elif kind == 19:
                token = self._next("typing")
                row = self._row("typing", [room, [user]])
                out.append(_rdata("typing", "main", token, row))
            elif n % 200 == 5:
                token = self._next("events")
                event_id = f"$m{n}"
                fields = [
                    event_id,
                    room,
                    "m.room.member",
                    user,
                    None,
                    None,
                    "join",
                    False,
                    False,
                    True,
                ]
                ev = ["ev", fields]
                out.append(_rdata("events", WRITER, None, self._row("events", ev)))
                state = ["state", [room, "m.room.member", user, event_id]]
                out.append(_rdata("events", WRITER, token, self._row("events", state)))
            else:
                token = self._next("events")
                fields = [
                    f"$m{n}",
                    room,
                    "m.room.message",
                    None,
                    None,
                    None,
                    None,
                    False,
                    False,
                    True,
                ]
                ev = ["ev", fields]
                out.append(_rdata("events", WRITER, token, self._row("events", ev)))
        return out


class _Transport:
    """What the protocol writes to (discarded) and asks of a socket."""

    def __init__(self) -> None:
        self.written = 0
        self.disconnecting = False

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def writeSequence(self, data: list[bytes]) -> None:
        self.written += sum(map(len, data))

    def loseConnection(self) -> None:
        pass

    def abortConnection(self) -> None:
        pass

    def registerProducer(self, producer: object, streaming: bool) -> None:
        pass

    def unregisterProducer(self) -> None:
        pass

    def getPeer(self) -> object:
        return "bench"

    def getHost(self) -> object:
        return "bench"

    def setTcpNoDelay(self, enabled: bool) -> None:
        pass


async def measure(reactor: Any, lines: int, chunks: list[int], turn_every: int) -> dict[str, Any]:
    """The measurement in this process: CPU µs per line for each chunk size."""
    from twisted.internet import task

    from synapse_lite.app.composition import build_homeserver
    from synapse_lite.replication.tcp.tcp_client import ReplicationClientFactory
    from tests.harness.databases import create_test_database
    from tests.harness.server import make_config

    test_db = create_test_database("sqlite", with_schema=True)
    results: dict[str, Any] = {}
    try:
        config = make_config(
            test_db,
            workers=[FOLLOWER, WRITER],
            stream_writers={"events": [WRITER]},
            rate_limiting={"enabled": False},
        )
        hs = build_homeserver(config, FOLLOWER, reactor)
        hs.loops.startService()
        try:
            handler = hs.replication
            follows = handler.followed_streams
            factory = ReplicationClientFactory(
                config.server_name,
                FOLLOWER,
                config.worker_replication_secret,
                handler,
                reactor,
                followed_streams=follows,
            )
            protocol = factory.buildProtocol(None)
            protocol.makeConnection(_Transport())
            writers = {"events": WRITER, "caches": "main", "receipts": "main", "typing": "main"}
            tokens = {
                name: hs.streams[name].positions.received_position(writer)
                for name, writer in writers.items()
            }
            handshake = [f"SERVER {config.server_name}\n".encode(), b"PING 1\n"]
            for name, writer in writers.items():
                handshake.append(
                    f"POSITION {name} {writer} {tokens[name]} {tokens[name]}\n".encode()
                )
            protocol.dataReceived(b"".join(handshake))
            for _ in range(5):
                await task.deferLater(reactor, 0, lambda: None)
            maker = LineMaker(tokens)
            per_line: dict[str, float] = {}
            for k in chunks:
                for phase, count in (("warm-up", max(lines // 10, 1000)), ("measured", lines)):
                    wire = maker.lines(count)
                    reads = [b"".join(wire[i : i + k]) for i in range(0, len(wire), k)]
                    start = time.process_time()
                    for i, data in enumerate(reads):
                        protocol.dataReceived(data)
                        if i % turn_every == turn_every - 1:
                            await task.deferLater(reactor, 0, lambda: None)
                    await task.deferLater(reactor, 0, lambda: None)
                    spent = time.process_time() - start
                    if phase == "measured":
                        per_line[str(k)] = spent / len(wire) * 1e6
            for name, writer in writers.items():
                got = hs.streams[name].positions.received_position(writer)
                if got != maker.tokens[name]:
                    raise RuntimeError(f"{name}: applied up to {got}, sent {maker.tokens[name]}")
            results["us_per_line"] = per_line
            results["follows"] = sorted(follows) if follows is not None else None
        finally:
            await hs.service.stopService()
    finally:
        test_db.drop()
    return results


def run_here(args: argparse.Namespace) -> dict[str, Any]:
    from twisted.internet import defer, reactor

    out: dict[str, Any] = {}

    async def go() -> None:
        out.update(await measure(reactor, args.lines, args.chunk, args.turn_every))

    def done(result: object) -> object:
        reactor.stop()
        return result

    def failed(failure: Any) -> None:
        out["error"] = failure.getTraceback()

    reactor.callWhenRunning(lambda: defer.ensureDeferred(go()).addErrback(failed).addBoth(done))
    reactor.run()
    if "error" in out:
        raise SystemExit(out["error"])
    return out


def run_child(source: str, args: argparse.Namespace) -> dict[str, float]:
    """One measurement in a child process whose code is ``source``'s."""
    command = [
        sys.executable,
        os.path.abspath(__file__),
        CHILD_FLAG,
        source,
        "--lines",
        str(args.lines),
        "--turn-every",
        str(args.turn_every),
    ]
    for k in args.chunk:
        command += ["--chunk", str(k)]
    env = dict(os.environ, PYTHONPATH=source)
    done = subprocess.run(command, cwd=source, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"child on {source} failed:\n{done.stderr[-4000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])["us_per_line"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--chunk", type=int, action="append", help="lines per read (1, 16)")
    parser.add_argument("--turn-every", type=int, default=4, help="reads per reactor turn")
    parser.add_argument("--baseline", help="a git archive of the commit to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(CHILD_FLAG, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.chunk = args.chunk or [1, 16]
    if args.child_source is not None:
        print(json.dumps(run_here(args)))
        return
    load = os.getloadavg()
    print(
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.lines} lines per k, "
        f"{args.turn_every} reads per reactor turn"
    )
    if args.baseline is None:
        result = run_here(args)
        for k, us in result["us_per_line"].items():
            print(f"k={k}: {us:.2f} us CPU per line")
        return
    sides = {"this": SOURCE_ROOT, "baseline": os.path.abspath(args.baseline)}
    figures: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
    for round_no in range(1, args.rounds + 1):
        for side, source in sides.items():
            got = run_child(source, args)
            for k, us in got.items():
                figures[side].setdefault(k, []).append(us)
            shown = ", ".join(f"k={k} {us:.2f}" for k, us in got.items())
            print(f"round {round_no} {side:8}: {shown} us per line", flush=True)
    for k in (str(k) for k in args.chunk):
        # The fastest round is the least disturbed by other load on a
        # shared machine; both are shown.
        for how, pick in (("medians", statistics.median), ("fastest", min)):
            this, base = pick(figures["this"][k]), pick(figures["baseline"][k])
            print(
                f"k={k}: this {this:.2f} us, baseline {base:.2f} us ({how}), "
                f"ratio this / baseline {this / base:.3f}"
            )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
