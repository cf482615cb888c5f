"""What the router itself spends per request it proxies: ``python -m bench.router_cost``.

Starts the default layout (generate-config's, as ``synapse-lite run`` runs
it; PostgreSQL by default) on a fresh database, makes users and rooms through
the main process, then samples the router's user+system CPU time from
``/proc/<pid>/stat`` around:

* ``idle``: nothing sent for ``--idle`` seconds: what the router pays per
  second whatever the traffic (health checks, replication pings);
* ``send``: ``--messages`` sends through the router from ``--senders``
  concurrent senders, as fast as the cluster takes them;
* ``send@40/s``: sends at 40/s open-loop (the rate of the issue's ~1.4 ms
  figure, which includes the per-second cost spread over few requests);
* ``sync``: ``--syncs`` incremental /sync requests (``timeout=0``: answered
  at once) through the router from the same number of concurrent clients.

Each figure is printed raw (router CPU over requests) and net of the idle cost
per second for the phase's duration. With ``--baseline DIR`` (another
checkout, e.g. ``git archive main | tar -x -C DIR``) the same run measures that
code too, alternating with this code over ``--repeat`` rounds, and prints the
ratios. ``--profile OUT`` runs this code's router under cProfile and writes
its statistics to OUT (read with ``python -m pstats``).

Target (issue 35): the router's own CPU per proxied request <= 0.3 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import sys
import time
from typing import Any

import aiohttp

SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if SOURCE_ROOT not in sys.path:
    sys.path.insert(0, SOURCE_ROOT)

from bench.cluster import Cluster  # noqa: E402
from bench.scenarios import Client, User, setup_users_and_rooms  # noqa: E402

TARGET_MS_PER_REQUEST = 0.3
PACED_RATE = 40.0
PHASES = ("idle/s", "send", f"send@{PACED_RATE:.0f}/s", "sync")


def user_system_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU time of a process so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


class Phases:
    """The router's CPU around each phase of one cluster's run."""

    def __init__(self, cluster: Cluster, idle_seconds: float) -> None:
        self.pid = cluster.processes["router"].pid
        self.idle_seconds = idle_seconds
        #: phase -> (router CPU seconds, wall seconds, requests)
        self.figures: dict[str, tuple[float, float, int]] = {}
        #: phase -> the share of the router's CPU spent in the kernel
        self.system_share: dict[str, float] = {}

    async def measure(self, phase: str, work: Any, requests: int) -> None:
        (user, system), wall = user_system_seconds(self.pid), time.monotonic()
        await work
        user_after, system_after = user_system_seconds(self.pid)
        cpu = user_after - user + system_after - system
        self.figures[phase] = (cpu, time.monotonic() - wall, requests)
        self.system_share[phase] = (system_after - system) / cpu if cpu else 0.0

    def per_request_ms(self, phase: str, net: bool) -> float:
        """Router CPU ms per request in ``phase`` (``net``: less the idle cost
        for the phase's duration); per second for ``idle/s``."""
        cpu, wall, requests = self.figures[phase]
        if phase == "idle/s":
            return cpu / wall * 1000
        if net:
            idle_cpu, idle_wall, _ = self.figures["idle/s"]
            cpu -= idle_cpu / idle_wall * wall
        return cpu / requests * 1000

    def rate(self, phase: str) -> float:
        _, wall, requests = self.figures[phase]
        return requests / wall


async def sends(
    client: Client, router: str, people: list[User], rooms: list[str], count: int, senders: int
) -> None:
    remaining = iter(range(count))

    async def sender(i: int) -> None:
        for n in remaining:
            await client.send(router, people[i % len(people)], rooms[n % len(rooms)], f"m{n}")

    await asyncio.gather(*(sender(i) for i in range(senders)))


async def paced_sends(
    client: Client, router: str, people: list[User], rooms: list[str], count: int
) -> None:
    started = time.monotonic()
    tasks = []
    for n in range(count):
        delay = started + n / PACED_RATE - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(
            asyncio.ensure_future(
                client.send(router, people[n % len(people)], rooms[n % len(rooms)], f"p{n}")
            )
        )
    await asyncio.gather(*tasks)


async def syncs(client: Client, router: str, people: list[User], count: int, clients: int) -> None:
    tokens = {
        p.user_id: (await client.sync(router, p, None, 0, False))["next_batch"] for p in people
    }
    remaining = iter(range(count))

    async def syncer(i: int) -> None:
        person = people[i % len(people)]
        for _ in remaining:
            await client.sync(router, person, tokens[person.user_id], 0, False)

    await asyncio.gather(*(syncer(i) for i in range(clients)))


async def run(cluster: Cluster, args: argparse.Namespace) -> Phases:
    phases = Phases(cluster, args.idle)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        client = Client(session)
        router = cluster.url("router")
        people, rooms = await setup_users_and_rooms(
            client, cluster.url("main"), args.users, args.rooms
        )
        # Warm the router's room writers, pooled connections and the workers' caches.
        await sends(client, router, people, rooms, 80, args.senders)
        await syncs(client, router, people, 40, args.senders)
        await phases.measure("idle/s", asyncio.sleep(args.idle), 0)
        await phases.measure(
            "send", sends(client, router, people, rooms, args.messages, args.senders), args.messages
        )
        paced = int(PACED_RATE * args.idle)
        await phases.measure(
            phases_name("paced"), paced_sends(client, router, people, rooms, paced), paced
        )
        await phases.measure(
            "sync", syncs(client, router, people, args.syncs, args.senders), args.syncs
        )
    return phases


def phases_name(kind: str) -> str:
    return f"send@{PACED_RATE:.0f}/s" if kind == "paced" else kind


def measure(source: str | None, args: argparse.Namespace, profile: str | None) -> Phases:
    cluster = Cluster("default", args.engine, source_root=source)
    if profile:
        cluster.profiled["router"] = os.path.abspath(profile)
    try:
        cluster.start()
        phases = asyncio.run(run(cluster, args))
        if profile:
            os.kill(cluster.processes["router"].pid, signal.SIGUSR2)
            time.sleep(1)
        return phases
    finally:
        cluster.stop(keep=args.keep)


def report(results: dict[str, list[Phases]]) -> bool:
    print(
        f"\n## Router CPU per proxied request: default layout, {platform.node()},"
        f" {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    )
    print(
        "ms per request, raw / net of the idle cost (idle: ms per second); requests/s;"
        " [the kernel's share of the router's CPU]"
    )
    names = list(results)
    print("| phase | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    for phase in PHASES:
        cells = []
        for name in names:
            rounds = results[name]
            if phase == "idle/s":
                cells.append(
                    ", ".join(
                        f"{p.per_request_ms(phase, False):.2f} [sys {p.system_share[phase]:.0%}]"
                        for p in rounds
                    )
                )
            else:
                cells.append(
                    ", ".join(
                        f"{p.per_request_ms(phase, False):.3f}"
                        f" / {p.per_request_ms(phase, True):.3f}"
                        f" ({p.rate(phase):.0f}/s) [sys {p.system_share[phase]:.0%}]"
                        for p in rounds
                    )
                )
        print(f"| {phase} | " + " | ".join(cells) + " |")
    ours = results["this code"]
    ok = all(
        p.per_request_ms(phase, True) <= TARGET_MS_PER_REQUEST
        for p in ours
        for phase in ("send", "sync")
    )
    print(
        f"target: net router CPU per proxied send and /sync <= {TARGET_MS_PER_REQUEST} ms:"
        f" {'PASS' if ok else 'FAIL'}"
    )
    if "baseline" in results:
        for phase in PHASES:
            for i, (a, b) in enumerate(zip(ours, results["baseline"], strict=True)):
                net = phase != "idle/s"
                ratio = a.per_request_ms(phase, net) / max(b.per_request_ms(phase, net), 1e-9)
                print(f"{phase} #{i + 1}: this code / baseline {ratio:.2f}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.router_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--engine", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--syncs", type=int, default=1000)
    parser.add_argument("--senders", type=int, default=8)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--rooms", type=int, default=4)
    parser.add_argument(
        "--idle",
        type=float,
        default=10.0,
        help="seconds of the idle phase (and of the paced sends)",
    )
    parser.add_argument("--baseline", metavar="DIR", help="another checkout, measured alike")
    parser.add_argument("--repeat", type=int, default=1, help="rounds, alternating sources")
    parser.add_argument("--profile", metavar="OUT", help="cProfile this code's router to OUT")
    parser.add_argument("--keep", action="store_true", help="keep the layouts' directories")
    args = parser.parse_args(argv)
    sources: list[tuple[str, str | None]] = [("this code", None)]
    if args.baseline:
        sources.append(("baseline", os.path.abspath(args.baseline)))
    results: dict[str, list[Phases]] = {name: [] for name, _ in sources}
    for round_ in range(args.repeat):
        for name, source in sources if round_ % 2 == 0 else list(reversed(sources)):
            profile = args.profile if source is None and round_ == 0 else None
            results[name].append(measure(source, args, profile))
            print(f"{name} #{round_ + 1} done", flush=True)
    return 0 if report(results) else 1


if __name__ == "__main__":
    sys.exit(main())
