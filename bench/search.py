"""Server-side search's cost: ``python -m bench.search``.

    python -m bench.search [--engine sqlite|postgres] [--events 10000]
                           [--searches 50] [--rounds 10]

Runs one main process in this Python process, on a throwaway database made
the way the tests make theirs, with one user in a room of ``--events``
messages. Each message is ``message <n> about <word>``, ``<word>`` one of 100,
so a search for one of them matches 1 % of the room and ``message`` all of
it. Prints, with a baseline measured in the same run:

* search latency (p50 and p99 over ``--searches`` searches, through the
  search handler, a page of 10) for the rare word by rank and by recent, the
  common word by rank, against reading one page of 10 with ``/messages``
  (the pagination handler) in the same room;
* the cost of indexing on the write path: messages persisted per second by
  the events writer with the index written and with it skipped, in
  alternating rounds (the ratio says what the index costs a send).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from twisted.internet import defer, task

from bench.in_process import with_main_process
from bench.scenarios import percentile
from synapse_lite.events import EventSpec
from synapse_lite.handlers.auth import Requester
from synapse_lite.storage.databases.main import events as events_store

WORDS = [f"word{i:02d}" for i in range(100)]
USER = "@searcher:test.local"


async def _run(reactor: Any, args: argparse.Namespace) -> None:
    async def measure(hs: Any) -> None:
        await _measure(hs, args)

    await with_main_process(reactor, args.engine, measure)


async def _persist(hs: Any, room_id: str, first: int, count: int) -> None:
    clock = hs.handlers.clock
    for start in range(first, first + count, 100):
        specs = [
            EventSpec(
                "m.room.message",
                None,
                USER,
                {"msgtype": "m.text", "body": f"message {n} about {WORDS[n % len(WORDS)]}"},
                clock.time_msec(),
            )
            for n in range(start, min(start + 100, first + count))
        ]
        await hs.handlers.events.persist_as_writer(room_id, specs)


async def _timed(call: Any, times: int) -> tuple[float, float]:
    """p50 and p99 of ``times`` calls, in ms."""
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return percentile(samples, 0.5), percentile(samples, 0.99)


async def _measure(hs: Any, args: argparse.Namespace) -> None:
    requester = Requester(USER, "DEV", "x")
    room_id = await hs.handlers.room_creation.create_room(requester, {"preset": "public_chat"})
    started = time.perf_counter()
    await _persist(hs, room_id, 0, args.events)
    print(
        f"{args.events} messages in one room ({args.engine}),"
        f" persisted in {time.perf_counter() - started:.1f} s"
    )
    search = hs.handlers.search

    def searching(term: str, order_by: str) -> Any:
        body = {"search_categories": {"room_events": {"search_term": term, "order_by": order_by}}}

        async def call() -> None:
            answer = await search.search(requester, body, None)
            assert answer["search_categories"]["room_events"]["results"], term

        return call

    async def one_page() -> None:
        await hs.handlers.pagination.get_messages(requester, room_id, None, None, "b", 10)

    rows = [
        ("/messages, a page of 10 (baseline)", one_page),
        ("search, 1 % of the room, by rank", searching(WORDS[7], "rank")),
        ("search, 1 % of the room, by recent", searching(WORDS[7], "recent")),
        ("search, all of the room, by rank", searching("message", "rank")),
        ("search, all of the room, by recent", searching("message", "recent")),
    ]
    baseline = None
    for label, call in rows:
        await call()  # warm caches
        p50, p99 = await _timed(call, args.searches)
        baseline = baseline or p50
        print(f"  {label:<38} p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  ({p50 / baseline:5.1f}x)")

    # The write path with and without the index, alternating rounds.
    real_index = events_store.index_events_txn
    rates: dict[bool, list[float]] = {True: [], False: []}
    next_n = args.events
    per_round = 200
    try:
        for round_number in range(args.rounds):
            for indexed in (True, False) if round_number % 2 == 0 else (False, True):
                events_store.index_events_txn = real_index if indexed else _no_index
                started = time.perf_counter()
                await _persist(hs, room_id, next_n, per_round)
                rates[indexed].append(per_round / (time.perf_counter() - started))
                next_n += per_round
    finally:
        events_store.index_events_txn = real_index
    on = sum(rates[True]) / len(rates[True])
    off = sum(rates[False]) / len(rates[False])
    print(
        f"  persist, batches of 100: indexed {on:,.0f}/s, not indexed {off:,.0f}/s,"
        f" ratio {on / off:.2f}"
    )


def _no_index(txn: Any, events: Any) -> None:
    return None


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.search")
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--searches", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    def run(reactor: Any) -> defer.Deferred[None]:
        return defer.ensureDeferred(_run(reactor, args))

    task.react(run)


if __name__ == "__main__":
    main()
