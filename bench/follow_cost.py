"""What every process pays per event: ``python -m bench.follow_cost``.

Starts the monolith and the default layout (generate-config's configs, as
``synapse-lite run`` runs them; ``--layout sharded`` adds that one) on a fresh
database each, and for each rate of sends (40, 200 and 1,000 events/s by
default, or as far as the machine goes) sends messages open-loop at that rate
for ``--seconds``, with no /sync client anywhere, sampling every process's
user+system CPU time from ``/proc/<pid>/stat`` before and after. Sends go
straight to the room's events writer, as the router routes them, and every
room used is on ``persister1``, so each process has one role:

* ``persister1``: writer of the rooms (persists every event, sends RDATA);
* ``persister2`` (and the sharded layout's other persisters): an events
  writer following another writer's events;
* ``synchrotron1``: a pure follower (a /sync worker with no clients);
* ``media1``, the router: read the caches stream alone (subscriptions by
  role, ``docs/workers.md``): what they pay per event is what following
  costs a process that receives no event rows;
* ``main``: follows, and relays every worker's commands to the others (TCP).

Prints CPU milliseconds per event for every process, the whole cluster's CPU
per event as a ratio to the monolith's at the same rate (both measured in this
run), the projected ceiling for 2, 4, 8 and 16 events writers (docs/scaling.md
explains the model), the replication latency from a writer's commit to a
follower's position (``bench/replication.py``'s TCP measurement, p50/p99),
the sequence reads per event (the checks of claimed positions: main's, and
everyone's, which over Redis the main process's CHECKED notes keep to
main's) and the /sync wake-up through a worker (send to the writer,
long-poll parked on ``synchrotron1``), with the load average: the machine is shared, so the
ratios measured in one run are the figures that matter.

CPU of the database server and of this client is not counted (the processes
of the homeserver only). Targets (issue 18): a pure follower <= 0.3 ms per
event at 200 events/s; the default layout's cluster <= 1.3x the monolith's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
import urllib.request
from typing import Any

import aiohttp

SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if SOURCE_ROOT not in sys.path:
    sys.path.insert(0, SOURCE_ROOT)

from bench import reference_follow  # noqa: E402
from bench.cluster import Cluster, database_server_cpu_seconds  # noqa: E402
from bench.scenarios import Client, User, measure_wakeup, percentile  # noqa: E402
from tests.harness.synapse_install import installed_workers_python  # noqa: E402

TARGET_FOLLOWER_MS = 0.3
TARGET_CLUSTER_RATIO = 1.3
TARGET_REPLICATION_P50_MS = 1.0
TARGET_WAKEUP_P50_MS = 10.0
#: The reference's operators' figure: ~25% of a core at 40 events/s per worker.
REFERENCE_FOLLOWER_MS = 6.0
#: The reference's worker in ``--reference`` runs.
REFERENCE_WORKER = reference_follow.WORKER
#: The writer every room of the benchmark lives on.
WRITER = "persister1"
#: Sends in flight at most; beyond that the machine has reached its limit.
MAX_IN_FLIGHT = 64


def role(layout: str, name: str) -> str:
    if layout.startswith("monolith"):
        return "everything"
    if name == WRITER:
        return "writer of the rooms"
    if name.startswith("persister"):
        return "events writer, following"
    if name == "main":
        return "main: relays, follows"
    if name == "router":
        return "router (unused: sends go to the writer)"
    if name.startswith("media"):
        return "media worker (reads caches only)"
    return "pure follower"


SEQUENCE_READS = 'synapse_lite_db_transaction_seconds_count{desc="read_max_allocated"}'


def sequence_reads(cluster: Cluster) -> dict[str, float]:
    """Each process's reads of a stream's sequence so far (the check of a
    peer's claimed position), from its /metrics; processes without metrics
    are left out."""
    counts = {}
    for name in cluster.processes:
        try:
            with urllib.request.urlopen(cluster.metrics_url(name), timeout=5) as response:
                text = response.read().decode()
        except OSError:
            continue
        counts[name] = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(SEQUENCE_READS)
        )
    return counts


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"{os.cpu_count()} cores, load average {one:.1f} (1 min) / {five:.1f} (5 min)"


async def setup(client: Client, cluster: Cluster, rooms: int) -> tuple[list[User], list[str]]:
    """Two users, and ``rooms`` rooms all on :data:`WRITER` (any room on the monolith)."""
    main = cluster.url("main")
    people = [await client.register(main, f"user{i}") for i in range(2)]
    chosen: list[str] = []
    for i in range(rooms * 8):
        created = await client.call(
            "POST", main, "/createRoom", people[0], {"preset": "public_chat", "name": f"r{i}"}
        )
        room = created["room_id"]
        if cluster.layout == "monolith" or cluster.room_writers().get(room) == WRITER:
            await client.call("POST", main, f"/join/{room}", people[1], {})
            chosen.append(room)
            if len(chosen) == rooms:
                return people, chosen
    raise RuntimeError(f"no {rooms} rooms landed on {WRITER}")


async def send_at_rate(
    client: Client, base: str, people: list[User], rooms: list[str], rate: float, seconds: float
) -> tuple[int, float]:
    """Open-loop sends at ``rate`` per second for ``seconds``: (sent, elapsed)."""
    total = int(rate * seconds)
    in_flight: set[asyncio.Task[str]] = set()
    sent = 0
    start = time.perf_counter()
    for n in range(total):
        delay = start + n / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        while len(in_flight) >= MAX_IN_FLIGHT:
            done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            in_flight -= done
            sent += sum(1 for d in done if not d.exception())
        task = asyncio.create_task(
            client.send(base, people[n % 2], rooms[n % len(rooms)], f"follow {n}")
        )
        in_flight.add(task)
    if in_flight:
        done, _ = await asyncio.wait(in_flight)
        sent += sum(1 for d in done if not d.exception())
    return sent, time.perf_counter() - start


async def measure_layout(
    layout: str, args: argparse.Namespace, source: str | None = None
) -> dict[str, Any]:
    """``source``: a checkout whose code the processes run (None: this one)."""
    cluster = Cluster(
        layout,
        args.engine,
        replication=args.transport,
        source_root=os.path.abspath(source) if source is not None else None,
    )
    for name in args.profile or ():
        cluster.profiled[name] = os.path.abspath(f"{layout}-{name}.prof")
    results: dict[str, Any] = {"rates": {}, "names": [], "layout": layout}
    try:
        cluster.start()
        results["names"] = list(cluster.processes)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            client = Client(session)
            people, rooms = await setup(client, cluster, args.rooms)
            base = cluster.url("main" if layout == "monolith" else WRITER)
            await send_at_rate(client, base, people, rooms, 50, 1.0)  # warm up
            await asyncio.sleep(1.0)
            before, idle_start = cluster.cpu_seconds(), time.perf_counter()
            await asyncio.sleep(args.idle)
            idle_elapsed = time.perf_counter() - idle_start
            results["idle_ms_per_s"] = {
                n: (t - before[n]) * 1000 / idle_elapsed for n, t in cluster.cpu_seconds().items()
            }
            for rate in args.rates:
                reads_before = sequence_reads(cluster)
                before = cluster.cpu_seconds()
                database_before = database_server_cpu_seconds()
                sent, elapsed = await send_at_rate(client, base, people, rooms, rate, args.seconds)
                await asyncio.sleep(0.5)  # let the followers finish
                cpu = {n: t - before[n] for n, t in cluster.cpu_seconds().items()}
                database_cpu = database_server_cpu_seconds() - database_before
                reads = {
                    n: (c - reads_before[n]) / max(sent, 1)
                    for n, c in sequence_reads(cluster).items()
                    if n in reads_before
                }
                results["rates"][rate] = {
                    "sent": sent,
                    "achieved": sent / elapsed,
                    "ms_per_event": {n: c * 1000 / max(sent, 1) for n, c in cpu.items()},
                    "reads_per_event": reads,
                    "database_ms_per_event": database_cpu * 1000 / max(sent, 1),
                    "load": os.getloadavg()[0],
                }
            sync_process = "synchrotron1" if "synchrotron1" in cluster.ports else "main"
            send_ms: list[float] = []
            wakeups = await measure_wakeup(
                client, base, cluster.url(sync_process), people[1], people[0], rooms[0],
                args.wakeups, False, send_ms,
            )  # fmt: skip
            results["wakeup"] = (percentile(wakeups, 0.5), percentile(wakeups, 0.99))
            # The send's own answer is part of every wake-up: what replication
            # adds is the rest.
            results["wakeup_send"] = percentile(send_ms, 0.5)
            results["wakeup_after_send"] = percentile(
                [w - s for w, s in zip(wakeups, send_ms, strict=True)], 0.5
            )
    finally:
        cluster.stop()
    return results


def projection(default: dict[str, float]) -> dict[str, float]:
    """The model of docs/scaling.md, from the default layout's per-event CPU:
    per-event costs of each process with N events writers and one /sync
    worker; returns {"writer": w, "follower": f, "relay": r per receiver}."""
    follower = default["synchrotron1"]
    # Over TCP the main process relays the writer's lines to every other
    # connection: the other workers and the router.
    receivers = len([n for n in default if n not in ("main", WRITER)])
    return {
        "writer": default[WRITER],
        "writer_follows": default["persister2"],
        "follower": follower,
        "relay": max(0.0, default["main"] - follower) / max(receivers, 1),
    }


def ceilings(model: dict[str, float], writers: int) -> tuple[float, str]:
    """Events/s at which the busiest process of a layout with ``writers``
    events writers (plus main, a /sync worker, the media worker and the router)
    saturates one core, and which process that is."""
    per_event = {
        "each writer": model["writer"] / writers
        + model["writer_follows"] * (writers - 1) / writers,
        "main": model["follower"] + model["relay"] * (writers + 2),
        "a /sync worker": model["follower"],
    }
    busiest = max(per_event, key=lambda k: per_event[k])
    return 1000.0 / per_event[busiest], busiest


def replication_latency(
    engine: str, events: int, transport: str = "tcp"
) -> tuple[float, float, float]:
    """p50 and p99 ms from commit to a follower's position, and the writer's
    p50 ms to get its new rows for the RDATA (bench/replication.py's run)."""
    from bench.replication import run_transport

    result = run_transport(transport, engine, events)
    return result["p50_ms"], result["p99_ms"], result["read_back_p50_ms"]


def report(
    results: dict[str, dict[str, Any]], extra: dict[str, Any], args: argparse.Namespace
) -> None:
    print()
    print(
        f"## Follow cost, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {args.engine},"
        f" {args.transport} replication, {load_note()}; sends straight to the room's writer"
        f" for {args.seconds:.0f} s per rate,"
        f" no /sync clients ({platform.python_implementation()} {platform.python_version()})"
    )
    for layout, r in results.items():
        print_layout(layout, r, monolith_of(results, layout))
    for key in ("default", "default@baseline"):
        if results.get(key, {}).get("rates"):
            print_targets(key, results[key], monolith_of(results, key))
    if "reference" in extra:
        print_reference(extra["reference"], results.get("default"))
    if "replication" in extra:
        p50, p99, read_back = extra["replication"]
        print(
            f"  replication latency, commit -> follower position (TCP, via main): p50"
            f" {p50:.2f} ms, p99 {p99:.2f} ms (target p50 <= {TARGET_REPLICATION_P50_MS:g},"
            f" quiet machine) {verdict(p50 <= TARGET_REPLICATION_P50_MS)}; the writer's"
            f" getting of its new rows: p50 {read_back:.3f} ms"
        )


def print_reference(reference: dict[float, dict[str, Any]], default: dict[str, Any] | None) -> None:
    """The reference's worker, measured in this run (bench/reference_follow.py),
    and its CPU per event over our pure follower's (``synchrotron1`` of the
    default layout) at the same rate: issue 35 aims at >= 5."""
    print()
    print("### the reference homeserver, same machine and client (main + one worker, Redis)")
    for rate, r in reference.items():
        ms = r["ms_per_event"]
        ours = (default or {}).get("rates", {}).get(rate, {}).get("ms_per_event", {})
        ours_note = ""
        if "synchrotron1" in ours:
            ours_note = (
                f"; ours (synchrotron1) {ours['synchrotron1']:.3f} ms; reference / ours"
                f" {ms[REFERENCE_WORKER] / max(ours['synchrotron1'], 1e-9):.2f}"
            )
        if r["achieved"] < 0.9 * rate:
            # Its main process saturated: its follower's cost per event falls
            # with the rate (more events per wake-up), so this ratio is not
            # like for like; the nearest rate both reached is.
            ours_note += " (not at the same rate: its main gave out)"
        print(
            f"  {rate:g}/s asked, {r['achieved']:.1f}/s achieved: its worker (pure follower)"
            f" {ms[REFERENCE_WORKER]:.3f} ms per event{ours_note}; its main process"
            f" {ms['main']:.3f} ms"
        )


def monolith_of(results: dict[str, dict[str, Any]], layout: str) -> dict[str, Any] | None:
    """The monolith measured with the same code as ``layout`` (``X@baseline``:
    the baseline's), else this code's."""
    _, at, suffix = layout.partition("@")
    return results.get(f"monolith{at}{suffix}") or results.get("monolith")


def print_layout(layout: str, r: dict[str, Any], mono: dict[str, Any] | None) -> None:
    print()
    print(f"### {layout}: CPU ms per event (idle ms of CPU per second in brackets)")
    print(f"  {'process':<16}{'role':<41}" + "".join(f"{f'{rate:g}/s':>10}" for rate in r["rates"]))
    for name in r["names"]:
        cells = "".join(f"{x['ms_per_event'][name]:>10.3f}" for x in r["rates"].values())
        idle = r["idle_ms_per_s"][name]
        print(f"  {name:<16}{role(layout, name) + f' [{idle:.1f}]':<41}{cells}")
    totals = {rate: sum(x["ms_per_event"].values()) for rate, x in r["rates"].items()}
    rows: list[tuple[str, str, list[str]]] = [
        ("cluster", "all processes", [f"{t:>10.3f}" for t in totals.values()]),
        (
            "database",
            "the PostgreSQL server (not in cluster)",
            [f"{x.get('database_ms_per_event', 0.0):>10.3f}" for x in r["rates"].values()],
        ),
        ("achieved", "events/s sent", [f"{x['achieved']:>10.1f}" for x in r["rates"].values()]),
        ("load", "1-min load average after", [f"{x['load']:>10.1f}" for x in r["rates"].values()]),
    ]
    if mono is not None and not layout.startswith("monolith"):
        ratios = [
            totals[rate] / sum(mono["rates"][rate]["ms_per_event"].values())
            for rate in r["rates"]
            if rate in mono["rates"]
        ]
        rows.append(("vs monolith", "cluster CPU / monolith CPU", [f"{q:>10.2f}" for q in ratios]))
    if not layout.startswith("monolith"):
        # Over TCP the main process checks every claim before relaying it
        # (a read per new position); workers take its word.
        reads = [x.get("reads_per_event", {}).get("main") for x in r["rates"].values()]
        rows.append((
            "seq. reads", "main's sequence reads per event",
            [f"{q:>10.2f}" if q is not None else f"{'-':>10}" for q in reads],
        ))  # fmt: skip
        # Over Redis the others take main's signed notes of its reads.
        everyone = [sum(x.get("reads_per_event", {}).values()) for x in r["rates"].values()]
        rows.append((
            "", "everyone's sequence reads per event",
            [f"{q:>10.2f}" for q in everyone],
        ))  # fmt: skip
    for name, what, values in rows:
        print(f"  {name:<16}{what:<41}" + "".join(values))


def print_targets(key: str, default: dict[str, Any], mono: dict[str, Any] | None) -> None:
    rate = 200 if 200 in default["rates"] else next(iter(default["rates"]))
    per_event = default["rates"][rate]["ms_per_event"]
    model = projection(per_event)
    print()
    print(
        f"### {key}: projected ceiling (from {rate:g}/s: writer"
        f" {model['writer']:.3f} ms, writer following {model['writer_follows']:.3f} ms,"
        f" follower {model['follower']:.3f} ms, main's relay {model['relay']:.3f} ms"
        f" per receiver, per event; one core per process; database not modelled)"
    )
    if mono is not None and rate in mono["rates"]:
        mono_ms = mono["rates"][rate]["ms_per_event"]["main"]
        print(f"  monolith: {1000 / mono_ms:,.0f} events/s (main {mono_ms:.3f} ms per event)")
    for writers in (2, 4, 8, 16):
        events, busiest = ceilings(model, writers)
        print(f"  {writers:>2} events writers: {events:,.0f} events/s (busiest: {busiest})")
    print(f"### {key}: targets")
    follower = per_event["synchrotron1"]
    print(
        f"  pure follower at {rate:g}/s: {follower:.3f} ms per event (target <="
        f" {TARGET_FOLLOWER_MS}; reference's reported ~{REFERENCE_FOLLOWER_MS} ms:"
        f" {REFERENCE_FOLLOWER_MS / max(follower, 1e-9):.0f}x less)"
        f" {verdict(follower <= TARGET_FOLLOWER_MS)}"
    )
    if mono is not None and rate in mono["rates"]:
        ratio = sum(per_event.values()) / sum(mono["rates"][rate]["ms_per_event"].values())
        print(
            f"  cluster CPU per event / monolith's at {rate:g}/s: {ratio:.2f}"
            f" (target <= {TARGET_CLUSTER_RATIO}) {verdict(ratio <= TARGET_CLUSTER_RATIO)}"
        )
    reads = default["rates"][rate].get("reads_per_event", {})
    if reads:
        others = sum(n for name, n in reads.items() if name != "main")
        print(
            f"  sequence reads per event at {rate:g}/s: main {reads.get('main', 0.0):.2f},"
            f" every other process together {others:.2f} (target: the cluster reads once per"
            f" new position, not once per process) {verdict(others <= 0.05)}"
        )
    if "wakeup" in default:
        p50, p99 = default["wakeup"]
        print(
            f"  /sync wake-up through synchrotron1: p50 {p50:.1f} ms, p99 {p99:.1f} ms"
            f" (target p50 <= {TARGET_WAKEUP_P50_MS:g}) {verdict(p50 <= TARGET_WAKEUP_P50_MS)}"
        )
        print(
            f"    of which the send's own answer: p50 {default['wakeup_send']:.1f} ms; from the"
            f" send's answer to the /sync's, p50 {default['wakeup_after_send']:.1f} ms"
        )
        if mono is not None and "wakeup" in mono:
            print(
                f"    the monolith, same run: p50 {mono['wakeup'][0]:.1f} ms (send"
                f" {mono['wakeup_send']:.1f} ms, then {mono['wakeup_after_send']:.1f} ms)"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.follow_cost", description=__doc__)
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="postgres")
    parser.add_argument(
        "--layout", dest="layouts", action="append",
        choices=("monolith", "default", "sharded"), help="repeatable; default: monolith, default",
    )  # fmt: skip
    parser.add_argument(
        "--rate", dest="rates", action="append", type=float, help="events/s; repeatable"
    )
    parser.add_argument(
        "--profile", action="append", metavar="NAME",
        help="run this process under cProfile, stats to ./LAYOUT-NAME.prof; repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--baseline", metavar="DIR",
        help="also run each layout with the code of this checkout (e.g. main), in the same run",
    )  # fmt: skip
    parser.add_argument(
        "--transport", choices=("tcp", "redis"), default="tcp",
        help="replication between the processes (redis: on 127.0.0.1:6379)",
    )  # fmt: skip
    parser.add_argument("--seconds", type=float, default=10.0, help="of sends per rate")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds of idle CPU sampled")
    parser.add_argument("--rooms", type=int, default=4)
    parser.add_argument("--wakeups", type=int, default=30)
    parser.add_argument(
        "--reference", metavar="PYTHON", nargs="?", const="",
        help="also measure the reference homeserver's pure-follower worker (Redis, PostgreSQL),"
        " installed in this Python's venv (alone: the one tests/harness/synapse_install.py"
        " --workers made)",
    )  # fmt: skip
    parser.add_argument(
        "--replication-events", type=int, default=2000,
        help="throughput events of the replication latency run (0: skip it)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.reference == "":
        args.reference = installed_workers_python()
        if args.reference is None:
            parser.error(
                "--reference without PYTHON needs the reference's workers' install:"
                " python3 tests/harness/synapse_install.py --workers"
            )
    args.layouts = args.layouts or ["monolith", "default"]
    args.rates = args.rates or [40.0, 200.0, 1000.0]
    results: dict[str, Any] = {}
    for layout in args.layouts:
        results[layout] = asyncio.run(measure_layout(layout, args))
        if args.baseline:
            results[f"{layout}@baseline"] = asyncio.run(measure_layout(layout, args, args.baseline))
    extra: dict[str, Any] = {}
    if args.reference:
        extra["reference"] = asyncio.run(
            reference_follow.measure(
                args.reference, reference_follow.ADMIN_DATABASE, args.rates, args.seconds
            )
        )
    if args.replication_events:
        extra["replication"] = replication_latency(
            args.engine, args.replication_events, args.transport
        )
    report(results, extra, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
