"""The client API benchmark: ``python -m bench.client``.

Starts each layout in turn on a fresh database (PostgreSQL by default; the
split layout replicates over Redis when it runs, else TCP), then measures
over HTTP, with the benchmark client on the same machine:

* send throughput: concurrent senders over several rooms, events/s sent and
  delivered (every user's /sync has them all), with send latency p50 and p99;
* /sync wake-up: from a user's send to another user's parked /sync returning it;
* typing wake-up: the same for a typing notification;
* initial /sync time, and each process's resident memory after the run.

``--sync-modes`` runs the throughput measurement once per way the users read
/sync while the messages are sent (``bench.scenarios.SYNC_MODES``): ``poll``
(long polls, the default and the natural client), ``paced`` (one /sync per
user every ``--sync-every`` messages, the same number for every tree) and
``none`` (no /sync until the last message is sent). Long polls make each
tree answer as many /syncs as its wake-ups allow, which is part of what a
server costs but not of what sending costs; the other two modes make trees
compare on the same work besides sending. Columns of the other modes are
named ``LAYOUT/MODE``; the wake-up, typing and initial /sync figures are
measured once per cluster (after every mode) and shown in each column.
"CPU ms per send" is the layout's processes' CPU time from the first to the
last send's answer over the messages sent (with ``none``, the sends alone);
on PostgreSQL, the server's CPU over the same span is shown beside it (every
``postgres`` process on the machine, so other users of the server count).

Layouts: ``single`` (the main process does everything), ``default`` (the
README's layout: the router in front of main, a /sync worker and two event
persisters; measured three ways on one cluster: through the router, with
every request sent to main, and with each request sent straight to the
process the router would choose) and ``split`` (main, a /sync worker, two
event persisters, a typing writer). Prints one table with the targets,
PASS/FAIL, and the larger homeserver's figures measured on the same machine
and settings. The router's targets: the default layout through it at least as
fast as the monolith, and at most 1 ms added to the /sync wake-up p50 (router
against direct, measured in alternating pairs: the median of the pairs'
differences).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from typing import Any

import aiohttp
import attr

from bench.cluster import SEND_TO, SYNC_ON, Cluster, database_server_cpu_seconds
from bench.scenarios import (
    SYNC_MODES,
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
TARGET_ROUTER_ADDS_MS = 1.0


#: How the default layout is reached, measured on one cluster: through the
#: router (the README's path now); everything to the main process (the
#: README's path before the router); and each request straight to the process
#: the router would pick (the baseline the router's overhead is measured from).
ROUTINGS = ("router", "main", "direct")


def monolith_throughput_options(args: argparse.Namespace, sync_mode: str) -> None:
    """Set on ``args`` what :func:`run_layout` reads besides the engine and
    the message count, for its throughput workload on the monolith as the
    monolith's profiling benches run it: 8 senders, 4 users, 4 rooms split
    evenly, /sync read as ``sync_mode`` (``bench.scenarios.SYNC_MODES``)."""
    args.senders, args.users, args.rooms, args.rounds = 8, 4, 4, 10
    args.route_to_writer, args.even_writers, args.routings = False, True, "router"
    args.one_writer = False
    args.sync_modes, args.sync_every = sync_mode, 25


def monolith_column(sync_mode: str) -> str:
    """The result column of :func:`run_layout` for the monolith read so."""
    return "single" if sync_mode == "poll" else f"single/{sync_mode}"


async def run_layout(cluster: Cluster, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Results by column: one for ``single`` and ``split``, one per routing
    for ``default``."""
    layout = cluster.layout
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        client = Client(session)
        main = cluster.url("main")
        people, rooms = await setup_users_and_rooms(client, main, args.users, args.rooms)
        if args.even_writers or args.one_writer:
            rooms = await even_rooms(client, cluster, main, people, rooms, args.one_writer)
        if layout != "default":
            send_bases = [cluster.url(n) for n in SEND_TO[layout]]
            sync_base = cluster.url(SYNC_ON[layout])
            room_bases = None
            if args.route_to_writer and layout != "single":
                # What a load balancer that knows each room's writer would do.
                room_bases = {r: cluster.url(w) for r, w in cluster.room_writers().items()}
            paths = Paths(send_bases, sync_base, main, room_bases)
            return named(layout, await measure_paths(client, cluster, paths, people, rooms, args))
        writers = {r: cluster.url(w) for r, w in cluster.room_writers().items()}
        router = cluster.url("router")
        reader = cluster.url("synchrotron1")
        paths_of = {
            "router": Paths([router], router, router, None),
            "main": Paths([main], main, main, None),
            "direct": Paths([writers[rooms[0]]], reader, main, writers),
        }
        results = {}
        for routing in args.routings.split(","):
            results.update(
                named(
                    f"default/{routing}",
                    await measure_paths(client, cluster, paths_of[routing], people, rooms, args),
                )
            )
        # The router's overhead on a wake-up: one round direct, one round
        # through the router, and so on, so that the machine's load, which
        # moves by the second, weighs on both alike; the figure is the median
        # of the pairs' differences.
        if not {"router", "direct"} <= set(args.routings.split(",")):
            return results
        rounds: dict[str, list[float]] = {"router": [], "direct": []}
        for _ in range(args.rounds * 2):
            for routing in ("direct", "router"):
                paths = paths_of[routing]
                rounds[routing] += await measure_wakeup(
                    client, paths.send[0], paths.sync, people[1], people[0], rooms[0], 1, False
                )
        for routing, values in rounds.items():
            results[f"default/{routing}"]["wakeup_p50"] = percentile(values, 0.5)
            results[f"default/{routing}"]["wakeup_p99"] = percentile(values, 0.99)
        added = [r - d for r, d in zip(rounds["router"], rounds["direct"], strict=True)]
        results["default/router"]["router_adds_ms"] = percentile(added, 0.5)
        # And to one plain request (GET /versions, answered by main), the same way.
        hops = await request_pairs(client, main, router, args.rounds * 4)
        results["default/router"]["hop_ms"] = percentile(hops, 0.5)
        return results


