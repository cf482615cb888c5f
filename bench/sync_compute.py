"""What one /sync costs to compute, in process: ``python -m bench.sync_compute``.

One main process inside this Python process (``bench/in_process.py``), on a
throwaway database: Bob is joined to ``--rooms`` rooms holding ``--events``
messages in all. Each round sends one message to one room and times Bob's
incremental /sync computing the response (``SyncHandler.sync`` with no
timeout: no HTTP, no waiting), then times one initial /sync. Prints the
medians in microseconds.

``--baseline DIR``: the same measurement of another checkout (``git worktree
add DIR REV``), in child processes alternating with this checkout's
(``--pairs`` of them, so the machine's load falls on both alike); prints both
sides' medians over the pairs and this checkout's ratio to the baseline.
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

from twisted.internet import defer, task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALICE, BOB = "@alice:test.local", "@bob:test.local"


async def _measure(hs: Any, args: argparse.Namespace) -> dict[str, float]:
    from synapse_lite.events import EventSpec
    from synapse_lite.handlers.auth import Requester
    from synapse_lite.handlers.filtering import SyncFilter

    events, clock, sync = hs.handlers.events, hs.handlers.clock, hs.handlers.sync
    alice, bob = Requester(ALICE, "DEV", "x"), Requester(BOB, "DEV", "y")
    rooms = []
    for _ in range(args.rooms):
        room_id = await hs.handlers.room_creation.create_room(alice, {"preset": "public_chat"})
        join = EventSpec("m.room.member", BOB, BOB, {"membership": "join"}, clock.time_msec())
        await events.persist_as_writer(room_id, [join])
        rooms.append(room_id)

    def message(body: str) -> Any:
        content = {"msgtype": "m.text", "body": body}
        return EventSpec("m.room.message", None, ALICE, content, clock.time_msec())

    per_room = args.events // args.rooms
    for room_id in rooms:
        for start in range(0, per_room, 100):
            batch = [message(f"m{i}") for i in range(start, min(start + 100, per_room))]
            await events.persist_as_writer(room_id, batch)

    async def one_sync(since: str | None) -> tuple[float, str]:
        started = time.perf_counter()
        response = await sync.sync(bob, since, 0, False, SyncFilter(), "offline")
        return time.perf_counter() - started, response["next_batch"]

    _, since = await one_sync(None)
    incremental, initial = [], []
    for i in range(args.rounds):
        await events.persist_as_writer(rooms[i % len(rooms)], [message(f"r{i}")])
        took, since = await one_sync(since)
        incremental.append(took)
        if i % 10 == 0:
            initial.append((await one_sync(None))[0])
    return {
        "incremental_us": statistics.median(incremental) * 1e6,
        "initial_us": statistics.median(initial) * 1e6,
    }


async def _run(reactor: Any, args: argparse.Namespace) -> None:
    from bench.in_process import with_main_process

    figures: dict[str, float] = {}

    async def measure(hs: Any) -> None:
        figures.update(await _measure(hs, args))

    await with_main_process(reactor, args.engine, measure)
    print(json.dumps(figures) if args.json else _line(figures))


def _line(figures: dict[str, float]) -> str:
    return (
        f"incremental /sync after one new event: {figures['incremental_us']:.0f} us;"
        f" initial /sync: {figures['initial_us']:.0f} us (medians)"
    )


def _child(source: str, args: argparse.Namespace) -> dict[str, float]:
    command = [sys.executable, os.path.abspath(__file__), "--json", "--engine", args.engine,
               "--rooms", str(args.rooms), "--events", str(args.events),
               "--rounds", str(args.rounds)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=source)
    out = subprocess.run(command, env=env, cwd=source, check=True, capture_output=True, text=True)
    figures: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def _compare(args: argparse.Namespace) -> None:
    baseline = os.path.abspath(args.baseline)
    sides: dict[str, list[dict[str, float]]] = {"this": [], "baseline": []}
    for pair in range(args.pairs):
        order = [("this", ROOT), ("baseline", baseline)]
        for name, source in order if pair % 2 == 0 else reversed(order):
            sides[name].append(_child(source, args))
    print(f"/sync computation, {args.engine}, {args.rooms} rooms, {args.events} messages,"
          f" {args.rounds} rounds, {args.pairs} alternating pairs"
          " (medians over the pairs)")  # fmt: skip
    print(f"  baseline {baseline}")
    for key, label in (
        ("incremental_us", "incremental /sync us"),
        ("initial_us", "initial /sync us"),
    ):
        this = statistics.median(f[key] for f in sides["this"])
        base = statistics.median(f[key] for f in sides["baseline"])
        print(f"  {label:22} this {this:8.0f}  baseline {base:8.0f}  ratio {this / base:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--rooms", type=int, default=10)
    parser.add_argument("--events", type=int, default=2000, help="messages, over all rooms")
    parser.add_argument("--rounds", type=int, default=200, help="incremental syncs timed")
    parser.add_argument("--baseline", help="another checkout to compare with")
    parser.add_argument("--pairs", type=int, default=4, help="with --baseline: runs of each")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline:
        _compare(args)
        return
    task.react(lambda reactor: defer.ensureDeferred(_run(reactor, args)))


if __name__ == "__main__":
    main()
