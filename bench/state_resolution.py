"""State resolution over plain events: ``python -m bench.state_resolution``.

    python -m bench.state_resolution [--members 10000] [--side 1000] [--rounds 3]

Pure Python, no database: a room of ``--members`` joined users (and ten
moderators), forked into two branches of ``--side`` state events each
(joins, leaves, kicks, bans, topics, names, power level changes), resolved
as rooms of version 1 (the original algorithm: the baseline), 10 (v2) and
12 (v2 with version 12's changes). Each is timed ``--rounds`` times (the
median is printed), at the full size and at a tenth of the members, so the
figures say what resolution grows with. Prints events/s (the branches'
events resolved per second) and each against version 1 in the same run,
and the auth difference alone: walking the auth chains, and from the auth
chain index (``event_graph/auth_chain_index.py``, the same answer, checked),
with their ratio and how fast the index is built.
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import attr

from synapse_lite.api.room_versions import SPEC_ROOM_VERSIONS, RoomVersion
from synapse_lite.event_graph.auth_chain_index import AuthChainIndex
from synapse_lite.event_graph.authorisation import select_auth_event_ids
from synapse_lite.event_graph.pdu import Pdu, StateKey, room_id_of_create
from synapse_lite.event_graph.state_resolution import auth_difference, resolve_state

ADMIN = "@admin:bench"


class _Builder:
    """Events of one room, each citing the auth events its branch's state selects."""

    def __init__(self, version: RoomVersion) -> None:
        self.version = version
        self.events: dict[str, Pdu] = {}
        self.count = 0
        self.room_id = "!bench:bench"

    def add(
        self,
        state: dict[StateKey, str],
        prev: str | None,
        event_type: str,
        sender: str,
        content: dict[str, Any],
        state_key: str,
    ) -> str:
        self.count += 1
        event = Pdu(
            event_id=f"${self.count:08d}",
            room_id=self.room_id,
            type=event_type,
            state_key=state_key,
            sender=sender,
            content=content,
            prev_event_ids=() if prev is None else (prev,),
            auth_event_ids=(),
            depth=self.count,
            origin_server_ts=1_000_000 + self.count,
        )
        auth = tuple(select_auth_event_ids(self.version, event, state))
        event = attr.evolve(event, auth_event_ids=auth)
        self.events[event.event_id] = event
        state[(event_type, state_key)] = event.event_id
        return event.event_id


def build(
    version: RoomVersion, members: int, side: int, seed: int
) -> tuple[dict[str, Pdu], list[dict[StateKey, str]]]:
    """The room's events and the two branches' states."""
    rng = random.Random(seed)
    room = _Builder(version)
    state: dict[StateKey, str] = {}
    content: dict[str, Any] = {"room_version": version.identifier}
    if version.creator_in_create_content:
        content["creator"] = ADMIN
    last = room.add(state, None, "m.room.create", ADMIN, content, "")
    if version.hashed_room_ids:
        room.room_id = room_id_of_create(last)
        create = room.events[last]
        room.events[last] = attr.evolve(create, room_id=room.room_id)
        del state[("m.room.create", "")]  # never an auth event in version 12
    last = room.add(state, last, "m.room.member", ADMIN, {"membership": "join"}, ADMIN)
    mods = [f"@mod{i}:bench" for i in range(10)]
    users = {m: 50 for m in mods}
    if not version.hashed_room_ids:
        users[ADMIN] = 100
    last = room.add(state, last, "m.room.power_levels", ADMIN, {"users": users}, "")
    last = room.add(state, last, "m.room.join_rules", ADMIN, {"join_rule": "public"}, "")
    people = [f"@user{i}:bench" for i in range(members)]
    for user in [*mods, *people]:
        last = room.add(state, last, "m.room.member", user, {"membership": "join"}, user)
    sides = []
    for _ in range(2):
        branch, tip = dict(state), last
        for step in range(side):
            roll = rng.random()
            user, mod = rng.choice(people), rng.choice(mods)
            joined = room.events[branch[("m.room.member", user)]].membership == "join"
            if roll < 0.4:
                membership = "leave" if joined else "join"
                tip = room.add(branch, tip, "m.room.member", user, {"membership": membership}, user)
            elif roll < 0.5 and joined:
                kind = rng.choice(["leave", "ban"])
                tip = room.add(branch, tip, "m.room.member", mod, {"membership": kind}, user)
            elif roll < 0.75:
                tip = room.add(branch, tip, "m.room.topic", mod, {"topic": str(step)}, "")
            elif roll < 0.95:
                tip = room.add(branch, tip, "m.room.name", mod, {"name": str(step)}, "")
            else:
                changed = {**users, rng.choice(people): rng.choice([0, 10, 20])}
                tip = room.add(branch, tip, "m.room.power_levels", ADMIN, {"users": changed}, "")
        if version.hashed_room_ids:
            branch[("m.room.create", "")] = room.room_id.replace("!", "$", 1)
        sides.append(branch)
    return room.events, sides


def _median_seconds(rounds: int, action: Callable[[], object]) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--side", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(
        "members  side  version  resolve ms  events/s  of v1  auth difference ms (events)"
        "  indexed ms  walked/indexed  index build events/s"
    )
    for members in (args.members // 10, args.members):
        baseline = None
        for identifier in ("1", "10", "12"):
            version = SPEC_ROOM_VERSIONS[identifier]
            events, sides = build(version, members, args.side, seed=members)
            resolve = functools.partial(resolve_state, version, sides, events)
            seconds = _median_seconds(args.rounds, resolve)
            rate = 2 * args.side / seconds
            baseline = baseline or rate
            diff_seconds = _median_seconds(
                args.rounds, functools.partial(auth_difference, sides, events)
            )
            diff = auth_difference(sides, events)
            index = AuthChainIndex()
            started = time.perf_counter()
            for event_id in sorted(events):  # ids are in creation order
                index.add(events[event_id])
            build_rate = len(events) / (time.perf_counter() - started)
            assert index.auth_difference(sides) == diff
            indexed_seconds = _median_seconds(
                args.rounds, functools.partial(index.auth_difference, sides)
            )
            print(
                f"{members:7d}  {args.side:4d}  {identifier:>7}  {seconds * 1000:10.1f}"
                f"  {rate:8.0f}  {rate / baseline:5.2f}  {diff_seconds * 1000:8.1f} ({len(diff)})"
                f"  {indexed_seconds * 1000:10.1f}  {diff_seconds / indexed_seconds:14.2f}"
                f"  {build_rate:10.0f}"
            )


if __name__ == "__main__":
    main()
