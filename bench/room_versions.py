"""What a room version costs a send: event ids made as reference hashes
(versions 3 on: two SHA-256 of the event's canonical JSON, the redacted form
built on the way) against random ids (versions 1 and 2, the baseline),
measured in one run, in alternating rounds.

    python -m bench.room_versions [--engine sqlite|postgres] [--messages 20]
                                  [--rounds 20] [--ids 20000]

Runs one main process in this Python process, on a throwaway database made
the way the tests make theirs, with a room of each version compared (1, 10
and 11). Sends go through the events writer's persist path (checked,
given an id, persisted), alternating between the rooms round by round so
the machine's load falls on all alike. Prints sends/s per version, each
against version 1, and the CPU one id costs (``to_persist`` alone, timed
over ``--ids`` calls).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from twisted.internet import defer, task

from bench.in_process import with_main_process
from synapse_lite.api.room_versions import KNOWN_ROOM_VERSIONS
from synapse_lite.events import EventSpec
from synapse_lite.handlers.auth import Requester

VERSIONS = ("1", "10", "11")
SENDER = "@member0:test.local"


async def _run(reactor: Any, args: argparse.Namespace) -> None:
    async def measure(hs: Any) -> None:
        await _measure(hs, args)

    await with_main_process(reactor, args.engine, measure)


def _message(clock: Any, label: str) -> EventSpec:
    content = {"msgtype": "m.text", "body": f"message {label} for the room"}
    return EventSpec("m.room.message", None, SENDER, content, clock.time_msec())


async def _measure(hs: Any, args: argparse.Namespace) -> None:
    events = hs.handlers.events
    clock = hs.handlers.clock
    requester = Requester(SENDER, "DEV", "x")
    rooms = {
        version: await hs.handlers.room_creation.create_room(
            requester, {"preset": "public_chat", "room_version": version}
        )
        for version in VERSIONS
    }

    async def send_round(version: str, label: int) -> float:
        started = time.perf_counter()
        for i in range(args.messages):
            await events.persist_as_writer(rooms[version], [_message(clock, f"{label}.{i}")])
        return time.perf_counter() - started

    for version in VERSIONS:  # warm caches
        await send_round(version, -1)
    seconds = dict.fromkeys(VERSIONS, 0.0)
    for round_number in range(args.rounds):
        order = VERSIONS if round_number % 2 == 0 else tuple(reversed(VERSIONS))
        for version in order:
            seconds[version] += await send_round(version, round_number)
    sent = args.messages * args.rounds
    baseline = sent / seconds["1"]
    print(f"sends through the writer's persist path ({args.engine}), {sent} per version:")
    for version in VERSIONS:
        rate = sent / seconds[version]
        print(f"  version {version:>2}: {rate:7.1f} sends/s  ({rate / baseline:.2f} of version 1)")

    spec = _message(clock, "id")
    print(f"CPU per event id ({args.ids} ids each):")
    for version in VERSIONS:
        room_version = KNOWN_ROOM_VERSIONS[version]
        started = time.process_time()
        for depth in range(args.ids):
            spec.to_persist(rooms[version], room_version, "test.local", ["$prev"], depth)
        per_id = (time.process_time() - started) / args.ids * 1e6
        print(f"  version {version:>2}: {per_id:6.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--ids", type=int, default=20_000)
    args = parser.parse_args()
    task.react(lambda reactor: defer.ensureDeferred(_run(reactor, args)))


if __name__ == "__main__":
    main()
