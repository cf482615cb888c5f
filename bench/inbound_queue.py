"""Inbound PDUs through the durable queue (issue 32), in one run:
``python -m bench.inbound_queue``.

    python -m bench.inbound_queue [--engine postgres] [--pdus 200] [--rooms 4]
                                  [--members 10000] [--side 1000] [--fork-pdus 4]

``b.test`` as tests/federation/test_inbound_queue.py makes it: its main
process is the rooms' one events writer, ``fed1`` and ``fed2`` receive
federation, carol of ``a.test`` is joined to every room. All of these
processes run inside this one Python process (one core for the readers'
checks and the writer together: the figures are the writer's intake
through the queue, not a multi-core projection).

1. Throughput: ``--pdus`` pre-signed messages in each of ``--rooms`` rooms,
   each room's chain sent as transactions of 10 by one stream (an origin
   sends one transaction at a time to a destination), every room through
   ``fed1`` (1 reader) or the rooms split over ``fed1`` and ``fed2`` (2
   readers); PDUs persisted per second by the writer, and 2 readers / 1.
2. Stall: the wait of other rooms' PDUs (queued, then the writer woken:
   time until each is persisted), p50 and max, when one room's PDUs each
   need an expensive state resolution and when they do not; with fork /
   without, for the writer as it is (rooms concurrently) and with one PDU
   at a time (``rooms_at_once=1``). The expensive room's cost is the real
   resolution of ``bench.state_resolution``'s fork (``--members`` joined
   users, two branches of ``--side`` state events, version 10), from its
   own database in a database thread as the persist path runs it
   (``resolve_states_txn``, the stored auth chain index), once per PDU
   before the PDU is persisted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import treq
from twisted.internet import defer, task, threads
from twisted.python.threadpool import ThreadPool

from bench.state_resolution import build
from bench.stored_auth_chains import fill
from synapse_lite.api.room_versions import SPEC_ROOM_VERSIONS, RoomVersion
from synapse_lite.event_graph.hashing import event_id_of, sign_event
from synapse_lite.federation.auth import sign_request
from synapse_lite.handlers.inbound_pdus import ROOMS_AT_ONCE
from synapse_lite.storage.database import make_startup_connection
from synapse_lite.storage.databases.main.state_groups import resolve_states_txn
from tests.federation.test_inbound_pdus import InboundPdusBase
from tests.federation.test_inbound_queue import queue_of
from tests.harness.databases import create_test_database
from tests.harness.processes import NO_KEEPALIVE

TXN_SIZE = 10


class _Servers(InboundPdusBase):
    """The tests' servers, driven outside trial."""

    b_workers = ("fed1", "fed2")

    def runTest(self) -> None:
        """Not a test: the benchmark drives the servers itself."""

    async def close(self) -> None:
        while self._cleanups:
            f, args, kwargs = self._cleanups.pop()
            await defer.maybeDeferred(f, *args, **kwargs)

    async def chain(self, room_id: str, version: RoomVersion, n: int) -> list[dict[str, Any]]:
        """``n`` messages of carol, each the child of the one before."""
        store = self.b["main"].store
        prev = sorted(await store.get_forward_extremities(room_id))
        first = await self.event(room_id, prev_events=prev)
        events = []
        for i in range(n):
            event = {k: v for k, v in first.items() if k not in ("signatures", "hashes")}
            event.update(
                prev_events=prev,
                depth=first["depth"] + i,
                content={"msgtype": "m.text", "body": f"m{i}"},
            )
            event = sign_event(version, event, "a.test", self.a_key)
            events.append(event)
            prev = [event_id_of(version, event)]
        return events

    async def send_to(self, instance: str, txn_id: str, pdus: list[Any]) -> dict[str, Any]:
        """``PUT /send`` to one of b.test's processes, as a.test."""
        path = f"/_matrix/federation/v1/send/{txn_id}"
        body = {"origin": "a.test", "origin_server_ts": 1, "pdus": pdus, "edus": []}
        header = sign_request(self.a_key, "a.test", "b.test", "PUT", path, body)
        url = self.b[instance].config.instance_map[instance].base_url + path
        headers: dict[bytes | str, bytes | str] = {
            "Authorization": header,
            "Content-Type": "application/json",
        }
        response = await treq.put(
            url,
            json.dumps(body).encode(),
            headers=headers,
            pool=NO_KEEPALIVE,
        )
        answer: dict[str, Any] = json.loads(await treq.content(response))
        assert response.code == 200, answer
        return answer


async def throughput(
    servers: _Servers, rooms: list[tuple[str, RoomVersion]], pdus: int, readers: int
) -> float:
    """PDUs persisted per second, the rooms' chains sent through
    ``readers`` receiving processes."""
    chains = [await servers.chain(room_id, version, pdus) for room_id, version in rooms]
    names = ["fed1", "fed2"][:readers]
    errors: list[Any] = []

    async def stream(index: int, chain: list[dict[str, Any]]) -> None:
        for start in range(0, len(chain), TXN_SIZE):
            answer = await servers.send_to(
                names[index % readers],
                f"r{readers}-{index}-{start}",
                chain[start : start + TXN_SIZE],
            )
            errors.extend(r for r in answer["pdus"].values() if r)

    store = servers.b["main"].store
    began = time.perf_counter()
    await defer.gatherResults(
        [defer.ensureDeferred(stream(i, c)) for i, c in enumerate(chains)], consumeErrors=True
    )
    while await store.get_inbound_queue_rooms():
        await task.deferLater(servers.b["main"].reactor, 0.01, lambda: None)
    took = time.perf_counter() - began
    assert not errors, errors[:3]
    return len(rooms) * pdus / took


