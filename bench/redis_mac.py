"""Cost of signing Redis replication messages (issue 34), per line.

Every Redis message is signed with an HMAC of the replication secret by its
sender and checked by every receiver. This measures, in one run, the bus's
own work per line on both ends, for the bus of this checkout and for the bus
of a baseline commit (its ``replication/tcp/redis.py`` loaded from git, the
rest of the code shared), with no Redis and no event loop in between:

* **send**: ``send_command`` of an RDATA of the events stream, encoded and
  enveloped (and signed), up to the hand-off to the publisher connection;
* **receive**: ``message_received`` of that message as it arrives from Redis:
  envelope opened (and MAC checked), line parsed, handed to a receiver that
  does nothing.

It prints µs per line for each, and the ratio of this checkout to the
baseline. Figures only; nothing is asserted.

    python bench/redis_mac.py [--lines 50000] [--baseline fd3dbe6]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from types import ModuleType
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a script: make the checkout importable
    sys.path.insert(0, ROOT)

from twisted.internet import task  # noqa: E402
from twisted.internet.defer import Deferred, succeed  # noqa: E402

from synapse_lite.replication.tcp import redis as current_redis  # noqa: E402
from synapse_lite.replication.tcp.commands import RdataCommand  # noqa: E402

#: An events row as a writer sends it (a typical message, ~200 bytes).
EVENT_ID = "$abcdefghijklmnopqrstuvwxyz0123456789ABC"
ROW = ["ev", [EVENT_ID, "!room:bench.example", "m.room.message", *[None] * 4, False, False, True]]
REPETITIONS = 5


class _Nothing:
    """A receiver that takes every command and does nothing."""

    def new_connection(self, connection: Any) -> None:
        pass

    def lost_connection(self, connection: Any) -> None:
        pass

    def on_command(self, connection: Any, cmd: Any) -> None:
        pass

    def read_started(self) -> None:
        pass

    def read_done(self) -> None:
        pass


class _Publisher:
    """Stands in for the publisher connection: takes the line, answers later."""

    def __init__(self) -> None:
        from collections import deque

        self.unacked: Any = deque()
        self.lines: list[bytes] = []

    def publish(self, channel: str, line: bytes) -> Deferred[Any]:
        self.lines.append(line)
        return succeed(None)


def load_baseline(commit: str) -> ModuleType:
    source = subprocess.run(
        ["git", "show", f"{commit}:synapse_lite/replication/tcp/redis.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    path = os.path.join(tempfile.mkdtemp(), "baseline_redis.py")
    with open(path, "wb") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("baseline_redis", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_bus(module: ModuleType, name: str) -> Any:
    kwargs: dict[str, Any] = {
        "server_name": "bench.example",
        "instance_name": name,
        "receiver": _Nothing(),
        "endpoint": None,
        "clock": task.Clock(),
        "deployment_id": "benchdeployment",
    }
    if hasattr(module, "mac_key"):
        kwargs["secret"] = "bench-secret"
    bus = module.RedisReplicationBus(**kwargs)
    # As if connected and subscribed: what the bus does per line, nothing else.
    bus._announced = True
    bus._subscriber = object()
    bus._publisher = _Publisher()
    return bus


def per_line_us(module: ModuleType, lines: int) -> tuple[float, float]:
    """(send, receive) µs per line, best of REPETITIONS."""
    sender = make_bus(module, "persister1")
    receiver = make_bus(module, "synchrotron1")
    cmd = RdataCommand("events", "persister1", 1234567, ROW)
    best_send = best_receive = float("inf")
    for _ in range(REPETITIONS):
        publisher = sender._publisher
        publisher.lines.clear()
        publisher.unacked.clear()
        started = time.perf_counter()
        for _ in range(lines):
            sender.send_command(cmd)
        best_send = min(best_send, (time.perf_counter() - started) / lines * 1e6)
        messages = list(publisher.lines)
        subscriber = receiver._subscriber
        started = time.perf_counter()
        for message in messages:
            receiver.message_received(subscriber, message)
        best_receive = min(best_receive, (time.perf_counter() - started) / lines * 1e6)
    return best_send, best_receive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/redis_mac.py", description=__doc__)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--baseline", default="fd3dbe6", help="commit to compare with")
    args = parser.parse_args(argv)
    baseline = load_baseline(args.baseline)
    results: dict[str, tuple[float, float]] = {}
    # Alternated, so that neither side always runs on a warmer machine.
    for label, module in (("baseline", baseline), ("this", current_redis)) * 2:
        send, receive = per_line_us(module, args.lines)
        old = results.get(label, (float("inf"), float("inf")))
        results[label] = (min(old[0], send), min(old[1], receive))
    base_send, base_receive = results["baseline"]
    send, receive = results["this"]
    print(f"Redis bus, per RDATA line ({args.lines} lines, best of {REPETITIONS * 2}):")
    print(f"  baseline {args.baseline}: send {base_send:.2f} µs, receive {base_receive:.2f} µs")
    print(
        f"  this checkout (signed): send {send:.2f} µs ({send / base_send:.2f}x),"
        f" receive {receive:.2f} µs ({receive / base_receive:.2f}x)"
    )
    extra_send, extra_receive = send - base_send, receive - base_receive
    print(f"  MAC cost: +{extra_send:.2f} µs to send, +{extra_receive:.2f} µs to receive")
    return 0


if __name__ == "__main__":
    sys.exit(main())
