"""Differential check of synapse_lite's event graph core against Synapse.

Builds random room graphs (three branches from a common point, events
valid and invalid, by ``tests/event_graph/rooms.py``), then compares

* ``state``: our ``resolve_state`` with Synapse's ``synapse.state.v1`` /
  ``v2`` resolution of the branches' states (Synapse is given our auth
  difference and conflicted subgraph; its orderings, iterative checks and
  auth rules are its own);
* ``auth``: our ``authorise`` with Synapse's
  ``check_state_dependent_auth_rules`` for every event against the state
  before it;
* ``hashing``: the event id (versions 3 on), content hash and signature of
  every event, by ``event_graph/hashing.py`` and by Synapse.

Run from the repository's root with the Python of a virtual environment
that has ``matrix-synapse`` (not a dependency of synapse_lite)::

    PYTHONPATH=. /path/to/synapse-venv/bin/python contrib/synapse_differential/compare.py \\
        [--cases 300] [--seed 1] [--versions 1,2,10,11,12] [--check state,auth,hashing]

Prints, per version and check, the cases and differences (the first few in
full); exits 1 if any differ.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from collections.abc import Coroutine
from typing import Any

import synapse.event_auth  # first: Synapse's modules import each other in this order
from signedjson.key import decode_signing_key_base64
from synapse.api.errors import AuthError as SynapseAuthError
from synapse.api.errors import SynapseError
from synapse.api.room_versions import KNOWN_ROOM_VERSIONS as SYNAPSE_VERSIONS
from synapse.crypto.event_signing import compute_content_hash, compute_event_signature
from synapse.events import make_event_from_dict
from synapse.state import v1 as synapse_v1
from synapse.state import v2 as synapse_v2
from synapse.storage.databases.main.event_federation import StateDifference

from synapse_lite.event_graph.authorisation import (
    EventAuthError,
    auth_types_for_event,
    authorise,
)
from synapse_lite.event_graph.hashing import content_hash, event_id_of, sign_event
from synapse_lite.event_graph.state_resolution import (
    auth_difference,
    conflicted_subgraph,
    resolve_state,
)
from synapse_lite.federation.crypto import (
    CanonicalJsonError,
    SigningKey,
    decode_base64,
    encode_base64,
)
from tests.event_graph.rooms import ALICE, BOB, CAROL, EVE, Room

USERS = [ALICE, BOB, CAROL, EVE]
MEMBERSHIPS = ["join", "invite", "leave", "ban", "knock", "dance"]
JOIN_RULES = ["public", "invite", "knock", "restricted", "knock_restricted", "private"]


def _levels(version: str, rng: random.Random, odd: bool) -> Any:
    """A power level as a server might send it in ``version``'s rooms
    (``odd``: strings, floats and nonsense too, where the version allows
    them to reach the rules)."""
    if int(version) >= 10 or not odd:
        return rng.choice([0, 10, 50, 60, 100])
    extra = [] if int(version) <= 2 else [1.5]  # versions 1-2: Synapse refuses floats
    return rng.choice([0, 10, 50, 60, 100, "50", " 7", "x", None, *extra])


def random_room(
    version: str, rng: random.Random, steps: int, checked: float
) -> tuple[Room, list[str]]:
    """A room forked into three branches; a share ``checked`` of the events
    are kept only if the rules allow them against their branch (the others
    are kept anyway, as a faulty server's would be). Returns the tips."""
    room = Room(version)
    room.standard()
    room.member(BOB, "join")
    room.member(CAROL, "join")
    tips = [room.add("m.room.topic", ALICE, {"topic": "base"}, state_key="").event_id] * 3
    for step in range(steps):
        branch = rng.randrange(3)
        prev = [tips[branch]]
        sender, target = rng.choice(USERS), rng.choice(USERS)
        action = rng.choice(["topic", "levels", "rule", "member", "member", "tpi"])
        if action == "topic":
            key = rng.choice(["", sender, target])
            event = room.add("m.room.topic", sender, {"topic": str(step)}, state_key=key, prev=prev)
        elif action == "levels":
            users = {} if room.version.hashed_room_ids else {ALICE: 100}
            content: dict[str, Any] = {
                "users": {**users, target: _levels(version, rng, odd=checked == 0)}
            }
            if rng.random() < 0.5:
                content[rng.choice(["ban", "kick", "invite", "state_default"])] = _levels(
                    version, rng, odd=checked == 0
                )
            event = room.add("m.room.power_levels", sender, content, state_key="", prev=prev)
        elif action == "rule":
            content = {"join_rule": rng.choice(JOIN_RULES), "allow": []}
            event = room.add("m.room.join_rules", sender, content, state_key="", prev=prev)
        elif action == "tpi":
            event = room.add("m.room.third_party_invite", sender, {}, state_key="tok", prev=prev)
        else:
            content = {"membership": rng.choice(MEMBERSHIPS)}
            if rng.random() < 0.2:
                content["join_authorised_via_users_server"] = rng.choice(USERS)
            event = room.member(target, content["membership"], sender=sender, content=content,
                                prev=prev)  # fmt: skip
        if rng.random() < checked:
            try:
                authorise(room.version, event, room.state(prev[0]))
            except EventAuthError:
                del room.events[event.event_id]
                continue
        tips[branch] = event.event_id
    return room, tips


def synapse_events(
    room: Room, hashing_differences: list[str] | None = None
) -> tuple[dict[str, str], dict[str, Any]]:
    """Synapse's events for ours (ids: ours in versions 1-2, reference
    hashes from 3, so mapped), in creation order. With
    ``hashing_differences``, also compares the event ids (3 on), content
    hashes and signatures both compute for each event."""
    version = SYNAPSE_VERSIONS[room.version.identifier]
    ids: dict[str, str] = {}
    events: dict[str, Any] = {}
    room_id = room.room_id
    for our_id in sorted(room.events):
        pdu = room.events[our_id]
        refs = lambda our: [[ids[e], {}] if version.event_format == 1 else ids[e] for e in our]  # noqa: E731
        data: dict[str, Any] = {
            "type": pdu.type, "sender": pdu.sender, "content": dict(pdu.content),
            "prev_events": refs(pdu.prev_event_ids), "auth_events": refs(pdu.auth_event_ids),
            "depth": pdu.depth, "origin_server_ts": pdu.origin_server_ts,
            "hashes": {}, "signatures": {}, "unsigned": {}, "room_id": room_id,
        }  # fmt: skip
        if version.event_format == 1:
            data["event_id"] = our_id
        if pdu.state_key is not None:
            data["state_key"] = pdu.state_key
        hashed_create = version.msc4291_room_ids_as_hashes and pdu.type == "m.room.create"
        if hashed_create:
            del data["room_id"]
        event = make_event_from_dict(data, version)
        if hashing_differences is not None:
            hashing_differences += compare_hashing(room.version, version, data, event.event_id)
        if hashed_create:
            room_id = "!" + event.event_id[1:]
        ids[our_id] = event.event_id
        events[event.event_id] = event
    return ids, events


#: One signing key for both sides: ed25519 signatures are deterministic.
_SEED = "YJDBA9Xnr2sVqXD9Vj7XVUnmFZcZrlw8Md7kMW+3XA1"


def compare_hashing(ours: Any, theirs: Any, data: dict[str, Any], their_id: str) -> list[str]:
    """Event id, content hash and signature of one event, by both (none
    for an event canonical JSON refuses: floats from version 6)."""
    try:
        return _compare_hashing(ours, theirs, data, their_id)
    except CanonicalJsonError:
        return []


def _compare_hashing(ours: Any, theirs: Any, data: dict[str, Any], their_id: str) -> list[str]:
    differences = []
    if theirs.event_format != 1 and event_id_of(ours, data) != their_id:
        differences.append(f"event id of {data['type']}: {event_id_of(ours, data)} {their_id}")
    _, digest = compute_content_hash(dict(data), hashlib.sha256)
    if content_hash(ours, data) != encode_base64(digest):
        differences.append(f"content hash of {data['type']}")
    key = SigningKey("1", decode_base64(_SEED))
    their_key = decode_signing_key_base64("ed25519", "1", _SEED)
    signed = sign_event(ours, data, "domain", key)
    their_hashed = {**data, "hashes": {"sha256": encode_base64(digest)}}
    their_signature = compute_event_signature(theirs, their_hashed, "domain", their_key)
    if signed["signatures"]["domain"] != their_signature["domain"]:
        differences.append(f"signature of {data['type']}")
    return differences


def _run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never waits (our store answers at once)."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError("Synapse's resolution waited on something")


class _Clock:
    async def sleep(self, duration: Any) -> None:
        return None


class _Store:
    """Synapse's state resolution store over our events and our auth
    difference."""

    def __init__(self, room: Room, ids: dict[str, str], events: dict[str, Any]) -> None:
        self.room, self.ids, self.events = room, ids, events
        self.ours = {theirs: ours for ours, theirs in ids.items()}

    async def get_events(self, event_ids: Any, allow_rejected: bool = False) -> dict[str, Any]:
        return {e: self.events[e] for e in event_ids if e in self.events}

    async def get_auth_chain_difference(
        self, room_id: str, state_sets: Any, conflicted_state: Any = None, additional: Any = None
    ) -> StateDifference:
        sets = [{("", self.ours[e]): self.ours[e] for e in s} for s in state_sets]
        difference = {self.ids[e] for e in auth_difference(sets, self.room.events)}
        subgraph = None
        if conflicted_state is not None:
            ours = {self.ours[e] for e in conflicted_state}
            subgraph = {self.ids[e] for e in conflicted_subgraph(ours, self.room.events)}
        return StateDifference(auth_difference=difference, conflicted_subgraph=subgraph)


def compare_state(room: Room, tips: list[str]) -> str | None:
    """None when both resolve the branches alike (or Synapse fails on the
    graph, which it does for some invalid events in its iterative checks),
    else what differs."""
    ids, events = synapse_events(room)
    ours_of = {theirs: ours for ours, theirs in ids.items()}
    sets = [room.state_after[t] for t in tips]
    ours = resolve_state(room.version, sets, room.events)
    version = SYNAPSE_VERSIONS[room.version.identifier]
    their_sets = [{k: ids[v] for k, v in s.items()} for s in sets]
    room_id = next(iter(events.values())).room_id
    if room.version.identifier == "1":

        async def fetch(wanted: Any) -> dict[str, Any]:
            return {e: events[e] for e in wanted if e in events}

        resolution = synapse_v1.resolve_events_with_store(room_id, version, their_sets, None, fetch)
    else:
        store = _Store(room, ids, events)
        resolution = synapse_v2.resolve_events_with_store(
            _Clock(), room_id, version, their_sets, None, store
        )
    try:
        resolved = _run(resolution)
    except SynapseError:  # e.g. version 12 power levels naming a creator: Synapse raises
        return None
    theirs = {k: ours_of[v] for k, v in resolved.items()}
    if theirs == ours:
        return None
    return repr({k: (ours.get(k), theirs.get(k)) for k in ours.keys() | theirs.keys()
                 if ours.get(k) != theirs.get(k)})  # fmt: skip


def compare_auth(room: Room) -> list[str]:
    """What differs between the two rules for each event, against the
    state before it (Synapse's crashes on values it cannot read, and float
    levels from version 6, which canonical JSON refuses first, are left out)."""
    ids, events = synapse_events(room)
    differences = []
    for our_id in sorted(room.events):
        event = room.events[our_id]
        if event.type == "m.room.create":
            continue
        state = room.state(event.prev_event_ids[0])
        keys = auth_types_for_event(room.version, event) | {("m.room.create", "")}
        auth = [events[ids[state[k].event_id]] for k in keys if k in state]
        try:
            authorise(room.version, event, state)
            ours = None
        except EventAuthError as e:
            ours = e.reason
        try:
            synapse.event_auth.check_state_dependent_auth_rules(events[ids[our_id]], auth)
            theirs = None
        except SynapseAuthError as e:
            theirs = str(e)
        except SynapseError as e:  # a 400: refused as malformed
            theirs = str(e)
        except (ValueError, TypeError):
            continue
        floats = "1.5" in repr(event.content) and room.version.strict_canonical_json
        if (ours is None) != (theirs is None) and not floats:
            differences.append(
                f"{event.type} {dict(event.content)}: ours {ours!r}, theirs {theirs!r}"
            )
    return differences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--versions", default=",".join(str(n) for n in range(1, 13)))
    parser.add_argument("--check", default="state,auth,hashing")
    args = parser.parse_args()
    failed = False
    for version in args.versions.split(","):
        for check in args.check.split(","):
            rng = random.Random(args.seed)
            differences: list[str] = []
            for _ in range(args.cases):
                checked = 0.8 if check == "state" else 0.0
                room, tips = random_room(version, rng, rng.randrange(25), checked)
                if check == "state":
                    difference = compare_state(room, tips)
                    differences += [difference] if difference else []
                elif check == "hashing":
                    synapse_events(room, differences)
                else:
                    differences += compare_auth(room)
            print(f"version {version:>2} {check:5}: {args.cases} rooms, {len(differences)} differ")
            for difference in differences[:3]:
                print("   ", difference)
            failed = failed or bool(differences)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
