"""Application services' delivery: ``python -m bench.appservice``.

For each setting (1 or 10 services; 1 or 2 ``appservice_instances``: the
main process alone, or the main process and a worker ``as1`` each sending
to the services they own), on a fresh database, with fake services (aiohttp
servers in this process answering every transaction at once), each
service's bot joined to one room a user sends to:

* latency: the user sends ``--latency-events`` messages one at a time; for
  each, the time from the start of its ``PUT /send`` to its arrival at the
  service (the first service's transaction), p50 and p99;
* throughput: ``--events`` messages sent by ``--senders`` concurrent
  clients; events per second delivered to every service (the last
  service's last arrival ends the clock).

The baseline, measured in the same run on the same processes: the plain
``PUT /send`` round trip (p50, p99) and the rate of sends acknowledged
with the same concurrency.

With ``--reference PYTHON`` (the Python of a virtualenv where the reference
homeserver is installed: ``python3 -m venv /tmp/ref && /tmp/ref/bin/pip
install 'matrix-synapse[postgres,redis]'``), the reference's main process
(where it sends to every application service) is measured too, right
after our 1-service settings, with the same kind of service, the same room
and the same load, on the same engine, and the ratios printed: its
delivery latency p50 over ours and our delivered rate over its.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import time
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from bench.cluster import LAYOUTS, WRITERS, Cluster
from bench.reference_homeserver import ReferenceHomeserver
from bench.scenarios import Client, User, percentile

LAYOUTS.setdefault("appservice_pair", {"as1": ["health"]})
WRITERS.setdefault("appservice_pair", {})


class FakeService:
    """Records when each message body arrives."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.arrivals: dict[str, float] = {}
        self.port = _free_port()
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_put("/_matrix/app/v1/transactions/{txn}", self._transaction)
        app.router.add_route("*", "/{tail:.*}", self._other)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _transaction(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        body = await request.json()
        for event in body.get("events", []):
            text = event.get("content", {}).get("body")
            if isinstance(text, str):
                self.arrivals.setdefault(text, now)
        return web.json_response({})

    async def _other(self, request: web.Request) -> web.Response:
        return web.json_response({"errcode": "M_UNRECOGNIZED"}, status=404)

    def registration(self) -> dict[str, Any]:
        i = self.index
        return {
            "id": f"bridge{i}",
            "url": f"http://127.0.0.1:{self.port}",
            "as_token": f"bench-as-{i}",
            "hs_token": f"bench-hs-{i}",
            "sender_localpart": f"bridgebot{i}",
            "namespaces": {"users": [{"exclusive": True, "regex": f"@_bridge{i}_.*"}]},
            "rate_limited": False,
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _wait_for(services: list[FakeService], bodies: list[str], timeout: float) -> float:
    """When the last of ``bodies`` reached the last service (monotonic)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(b in s.arrivals for s in services for b in bodies):
            return max(s.arrivals[b] for s in services for b in bodies)
        await asyncio.sleep(0.002)
    missing = sum(1 for s in services for b in bodies if b not in s.arrivals)
    raise RuntimeError(f"{missing} deliveries missing after {timeout} s")


def _write_registrations(services: list[FakeService], directory: str) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    paths = []
    for service in services:
        path = os.path.join(directory, f"bridge{service.index}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(service.registration(), f)
        paths.append(path)
    return paths


async def run_reference(services: list[FakeService], args: argparse.Namespace) -> dict[str, float]:
    directory = os.path.join("/tmp", f"bench_appservice_{os.getpid()}_reference")
    registrations = _write_registrations(services, directory)
    reference = ReferenceHomeserver(
        args.reference, args.engine, {"app_service_config_files": registrations}
    )
    try:
        reference.start()
        return await _measure(reference.url(), ReferenceHomeserver.SERVER_NAME, services, args)
    finally:
        reference.stop()


async def run_setting(
    services: list[FakeService], instances: int, args: argparse.Namespace
) -> dict[str, float]:
    directory = os.path.join("/tmp", f"bench_appservice_{os.getpid()}_{len(services)}_{instances}")
    paths = _write_registrations(services, directory)
    extra: dict[str, Any] = {"app_service_config_files": paths}
    layout = "single"
    if instances == 2:
        layout = "appservice_pair"
        extra["appservice_instances"] = ["main", "as1"]
    cluster = Cluster(layout, args.engine, extra)
    try:
        cluster.start()
        return await _measure(cluster.url("main"), "bench.local", services, args)
    finally:
        cluster.stop()


async def _measure(
    base: str, server_name: str, services: list[FakeService], args: argparse.Namespace
) -> dict[str, float]:
    """The measurements on the homeserver at ``base`` (whose users are
    ``@...:server_name``) with ``services`` registered."""
    async with aiohttp.ClientSession() as session:
        client = Client(session)
        alice = await client.register(base, "alice")
        room = await client.call("POST", base, "/createRoom", alice, {"preset": "public_chat"})
        room_id = room["room_id"]
        for service in services:
            bot = User(f"@bridgebot{service.index}:{server_name}", f"bench-as-{service.index}")
            await client.call("POST", base, f"/join/{room_id}", bot, {})
        # Warm-up: every service has its first transaction behind it.
        await client.send(base, alice, room_id, "warm-up")
        await _wait_for(services, ["warm-up"], 30)

        latencies, round_trips = [], []
        for i in range(args.latency_events):
            body = f"lat-{i}"
            start = time.monotonic()
            await client.send(base, alice, room_id, body)
            round_trips.append(time.monotonic() - start)
            arrived = await _wait_for(services[:1], [body], 30)
            latencies.append(arrived - start)
        await _wait_for(services, [f"lat-{i}" for i in range(args.latency_events)], 60)

        bodies = [f"thr-{i}" for i in range(args.events)]
        queue = list(reversed(bodies))
        acked: list[float] = []

        async def sender() -> None:
            while queue:
                await client.send(base, alice, room_id, queue.pop())
            acked.append(time.monotonic())

        start = time.monotonic()
        await asyncio.gather(*(sender() for _ in range(args.senders)))
        all_acked = max(acked)
        delivered = await _wait_for(services, bodies, 300)
    return {
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "send_p50_ms": percentile(round_trips, 0.5) * 1000,
        "send_p99_ms": percentile(round_trips, 0.99) * 1000,
        "delivered_per_s": args.events / (delivered - start),
        "acked_per_s": args.events / (all_acked - start),
    }


async def run_all(
    args: argparse.Namespace,
) -> tuple[list[tuple[int, int, dict[str, float]]], dict[str, float] | None]:
    """Our settings' figures, and the reference's for 1 service (or None
    without ``--reference``), measured right after our 1-service settings."""
    results = []
    reference = None
    for count in [int(c) for c in args.services.split(",")]:
        for instances in [int(n) for n in args.instances.split(",")]:
            print(f"{count} services, {instances} instances...", file=sys.stderr, flush=True)
            results.append(
                (count, instances, await _with_services(count, run_setting, instances, args))
            )
        if count == 1 and args.reference:
            print("the reference, 1 service...", file=sys.stderr, flush=True)
            reference = await _with_services(1, lambda s, _, a: run_reference(s, a), 0, args)
    return results, reference


async def _with_services(count: int, run: Any, *arguments: Any) -> dict[str, float]:
    """``run(services, *arguments)`` with ``count`` fresh services listening."""
    services = [FakeService(i) for i in range(count)]
    for service in services:
        await service.start()
    try:
        return dict(await run(services, *arguments))
    finally:
        for service in services:
            await service.stop()


def _row(services: str, instances: int, r: dict[str, float]) -> str:
    return (
        f"{services:>8} {instances:9} | {r['p50_ms']:8.1f} / {r['p99_ms']:<8.1f}"
        f" | {r['send_p50_ms']:6.1f} / {r['send_p99_ms']:<6.1f}"
        f" | {r['p50_ms'] / r['send_p50_ms']:9.2f}"
        f" | {r['delivered_per_s']:14.0f} | {r['acked_per_s']:16.0f}"
        f" | {r['delivered_per_s'] / r['acked_per_s']:.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.appservice", description=__doc__)
    parser.add_argument("--engine", choices=("postgres", "sqlite"), default="sqlite")
    parser.add_argument("--services", default="1,10")
    parser.add_argument("--instances", default="1,2")
    parser.add_argument("--latency-events", type=int, default=100)
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--senders", type=int, default=8)
    parser.add_argument(
        "--reference",
        metavar="PYTHON",
        help="also measure the reference homeserver installed for this Python (1 service)",
    )
    args = parser.parse_args(argv)
    results, reference = asyncio.run(run_all(args))
    print(
        f"engine {args.engine}; {args.latency_events} events one at a time, then"
        f" {args.events} by {args.senders} senders"
    )
    print(
        "services instances | to service p50/p99 ms | /send p50/p99 ms | ratio p50"
        " | delivered ev/s | /send acked ev/s | ratio"
    )
    for count, instances, r in results:
        print(_row(str(count), instances, r))
    if reference is not None:
        r = reference
        print(_row("ref", 1, r))
        for count, instances, ours in results:
            if count != 1:
                continue
            print(
                f"1 service, {instances} instance(s) against the reference:"
                f" latency p50 {r['p50_ms'] / ours['p50_ms']:.2f}x lower,"
                f" p99 {r['p99_ms'] / ours['p99_ms']:.2f}x lower,"
                f" delivered ev/s {ours['delivered_per_s'] / r['delivered_per_s']:.2f}x,"
                f" /send p50 {r['send_p50_ms'] / ours['send_p50_ms']:.2f}x lower"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
