"""Push evaluation's cost: sends in a room of 1,000 local members with push
rules evaluated (and push actions stored) against the same room with
evaluation off, measured in one run, in alternating rounds.

    python -m bench.push [--engine sqlite|postgres] [--members 1000]
                         [--messages 20] [--rounds 20] [--via persist|http]

Runs one main process in this Python process, on a throwaway database made
the way the tests make theirs. Sends go through the events writer's own
persist path, where evaluation happens (the harshest comparison: nothing
else of a send is counted), or with ``--via http`` through the client API
(``PUT /rooms/{roomId}/send``) as a client sends. Sends alternate between short rounds with
evaluation off and on, so the machine's load falls on both alike. Prints
sends/s with evaluation off and on (total sends over total time), their
ratio (the target is >= 0.7), the CPU spent evaluating per event and per
(event, member), and the rows stored.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from twisted.internet import defer, task

from bench.in_process import with_main_process
from synapse_lite.events import EventSpec
from synapse_lite.handlers.auth import Requester


async def _run(reactor: Any, args: argparse.Namespace) -> None:
    async def measure(hs: Any) -> None:
        await _measure(hs, args, reactor)

    await with_main_process(reactor, args.engine, measure)


async def _client(hs: Any, reactor: Any) -> Any:
    """A registered user sending through the client API, over HTTP."""
    from synapse_lite.http.server import make_site
    from tests.harness.client_api import ClientApi

    resources = ("client",)
    site = make_site(
        hs.listeners.resources.tree(resources),
        hs.config.limits.max_request_body_bytes,
        hs.listeners.resources.upload_routes(resources),
    )
    port = reactor.listenTCP(0, site, interface="127.0.0.1")
    no_testcase: Any = None  # ClientApi only keeps the testcase for its own failures
    api = ClientApi(no_testcase, f"http://127.0.0.1:{port.getHost().port}")
    return await api.register("member0")


async def _measure(hs: Any, args: argparse.Namespace, reactor: Any) -> None:
    events = hs.handlers.events
    push = events.push
    assert push is not None, "the main process of a monolith is an events writer"
    clock = hs.handlers.clock
    client = await _client(hs, reactor) if args.via == "http" else None
    sender = client.user_id if client is not None else "@member0:test.local"
    assert sender is not None
    room_id = await hs.handlers.room_creation.create_room(
        Requester(sender, "DEV", "x"), {"preset": "public_chat"}
    )
    members = [f"@member{i}:test.local" for i in range(1, args.members)]
    for start in range(0, len(members), 100):
        joins = [
            EventSpec("m.room.member", user, user, {"membership": "join", "displayname": f"M {i}"},
                      clock.time_msec())
            for i, user in enumerate(members[start : start + 100], start)
        ]  # fmt: skip
        await events.persist_as_writer(room_id, joins)
    joined = len(await hs.store.get_users_in_room(room_id))
    print(f"room of {joined} local members ({args.engine}, sends {args.via})")

    async def send_round(count: int, label: int) -> float:
        started = time.perf_counter()
        for i in range(count):
            if client is not None:
                await client.send(room_id, f"message {label}.{i} for the room")
                continue
            spec = EventSpec(
                "m.room.message",
                None,
                sender,
                {"msgtype": "m.text", "body": f"message {label}.{i} for the room"},
                clock.time_msec(),
            )
            await events.persist_as_writer(room_id, [spec])
        return count / (time.perf_counter() - started)

    # Warm both paths (caches of rules and members) before measuring.
    push.enabled = True
    await send_round(10, -1)
    push.enabled = False
    await send_round(10, -2)
    push.cpu_seconds, push.evaluations = 0.0, 0
    # Many short rounds, alternating: the machine's load (other processes)
    # falls on both sides alike.
    seconds = {True: 0.0, False: 0.0}
    sent = {True: 0, False: 0}
    rates: dict[bool, list[float]] = {True: [], False: []}
    for round_number in range(args.rounds):
        for enabled in (False, True) if round_number % 2 == 0 else (True, False):
            push.enabled = enabled
            rate = await send_round(args.messages, round_number)
            rates[enabled].append(rate)
            seconds[enabled] += args.messages / rate
            sent[enabled] += args.messages
    evaluated_events = sent[True]
    off, on = sent[False] / seconds[False], sent[True] / seconds[True]
    middle = args.rounds // 2
    print(f"evaluation off: {off:.1f} sends/s  (median round {sorted(rates[False])[middle]:.1f})")
    print(f"evaluation on:  {on:.1f} sends/s  (median round {sorted(rates[True])[middle]:.1f})")
    print(f"ratio on/off: {on / off:.2f}  (target >= 0.7)")
    per_event_ms = push.cpu_seconds / evaluated_events * 1000
    per_member_us = push.cpu_seconds / max(push.evaluations, 1) * 1e6
    print(
        f"evaluation time: {per_event_ms:.2f} ms per event, {per_member_us:.2f} us per member"
        f" ({push.evaluations} member evaluations)"
    )
    summaries = await hs.store.db_pool.select(
        "bench_count",
        "SELECT COUNT(*) FROM events WHERE room_id = ? AND push_actions IS NOT NULL",
        room_id,
    )
    exceptions = await hs.store.db_pool.select(
        "bench_count", "SELECT COUNT(*) FROM event_push_actions WHERE room_id = ?", room_id
    )
    print(
        f"stored: {summaries[0][0]} events with default push actions,"
        f" {exceptions[0][0]} per-user rows"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=20, help="sends per round")
    parser.add_argument("--rounds", type=int, default=20, help="rounds of each kind")
    parser.add_argument(
        "--via",
        choices=("persist", "http"),
        default="persist",
        help="send on the writer's persist path (default), or as a client over HTTP",
    )
    args = parser.parse_args()
    task.react(lambda reactor: defer.ensureDeferred(_run(reactor, args)))


if __name__ == "__main__":
    main()
