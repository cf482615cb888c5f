"""Inbound PDUs with real federation reader processes (issue 32):
``python -m bench.inbound_readers``.

    python -m bench.inbound_readers [--engine sqlite|postgres] [--readers 1,2,4]
                                    [--rooms 8] [--pdus 300] [--txn 50]

``bench/inbound_queue.py`` runs b.test's processes inside one Python
process; here each is an OS process of a real layout (``bench/cluster.py``):
the main process, the rooms' one events writer, and 1, 2 or 4
``reader<i>`` workers serving ``federation`` and ``keys`` (any worker
serving ``federation`` is a federation reader, docs/workers.md). One remote
server ``r0.test`` (``bench.federation_burst.Receiver``: its key document,
and a ``/send`` that accepts what the writer sends it) joins its user to
``--rooms`` rooms through ``make_join``/``send_join`` on ``reader1``; then
each room's chain of ``--pdus`` messages of that user, pre-signed, is sent
as transactions of ``--txn`` (one transaction at a time per room, as one
origin sends to one destination), room i to reader i mod N, all rooms at
once. Each reader checks the PDUs (format, hashes, signatures, the
origin's right to send) and queues them durably before answering; the
writer persists each room's queue.

Measured per layout: the writer's PDUs persisted per second (from the
first transaction until the queue table is empty), how fast the readers
answered (PDUs per second until the last 200), and CPU per PDU (user +
system, /proc) of the readers together, of the busiest reader, and of the
writer. The ceiling each layout projects is in docs/scaling.md.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.parse
from typing import Any, cast

import yaml
from twisted.internet import defer, reactor, task

from bench.cluster import LAYOUTS, WRITERS, Cluster, process_cpu_seconds
from bench.federation_burst import (
    CLIENT_POOL,
    ORIGIN,
    Receiver,
    Receivers,
    client_request,
    register_user,
    run_reactor,
    signed_request,
)
from synapse_lite.api.room_versions import KNOWN_ROOM_VERSIONS
from synapse_lite.event_graph.hashing import event_id_of, sign_event

_reactor = cast(Any, reactor)
VERSION = KNOWN_ROOM_VERSIONS["10"]


def _layout(readers: int) -> str:
    name = f"fedread{readers}"
    LAYOUTS[name] = {f"reader{i + 1}": ["federation", "keys", "health"] for i in range(readers)}
    WRITERS[name] = {}
    return name


def queue_length(cluster: Cluster) -> int:
    """Rows in the durable inbound queue (read from the database)."""
    database = cluster.database
    if database["engine"] == "sqlite":
        import sqlite3

        conn: Any = sqlite3.connect(database["args"]["path"], timeout=30)
    else:
        import psycopg2

        conn = psycopg2.connect(**database["args"])
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT COUNT(*) FROM inbound_pdu_queue")
        return int(cursor.fetchone()[0])
    finally:
        conn.close()


async def join_room(reader_url: str, origin: Receiver, room_id: str) -> dict[str, Any]:
    """``@u:<origin>`` joined through ``reader_url``; what the user's first
    message needs: its auth events (the room's create and power levels,
    the join), prev events (the join) and depth."""
    user = f"@u:{origin.name}"
    quoted = urllib.parse.quote(room_id)
    path = f"/_matrix/federation/v1/make_join/{quoted}/{urllib.parse.quote(user)}?ver=10"
    template = (await signed_request(origin, reader_url, "GET", path))["event"]
    template["origin_server_ts"] = int(time.time() * 1000)
    template["origin"] = origin.name
    join = sign_event(VERSION, template, origin.name, origin.key)
    join_id = event_id_of(VERSION, join)
    path = f"/_matrix/federation/v2/send_join/{quoted}/{urllib.parse.quote(join_id)}"
    answer = await signed_request(origin, reader_url, "PUT", path, join)
    auth = [join_id]
    for event in answer["state"]:
        if event["type"] in ("m.room.create", "m.room.power_levels"):
            auth.append(event_id_of(VERSION, event))
    return {"auth_events": sorted(auth), "prev_events": [join_id], "depth": join["depth"] + 1}


def chain(origin: Receiver, room_id: str, start: dict[str, Any], count: int) -> list[Any]:
    """``count`` messages of ``@u:<origin>``, each the child of the one before."""
    events = []
    prev = start["prev_events"]
    for i in range(count):
        event = {
            "room_id": room_id,
            "type": "m.room.message",
            "sender": f"@u:{origin.name}",
            "origin": origin.name,
            "origin_server_ts": 1_700_000_000_000 + i,
            "content": {"msgtype": "m.text", "body": f"m{i}"},
            "depth": start["depth"] + i,
            "auth_events": start["auth_events"],
            "prev_events": prev,
        }
        signed = sign_event(VERSION, event, origin.name, origin.key)
        events.append(signed)
        prev = [event_id_of(VERSION, signed)]
    return events


async def run_layout(
    readers: int, origin: Receivers, rooms: int, pdus: int, txn: int, engine: str
) -> dict[str, float]:
    """The figures of one layout with ``readers`` federation readers."""
    origin.reset()
    sender = next(iter(origin.servers.values()))
    cluster = Cluster(_layout(readers), engine)
    with open(cluster.config_path) as f:
        config = yaml.safe_load(f)
    config["federation"] = {"destinations": dict(origin.urls)}
    with open(cluster.config_path, "w") as f:
        yaml.safe_dump(config, f)
    cluster.start()
    try:
        names = [f"reader{i + 1}" for i in range(readers)]
        base = cluster.url("main")
        token = await register_user(base, "alice")
        chains = []
        for _ in range(rooms):
            room = await _client_create(base, token)
            start = await join_room(cluster.url("reader1"), sender, room)
            chains.append(chain(sender, room, start, pdus))
        while queue_length(cluster) > 0:
            await task.deferLater(_reactor, 0.1, lambda: None)
        await task.deferLater(_reactor, 1.0, lambda: None)
        pids = {n: cluster.processes[n].pid for n in ["main", *names]}
        before = {n: process_cpu_seconds(p) for n, p in pids.items()}
        errors: list[Any] = []
        started = time.monotonic()

        async def stream(index: int, events: list[Any]) -> None:
            url = cluster.url(names[index % readers])
            for at in range(0, len(events), txn):
                path = f"/_matrix/federation/v1/send/{readers}-{index}-{at}"
                body = {
                    "origin": sender.name,
                    "origin_server_ts": int(time.time() * 1000),
                    "pdus": events[at : at + txn],
                    "edus": [],
                }
                answer = await signed_request(sender, url, "PUT", path, body, ORIGIN)
                errors.extend(r for r in answer["pdus"].values() if r)

        await defer.gatherResults(
            [defer.ensureDeferred(stream(i, c)) for i, c in enumerate(chains)],
            consumeErrors=True,
        )
        answered = time.monotonic() - started
        reader_cpu = {n: process_cpu_seconds(pids[n]) - before[n] for n in names}
        while queue_length(cluster) > 0:
            if time.monotonic() - started > 600:
                raise RuntimeError("the writer did not empty the queue in 600 s")
            await task.deferLater(_reactor, 0.02, lambda: None)
        persisted = time.monotonic() - started
        writer_cpu = process_cpu_seconds(pids["main"]) - before["main"]
        if errors:
            raise RuntimeError(f"PDUs refused: {errors[:3]}")
        total = rooms * pdus
        return {
            "persisted_per_s": total / persisted,
            "answered_per_s": total / answered,
            "persisted_s": persisted,
            "readers_cpu_us_per_pdu": sum(reader_cpu.values()) / total * 1e6,
            "busiest_reader_cpu_s": max(reader_cpu.values()),
            "writer_cpu_us_per_pdu": writer_cpu / total * 1e6,
        }
    finally:
        cluster.stop()


async def _client_create(base: str, token: str) -> str:
    room = await client_request(
        "POST",
        base + "/_matrix/client/v3/createRoom",
        token,
        {"preset": "public_chat", "room_version": "10"},
    )
    return str(room["room_id"])


async def main_async(args: argparse.Namespace) -> dict[int, dict[str, float]]:
    origin = Receivers(1)
    results: dict[int, dict[str, float]] = {}
    try:
        for readers in args.readers:
            results[readers] = await run_layout(
                readers, origin, args.rooms, args.pdus, args.txn, args.engine
            )
            print(f"{readers} reader(s): {json.dumps(results[readers])}", flush=True)
    finally:
        for port in origin.ports:
            await port.stopListening()
        await CLIENT_POOL.closeCachedConnections()
    print()
    print(
        f"Inbound: {args.rooms} rooms x {args.pdus} PDUs in transactions of {args.txn},"
        f" one events writer ({args.engine}); readers and writer are separate processes"
    )
    print(
        f"{'readers':>7} {'writer PDUs/s':>13} {'answered PDUs/s':>15}"
        f" {'readers CPU us/PDU':>18} {'writer CPU us/PDU':>17}"
        f" {'reader ceiling PDUs/s':>21} {'writer ceiling PDUs/s':>21}"
    )
    for readers, r in results.items():
        # One core each: N readers check N / c_r PDUs/s; one writer 1 / c_w.
        print(
            f"{readers:>7} {r['persisted_per_s']:>13.1f} {r['answered_per_s']:>15.1f}"
            f" {r['readers_cpu_us_per_pdu']:>18.0f} {r['writer_cpu_us_per_pdu']:>17.0f}"
            f" {readers * 1e6 / r['readers_cpu_us_per_pdu']:>21.0f}"
            f" {1e6 / r['writer_cpu_us_per_pdu']:>21.0f}"
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument(
        "--readers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4]
    )
    parser.add_argument("--rooms", type=int, default=8)
    parser.add_argument("--pdus", type=int, default=300)
    parser.add_argument("--txn", type=int, default=50)
    args = parser.parse_args(argv)
    return run_reactor(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
