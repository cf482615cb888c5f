"""How far each destination has taken our room events (``destination_rooms``,
``destinations.pdus_sent_upto``, ``federation_feed_position``; delta 0175).

The contract (docs/federation.md, "Outbound: room events"):

* ``destination_rooms`` holds, per destination and room, the newest event
  queued for that destination, written by the room events feed *before*
  the events are queued in memory;
* ``federation_feed_position`` is the events stream position up to which
  the feed has written ``destination_rooms`` for every destination;
* ``destinations.pdus_sent_upto``: every event for the destination at or
  below it was accepted by it. Set when the feed first queues an event for
  a destination (to the position before it) and moved forward by that
  destination's sender after each accepted transaction;
* ``destinations.pdus_in_flight_upto``: the transaction in flight carries
  the events above ``pdus_sent_upto`` up to it (written before it is sent),
  so the next run forms the same transaction again.

So a destination is *behind* exactly when one of its ``destination_rooms``
rows is above its ``pdus_sent_upto``; those rows are what catch-up sends.
Any process may read these; only the senders and their feeds write.
"""

from __future__ import annotations

from collections.abc import Iterable

import attr

from synapse_lite.storage._base import SQLBaseStore
from synapse_lite.storage.database import LoggingTransaction


@attr.s(slots=True, frozen=True, auto_attribs=True)
class QueuedPdu:
    """One of our events for a destination, at its events stream position."""

    event_id: str
    stream_ordering: int


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PduPositions:
    """A destination's ``pdus_sent_upto`` and ``pdus_in_flight_upto``."""

    sent_upto: int | None
    in_flight_upto: int | None


@attr.s(slots=True, frozen=True, auto_attribs=True)
class DestinationRoom:
    """The newest event queued for ``destination`` in ``room_id``."""

    destination: str
    room_id: str
    pdu: QueuedPdu


class DestinationRoomsWorkerStore(SQLBaseStore):
    """The tables above (see the module docstring)."""

    async def record_destination_rooms(
        self, rows: Iterable[DestinationRoom], batch_from: int, feed_upto: int
    ) -> None:
        """One batch of the feed, in one transaction: the newest event per
        (destination, room) of the batch (``rows``), a ``pdus_sent_upto`` of
        ``batch_from`` (the position before the batch) for destinations that
        had none, and the feed's position moved to ``feed_upto`` (never
        back: several senders' feeds write it)."""
        rows = list(rows)

        def txn_func(txn: LoggingTransaction) -> None:
            if rows:
                txn.execute_batch(
                    "INSERT INTO destination_rooms (destination, room_id, stream_ordering,"
                    " event_id) VALUES (?, ?, ?, ?) ON CONFLICT (destination, room_id) DO UPDATE"
                    " SET stream_ordering = EXCLUDED.stream_ordering,"
                    " event_id = EXCLUDED.event_id"
                    " WHERE destination_rooms.stream_ordering < EXCLUDED.stream_ordering",
                    [
                        (r.destination, r.room_id, r.pdu.stream_ordering, r.pdu.event_id)
                        for r in rows
                    ],
                )
                txn.execute_batch(
                    "INSERT INTO destinations (destination, pdus_sent_upto) VALUES (?, ?)"
                    " ON CONFLICT (destination) DO UPDATE SET pdus_sent_upto ="
                    " EXCLUDED.pdus_sent_upto WHERE destinations.pdus_sent_upto IS NULL",
                    [(d, batch_from) for d in sorted({r.destination for r in rows})],
                )
            txn.execute(
                "INSERT INTO federation_feed_position (singleton, stream_ordering) VALUES (1, ?)"
                " ON CONFLICT (singleton) DO UPDATE SET stream_ordering ="
                " EXCLUDED.stream_ordering"
                " WHERE federation_feed_position.stream_ordering < EXCLUDED.stream_ordering",
                (feed_upto,),
            )

        await self.db_pool.runInteraction("record_destination_rooms", txn_func)

    async def get_federation_feed_position(self) -> int | None:
        """How far ``destination_rooms`` is complete (None: no feed ever ran)."""
        rows = await self.db_pool.select(
            "get_federation_feed_position",
            "SELECT stream_ordering FROM federation_feed_position WHERE singleton = 1",
        )
        return int(rows[0][0]) if rows else None

    async def get_destinations_behind(self) -> dict[str, int]:
        """``destination -> pdus_sent_upto`` of every destination that is
        behind (a ``destination_rooms`` row above its ``pdus_sent_upto``)."""
        rows = await self.db_pool.select(
            "get_destinations_behind",
            "SELECT d.destination, d.pdus_sent_upto FROM destinations AS d"
            " WHERE d.pdus_sent_upto IS NOT NULL AND EXISTS (SELECT 1 FROM destination_rooms"
            " AS r WHERE r.destination = d.destination AND r.stream_ordering > d.pdus_sent_upto)",
        )
        return {r[0]: int(r[1]) for r in rows}

    async def get_pdu_positions(self, destination: str) -> PduPositions:
        """``destinations.pdus_sent_upto`` and ``pdus_in_flight_upto``."""
        rows = await self.db_pool.select(
            "get_pdu_positions",
            "SELECT pdus_sent_upto, pdus_in_flight_upto FROM destinations WHERE destination = ?",
            destination,
        )
        if not rows:
            return PduPositions(None, None)
        sent, in_flight = rows[0]
        return PduPositions(
            None if sent is None else int(sent), None if in_flight is None else int(in_flight)
        )

    async def get_pdus_sent_upto(self, destination: str) -> int | None:
        """``destinations.pdus_sent_upto`` (None: nothing was ever queued)."""
        return (await self.get_pdu_positions(destination)).sent_upto

    async def set_pdu_positions(self, destination: str, positions: PduPositions) -> None:
        """Record how far the destination got (``sent_upto`` never moves
        back; None leaves it) and the transaction in flight."""
        await self.db_pool.execute(
            "set_pdu_positions",
            "INSERT INTO destinations (destination, pdus_sent_upto, pdus_in_flight_upto)"
            " VALUES (?, ?, ?) ON CONFLICT (destination) DO UPDATE SET"
            " pdus_in_flight_upto = EXCLUDED.pdus_in_flight_upto,"
            " pdus_sent_upto = CASE WHEN destinations.pdus_sent_upto IS NULL"
            " OR destinations.pdus_sent_upto < EXCLUDED.pdus_sent_upto"
            " THEN EXCLUDED.pdus_sent_upto ELSE destinations.pdus_sent_upto END",
            destination,
            positions.sent_upto,
            positions.in_flight_upto,
        )

    async def set_pdus_sent_upto(self, destination: str, stream_ordering: int) -> None:
        """The destination accepted every event for it up to
        ``stream_ordering`` (never moves back), none in flight."""
        await self.set_pdu_positions(destination, PduPositions(stream_ordering, None))

    async def get_catch_up_pdus(self, destination: str, after: int, limit: int) -> list[QueuedPdu]:
        """The newest event of each room the destination is behind in
        (rows above ``after``), oldest first, at most ``limit``."""
        rows = await self.db_pool.select(
            "get_catch_up_pdus",
            "SELECT event_id, stream_ordering FROM destination_rooms"
            " WHERE destination = ? AND stream_ordering > ?"
            " ORDER BY stream_ordering ASC LIMIT ?",
            destination,
            after,
            limit,
        )
        return [QueuedPdu(r[0], int(r[1])) for r in rows]
