"""What one /sync costs to compute, in process: ``python -m bench.sync_compute``.

One main process inside this Python process (``bench/in_process.py``), on a
throwaway database: Bob is joined to ``--rooms`` rooms holding ``--events``
messages in all. Each round sends one message to one room and times Bob's
incremental /sync computing the response (``SyncHandler.sync`` with no
timeout: no HTTP, no waiting), then times one initial /sync. Prints the
medians in microseconds, and the database interactions of Bob's incremental
/sync: woken by one new event (how many, and the most running at once), and
with nothing new for him while every other stream moved (Alice's message,
receipt, account data and to-device message, in a room of her own).

``--stages``: also profile (cProfile) the timed incremental /syncs alone and
print each stage's reactor CPU per /sync (cumulative time of the handler's
and the sections' functions over the number of /syncs; the profiler's own
cost inflates every figure alike, and the database threads are not in it).

``--baseline DIR``: the same measurement of another checkout (``git worktree
add DIR REV``), in child processes alternating with this checkout's
(``--pairs`` of them, so the machine's load falls on both alike); prints both
sides' medians over the pairs and this checkout's ratio to the baseline.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
import traceback
from typing import Any

from twisted.internet import defer, task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALICE, BOB = "@alice:test.local", "@bob:test.local"


async def _measure(hs: Any, args: argparse.Namespace) -> dict[str, float]:
    from synapse_lite.events import EventSpec
    from synapse_lite.handlers.auth import Requester
    from synapse_lite.handlers.filtering import SyncFilter

    events, clock, sync = hs.handlers.events, hs.handlers.clock, hs.handlers.sync
    alice, bob = Requester(ALICE, "DEV", "x"), Requester(BOB, "DEV", "y")
    rooms = []
    for _ in range(args.rooms):
        room_id = await hs.handlers.room_creation.create_room(alice, {"preset": "public_chat"})
        join = EventSpec("m.room.member", BOB, BOB, {"membership": "join"}, clock.time_msec())
        await events.persist_as_writer(room_id, [join])
        rooms.append(room_id)

    def message(body: str) -> Any:
        content = {"msgtype": "m.text", "body": body}
        return EventSpec("m.room.message", None, ALICE, content, clock.time_msec())

    per_room = args.events // args.rooms
    for room_id in rooms:
        for start in range(0, per_room, 100):
            batch = [message(f"m{i}") for i in range(start, min(start + 100, per_room))]
            await events.persist_as_writer(room_id, batch)

    async def one_sync(since: str | None) -> tuple[float, str]:
        started = time.perf_counter()
        response = await sync.sync(bob, since, 0, False, SyncFilter(), "offline")
        return time.perf_counter() - started, response["next_batch"]

    # The /sync's own interactions (started from the sync handler's code, not
    # the background work a send leaves), with the most in flight at once;
    # only in counted rounds, apart from the timed ones.
    reads = {"count": 0, "running": 0, "most": 0}
    pool = hs.store.db_pool
    run = pool.runInteraction

    async def counting(desc: str, *a: Any, **kw: Any) -> Any:
        if not any("handlers/sync" in f.filename for f in traceback.extract_stack()):
            return await run(desc, *a, **kw)
        reads["count"] += 1
        reads["running"] += 1
        reads["most"] = max(reads["most"], reads["running"])
        try:
            return await run(desc, *a, **kw)
        finally:
            reads["running"] -= 1

    async def counted_sync(since: str) -> tuple[str, int, int]:
        reads.update(count=0, most=0)
        pool.runInteraction = counting
        try:
            _, since = await one_sync(since)
        finally:
            pool.runInteraction = run
        return since, reads["count"], reads["most"]

    profile = cProfile.Profile() if args.stages else None
    _, since = await one_sync(None)
    own = await hs.handlers.room_creation.create_room(alice, {"preset": "private_chat"})
    incremental, initial = [], []
    woken_reads, woken_most, quiet_reads = [], [], []
    for i in range(args.rounds):
        await events.persist_as_writer(rooms[i % len(rooms)], [message(f"r{i}")])
        if profile is not None:
            profile.enable()
        took, since = await one_sync(since)
        if profile is not None:
            profile.disable()
        incremental.append(took)
        await events.persist_as_writer(rooms[i % len(rooms)], [message(f"c{i}")])
        since, count, most = await counted_sync(since)
        woken_reads.append(count)
        woken_most.append(most)
        if i % 10 == 0:
            initial.append((await one_sync(None))[0])
            since = (await counted_sync(since))[0]
            # Nothing new for Bob; every other stream moves for Alice.
            [mine] = await events.persist_as_writer(own, [message(f"own{i}")])
            await hs.store.insert_receipt(own, "m.read", ALICE, mine.event_id, {"ts": i})
            await hs.store.add_account_data_for_user(ALICE, "m.x", {"i": i})
            await hs.store.add_messages_to_device_inbox({ALICE: {"DEV": {"i": i}}}, {})
            since, count, _ = await counted_sync(since)
            quiet_reads.append(count)
    if profile is not None:
        _print_stages(profile, args.rounds)
    return {
        "incremental_us": statistics.median(incremental) * 1e6,
        "initial_us": statistics.median(initial) * 1e6,
        "woken_reads": statistics.mean(woken_reads),
        "woken_reads_at_once": statistics.mean(woken_most),
        "quiet_reads": statistics.mean(quiet_reads),
    }


#: The stages of a woken /sync, by function name (handler, sections, reads).
STAGES = (
    "_parse_since", "_catch_up_to", "_delete_acknowledged_to_device", "_current_token",
    "load_memberships", "users_sharing_rooms", "get_ignored_users", "run_sections",
    "_joined_rooms", "_room_entry", "add_bundles_to", "format", "render",
    "get_room_events_between", "get_unread_counts", "runInteraction", "to_string", "_log_token",
)  # fmt: skip


def _print_stages(profile: cProfile.Profile, syncs: int) -> None:
    """Each stage's cumulative reactor CPU per /sync (``add_to``: per section)."""
    stats = pstats.Stats(profile)
    total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    print(f"reactor CPU per woken /sync under the profiler: {total / syncs * 1e3:.3f} ms")
    rows = []
    for (path, _, name), (_, _, _, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        if "synapse_lite" not in path or (name not in STAGES and name != "add_to"):
            continue
        where = path.split("synapse_lite/")[-1]
        label = f"{name} ({where.rsplit('/', 1)[-1]})" if name == "add_to" else name
        rows.append((cumulative / syncs * 1e3, label))
    for ms, label in sorted(rows, reverse=True):
        print(f"  {ms:7.3f} ms  {label}")


async def _run(reactor: Any, args: argparse.Namespace) -> None:
    from bench.in_process import with_main_process

    figures: dict[str, float] = {}

    async def measure(hs: Any) -> None:
        figures.update(await _measure(hs, args))

    await with_main_process(reactor, args.engine, measure)
    print(json.dumps(figures) if args.json else _line(figures))


def _line(figures: dict[str, float]) -> str:
    return (
        f"incremental /sync after one new event: {figures['incremental_us']:.0f} us;"
        f" initial /sync: {figures['initial_us']:.0f} us (medians);"
        f" database interactions per woken /sync {figures['woken_reads']:.2f}"
        f" (at most {figures['woken_reads_at_once']:.2f} at once, mean),"
        f" per /sync with nothing new while others' streams moved"
        f" {figures['quiet_reads']:.2f}"
    )


def _child(source: str, args: argparse.Namespace) -> dict[str, float]:
    command = [sys.executable, os.path.abspath(__file__), "--json", "--engine", args.engine,
               "--rooms", str(args.rooms), "--events", str(args.events),
               "--rounds", str(args.rounds)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=source)
    out = subprocess.run(command, env=env, cwd=source, check=True, capture_output=True, text=True)
    figures: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def _compare(args: argparse.Namespace) -> None:
    baseline = os.path.abspath(args.baseline)
    sides: dict[str, list[dict[str, float]]] = {"this": [], "baseline": []}
    for pair in range(args.pairs):
        order = [("this", ROOT), ("baseline", baseline)]
        for name, source in order if pair % 2 == 0 else reversed(order):
            sides[name].append(_child(source, args))
    print(f"/sync computation, {args.engine}, {args.rooms} rooms, {args.events} messages,"
          f" {args.rounds} rounds, {args.pairs} alternating pairs"
          " (medians over the pairs)")  # fmt: skip
    print(f"  baseline {baseline}")
    for key, label in (
        ("incremental_us", "incremental /sync us"),
        ("initial_us", "initial /sync us"),
        ("woken_reads", "reads, woken /sync"),
        ("woken_reads_at_once", "  of them at once"),
        ("quiet_reads", "reads, nothing new"),
    ):
        this = statistics.median(f[key] for f in sides["this"])
        base = statistics.median(f[key] for f in sides["baseline"])
        ratio = f"{this / base:.2f}" if base else "-"
        print(f"  {label:22} this {this:8.2f}  baseline {base:8.2f}  ratio {ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--rooms", type=int, default=10)
    parser.add_argument("--events", type=int, default=2000, help="messages, over all rooms")
    parser.add_argument("--rounds", type=int, default=200, help="incremental syncs timed")
    parser.add_argument("--baseline", help="another checkout to compare with")
    parser.add_argument("--pairs", type=int, default=4, help="with --baseline: runs of each")
    parser.add_argument("--stages", action="store_true", help="profile each stage (reactor CPU)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline:
        _compare(args)
        return
    task.react(lambda reactor: defer.ensureDeferred(_run(reactor, args)))


if __name__ == "__main__":
    main()
