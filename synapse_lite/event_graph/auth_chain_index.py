"""An auth chain index: auth chains and auth differences answered from
chain positions instead of walking every event (issue 30's "chain cover
index"), as plain in-memory data the storage persists as rows.

Each event gets a position ``(chain, sequence)``. An event continues the
chain of its auth event of the same state key when that event is the
chain's newest (so a run of topic changes, or of one user's memberships,
is one chain); otherwise it starts a chain. Within a chain every event is
in the auth chain of the later ones, so "which events of chain C does X
reach" is one number: the highest sequence reached. Each auth event in
another chain is a **link** ``(origin sequence) -> (chain, sequence)``; the
events reached from a set of events are the closure of their positions
over the links, one number per chain. The auth difference of state sets is
then, per chain, the sequences between the lowest and the highest that the
sets reach.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from synapse_lite.event_graph.pdu import Pdu, StateKey

#: ``(chain id, sequence number)``; sequences start at 1.
Position = tuple[int, int]


class AuthChainIndex:
    """Positions and links of a room's events; add events after their auth
    events (``KeyError`` names an auth event not yet added)."""

    def __init__(self) -> None:
        self.positions: dict[str, Position] = {}
        #: The events of each chain, by sequence - 1.
        self.chains: dict[int, list[str]] = {}
        self._chain_keys: dict[int, StateKey | None] = {}
        #: Links out of each chain: (origin sequence, target chain, target
        #: sequence), in ascending origin sequence.
        self.links: dict[int, list[tuple[int, int, int]]] = {}

    def add(self, event: Pdu) -> Position:
        """Index ``event``; returns its position."""
        if event.event_id in self.positions:
            return self.positions[event.event_id]
        auth_positions = []
        for auth_id in event.auth_event_ids:
            if auth_id not in self.positions:
                raise KeyError(f"auth event {auth_id} of {event.event_id} is not indexed")
            auth_positions.append(self.positions[auth_id])
        chain = None
        for chain_id, sequence in auth_positions:
            events = self.chains[chain_id]
            if self._chain_keys[chain_id] == event.state_pair and sequence == len(events):
                chain = chain_id
                break
        if chain is None:
            chain = len(self.chains) + 1
            self.chains[chain] = []
            self._chain_keys[chain] = event.state_pair
        self.chains[chain].append(event.event_id)
        position = (chain, len(self.chains[chain]))
        self.positions[event.event_id] = position
        links = self.links.setdefault(chain, [])
        for target_chain, target_sequence in auth_positions:
            if target_chain != chain:
                links.append((position[1], target_chain, target_sequence))
        return position

    def reach(self, event_ids: Iterable[str]) -> dict[int, int]:
        """The highest sequence of each chain that ``event_ids`` (included)
        reach by auth events."""
        reached: dict[int, int] = {}
        todo: list[int] = []
        for event_id in event_ids:
            chain, sequence = self.positions[event_id]
            if reached.get(chain, 0) < sequence:
                reached[chain] = sequence
                todo.append(chain)
        followed: dict[int, int] = {}
        while todo:
            chain = todo.pop()
            links = self.links.get(chain, [])
            index, highest = followed.get(chain, 0), reached[chain]
            while index < len(links) and links[index][0] <= highest:
                _, target, sequence = links[index]
                if reached.get(target, 0) < sequence:
                    reached[target] = sequence
                    todo.append(target)
                index += 1
            followed[chain] = index
        return reached

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

    def _links_at(self, chain: int, sequence: int) -> list[tuple[int, int, int]]:
        return [link for link in self.links.get(chain, []) if link[0] == sequence]

    def _events(self, reached: Mapping[int, int]) -> set[str]:
        return {e for chain, highest in reached.items() for e in self.chains[chain][:highest]}

    def auth_difference(self, state_sets: Sequence[Mapping[StateKey, str]]) -> set[str]:
        """What :func:`state_resolution.auth_difference` computes (each set's
        events with their auth chains; their union less their
        intersection), from positions: per chain, the sequences between
        the lowest and the highest any set reaches."""
        reached = [self.reach(state.values()) for state in state_sets]
        difference: set[str] = set()
        for chain in set().union(*reached):
            highs = [r.get(chain, 0) for r in reached]
            low, high = min(highs), max(highs)
            difference.update(self.chains[chain][low:high])
        return difference
