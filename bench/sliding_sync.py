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

With ``--reference PYTHON`` (the Python of a virtualenv holding the reference
homeserver: see ``bench/reference_homeserver.py``), first, over HTTP, our
main process (a real process, ``bench/cluster.py``) and then the reference's
main process, on the same engine, each on a fresh database: Bob creates
``--reference-rooms`` rooms (1,000) and Alice joins the first; then
``--reference-rounds`` times the first response of a new connection with
the room list above (timed from the request to the whole body read), and
as often the wake-up: a long-poll of Bob's connection, subscribed to the
first room, waiting (``timeout`` 30 s) when Alice sends a message there,
timed from the start of her ``PUT /send`` to the response carrying the
message; her ``/send`` round trip is the baseline. Prints p50 and p99 of
each and the reference's over ours.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from twisted.internet import defer, task

from bench.scenarios import percentile

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


SLIDING_PATH = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync"
#: The first room's subscription in the wake-up measurement (Element X's
#: when a room is opened, trimmed).
SUBSCRIPTION: dict[str, Any] = {
    "timeline_limit": 20,
    "required_state": [["m.room.member", "$LAZY"], ["m.room.name", ""]],
}


async def _http_figures(base: str, args: argparse.Namespace) -> dict[str, float]:
    """The first room list and the wake-up, over HTTP, on the homeserver at
    ``base`` (fresh: the users are registered here)."""
    import asyncio

    import aiohttp

    from bench.scenarios import Client

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        client = Client(session)
        bob = await client.register(base, "bob")
        alice = await client.register(base, "alice")
        rooms: list[str] = []
        names = iter(range(args.reference_rooms))

        async def creator() -> None:
            for i in names:
                created = await client.call(
                    "POST", base, "/createRoom", bob, {"preset": "public_chat", "name": f"r{i}"}
                )
                rooms.append(created["room_id"])

        # Side by side: the reference creates a room in ~100 ms.
        await asyncio.gather(*(creator() for _ in range(4)))
        subscribed = rooms[0]
        await client.call("POST", base, f"/join/{subscribed}", alice, {})

        async def sliding(body: dict[str, Any], pos: str | None, timeout: int) -> Any:
            query = f"?timeout={timeout}&set_presence=offline" + (f"&pos={pos}" if pos else "")
            url = base + SLIDING_PATH + query
            async with session.post(url, json=body, headers=bob.headers) as response:
                result = await response.json()
                if response.status != 200:
                    raise RuntimeError(f"sliding sync: {response.status} {result}")
                return result

        first: list[float] = []
        for _ in range(args.reference_rounds):
            started = time.perf_counter()
            response = await sliding(ROOM_LIST_BODY, None, 0)
            first.append(time.perf_counter() - started)
            if len(response["rooms"]) != min(20, args.reference_rooms):
                raise RuntimeError(f"{len(response['rooms'])} rooms in the first room list")
        body = dict(ROOM_LIST_BODY, conn_id="wake", room_subscriptions={subscribed: SUBSCRIPTION})
        pos = (await sliding(body, None, 0))["pos"]
        wake: list[float] = []
        sends: list[float] = []
        for i in range(args.reference_rounds):
            text = f"wake {i}"
            polling = asyncio.ensure_future(sliding(body, pos, 30_000))
            # The long-poll parked before the message is sent.
            await asyncio.sleep(0.1)
            started = time.perf_counter()
            await client.send(base, alice, subscribed, text)
            sends.append(time.perf_counter() - started)
            while True:
                response = await polling
                pos = response["pos"]
                timeline = response["rooms"].get(subscribed, {}).get("timeline", [])
                if any(e["content"].get("body") == text for e in timeline):
                    break
                polling = asyncio.ensure_future(sliding(body, pos, 30_000))
            wake.append(time.perf_counter() - started)
    result = {}
    for name, values in (("first", first), ("wake", wake), ("send", sends)):
        result[f"{name}_p50_ms"] = percentile(values, 0.5) * 1e3
        result[f"{name}_p99_ms"] = percentile(values, 0.99) * 1e3
    return result


async def _compare_with_reference(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Our main process's HTTP figures, then the reference's."""
    from bench.cluster import Cluster
    from bench.reference_homeserver import ReferenceHomeserver

    ours = Cluster("single", args.engine)
    try:
        ours.start()
        print("ours over HTTP...", file=sys.stderr, flush=True)
        our_figures = await _http_figures(ours.url("main"), args)
    finally:
        ours.stop()
    # Shown now: the reference may fail to start.
    print(f"ours: {json.dumps(our_figures)}", file=sys.stderr, flush=True)
    reference = ReferenceHomeserver(args.reference, args.engine)
    try:
        reference.start()
        print("the reference over HTTP...", file=sys.stderr, flush=True)
        reference_figures = await _http_figures(reference.url(), args)
    finally:
        reference.stop()
    return {"ours": our_figures, "reference": reference_figures}


def _print_comparison(args: argparse.Namespace, figures: dict[str, dict[str, float]]) -> None:
    ours, ref = figures["ours"], figures["reference"]
    print(
        f"{args.engine}, over HTTP, Bob in {args.reference_rooms} rooms,"
        f" {args.reference_rounds} rounds (p50 / p99 ms):"
    )
    print("                                     ours              reference         reference/ours")
    for label, key in (
        ("first response, range [0, 19]", "first"),
        ("wake-up after one message    ", "wake"),
        ("baseline: the message's /send", "send"),
    ):
        p50, p99 = f"{key}_p50_ms", f"{key}_p99_ms"
        print(
            f"  {label}  {ours[p50]:7.1f} / {ours[p99]:7.1f}   {ref[p50]:7.1f} / {ref[p99]:7.1f}"
            f"   {ref[p50] / ours[p50]:5.2f} / {ref[p99] / ours[p99]:5.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--rooms", type=int, default=500)
    parser.add_argument("--messages", type=int, default=3, help="per room")
    parser.add_argument("--rounds", type=int, default=5, help="at least 2: one cold, then warm")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--reference",
        metavar="PYTHON",
        help="first compare with the reference homeserver installed for this Python, over HTTP",
    )
    parser.add_argument("--reference-rooms", type=int, default=1000)
    parser.add_argument("--reference-rounds", type=int, default=30)
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the first is the cold one)")
    if args.reference:
        import asyncio

        comparison = asyncio.run(_compare_with_reference(args))
        if args.json:
            print(json.dumps(comparison))
        else:
            _print_comparison(args, comparison)
    task.react(lambda reactor: defer.ensureDeferred(_run(reactor, args)))


if __name__ == "__main__":
    main()
