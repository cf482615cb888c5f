"""Room events as a client receives them: the one place /sync, /messages and
the state reads turn stored events into JSON.

Besides ``Event.to_client_dict`` this adds what depends on who reads:
``unsigned.transaction_id`` on the events the reader's own device sent with a
transaction id (clients match their local echo with it; other devices of the
same user and other users never see it), and a filter's ``event_fields``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from synapse_lite.events import Event
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.filtering import only_fields

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
