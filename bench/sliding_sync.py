"""Time to the first room list: sliding sync against /sync, in one run:
``python -m bench.sliding_sync``.

One main process inside this Python process (``bench/in_process.py``), on a
throwaway database: Bob is joined to ``--rooms`` rooms, each holding a few
messages. Alternating, ``--rounds`` times: the first response of a new
sliding sync connection as Element X asks for it (one list, range
``[0, 19]``, ``timeline_limit`` 1, a few state types, spaces filtered out;
``SlidingSyncHandler.sync``) and an initial /sync with the default filter
(``SyncHandler.sync``): no HTTP, no waiting. The first round finds the
process's caches cold, the others warm. Then the incremental sliding sync
response after one new message. Prints the cold figures, the warm medians,
and the ratios of sliding sync's first response to the initial /sync's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from twisted.internet import defer, task

ALICE, BOB = "@alice:test.local", "@bob:test.local"

#: What Element X asks for in its room list's first request.
ROOM_LIST_BODY: dict[str, Any] = {
    "conn_id": "room-list",
    "lists": {
        "all_rooms": {
            "ranges": [[0, 19]],
            "timeline_limit": 1,
            "required_state": [
                ["m.room.name", ""],
                ["m.room.avatar", ""],
                ["m.room.encryption", ""],
                ["m.room.member", "$LAZY"],
                ["m.room.member", "$ME"],
                ["m.room.canonical_alias", ""],
                ["m.room.power_levels", ""],
            ],
            "filters": {"not_room_types": ["m.space"]},
        }
    },
}


async def _measure(hs: Any, args: argparse.Namespace) -> dict[str, float]:
    from synapse_lite.events import EventSpec
    from synapse_lite.handlers.auth import Requester
    from synapse_lite.handlers.filtering import SyncFilter
    from synapse_lite.handlers.sliding_sync.body import parse_body

    events, clock = hs.handlers.events, hs.handlers.clock
    sync, sliding = hs.handlers.sync, hs.handlers.sliding_sync
    alice, bob = Requester(ALICE, "DEV", "x"), Requester(BOB, "DEV", "y")

    def message(body: str) -> Any:
        content = {"msgtype": "m.text", "body": body}
        return EventSpec("m.room.message", None, ALICE, content, clock.time_msec())

    rooms = []
    for i in range(args.rooms):
        room_id = await hs.handlers.room_creation.create_room(
            alice, {"preset": "public_chat", "name": f"room {i}"}
        )
        join = EventSpec("m.room.member", BOB, BOB, {"membership": "join"}, clock.time_msec())
        await events.persist_as_writer(room_id, [join])
        await events.persist_as_writer(room_id, [message(f"m{j}") for j in range(args.messages)])
        rooms.append(room_id)

    async def first_list() -> tuple[float, dict[str, Any]]:
        started = time.perf_counter()
        response = await sliding.sync(bob, parse_body(dict(ROOM_LIST_BODY, set_presence="offline")))
        return time.perf_counter() - started, response

    async def initial_sync() -> float:
        started = time.perf_counter()
        await sync.sync(bob, None, 0, False, SyncFilter(), "offline")
        return time.perf_counter() - started

    sliding_first, sync_initial = [], []
    for _ in range(args.rounds):
        sliding_first.append((await first_list())[0])
        sync_initial.append(await initial_sync())
    _, response = await first_list()
    pos = response["pos"]
    incremental = []
    for i in range(args.rounds * 5):
        await events.persist_as_writer(rooms[i % len(rooms)], [message(f"r{i}")])
        started = time.perf_counter()
        body = parse_body(dict(ROOM_LIST_BODY, set_presence="offline"), pos=pos)
        pos = (await sliding.sync(bob, body))["pos"]
        incremental.append(time.perf_counter() - started)
    return {
        # The first round finds the process's caches cold (as after a
        # restart); the others warm (the same user logging in again).
        "sliding_first_cold_ms": sliding_first[0] * 1e3,
        "sync_initial_cold_ms": sync_initial[0] * 1e3,
        "sliding_first_ms": statistics.median(sliding_first[1:]) * 1e3,
        "sync_initial_ms": statistics.median(sync_initial[1:]) * 1e3,
        "sliding_incremental_ms": statistics.median(incremental) * 1e3,
    }


async def _run(reactor: Any, args: argparse.Namespace) -> None:
    from bench.in_process import with_main_process

    figures: dict[str, float] = {}

    async def measure(hs: Any) -> None:
        figures.update(await _measure(hs, args))

    await with_main_process(reactor, args.engine, measure)
    if args.json:
        print(json.dumps(figures))
        return
    print(
        f"{args.engine}, {args.rooms} rooms of {args.messages} messages, {args.rounds} rounds"
        " (medians):"
    )
    print("                                              cold caches   warm (median)")
    for label, key in (
        ("first sliding sync response (range [0, 19])", "sliding_first"),
        ("initial /sync (every room)                 ", "sync_initial"),
    ):
        print(f"  {label} {figures[key + '_cold_ms']:8.1f} ms  {figures[key + '_ms']:8.1f} ms")
    cold = figures["sliding_first_cold_ms"] / figures["sync_initial_cold_ms"]
    warm = figures["sliding_first_ms"] / figures["sync_initial_ms"]
    print(f"  ratio sliding sync / initial /sync          {cold:8.3f}     {warm:8.3f}")
    print(
        f"  incremental sliding sync, one new message   {figures['sliding_incremental_ms']:8.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--rooms", type=int, default=500)
    parser.add_argument("--messages", type=int, default=3, help="per room")
    parser.add_argument("--rounds", type=int, default=5, help="at least 2: one cold, then warm")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the first is the cold one)")
    task.react(lambda reactor: defer.ensureDeferred(_run(reactor, args)))


if __name__ == "__main__":
    main()
