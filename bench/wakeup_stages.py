"""Where the milliseconds of one woken /sync go: ``python -m bench.wakeup_stages``.

Starts a layout (generate-config's, as ``bench/follow_cost.py`` does: the
monolith, the default layout) with every process under
``bench/traced_process.py``, parks a /sync long-poll (on ``synchrotron1`` in
the default layout, on ``main`` on the monolith), sends one message to the
room's events writer, and repeats; then lines up, per round, the first time
each traced stage happened after the send was started (the writer's commit,
the RDATA leaving it, main receiving it, main's check of the claim, the
relay, the /sync worker receiving and applying the row, the /sync's
computation and its reads, its answer). Prints the median of each stage's
time from the send's start, in the order they happen, for this checkout and,
with ``--baseline DIR``, for another one in the same run, alternating.

Timestamps are wall-clock times (one machine, one clock); the tracer's own
cost (a line written per stage) is in every figure alike.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

import aiohttp

SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if SOURCE_ROOT not in sys.path:
    sys.path.insert(0, SOURCE_ROOT)

from bench.cluster import Cluster  # noqa: E402
from bench.follow_cost import WRITER, load_note, send_at_rate, setup  # noqa: E402
from bench.scenarios import Client, event_ids  # noqa: E402

#: (time from the send's start, process, stage) of one round, per stage key.
Round = dict[tuple[str, str], float]


async def rounds_of(
    client: Client, send_base: str, sync_base: str, people: list[Any], room: str, n: int
) -> list[tuple[float, float, float]]:
    """``n`` wake-ups: (send started, send answered, /sync answered), wall clock."""
    receiver, sender = people[1], people[0]
    since = (await client.sync(sync_base, receiver, None, 0))["next_batch"]
    times = []
    for i in range(n):
        poll = asyncio.create_task(client.sync(sync_base, receiver, since, 30_000))
        await asyncio.sleep(0.05)  # let the long-poll park, and the previous round settle
        start = time.time()
        want = await client.send(send_base, sender, room, f"stage {i}")
        sent = time.time()
        while True:
            result = await poll
            since = result["next_batch"]
            if want in event_ids(result):
                times.append((start, sent, time.time()))
                break
            poll = asyncio.create_task(client.sync(sync_base, receiver, since, 30_000))
    return times


def read_traces(traces: dict[str, str]) -> list[tuple[float, str, str, str]]:
    """Every traced line: (time, process, stage, detail), in time order."""
    lines = []
    for process, path in traces.items():
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                parts = line.rstrip("\n").split(" ", 2)
                if len(parts) == 3:
                    lines.append((float(parts[0]), process, parts[1], parts[2]))
    lines.sort()
    return lines


def per_round(
    lines: list[tuple[float, str, str, str]], times: list[tuple[float, float, float]]
) -> list[Round]:
    """For each round, the first occurrence of each (process, stage detail)
    between the send's start and the /sync's answer, in ms from the start."""
    rounds = []
    for start, sent, answered in times:
        found: Round = {
            ("client", "send answered"): (sent - start) * 1000,
            ("client", "/sync answered"): (answered - start) * 1000,
        }
        for t, process, stage, detail in lines:
            if t < start:
                continue
            if t > answered:
                break
            key = (process, f"{stage} {detail}".strip())
            found.setdefault(key, (t - start) * 1000)
        rounds.append(found)
    return rounds


def summary(rounds: list[Round]) -> list[tuple[float, str, str, int]]:
    """(median ms, process, stage, rounds it was seen in), in time order."""
    seen: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rounds:
        for key, ms in r.items():
            seen[key].append(ms)
    rows = [
        (statistics.median(values), process, stage, len(values))
        for (process, stage), values in seen.items()
        # A stage seen in under half the rounds is other traffic.
        if len(values) * 2 >= len(rounds)
    ]
    return sorted(rows)


async def measure(layout: str, args: argparse.Namespace, source: str | None) -> list[Round]:
    cluster = Cluster(
        layout,
        args.engine,
        replication=args.transport,
        source_root=os.path.abspath(source) if source is not None else None,
    )
    for name in ["main", "synchrotron1", WRITER] if layout != "monolith" else ["main"]:
        cluster.traced[name] = os.path.join(cluster.dir, f"{name}.trace")
    try:
        cluster.start()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            client = Client(session)
            people, rooms = await setup(client, cluster, 1)
            send_base = cluster.url("main" if layout == "monolith" else WRITER)
            sync_base = cluster.url("synchrotron1" if layout != "monolith" else "main")
            await send_at_rate(client, send_base, people, rooms, 50, 1.0)  # warm up
            await rounds_of(client, send_base, sync_base, people, rooms[0], 5)  # warm up
            await asyncio.sleep(0.5)
            times = await rounds_of(client, send_base, sync_base, people, rooms[0], args.wakeups)
        return per_round(read_traces(cluster.traced), times)
    finally:
        if args.keep:
            print(f"traces kept in {cluster.dir}")
        cluster.stop(keep=args.keep)


def print_table(title: str, rounds: list[Round]) -> None:
    print(f"\n{title} ({len(rounds)} rounds): median ms from the send's start")
    for ms, process, stage, count in summary(rounds):
        seen = f"  (in {count} rounds)" if count < len(rounds) else ""
        print(f"  {ms:7.2f}  {process:13s} {stage}{seen}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["sqlite", "postgres"], default="postgres")
    parser.add_argument("--transport", choices=["tcp", "redis"], default="tcp")
    parser.add_argument(
        "--layout", action="append", choices=["monolith", "default"], dest="layouts"
    )
    parser.add_argument("--wakeups", type=int, default=30)
    parser.add_argument("--pairs", type=int, default=1, help="alternating runs of each side")
    parser.add_argument("--baseline", help="also run another checkout (e.g. main), alternating")
    parser.add_argument("--keep", action="store_true", help="keep each run's directory and traces")
    args = parser.parse_args(argv)
    layouts = args.layouts or ["default"]
    print(f"{load_note()}; {args.engine}, {args.transport}")
    results: dict[str, list[Round]] = defaultdict(list)
    for _ in range(args.pairs):
        for layout in layouts:
            sides: list[tuple[str, str | None]] = [("this checkout", None)]
            if args.baseline:
                sides.insert(0, ("baseline", args.baseline))
            for label, source in sides:
                results[f"{layout}, {label}"] += asyncio.run(measure(layout, args, source))
    for title, rounds in results.items():
        print_table(title, rounds)
    print(f"\n{load_note()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
