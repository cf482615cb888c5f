"""The events stream (new events and current-state changes) and the backfill stream."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import attr

from synapse_lite.replication.tcp.streams._base import InvalidRow, StreamFromIdGen, Updates
from synapse_lite.storage._base import page_of_updates

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main.events_worker import EventsWorkerStore

_str = attr.validators.instance_of(str)
_opt_str = attr.validators.optional(attr.validators.instance_of(str))
_bool = attr.validators.instance_of(bool)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class EventsStreamEventRow:
    """An event was persisted (``"ev"`` rows)."""

    TypeId: ClassVar[str] = "ev"

    event_id: str = attr.ib(validator=_str)
    room_id: str = attr.ib(validator=_str)
    type: str = attr.ib(validator=_str)
    state_key: str | None = attr.ib(validator=_opt_str)
    redacts: str | None = attr.ib(validator=_opt_str)
    relates_to: str | None = attr.ib(validator=_opt_str)
    membership: str | None = attr.ib(validator=_opt_str)
    rejected: bool = attr.ib(validator=_bool)
    outlier: bool = attr.ib(validator=_bool)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class EventsStreamCurrentStateRow:
    """A room's current state changed (``"state"`` rows)."""

    TypeId: ClassVar[str] = "state"

    room_id: str = attr.ib(validator=_str)
    type: str = attr.ib(validator=_str)
    state_key: str = attr.ib(validator=_str)
    event_id: str | None = attr.ib(validator=_opt_str)


_ROW_TYPES: dict[str, type] = {
    EventsStreamEventRow.TypeId: EventsStreamEventRow,
    EventsStreamCurrentStateRow.TypeId: EventsStreamCurrentStateRow,
}


@attr.s(slots=True, frozen=True, auto_attribs=True)
class EventsStreamRow:
    """One row of the events stream: ``[type, [fields...]]`` on the wire."""

    type: str
    data: Any


class EventsStream(StreamFromIdGen):
    """New events and current-state changes, per events writer."""

    NAME = "events"
    ROW_TYPE = EventsStreamRow

    def __init__(self, local_instance_name: str, store: EventsWorkerStore) -> None:
        self._store = store
        super().__init__(local_instance_name, self._update_function, store._stream_id_gen)

    @classmethod
    def parse_row(cls, row: Any) -> EventsStreamRow:
        if not isinstance(row, list) or len(row) != 2 or not isinstance(row[0], str):
            raise InvalidRow("an events row must be [type, [fields...]]")
        row_type = _ROW_TYPES.get(row[0])
        if row_type is None:
            raise InvalidRow(f"unknown events row type {row[0]!r}")
        if not isinstance(row[1], list):
            raise InvalidRow("events row fields must be a list")
        try:
            return EventsStreamRow(row[0], row_type(*row[1]))
        except (TypeError, ValueError) as e:
            raise InvalidRow(f"bad events row: {e}") from None

    async def _update_function(
        self, instance_name: str, from_token: int, upto_token: int, limit: int
    ) -> tuple[Updates, int, bool]:
        event_rows, state_rows = await self._store.get_events_stream_rows(
            instance_name, from_token, upto_token, limit
        )
        limited = False
        # Each state row has the id of the one event that made it, so no id is
        # split between pages; stop where the first truncated source stops so
        # nothing of a later id goes out before an earlier one.
        if len(event_rows) >= limit:
            upto_token = event_rows[-1][0]
            limited = True
        if len(state_rows) >= limit:
            upto_token = min(upto_token, state_rows[-1][0])
            limited = True
        updates: list[tuple[int, Any]] = []
        for r in event_rows:
            if r[0] <= upto_token:
                event_data = [r[1], r[2], r[3], r[4], r[5], None, r[6], False, bool(r[7])]
                updates.append((r[0], [EventsStreamEventRow.TypeId, event_data]))
        for r in state_rows:
            if r[0] <= upto_token:
                updates.append(
                    (r[0], [EventsStreamCurrentStateRow.TypeId, [r[1], r[2], r[3], r[4]]])
                )
        # Stable: for one id the event row comes before its state rows.
        updates.sort(key=lambda u: u[0])
        return updates, upto_token, limited


@attr.s(slots=True, frozen=True, auto_attribs=True)
class BackfillStreamRow:
    """A backfilled event (tokens are positive on the wire)."""

    event_id: str = attr.ib(validator=_str)
    room_id: str = attr.ib(validator=_str)
    type: str = attr.ib(validator=_str)
    state_key: str | None = attr.ib(validator=_opt_str)
    redacts: str | None = attr.ib(validator=_opt_str)
    relates_to: str | None = attr.ib(validator=_opt_str)


class BackfillStream(StreamFromIdGen):
    """Backfilled events: the negative backfill stream, negated on the wire."""

    NAME = "backfill"
    ROW_TYPE = BackfillStreamRow

    def __init__(self, local_instance_name: str, store: EventsWorkerStore) -> None:
        self._store = store
        super().__init__(local_instance_name, self._update_function, store._backfill_id_gen)

    def current_token(self, instance_name: str) -> int:
        return -self.id_gen.get_current_token_for_writer(instance_name)

    def minimal_local_current_token(self) -> int:
        return -self.id_gen.get_minimal_local_current_token()

    async def get_stopped_writer_token(self, instance_name: str) -> int:
        return -(await self.id_gen.get_stopped_writer_position(instance_name))

    def row_received(self, instance_name: str, token: int) -> None:
        self.id_gen.advance_past_row(instance_name, -token)

    def processed_position(self, instance_name: str) -> int:
        if instance_name == self.local_instance_name:
            return self.current_token(instance_name)
        own = self.id_gen.get_positions().get(instance_name)
        return self.current_token(instance_name) if own is None else -own

    async def _update_function(
        self, instance_name: str, from_token: int, upto_token: int, limit: int
    ) -> tuple[Updates, int, bool]:
        rows = await self._store.get_all_new_backfill_event_rows(
            instance_name, from_token, upto_token, limit
        )
        updates = [(r[0], [r[1], r[2], r[3], r[4], r[5], None]) for r in rows]
        return page_of_updates(updates, limit, upto_token)
