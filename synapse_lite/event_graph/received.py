"""What becomes of an event received from another server: the spec's three
authorisation checks (server-server API, "Checks performed on receipt of a
PDU", 4-6) as one pure function over plain values.

1. against the event's own ``auth_events`` (and the rules on auth events):
   failure means **rejected**;
2. against the state before the event (resolved from its prev events):
   failure means **rejected**;
3. against the room's current state: failure means **soft-failed**.

An outlier (its state before unknown) gets the first check only. The storage
persists the outcome (docs/event-graph.md, "Rejected, soft-failed and
outliers"); the callers load the events these read.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import attr

from synapse_lite.api.room_versions import RoomVersion
from synapse_lite.event_graph.authorisation import (
    CREATE,
    EventAuthError,
    auth_events_state,
    auth_types_for_event,
    authorise,
)
from synapse_lite.event_graph.pdu import Pdu, StateKey


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ReceivedOutcome:
    """The verdict on a received event: at most one reason is set; neither
    means it is accepted."""

    #: Why it is rejected (check 1 or 2 failed).
    rejected: str | None = None
    #: Why it is soft-failed (check 3 failed).
    soft_failed: str | None = None

    @property
    def accepted(self) -> bool:
        return self.rejected is None and self.soft_failed is None


def needed_state_keys(room_version: RoomVersion, event: Pdu) -> set[StateKey]:
    """The state keys the checks against a state read (the rules read no
    other): what a caller loads of the state before and the current state."""
    return auth_types_for_event(room_version, event) | {CREATE}


def received_outcome(
    room_version: RoomVersion,
    event: Pdu,
    auth_events: Mapping[str, Pdu],
    rejected: Collection[str],
    state_before: Mapping[StateKey, Pdu] | None,
    current_state: Mapping[StateKey, Pdu] | None,
) -> ReceivedOutcome:
    """The outcome of ``event`` (already checked for format, hashes and
    signatures by the caller).

    ``auth_events``: the stored events among its ``auth_events`` (event id
    -> Pdu; one missing rejects it: the caller fetches what it can first);
    ``rejected``: which stored events were rejected (an auth event that was
    rejects it). ``state_before`` and ``current_state``: at least the keys
    of :func:`needed_state_keys`; ``state_before`` None for an outlier
    (only the first check is made), ``current_state`` None when the room
    has none yet (its create event). In version 12 the create event is
    taken from the state given (it is no auth event there)."""
    missing = [a for a in event.auth_event_ids if a not in auth_events]
    if missing:
        return ReceivedOutcome(rejected=f"auth events not known: {', '.join(missing)}")
    create = None
    for state in (state_before, current_state):
        if create is None and state is not None:
            create = state.get(CREATE)
    try:
        own = auth_events_state(
            room_version,
            event,
            [auth_events[a] for a in event.auth_event_ids],
            create=create,
            rejected=rejected,
        )
        authorise(room_version, event, own)
    except EventAuthError as e:
        return ReceivedOutcome(rejected=f"against its auth events: {e.reason}")
    if state_before is not None:
        try:
            authorise(room_version, event, _with_own_create(state_before, own))
        except EventAuthError as e:
            return ReceivedOutcome(rejected=f"against the state before it: {e.reason}")
    if state_before is not None and current_state is not None:
        try:
            authorise(room_version, event, _with_own_create(current_state, own))
        except EventAuthError as e:
            return ReceivedOutcome(soft_failed=f"against the current state: {e.reason}")
    return ReceivedOutcome()


def _with_own_create(
    state: Mapping[StateKey, Pdu], own: Mapping[StateKey, Pdu]
) -> Mapping[StateKey, Pdu]:
    """``state``, with the create event of the event's own auth events where
    ``state`` has none (the create event's own check reads no state)."""
    if CREATE in state or CREATE not in own:
        return state
    return {**state, CREATE: own[CREATE]}