def named(column: str, by_mode: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Results by column: ``column`` for the ``poll`` mode, ``column/MODE``
    for the others."""
    return {column if m == "poll" else f"{column}/{m}": r for m, r in by_mode.items()}


async def even_rooms(
    client: Client,
    cluster: Cluster,
    main: str,
    people: list[Any],
    rooms: list[str],
    one_writer: bool = False,
) -> list[str]:
    """``len(rooms)`` rooms split evenly over the layout's events writers (a
    room's writer is a hash of its random id, so a few rooms often land on one
    writer, and differently for each run), or all on its first one with
    ``one_writer``: rooms are created and joined until every writer has its
    share, and everyone leaves the ones not kept. ``len(rooms)`` must be a
    multiple of the number of writers."""
    writers = cluster.events_writers()
    if len(writers) == 1:
        return rooms
    if one_writer:
        writers = writers[:1]
    elif len(rooms) % len(writers):
        raise ValueError(f"--rooms {len(rooms)} is not a multiple of {len(writers)} writers")
    share = len(rooms) // len(writers)
    kept: dict[str, list[str]] = {w: [] for w in writers}
    extra: list[str] = []
    pending = list(rooms)
    while any(len(k) < share for k in kept.values()):
        if not pending:
            pending = (await setup_users_and_rooms(client, main, 0, 1, people))[1]
        room = pending.pop()
        writer = cluster.room_writers()[room]
        if writer in kept and len(kept[writer]) < share:
            kept[writer].append(room)
        else:
            extra.append(room)
    for room in extra + pending:
        for person in people:
            await client.call("POST", main, f"/rooms/{room}/leave", person, {})
    return [room for i in range(share) for room in (k[i] for k in kept.values())]


async def request_pairs(client: Client, direct: str, router: str, pairs: int) -> list[float]:
    """Milliseconds the router adds to a request: ``GET /versions`` straight
    to the process, then through the router, ``pairs`` times."""
    added = []
    for _ in range(pairs):
        took = []
        for base in (direct, router):
            start = time.perf_counter()
            async with client.session.get(f"{base}/_matrix/client/versions") as response:
                await response.read()
            took.append((time.perf_counter() - start) * 1000)
        added.append(took[1] - took[0])
    return added


@attr.s(auto_attribs=True)
class Paths:
    """Where one way of reaching a layout sends each kind of request."""

    send: list[str]
    sync: str
    typing: str
    #: Each room's process, when sends go to it rather than to ``send``.
    rooms: dict[str, str] | None


async def measure_paths(
    client: Client,
    cluster: Cluster,
    paths: Paths,
    people: list[Any],
    rooms: list[str],
    args: argparse.Namespace,
) -> dict[str, dict[str, Any]]:
    """Results by /sync mode (``args.sync_modes``), each mode's throughput run
    in turn on this cluster, then the latency figures once, shared."""
    # Warm up caches and connections.
    await measure_throughput(client, paths.send, paths.sync, people, rooms, 40, args.senders)
    by_mode = {}
    postgres = cluster.database["engine"] == "postgres"
    for mode in args.sync_modes.split(","):
        cpu_before = cluster.cpu_seconds()
        server_before = database_server_cpu_seconds() if postgres else 0.0
        cpu_sent: dict[str, float] = {}
        server_sent: list[float] = []

        def record_sent(
            into: dict[str, float] = cpu_sent, server: list[float] = server_sent
        ) -> None:
            into.update(cluster.cpu_seconds())
            server.append(database_server_cpu_seconds() if postgres else 0.0)

        throughput = await measure_throughput(
            client,
            paths.send,
            paths.sync,
            people,
            rooms,
            args.messages,
            args.senders,
            paths.rooms,
            sync_mode=mode,
            sync_every=args.sync_every,
            on_sent=record_sent,
        )
        cpu = {n: t - cpu_before[n] for n, t in cluster.cpu_seconds().items()}
        sending = sum(cpu_sent[n] - cpu_before[n] for n in cpu_before)
        by_mode[mode] = {
            "sent": throughput.sent_per_second,
            "delivered": throughput.delivered_per_second,
            "syncs": throughput.syncs,
            "syncs_during_sends": throughput.syncs_during_sends,
            "cpu_ms_per_send": sending * 1000 / args.messages,
            # Every PostgreSQL process on the machine: other users' too.
            "db_cpu_ms_per_send": (server_sent[0] - server_before) * 1000 / args.messages,
            "send_p50": percentile(throughput.latencies_ms, 0.5),
            "send_p99": percentile(throughput.latencies_ms, 0.99),
            "cpu": cpu,
            "transport": cluster.transport,
        }
    send = paths.rooms[rooms[0]] if paths.rooms else paths.send[0]
    wakeup = await measure_wakeup(
        client, send, paths.sync, people[1], people[0], rooms[0], args.rounds, False
    )
    typing = await measure_wakeup(
        client, paths.typing, paths.sync, people[1], people[0], rooms[0], args.rounds, True
    )
    initial = await measure_initial_sync(client, paths.sync, people[2], 5)
    latency = {
        "wakeup_p50": percentile(wakeup, 0.5),
        "wakeup_p99": percentile(wakeup, 0.99),
        "typing_p50": percentile(typing, 0.5),
        "typing_p99": percentile(typing, 0.99),
        "initial_ms": initial,
        "rss": cluster.rss_mb(),
    }
    return {mode: {**figures, **latency} for mode, figures in by_mode.items()}


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
    row("/sync requests (sends)", "syncs", "{:d}", "", None, "")
    row("/sync requests while sending", "syncs_during_sends", "{:d}", "", None, "")
    row("CPU ms per send", "cpu_ms_per_send", "{:.2f}", "", None, "")
    if args.engine == "postgres":
        row("PostgreSQL server CPU ms per send", "db_cpu_ms_per_send", "{:.2f}", "", None, "")
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
    blank = [""] * (len(layouts) - 1)
    if {"single", "split"} <= set(results):
        ok = results["split"]["delivered"] >= results["single"]["delivered"]
        all_ok = all_ok and ok
        ratio = results["split"]["delivered"] / results["single"]["delivered"]
        rows.append(
            [
                "split / single delivered",
                *blank,
                f"{ratio:.2f}",
                ">= 1.00",
                "22/30 = 0.73",
                verdict(ok),
            ]
        )
    if {"single", "default/router"} <= set(results):
        router, single = results["default/router"], results["single"]
        for key, what in (("delivered", "delivered"), ("sent", "sent")):
            ratio = router[key] / single[key]
            ok = ratio >= 1.0
            all_ok = all_ok and ok
            rows.append(
                [
                    f"default via router / monolith, {what}",
                    *blank,
                    f"{ratio:.2f}",
                    ">= 1.00",
                    "",
                    verdict(ok),
                ]
            )
    if {"default/router", "default/direct"} <= set(results):
        added = results["default/router"]["router_adds_ms"]
        ok = added <= TARGET_ROUTER_ADDS_MS
        all_ok = all_ok and ok
        rows.append(
            [
                "router adds to /sync wake-up, median of pairs, ms",
                *blank,
                f"{added:.2f}",
                "<= 1.0",
                "",
                verdict(ok),
            ]
        )
        hop = results["default/router"]["hop_ms"]
        rows.append(
            ["router adds to one request, median of pairs, ms", *blank, f"{hop:.2f}", "", "", ""]
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
    parser.add_argument(
        "--layouts",
        default="single,default",
        help="comma-separated: single (monolith), default (the README's layout through the"
        " router, with every request to main, and straight to each process), split",
    )
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
    parser.add_argument(
        "--routings",
        default=",".join(ROUTINGS),
        help="comma-separated ways of reaching the default layout, of " + ", ".join(ROUTINGS),
    )
    parser.add_argument(
        "--even-writers",
        action="store_true",
        help="split the rooms evenly over the layout's events writers (more rooms created,"
        " the extra ones left), so that runs of different code compare alike",
    )
    parser.add_argument(
        "--one-writer",
        action="store_true",
        help="all the rooms on the layout's first events writer (the others only follow)",
    )
    parser.add_argument(
        "--sync-modes",
        default="poll",
        help="comma-separated ways the users read /sync during the throughput run, of "
        + ", ".join(SYNC_MODES)
        + ": long polls (poll), one /sync each per --sync-every messages (paced), none until"
        " the last message is sent (none)",
    )
    parser.add_argument(
        "--sync-every",
        type=int,
        default=25,
        help="messages sent per /sync of each user with --sync-modes paced",
    )
    parser.add_argument("--keep", action="store_true", help="keep the layouts' directories")
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        action="append",
        default=[],
        help="a checkout of other code (e.g. `git worktree add DIR REV`): each layout runs with"
        " it right after this code's run, columns '@baseline' ('@baseline2', ... for a second"
        " --baseline), and the ratios are printed",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of every source per layout, alternating (every other round in reverse"
        " order); columns get '#1', '#2', ...",
    )
    args = parser.parse_args(argv)
    if not set(args.routings.split(",")) <= set(ROUTINGS):
        parser.error(f"--routings: each of {', '.join(ROUTINGS)}")
    if not set(args.sync_modes.split(",")) <= set(SYNC_MODES):
        parser.error(f"--sync-modes: each of {', '.join(SYNC_MODES)}")
    if args.sync_every < 1:
        parser.error("--sync-every: at least 1")
    results: dict[str, dict[str, Any]] = {}
    sources: list[tuple[str | None, str]] = [(None, "")]
    for i, baseline in enumerate(args.baseline):
        sources.append((os.path.abspath(baseline), BASELINE + (str(i + 1) if i else "")))
    for layout in args.layouts.split(","):
        for run in range(args.repeat):
            tag = f"#{run + 1}" if args.repeat > 1 else ""
            for source, suffix in sources if run % 2 == 0 else list(reversed(sources)):
                cluster = Cluster(layout, args.engine, source_root=source)
                started = time.monotonic()
                try:
                    cluster.start()
                    took = time.monotonic() - started
                    print(f"{layout}{suffix}{tag}: started in {took:.1f} s ({cluster.dir})")
                    columns = asyncio.run(run_layout(cluster, args))
                    results.update({name + suffix + tag: value for name, value in columns.items()})
                finally:
                    cluster.stop(keep=args.keep)
    ok = report(results, args)
    if args.baseline:
        print_ratios(results, [suffix for _, suffix in sources[1:]])
    return 0 if ok else 1


#: The suffix of the columns measured with ``--baseline``'s code.
BASELINE = "@baseline"


def print_ratios(results: dict[str, dict[str, Any]], suffixes: list[str]) -> None:
    """This code's figures over each baseline's, measured in the same run
    (per round with ``--repeat``), then per column the medians over rounds of
    the events/s sent and CPU per send ratios."""
    print()
    sent_ratios: dict[str, list[float]] = {}
    cpu_ratios: dict[str, list[float]] = {}
    for name, ours in results.items():
        if "@" in name:
            continue
        column, _, tag = name.partition("#")
        for suffix in suffixes:
            theirs = results.get(column + suffix + ("#" + tag if tag else ""))
            if theirs is None:
                continue
            sent, delivered, wakeup, initial, per_send = (
                ours[k] / theirs[k]
                for k in ("sent", "delivered", "wakeup_p50", "initial_ms", "cpu_ms_per_send")
            )
            cpu = sum(ours["cpu"].values()) / max(sum(theirs["cpu"].values()), 1e-9)
            sent_ratios.setdefault(column + suffix, []).append(sent)
            cpu_ratios.setdefault(column + suffix, []).append(per_send)
            print(
                f"{name} / {suffix[1:]}: events/s sent {sent:.2f}, delivered {delivered:.2f};"
                f" CPU ms per send {per_send:.2f} ({ours['cpu_ms_per_send']:.2f} /"
                f" {theirs['cpu_ms_per_send']:.2f}); /syncs while sending"
                f" {ours['syncs_during_sends']} / {theirs['syncs_during_sends']};"
                f" PostgreSQL server CPU ms per send {ours['db_cpu_ms_per_send']:.2f} /"
                f" {theirs['db_cpu_ms_per_send']:.2f};"
                f" /sync wake-up p50 {wakeup:.2f} ({ours['wakeup_p50']:.1f} /"
                f" {theirs['wakeup_p50']:.1f} ms); initial /sync {initial:.2f}; CPU s of the"
                f" throughput run {cpu:.2f}; send p50 {ours['send_p50']:.1f} /"
                f" {theirs['send_p50']:.1f} ms"
            )
    if any(len(v) > 1 for v in sent_ratios.values()):
        print()
        for key, values in sent_ratios.items():
            column, _, suffix = key.partition("@")
            print(
                f"{column} / {suffix}, median of {len(values)} rounds: events/s sent"
                f" {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f}),"
                f" CPU ms per send {statistics.median(cpu_ratios[key]):.2f}"
                f" ({min(cpu_ratios[key]):.2f}-{max(cpu_ratios[key]):.2f})"
            )


if __name__ == "__main__":
    sys.exit(main())
