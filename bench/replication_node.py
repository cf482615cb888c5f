"""One process of the replication benchmark (started by bench/replication.py).

A *receiver* is an ordinary process of the homeserver that also records, for
every events row it receives, when it arrived. A *writer* (an events writer)
persists events and records when each one committed. Both write their records
as JSON lines to ``--out`` when they finish.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from twisted.internet import defer, reactor, task

from synapse_lite.app.composition import build_homeserver
from synapse_lite.app.logs import setup_logging
from synapse_lite.config.homeserver import load_config
from synapse_lite.events import EventContent, random_event_id
from synapse_lite.replication.tcp.commands import RdataCommand
from synapse_lite.server import HomeServer
from synapse_lite.streams.catalog import EventsStreamEventRow


def event(room_id: str, index: int) -> EventContent:
    return EventContent(
        event_id=random_event_id("bench.local"),
        room_id=room_id,
        type="m.room.message",
        state_key=None,
        sender="@bench:bench.local",
        content={"body": f"message {index}"},
        origin_server_ts=int(time.time() * 1000),
    )


def trace_streamer(hs: HomeServer) -> list[dict[str, Any]]:
    """Time, on the writer, the streamer reading new events rows back
    (``new_local_rows``) and the RDATA leaving after it: where the writer's share
    of the latency goes. Returns the list the timings are appended to."""
    stream = hs.replication.streams["events"]
    handler = hs.replication
    read_back = stream.new_local_rows
    send_command = handler.send_command
    timings: list[dict[str, Any]] = []
    #: When the last read that found rows started, until its first RDATA goes.
    read_started: list[float] = []

    async def timed_get_updates() -> Any:
        start = time.perf_counter()
        result = await read_back()
        timings.append({"phase": "read_back", "ms": (time.perf_counter() - start) * 1000})
        if result[0]:
            read_started[:] = [start]
        return result

    def timed_send_command(cmd: Any) -> None:
        send_command(cmd)
        if read_started and isinstance(cmd, RdataCommand) and cmd.stream_name == "events":
            ms = (time.perf_counter() - read_started.pop()) * 1000
            timings.append({"phase": "read_to_sent", "ms": ms})

    stream.new_local_rows = timed_get_updates  # type: ignore[method-assign]
    handler.send_command = timed_send_command  # type: ignore[method-assign]
    return timings


async def run_writer(hs: HomeServer, args: argparse.Namespace) -> list[dict[str, Any]]:
    store = hs.store
    records: list[dict[str, Any]] = []
    await task.deferLater(reactor, 1.0, lambda: None)  # let receivers see our POSITION
    # Latency: one event at a time, spaced out, with the streamer timed.
    timings = trace_streamer(hs)
    for i in range(args.latency_events):
        [persisted] = await store.persist_events([event("!latency:bench.local", i)])
        records.append({"phase": "latency", "id": persisted.event_id, "t": time.time()})
        await task.deferLater(reactor, args.latency_interval, lambda: None)
    # The throughput phase's timings are not reported: only these.
    records.extend(timings)
    timings.clear()
    # Throughput: batches as fast as they commit.
    written = 0
    while written < args.throughput_events:
        batch = [event("!throughput:bench.local", written + i) for i in range(args.batch)]
        persisted_batch = await store.persist_events(batch)
        now = time.time()
        records.extend({"phase": "throughput", "id": e.event_id, "t": now} for e in persisted_batch)
        written += len(persisted_batch)
    # Stay until every row has gone out, or the receivers would miss the tail.
    stream = hs.replication.streams["events"]
    while stream.last_sent_position < stream.positions.writer_position(hs.instance_name):
        await task.deferLater(reactor, 0.01, lambda: None)
    await task.deferLater(reactor, 0.5, lambda: None)
    return records


async def run_receiver(hs: HomeServer, args: argparse.Namespace) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    expected = args.latency_events + args.throughput_events

    def on_rows(instance: str, token: int, rows: Sequence[Any]) -> None:
        now = time.time()
        for row in rows:
            if isinstance(row, EventsStreamEventRow):
                records.append({"id": row.event_id, "t": now})

    hs.replication.receiver.add_row_hook("events", on_rows)
    deadline = time.monotonic() + args.timeout
    while len(records) < expected and time.monotonic() < deadline:
        await task.deferLater(reactor, 0.05, lambda: None)
    return records


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--role", choices=("writer", "receiver"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--latency-events", type=int, default=500)
    parser.add_argument("--latency-interval", type=float, default=0.01)
    parser.add_argument("--throughput-events", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()

    config = load_config(args.config)
    setup_logging(args.name, "WARNING")
    hs = build_homeserver(config, args.name, reactor)
    hs.service.startService()
    reactor.addSystemEventTrigger("before", "shutdown", hs.service.stopService)

    async def run() -> None:
        runner = run_writer if args.role == "writer" else run_receiver
        records = await runner(hs, args)
        with open(args.out, "w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
        reactor.stop()

    def failed(f: Any) -> None:
        print(f.getTraceback(), file=sys.stderr)
        reactor.stop()

    reactor.callWhenRunning(lambda: defer.ensureDeferred(run()).addErrback(failed))
    profile_path = os.environ.get("SYNAPSE_LITE_BENCH_PROFILE")
    if profile_path:
        import cProfile

        cProfile.runctx("reactor.run()", globals(), locals(), f"{profile_path}.{args.name}")
    else:
        reactor.run()


if __name__ == "__main__":
    main()
