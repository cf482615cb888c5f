"""An auth chain index: auth chains and auth differences answered from
chain positions instead of walking every event (issue 30's "chain cover
index"), as plain values the storage persists as rows
(``event_auth_chains``, ``event_auth_chain_links``).

Each event gets a position ``(chain, sequence)``. An event continues the
chain of its auth event of the same state key when that event is the
chain's newest (so a run of power levels changes, or of one user's
memberships, is one chain); otherwise it starts a chain. Within a chain
every event is in the auth chain of the later ones, so "which events of
chain C does X reach" is one number: the highest sequence reached. Each
auth event in another chain is a **link** ``(origin sequence) -> (chain,
sequence)``; the events reached from a set of events are the closure of
their positions over the links, one number per chain. The auth difference
of state sets is then, per chain, the sequences between the lowest and the
highest that the sets reach.

The pure functions (:func:`place`, :func:`reach`, :func:`difference_ranges`,
:func:`auth_order`) are what the storage and :class:`AuthChainIndex` (the
in-memory index of tests and benchmarks) share.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence

from synapse_lite.event_graph.pdu import Pdu, StateKey

#: ``(chain id, sequence number)``; sequences start at 1.
Position = tuple[int, int]
#: A link out of a chain: ``(origin sequence, target chain, target sequence)``.
Link = tuple[int, int, int]


def place(
    auth_positions: Sequence[tuple[Position, bool]], new_chain: int
) -> tuple[Position, list[Link]]:
    """The position of an event and its links, from its auth events'
    positions, each with whether the event may continue that auth event's
    chain (same state key, same room, and the chain's newest event). It
    continues the first such chain, else starts ``new_chain`` at 1; every
    auth event in another chain is a link."""
    position = next(
        ((chain, sequence + 1) for (chain, sequence), extends in auth_positions if extends),
        (new_chain, 1),
    )
    links = [
        (position[1], chain, sequence)
        for (chain, sequence), _ in auth_positions
        if chain != position[0]
    ]
    return position, links


def reach(starts: Iterable[Position], links: Mapping[int, Sequence[Link]]) -> dict[int, int]:
    """The highest sequence of each chain that the events at ``starts``
    (included) reach by auth events. ``links`` holds the links out of
    every chain reached, each chain's in ascending origin sequence (a chain
    missing from it has none)."""
    reached: dict[int, int] = {}
    todo: list[int] = []
    for chain, sequence in starts:
        if reached.get(chain, 0) < sequence:
            reached[chain] = sequence
            todo.append(chain)
    followed: dict[int, int] = {}
    while todo:
        chain = todo.pop()
        out = links.get(chain, ())
        index, highest = followed.get(chain, 0), reached[chain]
        while index < len(out) and out[index][0] <= highest:
            _, target, sequence = out[index]
            if reached.get(target, 0) < sequence:
                reached[target] = sequence
                todo.append(target)
            index += 1
        followed[chain] = index
    return reached


def combine(*reaches: Mapping[int, int]) -> dict[int, int]:
    """The reach of the union of the events of ``reaches`` (per chain, the
    highest: what an event reaches in a chain is a prefix of it)."""
    combined: dict[int, int] = {}
    for reached in reaches:
        for chain, sequence in reached.items():
            if combined.get(chain, 0) < sequence:
                combined[chain] = sequence
    return combined


def difference_ranges(reaches: Sequence[Mapping[int, int]]) -> dict[int, tuple[int, int]]:
    """The auth difference of sets that reach ``reaches``, as per-chain
    sequence ranges ``(low, high]``: between the lowest and the highest
    any set reaches (chains all sets reach equally are left out)."""
    ranges: dict[int, tuple[int, int]] = {}
    for chain in set().union(*reaches):
        highs = [r.get(chain, 0) for r in reaches]
        low, high = min(highs), max(highs)
        if low < high:
            ranges[chain] = (low, high)
    return ranges


def auth_order(
    events: Sequence[tuple[str, Sequence[str]]],
) -> list[str]:
    """``events`` (id, auth event ids) in an order where each comes after
    its auth events among them, else in the given order (auth events not
    among them are ignored; a cycle, which no valid room has, is broken by
    taking the earliest waiting event)."""
    rank = {event_id: i for i, (event_id, _) in enumerate(events)}
    children: dict[str, list[str]] = {event_id: [] for event_id, _ in events}
    waiting: dict[str, int] = {}
    for event_id, auth_ids in events:
        parents = {a for a in auth_ids if a in rank and a != event_id}
        waiting[event_id] = len(parents)
        for parent in parents:
            children[parent].append(event_id)
    ready = [rank[e] for e, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    ordered: list[str] = []
    done: set[str] = set()
    pending = 0  # the next event in the given order (for breaking cycles)
    while len(ordered) < len(events):
        if not ready:
            while events[pending][0] in done:
                pending += 1
            heapq.heappush(ready, pending)
            waiting[events[pending][0]] = 0
        event_id = events[heapq.heappop(ready)][0]
        if event_id in done:
            continue
        done.add(event_id)
        ordered.append(event_id)
        for child in children[event_id]:
            waiting[child] -= 1
            if waiting[child] == 0 and child not in done:
                heapq.heappush(ready, rank[child])
    return ordered


class AuthChainIndex:
    """Positions and links of a room's events, in memory; add events after
    their auth events (``KeyError`` names an auth event not yet added)."""

    def __init__(self) -> None:
        self.positions: dict[str, Position] = {}
        #: The events of each chain, by sequence - 1.
        self.chains: dict[int, list[str]] = {}
        self._chain_keys: dict[int, StateKey | None] = {}
        #: Links out of each chain, in ascending origin sequence.
        self.links: dict[int, list[Link]] = {}

    def add(self, event: Pdu) -> Position:
        """Index ``event``; returns its position."""
        if event.event_id in self.positions:
            return self.positions[event.event_id]
        auth_positions = []
        for auth_id in event.auth_event_ids:
            if auth_id not in self.positions:
                raise KeyError(f"auth event {auth_id} of {event.event_id} is not indexed")
            chain, sequence = self.positions[auth_id]
            extends = self._chain_keys[chain] == event.state_pair and sequence == len(
                self.chains[chain]
            )
            auth_positions.append(((chain, sequence), extends))
        position, links = place(auth_positions, len(self.chains) + 1)
        chain = position[0]
        if chain not in self.chains:
            self.chains[chain] = []
            self._chain_keys[chain] = event.state_pair
        self.chains[chain].append(event.event_id)
        self.positions[event.event_id] = position
        self.links.setdefault(chain, []).extend(links)
        return position

    def reach(self, event_ids: Iterable[str]) -> dict[int, int]:
        """The highest sequence of each chain that ``event_ids`` (included)
        reach by auth events."""
        return reach((self.positions[e] for e in event_ids), self.links)

    def auth_chain(self, event_ids: Iterable[str]) -> set[str]:
        """The auth chain of ``event_ids``: what their auth events reach."""
        auth_ids = set()
        for event_id in event_ids:
            chain, sequence = self.positions[event_id]
            if sequence > 1:
                auth_ids.add(self.chains[chain][sequence - 2])
            for _, target, target_sequence in self._links_at(chain, sequence):
                auth_ids.add(self.chains[target][target_sequence - 1])
        return self._events(self.reach(auth_ids))

    def _links_at(self, chain: int, sequence: int) -> list[Link]:
        return [link for link in self.links.get(chain, []) if link[0] == sequence]

    def _events(self, reached: Mapping[int, int]) -> set[str]:
        return {e for chain, highest in reached.items() for e in self.chains[chain][:highest]}

    def auth_difference(self, state_sets: Sequence[Mapping[StateKey, str]]) -> set[str]:
        """What :func:`state_resolution.auth_difference` computes (each set's
        events with their auth chains; their union less their
        intersection), from positions: per chain, the sequences between
        the lowest and the highest any set reaches."""
        ranges = difference_ranges([self.reach(state.values()) for state in state_sets])
        difference: set[str] = set()
        for chain, (low, high) in ranges.items():
            difference.update(self.chains[chain][low:high])
        return difference
