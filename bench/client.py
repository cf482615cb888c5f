"""The client API benchmark: ``python -m bench.client``.

Starts each layout in turn on a fresh database (PostgreSQL by default; the
split layout replicates over Redis when it runs, else TCP), then measures
over HTTP, with the benchmark client on the same machine:

* send throughput: concurrent senders over several rooms, events/s sent and
  delivered (every user's /sync has them all), with send latency p50 and p99;
* /sync wake-up: from a user's send to another user's parked /sync returning it;
* typing wake-up: the same for a typing notification;
* initial /sync time, and each process's resident memory after the run.

Layouts: ``single`` (the main process does everything) and ``split`` (main, a
/sync worker, two event persisters, a typing writer). Prints one table with
the targets, PASS/FAIL, and the larger homeserver's figures measured on the
same machine and settings.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from typing import Any

import aiohttp

from bench.cluster import SEND_TO, SYNC_ON, Cluster
from bench.scenarios import (
    Client,
    measure_initial_sync,
    measure_throughput,
    measure_wakeup,
    percentile,
    setup_users_and_rooms,
)

TARGET_THROUGHPUT = 300.0
TARGET_WAKEUP_MS = 15.0
TARGET_TYPING_MS = 8.0
TARGET_RSS_MB = 75.0


async def run_layout(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    layout = cluster.layout
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        client = Client(session)
        main = cluster.url("main")
        send_bases = [cluster.url(n) for n in SEND_TO[layout]]
        sync_base = cluster.url(SYNC_ON[layout])
        people, rooms = await setup_users_and_rooms(client, main, args.users, args.rooms)
        room_bases = None
        if args.route_to_writer and layout != "single":
            # What a load balancer that knows each room's writer would do.
            room_bases = {r: cluster.url(w) for r, w in cluster.room_writers().items()}
        # Warm up caches and connections.
        await measure_throughput(client, send_bases, sync_base, people, rooms, 40, args.senders)
        cpu_before = cluster.cpu_seconds()
        throughput = await measure_throughput(
            client, send_bases, sync_base, people, rooms, args.messages, args.senders, room_bases
        )
        cpu = {n: t - cpu_before[n] for n, t in cluster.cpu_seconds().items()}
        wakeup = await measure_wakeup(
            client, send_bases[0], sync_base, people[1], people[0], rooms[0], args.rounds, False
        )
        typing = await measure_wakeup(
            client, main, sync_base, people[1], people[0], rooms[0], args.rounds, True
        )
        initial = await measure_initial_sync(client, sync_base, people[2], 5)
    return {
        "sent": throughput.sent_per_second,
        "delivered": throughput.delivered_per_second,
        "send_p50": percentile(throughput.latencies_ms, 0.5),
        "send_p99": percentile(throughput.latencies_ms, 0.99),
        "wakeup_p50": percentile(wakeup, 0.5),
        "wakeup_p99": percentile(wakeup, 0.99),
        "typing_p50": percentile(typing, 0.5),
        "typing_p99": percentile(typing, 0.99),
        "initial_ms": initial,
        "rss": cluster.rss_mb(),
        "cpu": cpu,
        "transport": cluster.transport,
    }


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> bool:
    layouts = list(results)
    print()
    print(
        f"## Client API benchmark: {args.engine}, {os.cpu_count()} cores, {args.users} users,"
        f" {args.senders} senders, {args.rooms} rooms, {args.messages} messages"
        f" ({platform.python_implementation()} {platform.python_version()})"
    )
    transports = ", ".join(f"{n}: {r['transport']}" for n, r in results.items())
    print(f"replication: {transports}")
    routing = "to each room's writer" if args.route_to_writer else "round-robin over the persisters"
    print(f"split layout sends: {routing}")
    print()
    header = ["metric", *layouts, "target", "larger homeserver", "result"]
    rows: list[list[str]] = []
    all_ok = True

    def row(name: str, key: str, fmt: str, target: str, ok: Any, theirs: str) -> None:
        nonlocal all_ok
        values = [fmt.format(results[n][key]) for n in layouts]
        passed = all(ok(results[n][key]) for n in layouts) if ok else None
        if passed is False:
            all_ok = False
        rows.append([name, *values, target, theirs, "" if passed is None else verdict(passed)])

    row("events/s sent", "sent", "{:.0f}", ">= 300", lambda v: v >= TARGET_THROUGHPUT, "30 / 22")
    row(
        "events/s delivered",
        "delivered",
        "{:.0f}",
        ">= 300",
        lambda v: v >= TARGET_THROUGHPUT,
        "",
    )
    row("send latency p50 ms", "send_p50", "{:.1f}", "", None, "")
    row("send latency p99 ms", "send_p99", "{:.1f}", "", None, "")
    row(
        "/sync wake-up p50 ms",
        "wakeup_p50",
        "{:.1f}",
        "<= 15",
        lambda v: v <= TARGET_WAKEUP_MS,
        "66-94",
    )
    row("/sync wake-up p99 ms", "wakeup_p99", "{:.1f}", "", None, "")
    row(
        "typing wake-up p50 ms",
        "typing_p50",
        "{:.1f}",
        "<= 8",
        lambda v: v <= TARGET_TYPING_MS,
        "12-15",
    )
    row("typing wake-up p99 ms", "typing_p99", "{:.1f}", "", None, "")
    row("initial /sync ms", "initial_ms", "{:.1f}", "", None, "")
    for n in layouts:
        results[n]["rss_max"] = max(results[n]["rss"].values())
    row(
        "max RSS per process MB", "rss_max", "{:.0f}", "<= 75", lambda v: v <= TARGET_RSS_MB, "~150"
    )
    if {"single", "split"} <= set(results):
        ok = results["split"]["delivered"] >= results["single"]["delivered"]
        all_ok = all_ok and ok
        ratio = results["split"]["delivered"] / results["single"]["delivered"]
        rows.append(
            ["split / single delivered", "", f"{ratio:.2f}", ">= 1.00", "22/30 = 0.73", verdict(ok)]
        )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
    print()
    for n in layouts:
        memory = ", ".join(f"{p} {mb:.0f}" for p, mb in results[n]["rss"].items())
        print(f"RSS MB after the run ({n}): {memory}")
    for n in layouts:
        cpu = ", ".join(f"{p} {s:.1f}" for p, s in results[n]["cpu"].items())
        print(f"CPU seconds during the throughput run ({n}): {cpu}")
    print(f"overall: {verdict(all_ok)}")
    return all_ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.client", description=__doc__)
    parser.add_argument("--engine", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--layouts", default="single,split")
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--senders", type=int, default=8)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--rooms", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=50, help="wake-up measurements")
    parser.add_argument(
        "--route-to-writer",
        action="store_true",
        help="send each room's messages to its events writer (split layout)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the layouts' directories")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    for layout in args.layouts.split(","):
        cluster = Cluster(layout, args.engine)
        started = time.monotonic()
        try:
            cluster.start()
            print(f"{layout}: started in {time.monotonic() - started:.1f} s ({cluster.dir})")
            results[layout] = asyncio.run(run_layout(cluster, args))
        finally:
            cluster.stop(keep=args.keep)
    return 0 if report(results, args) else 1


if __name__ == "__main__":
    sys.exit(main())
