"""Filling a gap in a room's graph with the state another server gives
(docs/federation.md, "Inbound PDUs", step 7): a received event whose
parents ``get_missing_events`` could not all supply is persisted with the
state before it worked out from the states after its missing parents, as
the origin tells them with ``/state_ids`` and ``/event``.

:class:`StateGaps` runs where the PDU was received. For each missing
parent ``P`` (at most :data:`MAX_MISSING_PARENTS`):

1. ``GET /_matrix/federation/v1/state_ids/{roomId}?event_id=P``: the ids of
   the state before ``P`` and of its auth chain (lists of strings, at most
   :data:`MAX_STATE_IDS` together);
2. every one of those and ``P`` we do not have is fetched with ``GET
   /_matrix/federation/v1/event/{eventId}`` (at most :data:`MAX_FETCHED`
   for the whole gap), each checked as untrusted input: the id it has is
   the one asked for, of the room's version and within the spec's limits,
   of **this room**, signed by every server that must sign it;
3. the state after ``P`` is the state before it (each id an event of ours
   or fetched, a state event) with ``P`` itself when it is a state event;
   the writer leaves out of it every event it rejected (stored as an
   outlier checked against its own auth events): a rejected event is
   never state, whatever the origin says.

The room's events writer (:class:`StateGapWriter`, internal call
``persist_state_gap``) stores the fetched events as **outliers** (each
checked against its own auth events, as any outlier; not a missing parent
that is not a state event and that no state or auth chain names: a message
left out of the timeline as an outlier would never be shown, while left
unstored it is a hole that backfill fills), then the event with
the state before it resolved from the states after its parents, ours for
those we have and the given ones for the others (the room version's
resolution), and its outcome (rejected, soft-failed or accepted) decided
against that state as for any received event. Anything failing refuses
the event with :class:`~synapse_lite.federation.pdu_checks.PduRefused`,
and nothing of the event is stored (fetched outliers may be).
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import SynapseError
from synapse_lite.api.room_versions import RoomVersion
from synapse_lite.event_graph.pdu import StateKey
from synapse_lite.federation.pdu_checks import CheckedPdu, PduRefused, check_room_pdu
from synapse_lite.handlers.received_events import received_pdu
from synapse_lite.replication.http.federation_rooms import PERSIST_STATE_GAP, StateGap
from synapse_lite.replication.http.send_events import EventsPersisted

if TYPE_CHECKING:
    from synapse_lite.events import Event
    from synapse_lite.federation.client import FederationClient
    from synapse_lite.federation.keyring import Keyring
    from synapse_lite.handlers.message import EventCreationHandler
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: Missing parents of one event whose states are asked for.
MAX_MISSING_PARENTS = 5
#: Ids of one ``/state_ids`` answer (state and auth chain together).
MAX_STATE_IDS = 20_000
#: Events fetched with ``/event`` for one gap.
MAX_FETCHED = 500


class StateGaps:
    """Fills gaps for received PDUs (any process with the ``federation``
    resource; the room's writer persists)."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        keyring: Keyring,
        client: FederationClient,
        calls: InternalCalls,
        event_writers: Callable[[], Sequence[str]],
    ) -> None:
        self._store = store
        self._keyring = keyring
        self._client = client
        self._calls = calls
        self._event_writers = event_writers

    async def persist_filling_gap(
        self, origin: str, version: RoomVersion, pdu: CheckedPdu, missing: set[str]
    ) -> None:
        """Persist ``pdu`` (checked as a PDU of a transaction) whose parents
        ``missing`` we do not have, with the states after them ``origin``
        gives (module docstring). :class:`PduRefused` (or the request's
        :class:`FederationRequestError`) when the gap cannot be filled."""
        room_id = pdu.event.room_id
        if len(missing) > MAX_MISSING_PARENTS:
            raise PduRefused(
                f"{len(missing)} of its parents are unknown here (at most"
                f" {MAX_MISSING_PARENTS} are asked for)"
            )
        fetched: dict[str, CheckedPdu] = {}
        states: list[list[list[str]]] = []
        #: Ids some state or auth chain names: needed as outliers.
        named: set[str] = set()
        for parent in sorted(missing):
            path = f"/_matrix/federation/v1/state_ids/{_q(room_id)}?event_id={_q(parent)}"
            state_ids, auth_ids = _state_ids_answer(await self._client.get_json(origin, path))
            named.update(state_ids, auth_ids)
            wanted = sorted({*state_ids, *auth_ids, parent} - fetched.keys())
            have = await self._store.get_events(wanted)
            unknown = [i for i in wanted if i not in have]
            if len(fetched) + len(unknown) > MAX_FETCHED:
                raise PduRefused(
                    f"the state at {parent} needs more than {MAX_FETCHED} events we do not have"
                )
            for event_id in unknown:
                fetched[event_id] = await self._fetch(origin, version, room_id, event_id)
            states.append(_state_after(parent, state_ids, have, fetched))
        writer = await self._store.get_event_writer_for_room(room_id, self._event_writers())
        if writer is None:
            raise PduRefused(f"room {room_id} is not known here")
        # A parent that is not a state event (a message) is not stored as an
        # outlier: it is needed here only to tell the state after it, and an
        # outlier is never shown in the timeline (backfill leaves out events
        # held, outliers too), while a parent not stored at all is a hole
        # that paging back fills from the origin, in the timeline.
        outliers = [
            f
            for f in fetched.values()
            if f.event_id in named or f.event_id not in missing or f.event.state_key is not None
        ]
        answer = {
            "pdu": pdu.pdu,
            "outliers": [f.pdu for f in sorted(outliers, key=lambda f: f.event.depth)],
            "states": states,
        }
        await self._store.store_received_pdu(pdu.event_id, room_id, origin, pdu.pdu)
        try:
            await self._calls.call(
                PERSIST_STATE_GAP, StateGap(room_id, origin, answer), instance=writer
            )
        except SynapseError as e:
            if e.code < 500 and await self._store.get_event(pdu.event_id) is None:
                await self._store.delete_received_pdu(pdu.event_id)
            raise PduRefused(e.msg) from None

    async def _fetch(
        self, origin: str, version: RoomVersion, room_id: str, event_id: str
    ) -> CheckedPdu:
        answer = await self._client.get_json(origin, f"/_matrix/federation/v1/event/{_q(event_id)}")
        pdus = answer.get("pdus") if isinstance(answer, dict) else None
        if not isinstance(pdus, list) or len(pdus) != 1:
            raise PduRefused(f"{origin} did not answer /event/{event_id} with one event")
        found = await check_room_pdu(self._keyring, version, room_id, pdus[0])
        if found.event_id != event_id:
            raise PduRefused(f"{origin} answered /event/{event_id} with {found.event_id}")
        return found


