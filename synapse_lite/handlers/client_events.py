"""Room events as a client receives them: the one place /sync, /messages and
the state reads turn stored events into JSON.

Besides ``Event.to_client_dict`` this adds what depends on who reads:
``unsigned.transaction_id`` on the events the reader's own device sent with a
transaction id (clients match their local echo with it; other devices of the
same user and other users never see it), a filter's ``event_format`` and
``event_fields`` (:class:`EventFormat`), and account erasure: the events of a
user who deactivated with ``erase`` are served redacted to whoever could not
see them by the time of the erasure (the spec: those who join later get
redacted copies, those who had visibility before keep seeing them).

``event_format: federation`` serves each event as federation would carry it
(:func:`synapse_lite.events.event_pdu`): ``room_id``, ``depth``,
``prev_events``, ``auth_events``, ``hashes`` (of the event as persisted, so
a redacted event keeps its original's), ``signatures`` (the server's key,
over the redacted form, as the server-server spec signs) and ``unsigned``
holding only ``age``; plus ``event_id``, which a client needs and a PDU of
version 3 on leaves out. A redacted (or erased user's) event is served as
the redaction algorithm leaves the PDU. Computed, not stored: the same on
every process, as signing with one key is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.events import Event, content_hashes, pruned_event
from synapse_lite.federation.crypto import SigningKey, SigningKeyFileError, sign_json
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.filtering import CLIENT_FORMAT, EventFormat, only_fields
from synapse_lite.handlers.visibility import RoomVisibility, load_room_visibility

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main import GenericWorkerStore


class PduSigner:
    """Signs events served in the federation format with the server's key
    (read when first needed: processes that never serve the format never
    read it)."""

    def __init__(self, server_name: str, load_key: Callable[[], SigningKey]) -> None:
        self.server_name = server_name
        self._load_key = load_key
        self._key: SigningKey | None = None

    def signatures(self, redacted_pdu: dict[str, Any]) -> dict[str, Any]:
        """Our ``signatures`` of an event (its redacted form); a 503 when
        this process cannot read the key (``data_dir/signing.key`` is on the
        main process's host only, unless copied: docs/client-api.md)."""
        if self._key is None:
            try:
                self._key = self._load_key()
            except SigningKeyFileError as e:
                raise SynapseError(
                    503,
                    f"This process cannot sign events in the federation format: {e}",
                    Codes.UNKNOWN,
                ) from None
        signed = sign_json(redacted_pdu, self.server_name, self._key)
        signatures: dict[str, Any] = signed["signatures"]
        return signatures


class ClientEventFormatter:
    """Formats events for one reader (``signer``: for ``event_format:
    federation``; a formatter without one serves the client format only)."""

    def __init__(self, store: GenericWorkerStore, signer: PduSigner | None = None) -> None:
        self._store = store
        self._signer = signer

    async def transaction_ids(
        self, requester: Requester | None, events: Sequence[Event]
    ) -> dict[str, str]:
        """The transaction ids of those of ``events`` that ``requester``'s
        device sent, by event id (one query, none if the reader sent none)."""
        if requester is None:
            return {}
        own = [e.event_id for e in events if e.sender == requester.user_id]
        if not own:
            return {}
        return await self._store.get_txn_ids_for_events(requester.user_id, requester.device_id, own)

    async def as_seen_by(self, user_id: str, events: Sequence[Event]) -> list[Event]:
        """``events`` as ``user_id`` is served them: those of erased users
        pruned (as a redaction prunes) unless the reader could see them by
        the erasure's position. Costs a cached lookup per other sender, and
        reads only for rooms with an erased sender's events."""
        erased: dict[str, int] = {}
        for sender in {e.sender for e in events if e.sender != user_id}:
            position = await self._store.get_erasure_position(sender)
            if position is not None:
                erased[sender] = position
        if not erased:
            return list(events)
        views: dict[str, RoomVisibility] = {}
        result: list[Event] = []
        for event in events:
            erased_at = erased.get(event.sender)
            if erased_at is not None and event.redacted_because is None:
                view = views.get(event.room_id)
                if view is None:
                    view = await load_room_visibility(self._store, user_id, event.room_id)
                    views[event.room_id] = view
                # The reader's view then: a member by then (joined or
                # invited), seeing the event under the room's visibility.
                then = tuple(h for h in view.history if h[0] <= erased_at)
                before = attr.evolve(view, history=then)
                if not (then and event.stream_ordering <= erased_at and before.can_see(event)):
                    event = event.pruned(await self._store.get_room_version(event.room_id))
            result.append(event)
        return result

    async def format(
        self,
        requester: Requester | None,
        events: Sequence[Event],
        now_ms: int,
        *,
        include_room_id: bool = True,
        event_format: EventFormat = CLIENT_FORMAT,
    ) -> list[dict[str, Any]]:
        """``events`` as ``requester`` is served them, in ``event_format``,
        in the order given."""
        if requester is not None:
            events = await self.as_seen_by(requester.user_id, events)
        # Transaction ids are a client-format detail: federation has none.
        txn_ids = {} if event_format.federation else await self.transaction_ids(requester, events)
        return await self.render(
            events, now_ms, event_format, txn_ids=txn_ids, include_room_id=include_room_id
        )

    async def render(
        self,
        events: Sequence[Event],
        now_ms: int,
        event_format: EventFormat,
        *,
        txn_ids: dict[str, str] | None = None,
        include_room_id: bool = True,
    ) -> list[dict[str, Any]]:
        """``events``, already as their reader sees them (:meth:`as_seen_by`),
        in ``event_format``, with the transaction ids in ``txn_ids``."""
        if event_format.federation:
            return await self.federation_format(events, now_ms, event_format.fields)
        return [
            format_event(
                e,
                now_ms,
                txn_ids or {},
                include_room_id=include_room_id,
                fields=event_format.fields,
            )
            for e in events
        ]

    async def federation_format(
        self, events: Sequence[Event], now_ms: int, fields: tuple[str, ...] | None = None
    ) -> list[dict[str, Any]]:
        """``events`` as federation has them (the module docstring says
        what that holds), cut down to ``fields``."""
        assert self._signer is not None, "this formatter serves the client format only"
        if not events:
            return []
        edges = await self._store.get_event_edges([e.event_id for e in events])
        # The events as persisted: those served pruned (redacted, or an
        # erased user's) keep the hashes of their original content.
        originals = await self._store.get_events_as_stored([e.event_id for e in events])
        result = []
        for event in events:
            version = await self._store.get_room_version(event.room_id)
            stored = originals.get(event.event_id, event)
            prev_ids, auth_ids = edges[event.event_id]
            pdu = stored.to_pdu(version, prev_ids, auth_ids)
            pdu["hashes"] = content_hashes(version, pdu)
            pdu["signatures"] = self._signer.signatures(pruned_event(version, pdu))
            if stored.content != event.content:
                pdu = pruned_event(version, pdu)
            pdu["event_id"] = event.event_id
            pdu["unsigned"] = {"age": max(0, now_ms - event.origin_server_ts)}
            result.append(pdu if fields is None else only_fields(pdu, fields))
        return result


def format_event(
    event: Event,
    now_ms: int,
    txn_ids: dict[str, str],
    *,
    include_room_id: bool = True,
    fields: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """One event, with its transaction id from ``txn_ids`` if it is there."""
    data = event.to_client_dict(now_ms, include_room_id=include_room_id)
    txn_id = txn_ids.get(event.event_id)
    if txn_id is not None:
        data["unsigned"]["transaction_id"] = txn_id
    if fields is not None:
        data = only_fields(data, fields)
    return data
