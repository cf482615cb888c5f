"""Join time for a remote room with ``--members`` members and ``--events``
events (issue 31, "Measure"; defaults 1,000 and 5,000), ours and Synapse's
in one run, with ratios against Synapse joining the same room.

Four servers (``bench/federation_peers.py``): ours ``o1`` and Synapse ``s1``
each host one big room, ours ``o2`` and Synapse ``s2`` join both. So every
room is joined once by ours and once by Synapse, from servers that have
never seen it:

- building a room: its creator makes it public, ``members - 1`` users of
  the host register (client API, dummy auth; password hashing cheapened on
  both: Synapse's ``bcrypt_rounds: 4``, our scrypt's cost lowered for the
  run) and join it (``--concurrency`` at a time), then messages are sent
  until the room holds ``--events`` events (the joins and the creation's
  state events count);
- a join: the joiner's user takes a /sync token, then the clock runs from
  its ``POST /join/{roomId}?server_name=<host>`` until its incremental
  /sync (long poll, no lazy loading) shows the room under ``join`` with
  the room's member list in its state. ``POST /join``'s own answer time is
  reported too: a server doing partial-state joins answers it before it
  has the state.

    python -m bench.remote_join [--members 1000] [--events 5000] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any, cast

from twisted.internet import defer, reactor

from bench.federation_peers import Peers, Server, q, register, run_label
from synapse_lite.handlers import auth as auth_handler
from tests.harness.client_api import ClientApi

_reactor = cast(Any, reactor)
#: How long one join may take before the run gives up.
JOIN_TIMEOUT_SECONDS = 600.0
#: Our scrypt cost for the benchmark's users (a power of two; the default
#: costs ~50 ms of CPU a user, which is not what is measured).
BENCH_SCRYPT_N = 16


@dataclass
class JoinResult:
    host: Server
    joiner: Server
    join_answer_s: float
    in_sync_s: float
    members_seen: int

    @property
    def name(self) -> str:
        joiner, host = self.joiner, self.host
        return f"{joiner.kind}({joiner.label}) joins {host.kind}({host.label})'s room"


async def gather(calls: list[Any], concurrency: int) -> list[Any]:
    """Await the zero-argument coroutine functions ``calls``, ``concurrency``
    at a time; their results in order."""
    results: list[Any] = [None] * len(calls)
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < len(calls):
            index = next_index
            next_index += 1
            results[index] = await calls[index]()

    await defer.gatherResults(
        [defer.ensureDeferred(worker()) for _ in range(concurrency)], consumeErrors=True
    )
    return results


async def build_room(host: Server, members: int, events: int, concurrency: int) -> str:
    """A public room on ``host`` with ``members`` joined users and about
    ``events`` events; its id."""
    tag = uuid.uuid4().hex[:6]
    creator = await register(host, f"big_{tag}_0")
    room_id = await creator.create_room(preset="public_chat", name=f"big {host.label}")

    async def member(i: int) -> ClientApi:
        user = await register(host, f"big_{tag}_{i}")
        await user.ok("POST", f"/rooms/{q(room_id)}/join", {})
        return user

    users: list[ClientApi] = [creator] + await gather(
        [lambda i=i: member(i) for i in range(1, members)], concurrency
    )
    # The creation's state events (create, member, power levels, join rules,
    # history visibility, name) and the joins so far.
    so_far = 6 + members - 1
    await gather(
        [
            lambda i=i: users[i % len(users)].send(room_id, f"filler {i}")
            for i in range(max(0, events - so_far))
        ],
        concurrency,
    )
    return room_id


async def time_join(host: Server, room_id: str, joiner_server: Server, members: int) -> JoinResult:
    joiner = await register(joiner_server, f"joiner_{uuid.uuid4().hex[:8]}")
    since = (await joiner.sync())["next_batch"]
    started = time.perf_counter()
    await joiner.ok("POST", f"/join/{q(room_id)}?server_name={q(host.server_name)}", {})
    answered = time.perf_counter() - started
    seen = 0
    while True:
        answer = await joiner.sync(since, timeout=10000)
        since = answer["next_batch"]
        room = answer.get("rooms", {}).get("join", {}).get(room_id)
        if room is not None:
            state = room.get("state", {}).get("events", []) + room.get("timeline", {}).get(
                "events", []
            )
            seen = len(
                {
                    e.get("state_key")
                    for e in state
                    if e.get("type") == "m.room.member"
                    and e.get("content", {}).get("membership") == "join"
                }
            )
            if seen >= members:
                break
        if time.perf_counter() - started > JOIN_TIMEOUT_SECONDS:
            raise TimeoutError(f"{joiner_server.label} did not see {room_id} with its members")
    return JoinResult(host, joiner_server, answered, time.perf_counter() - started, seen)


async def run(
    members: int, events: int, concurrency: int
) -> tuple[list[JoinResult], dict[str, float]]:
    """Start the servers, build the two rooms, time the four joins; the
    joins and how long each room took to build (seconds)."""
    peers = Peers()
    scrypt_n = auth_handler.SCRYPT_N
    auth_handler.SCRYPT_N = BENCH_SCRYPT_N
    try:
        servers = {"o1": peers.ours("o1"), "o2": peers.ours("o2")}
        servers["s1"] = await peers.synapse("s1")
        servers["s2"] = await peers.synapse("s2")
        rooms: dict[str, str] = {}
        build_s: dict[str, float] = {}
        for host in ("o1", "s1"):
            started = time.perf_counter()
            rooms[host] = await build_room(servers[host], members, events, concurrency)
            build_s[host] = time.perf_counter() - started
            print(f"built {host}'s room in {build_s[host]:.1f} s", file=sys.stderr)
        results = []
        for host in ("s1", "o1"):
            for joiner in ("o2", "s2"):
                results.append(
                    await time_join(servers[host], rooms[host], servers[joiner], members)
                )
                print(results[-1].name, f"{results[-1].in_sync_s:.2f} s", file=sys.stderr)
        return results, build_s
    finally:
        auth_handler.SCRYPT_N = scrypt_n
        await peers.stop()


def report(results: list[JoinResult], build_s: dict[str, float], members: int, events: int) -> str:
    by_host: dict[str, dict[str, JoinResult]] = {}
    for r in results:
        by_host.setdefault(r.host.label, {})[r.joiner.kind] = r
    lines = [
        f"## remote_join: {members} members, {events} events ({run_label()})",
        "",
        f"Rooms built in: ours {build_s.get('o1', 0):.1f} s, Synapse {build_s.get('s1', 0):.1f} s",
        "",
        "| join | POST /join answered s | in /sync with the members s | members seen | "
        "/ Synapse joining the same room |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in results:
        synapse = by_host[r.host.label]["synapse"]
        lines.append(
            f"| {r.name} | {r.join_answer_s:.2f} | {r.in_sync_s:.2f} | {r.members_seen} | "
            f"{r.in_sync_s / synapse.in_sync_s:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    outcome: list[Any] = []

    async def go() -> None:
        try:
            results, build_s = await run(args.members, args.events, args.concurrency)
            outcome.append(report(results, build_s, args.members, args.events))
        except BaseException as e:
            outcome.append(e)
        finally:
            _reactor.stop()

    _reactor.callWhenRunning(lambda: defer.ensureDeferred(go()))
    _reactor.run()
    if not outcome or isinstance(outcome[0], BaseException):
        print(f"remote_join failed: {outcome[0] if outcome else 'no result'}", file=sys.stderr)
        sys.exit(1)
    print(outcome[0])


if __name__ == "__main__":
    main()
