"""State resolution: the state of a room where branches of its graph meet
(room versions, "State resolution"). Version 1's original algorithm, and
v2 (versions 2-11) with version 12's changes.

Pure: state sets (state key -> event id) and the events they need in,
the resolved state out. ``events`` must hold every event of the state
sets and of their auth chains (:class:`MissingEventsError` names any
missing); ``rejected`` names events rejected by their own auth events,
which the iterative auth checks never fall back on. The auth difference
can be given by the caller as a plain set (the storage computes it from
its auth chain index) instead of being computed by walking ``events``.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import ChainMap
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence, Set

from synapse_lite.api.room_versions import RoomVersion, StateResolution
from synapse_lite.event_graph.authorisation import (
    CREATE,
    POWER_LEVELS,
    EventAuthError,
    auth_types_for_event,
    authorise,
    creators,
)
from synapse_lite.event_graph.pdu import Pdu, StateKey

#: A state: state key -> event id.
StateMap = Mapping[StateKey, str]


class MissingEventsError(KeyError):
    """Events the resolution needs are not in ``events``."""

    def __init__(self, event_ids: Iterable[str]) -> None:
        self.event_ids = sorted(event_ids)
        super().__init__(f"events missing for state resolution: {self.event_ids[:10]}")


def resolve_state(
    room_version: RoomVersion,
    state_sets: Sequence[StateMap],
    events: Mapping[str, Pdu],
    rejected: Collection[str] = (),
    indexed_auth_difference: Set[str] | None = None,
) -> dict[StateKey, str]:
    """The resolution of ``state_sets`` by the algorithm of ``room_version``
    (the same whatever their order). ``indexed_auth_difference``, when given, must
    be :func:`auth_difference` of ``state_sets`` (e.g. from the auth chain
    index); v1 does not use it."""
    if not state_sets:
        return {}
    if room_version.state_resolution is StateResolution.V1:
        return resolve_state_v1(room_version, state_sets, events)
    return resolve_state_v2(room_version, state_sets, events, rejected, indexed_auth_difference)


def separate(
    state_sets: Sequence[StateMap],
) -> tuple[dict[StateKey, str], dict[StateKey, set[str]]]:
    """The unconflicted state map (keys with the same event in every set)
    and the conflicted events by key (v2's definition: a key missing from
    some set is conflicted)."""
    unconflicted: dict[StateKey, str] = {}
    conflicted: dict[StateKey, set[str]] = {}
    keys = set().union(*(s.keys() for s in state_sets))
    for key in keys:
        values = {s.get(key) for s in state_sets}
        present = {v for v in values if v is not None}
        if len(values) == 1 and len(present) == 1:
            unconflicted[key] = present.pop()
        else:
            conflicted[key] = present
    return unconflicted, conflicted


def _event(events: Mapping[str, Pdu], event_id: str) -> Pdu:
    try:
        return events[event_id]
    except KeyError:
        raise MissingEventsError([event_id]) from None


def auth_chain(event_ids: Iterable[str], events: Mapping[str, Pdu]) -> set[str]:
    """Every event reachable from ``event_ids`` by ``auth_events`` links
    (not the events themselves, unless reachable)."""
    chain: set[str] = set()
    todo = [a for e in event_ids for a in _event(events, e).auth_event_ids]
    while todo:
        event_id = todo.pop()
        if event_id not in chain:
            chain.add(event_id)
            todo.extend(_event(events, event_id).auth_event_ids)
    return chain


def auth_difference(state_sets: Sequence[StateMap], events: Mapping[str, Pdu]) -> set[str]:
    """The union of the full auth chains of the state sets less their
    intersection (a set's full auth chain: the auth chains of its events,
    with the events themselves)."""
    chains = []
    for state in state_sets:
        ids = set(state.values())
        chains.append(auth_chain(ids, events) | ids)
    common = set(chains[0]).intersection(*chains[1:])
    return set().union(*chains) - common


def conflicted_subgraph(conflicted: set[str], events: Mapping[str, Pdu]) -> set[str]:
    """Version 12's conflicted state subgraph: the events on ``auth_events``
    paths between conflicted events (the endpoints included)."""
    # Events reachable from the conflicted set, then those of them from
    # which a conflicted event is reachable, in post-order (auth events
    # first) so that each is decided after its auth events.
    reaches: dict[str, bool] = {}
    for start in conflicted:
        stack: list[tuple[str, bool]] = [(start, False)]
        while stack:
            event_id, expanded = stack.pop()
            if expanded:
                auth_ids = _event(events, event_id).auth_event_ids
                reaches[event_id] = event_id in conflicted or any(reaches[a] for a in auth_ids)
                continue
            if event_id in reaches:
                continue
            reaches[event_id] = False  # in progress: a cycle reaches nothing through itself
            stack.append((event_id, True))
            stack.extend((a, False) for a in _event(events, event_id).auth_event_ids)
    return {e for e, r in reaches.items() if r}


def is_power_event(event: Pdu) -> bool:
    """Power levels, join rules, and kicks and bans (not the create event,
    which is in every state)."""
    if event.state_key is None:
        return False
    if event.type in ("m.room.power_levels", "m.room.join_rules"):
        return True
    return (
        event.type == "m.room.member"
        and event.membership in ("leave", "ban")
        and event.sender != event.state_key
    )


def resolve_state_v2(
    room_version: RoomVersion,
    state_sets: Sequence[StateMap],
    events: Mapping[str, Pdu],
    rejected: Collection[str],
    indexed_auth_difference: Set[str] | None,
) -> dict[StateKey, str]:
    """State resolution v2 (and, for version 12, v2 with its changes); the
    arguments are :func:`resolve_state`'s."""
    unconflicted, conflicted_by_key = separate(state_sets)
    if not conflicted_by_key:
        return unconflicted
    conflicted = set().union(*conflicted_by_key.values())
    full = conflicted | (
        indexed_auth_difference
        if indexed_auth_difference is not None
        else auth_difference(state_sets, events)
    )
    v12 = room_version.state_resolution is StateResolution.V2_1
    if v12:
        full |= conflicted_subgraph(conflicted, events)
    missing = [e for e in full if e not in events]
    if missing:
        raise MissingEventsError(missing)
    # The room's own events only: an auth chain that reaches into another
    # room (an event citing another room's auth events, rejected itself)
    # must not bring that room's state in (MSC4307).
    create = events.get(unconflicted.get(CREATE, ""))
    room_id = create.room_id if create is not None else None
    checker = _IterativeAuth(room_version, events, rejected, room_id)

    power = {e for e in full if is_power_event(events[e])}
    power |= auth_chain(power, events) & full
    ordered_power = checker.reverse_topological_power_order(power)
    resolved = checker.apply({} if v12 else dict(unconflicted), ordered_power)

    others = sorted(full - power)
    ordered_others = checker.mainline_order(others, resolved.get(POWER_LEVELS))
    resolved = checker.apply(resolved, ordered_others)
    resolved.update(unconflicted)
    return resolved