class Fork:
    """The expensive resolution, run in a database thread of its own."""

    def __init__(self, engine: str, members: int, side: int) -> None:
        self.version = SPEC_ROOM_VERSIONS["10"]
        events, self.sides = build(self.version, members, side, seed=members)
        self.db = create_test_database(engine, with_schema=True)
        conn = make_startup_connection(self.db.make_engine())
        try:
            fill(conn, events)
        finally:
            conn.close()
        self.pool = ThreadPool(1, 1, "fork")
        self.pool.start()
        self.conn: Any = None

    def _resolve(self) -> None:
        if self.conn is None:
            self.conn = make_startup_connection(self.db.make_engine())
        with self.conn.transaction("bench_fork") as txn:
            resolve_states_txn(txn, self.version, self.sides)

    async def resolve(self, reactor: Any) -> None:
        await threads.deferToThreadPool(reactor, self.pool, self._resolve)

    def close(self) -> None:
        if self.conn is not None:
            self.pool.callInThread(self.conn.close)
        self.pool.stop()
        self.db.drop()


async def stall(
    servers: _Servers,
    fork_room: tuple[str, RoomVersion],
    others: list[tuple[str, RoomVersion]],
    fork: Fork | None,
    fork_pdus: int,
    rooms_at_once: int,
) -> list[float]:
    """Seconds each PDU of ``others`` (20 per room) waited to be persisted,
    with ``fork_pdus`` PDUs of ``fork_room`` queued first (each resolving
    ``fork`` first when given)."""
    writer = servers.b["main"]
    queue = queue_of(writer)
    queue._slots = defer.DeferredSemaphore(rooms_at_once)
    events = writer.handlers.events
    persist = events.persist_received_event

    async def expensive(pdu: Any, **kwargs: Any) -> Any:
        if fork is not None and pdu["room_id"] == fork_room[0]:
            await fork.resolve(writer.reactor)
        return await persist(pdu, **kwargs)

    events.persist_received_event = expensive  # type: ignore[method-assign,assignment]
    settled: dict[str, float] = {}
    settle = queue._settle

    def timed_settle(event_id: str, outcome: dict[str, str]) -> None:
        settled[event_id] = time.perf_counter()
        settle(event_id, outcome)

    queue._settle = timed_settle  # type: ignore[method-assign]
    try:
        store = writer.store
        fork_chain = await servers.chain(*fork_room, fork_pdus)
        other_chains = [await servers.chain(r, v, 20) for r, v in others]
        for chain in [fork_chain, *other_chains]:
            await store.enqueue_inbound_pdus(
                (event_id_of(fork_room[1], e), e["room_id"], "a.test", e) for e in chain
            )
        began = time.perf_counter()
        await defer.gatherResults(
            [queue.wake(room_id) for room_id, _ in [fork_room, *others]], consumeErrors=True
        )
        waits = [
            settled[event_id_of(fork_room[1], e)] - began for chain in other_chains for e in chain
        ]
        assert len(waits) == 20 * len(others)
        return waits
    finally:
        del events.persist_received_event
        del queue._settle


async def run(reactor: Any, args: argparse.Namespace) -> None:
    os.environ["SYNAPSE_LITE_TEST_DB"] = args.engine
    print(f"engine {args.engine}; all of b.test's processes in this one Python process")
    fork = Fork(args.engine, args.members, args.side) if args.members else None
    servers = _Servers()
    servers.setUp()
    try:
        rooms = []
        for _ in range(2 * args.rooms + 4):
            _, room_id, version = await servers.joined_room()
            rooms.append((room_id, version))
        print(f"1. throughput: {args.rooms} rooms x {args.pdus} PDUs, transactions of {TXN_SIZE}")
        rates = {}
        for readers, chunk in ((1, rooms[: args.rooms]), (2, rooms[args.rooms : 2 * args.rooms])):
            rates[readers] = await throughput(servers, chunk, args.pdus, readers)
            print(f"   {readers} reader(s): {rates[readers]:8.1f} PDUs/s persisted by the writer")
        print(f"   2 readers / 1 reader: {rates[2] / rates[1]:.2f}")
        fork_room, others = rooms[2 * args.rooms], rooms[2 * args.rooms + 1 :]
        print(
            f"2. stall: {len(others)} rooms x 20 PDUs behind {args.fork_pdus} PDUs of a room"
            f" resolving a {args.members}-member fork ({args.side} state events per branch)"
            " each"
        )
        if fork is not None:
            began = time.perf_counter()
            await fork.resolve(reactor)
            print(f"   one resolution alone: {(time.perf_counter() - began) * 1000:.0f} ms")
        for rooms_at_once in (ROOMS_AT_ONCE, 1):
            result = {}
            for label, with_fork in (("without", None), ("with", fork)):
                waits = await stall(
                    servers, fork_room, others, with_fork, args.fork_pdus, rooms_at_once
                )
                result[label] = (statistics.median(waits), max(waits))
                print(
                    f"   rooms_at_once={rooms_at_once} {label:7s} fork: other rooms' PDUs"
                    f" wait p50 {result[label][0] * 1000:7.1f} ms, max"
                    f" {result[label][1] * 1000:7.1f} ms"
                )
            print(
                f"   rooms_at_once={rooms_at_once} with / without fork: p50"
                f" {result['with'][0] / result['without'][0]:.2f},"
                f" max {result['with'][1] / result['without'][1]:.2f}"
            )
    finally:
        await servers.close()
        if fork is not None:
            fork.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--pdus", type=int, default=200)
    parser.add_argument("--rooms", type=int, default=4)
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--side", type=int, default=1_000)
    parser.add_argument("--fork-pdus", type=int, default=4)
    args = parser.parse_args()
    task.react(lambda reactor: defer.ensureDeferred(run(reactor, args)))


if __name__ == "__main__":
    main()
