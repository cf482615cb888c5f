"""What the writer's persist path costs per send, this code against a
baseline checkout, in one run: ``python -m bench.persist_cpu --baseline DIR``.

    python -m bench.persist_cpu --baseline DIR [--engine postgres]
                                [--messages 200] [--state-every 0] [--rounds 4]

Each round runs, for this code and then the baseline's (order alternating
by round so the machine's load falls on both alike), a child Python whose
``PYTHONPATH`` is that tree: one main process inside it on a throwaway
database (``bench.in_process``), a room, ``--messages`` warm-up sends,
then ``--messages`` timed sends through ``persist_as_writer`` (checked,
placed in the graph, authorised, persisted; with ``--state-every N`` every
Nth a topic change). The child reports the CPU seconds its process used
and the wall seconds of the timed sends. Prints, per tree, CPU ms per send
and sends/s (medians over rounds) and this / baseline for both: on a
shared machine CPU per send is the steadier figure (other sessions' load
shows in wall time, not in this process's CPU).
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENDER = "@member0:test.local"


def _child(engine: str, messages: int, state_every: int) -> None:
    """In the child: measure and print one JSON line."""
    from twisted.internet import defer, task

    from bench.in_process import with_main_process
    from synapse_lite.events import EventSpec
    from synapse_lite.handlers.auth import Requester

    result: dict[str, Any] = {}

    async def measure(hs: Any) -> None:
        events, clock = hs.handlers.events, hs.handlers.clock
        room = await hs.handlers.room_creation.create_room(
            Requester(SENDER, "DEV", "x"), {"preset": "public_chat"}
        )

        def spec(i: int) -> EventSpec:
            if state_every and i % state_every == 0:
                return EventSpec("m.room.topic", "", SENDER, {"topic": f"t{i}"}, clock.time_msec())
            body = {"msgtype": "m.text", "body": f"message {i} for the room"}
            return EventSpec("m.room.message", None, SENDER, body, clock.time_msec())

        for i in range(messages):
            await events.persist_as_writer(room, [spec(i)])
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(messages):
            await events.persist_as_writer(room, [spec(i)])
        result["cpu"] = time.process_time() - cpu
        result["wall"] = time.perf_counter() - wall
        import synapse_lite

        print(json.dumps({**result, "code": synapse_lite.__file__}), flush=True)

    async def run(reactor: Any) -> None:
        await with_main_process(reactor, engine, measure)

    task.react(lambda reactor: defer.ensureDeferred(run(reactor)))


def _run_tree(tree: str, args: argparse.Namespace) -> dict[str, float]:
    # This file run as a script: its own directory first on sys.path, the
    # tree's packages (synapse_lite, bench.in_process, tests) from PYTHONPATH.
    env = dict(os.environ, PYTHONPATH=tree)
    command = [
        sys.executable, os.path.abspath(__file__), "--child",
        args.engine, str(args.messages), str(args.state_every),
    ]  # fmt: skip
    out = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=False)
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            found = json.loads(line)
            if not str(found.pop("code")).startswith(tree + os.sep):
                raise RuntimeError(f"the child ran other code than {tree}'s")
            return dict(found)
    raise RuntimeError(f"{tree}: no result\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="a checkout of the code to compare")
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="postgres")
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--state-every", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    trees = {"this": ROOT, "baseline": os.path.abspath(args.baseline)}
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for round_number in range(args.rounds):
        order = list(trees) if round_number % 2 == 0 else list(reversed(trees))
        for name in order:
            figures[name].append(_run_tree(trees[name], args))
    per_send: dict[str, tuple[float, float]] = {}
    kind = f"every {args.state_every}th a topic" if args.state_every else "messages"
    print(f"persist path, {args.engine}, {args.messages} sends ({kind}) x {args.rounds} rounds:")
    for name in trees:
        cpu = statistics.median(f["cpu"] for f in figures[name]) / args.messages * 1000
        rate = statistics.median(args.messages / f["wall"] for f in figures[name])
        per_send[name] = (cpu, rate)
        print(f"  {name:>8}: {cpu:.2f} ms CPU per send, {rate:.0f} sends/s")
    cpu_ratio = per_send["baseline"][0] / per_send["this"][0]
    rate_ratio = per_send["this"][1] / per_send["baseline"][1]
    print(f"  this / baseline: sends per CPU second {cpu_ratio:.2f}, sends/s {rate_ratio:.2f}")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