class _IterativeAuth:
    """The orderings and iterative auth checks of state resolution v2."""

    def __init__(
        self,
        room_version: RoomVersion,
        events: Mapping[str, Pdu],
        rejected: Collection[str],
        room_id: str | None = None,
    ) -> None:
        """``room_id``: the room resolved (None: unknown); an event of
        another room never enters its state."""
        self.room_version = room_version
        self.events = events
        self.rejected = rejected
        self.room_id = room_id
        self._power: dict[str, float] = {}

    def _auth_event_of_type(self, event: Pdu, key: StateKey) -> Pdu | None:
        for auth_id in event.auth_event_ids:
            auth_event = self.events.get(auth_id)
            if auth_event is not None and auth_event.state_pair == key:
                return auth_event
        return None

    def _create_of(self, event: Pdu) -> Pdu | None:
        """The create event of ``event``'s room (version 12 names it by the
        room id, earlier versions cite it as an auth event)."""
        if self.room_version.hashed_room_ids:
            return self.events.get("$" + event.room_id[1:])
        return self._auth_event_of_type(event, CREATE)

    def sender_power(self, event: Pdu) -> float:
        """The sender's power level by the event's own auth events."""
        if event.event_id in self._power:
            return self._power[event.event_id]
        create = self._create_of(event)
        room_creators = creators(self.room_version, create) if create is not None else frozenset()
        levels = self._auth_event_of_type(event, POWER_LEVELS)
        level: float
        if self.room_version.hashed_room_ids and event.sender in room_creators:
            level = float("inf")
        elif levels is None:
            level = 100 if event.sender in room_creators else 0
        else:
            users = levels.content.get("users")
            raw = users.get(event.sender) if isinstance(users, dict) else None
            if raw is None:
                raw = levels.content.get("users_default", 0)
            try:
                level = int(raw)
            except (TypeError, ValueError):
                level = 0
        self._power[event.event_id] = level
        return level

    def reverse_topological_power_order(self, event_ids: set[str]) -> list[str]:
        """Kahn's algorithm over the auth DAG of ``event_ids``, taking among
        the ready events the one of the most powerful sender, then the
        earliest ``origin_server_ts``, then the least event id."""
        children: dict[str, list[str]] = {e: [] for e in event_ids}
        waiting: dict[str, int] = {}
        for event_id in event_ids:
            parents = {a for a in self.events[event_id].auth_event_ids if a in event_ids}
            waiting[event_id] = len(parents)
            for parent in parents:
                children[parent].append(event_id)

        def key(event_id: str) -> tuple[float, int, str]:
            event = self.events[event_id]
            return (-self.sender_power(event), event.origin_server_ts, event_id)

        ready = [key(e) for e, n in waiting.items() if n == 0]
        heapq.heapify(ready)
        ordered = []
        while ready:
            event_id = heapq.heappop(ready)[2]
            ordered.append(event_id)
            for child in children[event_id]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    heapq.heappush(ready, key(child))
        return ordered

    def mainline_order(self, event_ids: list[str], power_levels_id: str | None) -> list[str]:
        """``event_ids`` by their mainline position based on the power levels
        event ``power_levels_id`` (earliest first), then
        ``origin_server_ts``, then event id."""
        mainline: dict[str, int] = {}
        current = self.events.get(power_levels_id) if power_levels_id is not None else None
        while current is not None:
            mainline[current.event_id] = len(mainline)
            current = self._auth_event_of_type(current, POWER_LEVELS)
        beyond = len(mainline)  # "infinity": before every mainline position

        position_of: dict[str, int] = {}

        def position(event: Pdu) -> int:
            seen = []
            current = self._auth_event_of_type(event, POWER_LEVELS)
            found = beyond
            while current is not None:
                if current.event_id in mainline:
                    found = mainline[current.event_id]
                    break
                if current.event_id in position_of:
                    found = position_of[current.event_id]
                    break
                seen.append(current.event_id)
                current = self._auth_event_of_type(current, POWER_LEVELS)
            for event_id in seen:
                position_of[event_id] = found
            return found

        def key(event_id: str) -> tuple[int, int, str]:
            event = self.events[event_id]
            return (-position(event), event.origin_server_ts, event_id)

        return sorted(event_ids, key=key)

    def apply(self, state: dict[StateKey, str], ordered: list[str]) -> dict[StateKey, str]:
        """The iterative auth checks: each event of ``ordered`` that the
        rules allow, against ``state`` (falling back on its own auth events
        that were not rejected for keys ``state`` lacks), replaces its key."""
        state = dict(state)
        for event_id in ordered:
            event = self.events[event_id]
            if event.state_pair is None:
                continue
            if self.room_id is not None and event.room_id != self.room_id:
                continue
            auth_state: dict[StateKey, Pdu] = {}
            for auth_id in event.auth_event_ids:
                auth_event = self.events.get(auth_id)
                if (
                    auth_event is not None
                    and auth_event.state_pair is not None
                    and auth_id not in self.rejected
                ):
                    auth_state[auth_event.state_pair] = auth_event
            for key in auth_types_for_event(self.room_version, event) | {CREATE}:
                if key in state:
                    auth_state[key] = self.events[state[key]]
            if CREATE not in auth_state and event.type != "m.room.create":
                create = self._create_of(event)
                if create is not None:
                    auth_state[CREATE] = create
            try:
                authorise(self.room_version, event, auth_state)
            except EventAuthError:
                continue
            state[event.state_pair] = event_id
        return state


