"""Time from a message sent on one server to the other server's /sync
(issue 31, "Measure"): ours→ours, ours→Synapse, Synapse→ours and
Synapse→Synapse in one run, p50 and p99, with ratios against
Synapse→Synapse.

Four servers (``bench/federation_peers.py``): ours ``o1``, ``o2`` (in this
process) and Synapses ``s1``, ``s2`` (their own processes). For each pair a
user of the sending server creates a public room, a user of the receiving
server joins it over federation, and keeps one long-poll ``/sync`` open. The
sender then sends ``--messages`` messages one at a time; each one's latency
is from just before its ``PUT /send`` until the receiver's ``/sync``
returns it (the next message is sent once it has arrived, so there is no
queueing). ``--warmup`` messages first are not counted (connections and
keys are fetched then).

    python -m bench.federation_latency [--messages 200] [--warmup 5]
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any, cast

from twisted.internet import defer, reactor, task

from bench.federation_peers import Peers, Server, percentile, q, register, run_label
from tests.harness.client_api import ClientApi

_reactor = cast(Any, reactor)
#: How long one message may take to arrive before the run gives up.
ARRIVAL_TIMEOUT_SECONDS = 60.0
#: The pairs measured, (sender, receiver), Synapse→Synapse last (the baseline).
PAIRS = (("o1", "o2"), ("o1", "s1"), ("s1", "o1"), ("s1", "s2"))


@dataclass
class PairResult:
    sender: Server
    receiver: Server
    latencies_ms: list[float]

    @property
    def name(self) -> str:
        return (
            f"{self.sender.kind}({self.sender.label})→{self.receiver.kind}({self.receiver.label})"
        )

    def p(self, fraction: float) -> float:
        return percentile(self.latencies_ms, fraction)


class Receiver:
    """One user's long-poll /sync loop, noting when each body arrives."""

    def __init__(self, client: ClientApi, room_id: str) -> None:
        self.client = client
        self.room_id = room_id
        self.arrived: dict[str, float] = {}
        self._running = True
        self._waiting: dict[str, defer.Deferred[None]] = {}
        self._loop: defer.Deferred[None] | None = None

    async def start(self) -> None:
        since = (await self.client.sync())["next_batch"]
        self._loop = defer.ensureDeferred(self._poll(since))

    async def _poll(self, since: str) -> None:
        while self._running:
            answer = await self.client.sync(since, timeout=5000)
            now = time.perf_counter()
            since = answer["next_batch"]
            room = answer.get("rooms", {}).get("join", {}).get(self.room_id, {})
            for event in room.get("timeline", {}).get("events", []):
                body = event.get("content", {}).get("body")
                if isinstance(body, str) and body not in self.arrived:
                    self.arrived[body] = now
                    waiting = self._waiting.pop(body, None)
                    if waiting is not None:
                        waiting.callback(None)

    async def wait_for(self, body: str) -> float:
        """When ``body`` arrived (perf_counter seconds)."""
        if body not in self.arrived:
            waiting: defer.Deferred[None] = defer.Deferred()
            self._waiting[body] = waiting
            waiting.addTimeout(ARRIVAL_TIMEOUT_SECONDS, _reactor)
            await waiting
        return self.arrived[body]

    async def stop(self) -> None:
        self._running = False
        if self._loop is not None:
            await self._loop


async def join_over_federation(joiner: ClientApi, room_id: str, host: Server) -> None:
    await joiner.ok("POST", f"/join/{q(room_id)}?server_name={q(host.server_name)}", {})


async def measure_pair(
    sender_server: Server, receiver_server: Server, messages: int, warmup: int
) -> PairResult:
    tag = uuid.uuid4().hex[:8]
    sender = await register(sender_server, f"lat_s_{tag}")
    receiver_user = await register(receiver_server, f"lat_r_{tag}")
    room_id = await sender.create_room(preset="public_chat")
    await join_over_federation(receiver_user, room_id, sender_server)
    receiver = Receiver(receiver_user, room_id)
    await receiver.start()
    latencies: list[float] = []
    try:
        for i in range(warmup + messages):
            body = f"{tag}-{i}"
            started = time.perf_counter()
            await sender.send(room_id, body)
            arrived = await receiver.wait_for(body)
            if i >= warmup:
                latencies.append((arrived - started) * 1000)
            # A pause, so that each message is a fresh wake-up, not part of
            # a burst the sync answers together.
            await task.deferLater(_reactor, 0.01, lambda: None)
    finally:
        await receiver.stop()
    return PairResult(sender_server, receiver_server, latencies)


async def run(messages: int, warmup: int) -> list[PairResult]:
    """Start the four servers, measure every pair of :data:`PAIRS`, stop them."""
    peers = Peers()
    try:
        servers = {"o1": peers.ours("o1"), "o2": peers.ours("o2")}
        servers["s1"] = await peers.synapse("s1")
        servers["s2"] = await peers.synapse("s2")
        results = []
        for sender, receiver in PAIRS:
            results.append(await measure_pair(servers[sender], servers[receiver], messages, warmup))
        return results
    finally:
        await peers.stop()


def report(results: list[PairResult]) -> str:
    baseline = results[-1]
    lines = [
        f"## federation_latency: send → remote /sync, {len(baseline.latencies_ms)} messages "
        f"per pair ({run_label()})",
        "",
        "| pair | p50 ms | p99 ms | max ms | p50 / Synapse→Synapse | p99 / Synapse→Synapse |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.p(0.5):.1f} | {r.p(0.99):.1f} | {max(r.latencies_ms):.1f} | "
            f"{r.p(0.5) / baseline.p(0.5):.2f} | {r.p(0.99) / baseline.p(0.99):.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    outcome: list[Any] = []

    async def go() -> None:
        try:
            outcome.append(report(await run(args.messages, args.warmup)))
        except BaseException as e:
            outcome.append(e)
        finally:
            _reactor.stop()

    _reactor.callWhenRunning(lambda: defer.ensureDeferred(go()))
    _reactor.run()
    if not outcome or isinstance(outcome[0], BaseException):
        print(
            f"federation_latency failed: {outcome[0] if outcome else 'no result'}", file=sys.stderr
        )
        sys.exit(1)
    print(outcome[0])


if __name__ == "__main__":
    main()
