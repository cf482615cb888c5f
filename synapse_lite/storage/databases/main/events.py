"""Persisting events: the events writer's half of the events stream.

Everything an event changes is written in the one transaction that takes its
stream id: the event, the room's current state and its delta stream, memberships
(``room_memberships`` and, for local users, ``local_current_membership``), the
client's transaction id, the push actions of the users it notifies, its
full-text search entry (``search.py``), and the batched cache invalidation for
other processes.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from synapse_lite.api.room_versions import IMPLICIT_ROOM_VERSION
from synapse_lite.events import Event, EventContent, relation_of
from synapse_lite.storage._base import json_encoder
from synapse_lite.storage.database import LoggingTransaction
from synapse_lite.storage.databases.main.events_worker import (
    EventsWorkerStore,
    self_destruct_after,
)
from synapse_lite.storage.databases.main.search import index_events_txn

logger = logging.getLogger(__name__)


class DuplicateTransactionError(Exception):
    """A send with the same (user, device, txn id) was persisted concurrently."""

    def __init__(self, event_id: str) -> None:
        super().__init__(event_id)
        self.event_id = event_id


class EventsStore(EventsWorkerStore):
    """Writes events. Only an events writer may call these (the ID generator
    refuses anyone else)."""

    async def persist_events(
        self,
        events: list[EventContent],
        push_actions: Mapping[str, Any] | None = None,
    ) -> list[Event]:
        """Persist events in order, in one transaction; returns them with their
        stream ids. ``push_actions``: event_id -> what it does for local
        members (``handlers.push.EventPushActions``), stored in the same
        transaction. Raises :class:`DuplicateTransactionError` if a client's
        transaction id was used meanwhile."""
        # A second run after a COMMIT of unknown outcome cannot store an event
        # twice: event ids and client transaction ids are unique keys.
        persisted = await self.db_pool.runInteraction(
            "persist_events",
            self._persist_events_txn,
            events,
            push_actions or {},
            idempotent=True,
        )
        for event in persisted:
            self._event_cache.set(event.event_id, event)
        return persisted

    def _persist_events_txn(
        self,
        txn: LoggingTransaction,
        events: list[EventContent],
        push_actions: Mapping[str, Any],
    ) -> list[Event]:
        persisted: list[Event] = []
        # Registered before the ids are taken, so it runs (after commit) before
        # they finish and the positions covering these events become visible.
        txn.call_after(self._record_persisted_positions, persisted)
        stream_ids = self._stream_id_gen.get_next_mult_txn(txn, len(events))
        depths: dict[str, int] = {}
        members_changed: dict[str, set[str]] = defaultdict(set)
        state_changed: set[str] = set()
        for content, stream_id in zip(events, stream_ids, strict=True):
            room_id = content.room_id
            if room_id not in depths:
                # The room's newest event has its greatest depth; reading it
                # through the (room_id, stream_ordering) index costs the same
                # however long the room is.
                txn.execute(
                    "SELECT topological_ordering FROM events WHERE room_id = ?"
                    " ORDER BY stream_ordering DESC LIMIT 1",
                    (room_id,),
                )
                row = txn.fetchone()
                depths[room_id] = int(row[0]) if row and row[0] is not None else 0
            depths[room_id] += 1
            event = Event(
                event_id=content.event_id,
                room_id=room_id,
                type=content.type,
                state_key=content.state_key,
                sender=content.sender,
                content=content.content,
                origin_server_ts=content.origin_server_ts,
                stream_ordering=stream_id,
                depth=depths[room_id],
                instance_name=self._instance_name,
                redacts=content.redacts,
            )
            if content.txn_key is not None:
                self._record_txn_id_txn(txn, content.txn_key, event)
            expiry = self_destruct_after(event.content) if self._self_destructing else None
            if expiry is not None:
                txn.execute(
                    "INSERT INTO event_expiry (event_id, expiry_ts) VALUES (?, ?)",
                    (event.event_id, expiry),
                )
            if event.is_state:
                state_changed.add(room_id)
                if event.type == "m.room.member" and event.state_key is not None:
                    members_changed[room_id].add(event.state_key)
                self._update_current_state_txn(txn, event)
            txn.call_after(self.invalidate_caches_for_event, event.event_id, event.redacts)
            persisted.append(event)
        self._insert_events_txn(txn, persisted, push_actions)
        self._insert_push_actions_txn(txn, persisted, push_actions)
        index_events_txn(txn, persisted)
        # Other processes learn of state changes from this transaction's rows
        # on the events stream (no caches-stream rows needed).
        for room_id in sorted(state_changed):
            txn.call_after(self.invalidate_state_caches, room_id, members_changed[room_id])
        return persisted

    def _record_persisted_positions(self, persisted: list[Event]) -> None:
        for event in persisted:
            self.record_event_position(
                event.room_id, event.type, event.state_key, event.instance_name,
                event.stream_ordering,
            )  # fmt: skip

    def _record_txn_id_txn(
        self, txn: LoggingTransaction, txn_key: tuple[str, str, str], event: Event
    ) -> None:
        user_id, device_id, txn_id = txn_key
        txn.execute(
            "INSERT INTO event_txn_ids (user_id, device_id, txn_id, room_id, event_id, inserted_ts)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (user_id, device_id, txn_id) DO NOTHING",
            (user_id, device_id, txn_id, event.room_id, event.event_id, self.clock.time_msec()),
        )
        if txn.rowcount == 0:
            txn.execute(
                "SELECT event_id FROM event_txn_ids"
                " WHERE user_id = ? AND device_id = ? AND txn_id = ?",
                (user_id, device_id, txn_id),
            )
            row = txn.fetchone()
            raise DuplicateTransactionError(row[0] if row else "")

    def _insert_events_txn(
        self, txn: LoggingTransaction, events: list[Event], push_actions: Mapping[str, Any]
    ) -> None:
        # One batch: on PostgreSQL a page of rows costs one round trip. An
        # event's default push actions ride on its row (no extra statement).
        defaults = {}
        for event_id, actions in push_actions.items():
            if actions.default is not None:
                defaults[event_id] = (json_encoder(actions.default[0]), actions.default[1])
        txn.execute_batch(
            "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id, type,"
            " state_key, sender, origin_server_ts, content, redacts, membership, outlier,"
            " instance_name, push_actions, push_highlight)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    event.stream_ordering,
                    event.depth,
                    event.event_id,
                    event.room_id,
                    event.type,
                    event.state_key,
                    event.sender,
                    event.origin_server_ts,
                    json_encoder(event.content),
                    event.redacts,
                    event.membership,
                    event.outlier,
                    event.instance_name,
                    *defaults.get(event.event_id, (None, None)),
                )
                for event in events
            ],
        )
        for event in events:
            self._update_room_row_txn(txn, event)
        relations = [(e, r) for e in events if (r := relation_of(e.content)) is not None]
        if relations:
            txn.execute_batch(
                "INSERT INTO event_relations (event_id, relates_to_id, relation_type, room_id,"
                " sender, type, stream_ordering) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (event_id) DO NOTHING",
                [
                    (e.event_id, parent, rel_type, e.room_id, e.sender, e.type, e.stream_ordering)
                    for e, (parent, rel_type) in relations
                ],
            )

    def _insert_push_actions_txn(
        self, txn: LoggingTransaction, events: list[Event], push_actions: Mapping[str, Any]
    ) -> None:
        """The per-user push actions (``push_actions``: event_id ->
        ``handlers.push.EventPushActions``; the defaults are on the events' rows)."""
        exceptions = []
        now = self.clock.time_msec()
        for event in events:
            actions = push_actions.get(event.event_id)
            if actions is None:
                continue
            for user_id, (user_actions, notif, highlight) in actions.exceptions.items():
                exceptions.append(
                    (
                        event.room_id,
                        event.event_id,
                        user_id,
                        event.stream_ordering,
                        json_encoder(user_actions),
                        notif,
                        highlight,
                        now,
                    )
                )
        if exceptions:
            txn.execute_batch(
                "INSERT INTO event_push_actions (room_id, event_id, user_id, stream_ordering,"
                " actions, notif, highlight, received_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                exceptions,
            )

    def _update_room_row_txn(self, txn: LoggingTransaction, event: Event) -> None:
        if event.type == "m.room.create" and event.state_key == "":
            txn.execute(
                "INSERT INTO rooms (room_id, creator, is_public, room_version, creation_ts,"
                " event_writer) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (room_id) DO NOTHING",
                (
                    event.room_id,
                    event.sender,
                    False,
                    str(event.content.get("room_version", IMPLICIT_ROOM_VERSION.identifier)),
                    event.origin_server_ts,
                    # The writer persisting the create event owns the room.
                    self._instance_name,
                ),
            )
        if event.type == "m.room.join_rules" and event.state_key == "":
            txn.execute(
                "UPDATE rooms SET is_public = ? WHERE room_id = ?",
                (event.content.get("join_rule") == "public", event.room_id),
            )

    def _update_current_state_txn(self, txn: LoggingTransaction, event: Event) -> None:
        assert event.state_key is not None
        txn.execute(
            "SELECT event_id FROM current_state_events"
            " WHERE room_id = ? AND type = ? AND state_key = ?",
            (event.room_id, event.type, event.state_key),
        )
        row = txn.fetchone()
        prev_event_id = row[0] if row else None
        txn.execute(
            "INSERT INTO current_state_events (room_id, type, state_key, event_id, membership)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (room_id, type, state_key) DO UPDATE"
            " SET event_id = EXCLUDED.event_id, membership = EXCLUDED.membership",
            (event.room_id, event.type, event.state_key, event.event_id, event.membership),
        )
        txn.execute(
            "INSERT INTO current_state_delta_stream (stream_id, instance_name, room_id, type,"
            " state_key, event_id, prev_event_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                event.stream_ordering,
                event.instance_name,
                event.room_id,
                event.type,
                event.state_key,
                event.event_id,
                prev_event_id,
            ),
        )
        membership = event.membership
        if membership is None or event.type != "m.room.member":
            return
        txn.execute(
            "INSERT INTO room_memberships (event_id, user_id, sender, room_id, membership,"
            " stream_ordering) VALUES (?, ?, ?, ?, ?, ?)",
            (
                event.event_id,
                event.state_key,
                event.sender,
                event.room_id,
                membership,
                event.stream_ordering,
            ),
        )
        if self.hs.is_mine_id(event.state_key):
            txn.execute(
                "INSERT INTO local_current_membership (room_id, user_id, event_id, membership,"
                " event_stream_ordering) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (user_id, room_id) DO UPDATE SET event_id = EXCLUDED.event_id,"
                " membership = EXCLUDED.membership,"
                " event_stream_ordering = EXCLUDED.event_stream_ordering",
                (event.room_id, event.state_key, event.event_id, membership, event.stream_ordering),
            )
