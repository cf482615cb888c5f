"""The shape of a room graph around one new event: which parents a local
event names, its depth, the forward extremities after it, the state after
it. Small pure rules the writer's persist path applies."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from synapse_lite.event_graph.pdu import Pdu, StateKey

#: How many parents a local event names at most: concurrent branches merge
#: on the next local event, and a room with many extremities merges them
#: over several events instead of one huge one.
MAX_PREV_EVENTS = 10
#: The largest depth the spec allows (a signed 64-bit integer).
MAX_DEPTH = 2**63 - 1


def prev_events_for_new_event(
    extremities: Mapping[str, int], limit: int = MAX_PREV_EVENTS
) -> list[str]:
    """The parents of a new local event: the room's forward extremities
    (event id -> depth), the ``limit`` deepest (ties by event id, so every
    process picks the same), oldest dropped."""
    deepest = sorted(extremities, key=lambda e: (-extremities[e], e))[:limit]
    return sorted(deepest)


def depth_of_new_event(parent_depths: Iterable[int]) -> int:
    """One more than the deepest parent (1 with none), capped at the
    spec's largest depth."""
    return min(max(parent_depths, default=0) + 1, MAX_DEPTH)


def forward_extremities_after(extremities: Iterable[str], event: Pdu) -> set[str]:
    """The room's forward extremities once ``event`` joins the graph as
    a child of its prev events (the caller leaves out soft-failed events,
    which are never extremities for local events, and outliers)."""
    return (set(extremities) - set(event.prev_event_ids)) | {event.event_id}


def state_after(event: Pdu, state_before: Mapping[StateKey, str]) -> dict[StateKey, str]:
    """S'(E): the state before ``event``, with its key replaced by it when
    it is a state event."""
    state = dict(state_before)
    if event.state_pair is not None:
        state[event.state_pair] = event.event_id
    return state
