"""Room events as a client receives them: the one place /sync, /messages and
the state reads turn stored events into JSON.

Besides ``Event.to_client_dict`` this adds what depends on who reads:
``unsigned.transaction_id`` on the events the reader's own device sent with a
transaction id (clients match their local echo with it; other devices of the
same user and other users never see it), a filter's ``event_fields``, and
account erasure: the events of a user who deactivated with ``erase`` are
served redacted to whoever could not see them by the time of the erasure
(the spec: those who join later get redacted copies, those who had
visibility before keep seeing them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.events import Event
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.filtering import only_fields
from synapse_lite.handlers.visibility import RoomVisibility, load_room_visibility

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main import GenericWorkerStore


class ClientEventFormatter:
    """Formats events for one reader."""

    def __init__(self, store: GenericWorkerStore) -> None:
        self._store = store

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
        event_fields: tuple[str, ...] | None = None,
    ) -> list[dict[str, Any]]:
        """``events`` in client format, in the order given."""
        if requester is not None:
            events = await self.as_seen_by(requester.user_id, events)
        txn_ids = await self.transaction_ids(requester, events)
        return [
            format_event(e, now_ms, txn_ids, include_room_id=include_room_id, fields=event_fields)
            for e in events
        ]


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