class StateGapWriter:
    """On a room's events writer: serves :data:`PERSIST_STATE_GAP`."""

    def __init__(self, store: GenericWorkerStore, events: EventCreationHandler) -> None:
        self._store = store
        self._events = events

    async def persist(self, request: StateGap) -> EventsPersisted:
        answer = request.answer
        pdu, outliers, raw_states = answer.get("pdu"), answer.get("outliers"), answer.get("states")
        if not isinstance(pdu, dict) or pdu.get("room_id") != request.room_id:
            raise SynapseError(400, "The event is of another room")
        if not isinstance(outliers, list) or not isinstance(raw_states, list):
            raise SynapseError(400, "outliers and states must be lists")
        version = await self._store.get_room_version(request.room_id)
        for raw in outliers:
            if not isinstance(raw, dict) or raw.get("room_id") != request.room_id:
                continue
            event_id = received_pdu(version, raw).event_id
            if await self._store.get_event(event_id) is not None:
                continue
            await self._store.store_received_pdu(event_id, request.room_id, request.origin, raw)
            try:
                await self._events.persist_received_event(raw, outlier=True)
            except SynapseError as e:
                # One the rules cannot place (a create event) is left out;
                # the state that names it then cannot be resolved.
                logger.info("Event %s fetched for a gap not stored: %s", event_id, e.msg)
                await self._store.delete_received_pdu(event_id)
        states = [await self._without_rejected(_state_map(s)) for s in raw_states]
        event = await self._events.persist_received_event(pdu, given_states=states)
        return EventsPersisted([(event.event_id, event.stream_ordering)])

    async def _without_rejected(self, state: dict[StateKey, str]) -> dict[StateKey, str]:
        """A given state without the events we rejected (the outliers just
        stored among them): a rejected event is never state, whatever
        another server says (a power levels event it made up, citing only
        its own join, say); its key is then left to the resolution."""
        found = await self._store.get_events(list(state.values()))
        kept = {k: e for k, e in state.items() if e not in found or not found[e].rejected}
        if len(kept) < len(state):
            dropped = sorted(set(state.values()) - set(kept.values()))
            logger.info("Rejected events left out of a given state: %s", dropped)
        return kept


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _state_ids_answer(answer: Any) -> tuple[list[str], list[str]]:
    """``pdu_ids`` and ``auth_chain_ids`` of a ``/state_ids`` answer;
    :class:`PduRefused` unless both are lists of strings, within bounds."""
    state = answer.get("pdu_ids") if isinstance(answer, dict) else None
    chain = answer.get("auth_chain_ids") if isinstance(answer, dict) else None
    if not isinstance(state, list) or not isinstance(chain, list):
        raise PduRefused("a /state_ids answer needs lists pdu_ids and auth_chain_ids")
    if len(state) + len(chain) > MAX_STATE_IDS:
        raise PduRefused(f"a /state_ids answer of more than {MAX_STATE_IDS} ids")
    if not all(isinstance(i, str) for i in [*state, *chain]):
        raise PduRefused("a /state_ids answer's ids must be strings")
    return state, chain


def _state_after(
    parent: str,
    state_ids: Sequence[str],
    have: Mapping[str, Event],
    fetched: Mapping[str, CheckedPdu],
) -> list[list[str]]:
    """The state after ``parent``: the state before it (``state_ids``, each
    a state event of ours or fetched; one key twice is refused) and the
    parent itself when it is a state event, as ``[type, state_key, id]``."""
    state: dict[StateKey, str] = {}
    for event_id in [*state_ids, parent]:
        event = have.get(event_id)
        found = fetched[event_id].event if event is None else event
        if found.state_key is None:
            if event_id == parent:
                continue
            raise PduRefused(f"{event_id} of the state given is not a state event")
        key = (found.type, found.state_key)
        if event_id != parent and key in state:
            raise PduRefused(f"the state given has two events for {key}")
        state[key] = event_id
    return [[t, k, i] for (t, k), i in sorted(state.items())]


def _state_map(raw: Any) -> dict[StateKey, str]:
    """A state as :class:`StateGapWriter` receives it."""
    if not isinstance(raw, list) or not all(
        isinstance(e, list) and len(e) == 3 and all(isinstance(x, str) for x in e) for e in raw
    ):
        raise SynapseError(400, "a state is a list of [type, state_key, event_id]")
    return {(t, k): i for t, k, i in raw}