class _StateEvents(Mapping[StateKey, Pdu]):
    """A state of event ids read as events, without copying it (the rules
    read a handful of its keys)."""

    def __init__(self, state: Mapping[StateKey, str], events: Mapping[str, Pdu]) -> None:
        self._state = state
        self._events = events

    def __getitem__(self, key: StateKey) -> Pdu:
        return self._events[self._state[key]]

    def __iter__(self) -> Iterator[StateKey]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)


def _sha1(event_id: str) -> bytes:
    return hashlib.sha1(event_id.encode("utf-8")).digest()


def resolve_state_v1(
    room_version: RoomVersion, state_sets: Sequence[StateMap], events: Mapping[str, Pdu]
) -> dict[StateKey, str]:
    """Version 1's algorithm: conflicts of power levels, join rules and
    members (in that order) by ascending depth, each applied while the
    rules allow; other conflicts by the highest depth (then lowest SHA-1 of
    the id) that the rules allow (the lowest depth when none is allowed).
    Where the spec is open (the state each key of a kind is checked
    against; no allowed event) this reads it as the reference homeserver
    does, see docs/event-graph.md."""
    resolved: dict[StateKey, str] = {}
    conflicted: dict[StateKey, set[str]] = {}
    for key in set().union(*(s.keys() for s in state_sets)):
        values = {s[key] for s in state_sets if key in s}
        if len(values) == 1:
            resolved[key] = values.pop()
        else:
            conflicted[key] = values
    missing = [e for ids in conflicted.values() for e in ids if e not in events]
    missing += [e for e in resolved.values() if e not in events]
    if missing:
        raise MissingEventsError(missing)

    def allowed(event_id: str, state: Mapping[StateKey, str]) -> bool:
        try:
            authorise(room_version, events[event_id], _StateEvents(state, events))
        except EventAuthError:
            return False
        return True

    auth_kinds = ("m.room.power_levels", "m.room.join_rules", "m.room.member")
    for kind in auth_kinds:
        # Each key of a kind is resolved against the state as it was before
        # the kind's pass (a key's result is not seen by the other keys of
        # its kind), so the order of the keys does not matter.
        # (The key's candidate is laid over that state, not copied into it:
        # a room's state can hold 100,000 members.)
        before = dict(resolved)
        for key in (k for k in conflicted if k[0] == kind):
            ordered = sorted(
                conflicted[key],
                key=lambda e: (events[e].depth, tuple(-b for b in _sha1(e))),
            )
            candidate = {key: ordered[0]}
            state = ChainMap(candidate, before)
            for event_id in ordered[1:]:
                if not allowed(event_id, state):
                    break
                candidate[key] = event_id
            resolved[key] = candidate[key]
    for key in (k for k in conflicted if k[0] not in auth_kinds):
        ordered = sorted(conflicted[key], key=lambda e: (-events[e].depth, _sha1(e)))
        resolved[key] = next((e for e in ordered if allowed(e, resolved)), ordered[-1])
    return resolved
