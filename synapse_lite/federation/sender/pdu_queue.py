"""The room events (PDUs) waiting for one destination, and how far it has
taken them (docs/federation.md, "Outbound: room events").

A destination is in one of two modes:

* **live**: the room events feed hands it every event for it, in stream
  order, into memory; transactions take the oldest
  :data:`MAX_PDUS_PER_TRANSACTION`. After each accepted transaction
  ``destinations.pdus_sent_upto`` moves to the last event's position.
* **catching up**: memory is dropped; each transaction carries the newest
  event of each room the destination is behind in (``destination_rooms``
  rows above ``pdus_sent_upto``, oldest first, up to 50 rooms), and the
  destination fetches the gap with ``get_missing_events``. It goes live
  again when no row is left above ``pdus_sent_upto``, the feed has written
  every row up to where memory starts, and no event came meanwhile.

It starts catching up when it cannot be current from memory: its
``pdus_sent_upto`` is below where this run's feed started handing out
events (a sender restarted after a long stop, or a destination handed over
to a sender that replays less than it owes), more than one transaction's
worth waits while it is backing off, or more than :data:`MAX_PENDING_PDUS`
wait. A healthy destination given a burst takes every event, 50 per
transaction.

So after a restart or a handover the new run resumes exactly where the old
one stopped: the feed replays from the lowest ``pdus_sent_upto`` of the
destinations it owns that are behind (within :data:`MAX_REPLAY_POSITIONS`),
each live queue drops what is at or below its own position, and the
transaction the old run had in flight is formed again from the same events
(its last position is recorded before it is sent: ``pdus_in_flight_upto``),
hence with the same transaction id, which the receiver answers from its
record. The positions are written once per transaction: before sending,
the previous transaction's ``pdus_sent_upto`` with this one's
``pdus_in_flight_upto``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attr

from synapse_lite.storage.databases.main.destination_rooms import PduPositions, QueuedPdu

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

MAX_PDUS_PER_TRANSACTION = 50
#: PDUs kept in memory for a destination; beyond, it catches up instead.
MAX_PENDING_PDUS = 10_000
#: How far back (events stream positions) a starting feed replays for a
#: destination that is behind; one further back catches up instead.
MAX_REPLAY_POSITIONS = 1_000


@attr.s(slots=True, auto_attribs=True)
class FeedProgress:
    """Where this process's room events feed is, shared with the queues.

    ``live_from``: the feed hands the queues every event above it (None:
    not started yet). ``filled_upto``: ``destination_rooms`` holds every
    event at or below it."""

    live_from: int | None = None
    filled_upto: int | None = None

    @property
    def filled_past_live_from(self) -> bool:
        return (
            self.live_from is not None
            and self.filled_upto is not None
            and self.filled_upto >= self.live_from
        )


class PduQueue:
    """One destination's room events (see the module docstring)."""

    def __init__(self, destination: str, store: GenericWorkerStore, progress: FeedProgress):
        self.destination = destination
        self._store = store
        self._progress = progress
        #: Live mode's events, oldest first.
        self._pdus: list[QueuedPdu] = []
        #: ``pdus_sent_upto`` (None: not read yet).
        self._sent_upto: int | None = None
        #: What the database holds (written when it differs).
        self._recorded = PduPositions(None, None)
        #: The previous run's transaction in flight ended here: the first
        #: transaction of this run stops there too.
        self._resume_upto: int | None = None
        self._catching_up = False
        #: Events handed over so far (catching up: whether any came while
        #: the rows were being read).
        self._added = 0
        #: The catch-up read's result, for the gauge.
        self._rooms_behind = 0

    @property
    def catching_up(self) -> bool:
        return self._catching_up

    @property
    def pending(self) -> int:
        return self._rooms_behind if self._catching_up else len(self._pdus)

    @property
    def sent_upto(self) -> int | None:
        return self._sent_upto

    def add(self, pdus: Sequence[QueuedPdu], backing_off: bool) -> None:
        """Events for the destination, in stream order after those given
        before (already in ``destination_rooms``)."""
        self._added += 1
        if self._catching_up:
            return
        self._pdus.extend(pdus)
        self.check_backlog(backing_off)

    def check_backlog(self, backing_off: bool) -> None:
        """Catch up rather than keep a backlog the destination is not taking."""
        if self._catching_up:
            return
        if len(self._pdus) > MAX_PENDING_PDUS:
            self._catch_up(f"{len(self._pdus)} PDUs are waiting")
        elif backing_off and len(self._pdus) > MAX_PDUS_PER_TRANSACTION:
            self._catch_up(f"it is backing off with {len(self._pdus)} PDUs waiting")

    def _catch_up(self, why: str) -> None:
        logger.info(
            "%s falls behind (%s): it will be sent the newest event of each room",
            self.destination,
            why,
        )
        self._catching_up = True
        self._pdus = []

    async def next_batch(self) -> list[QueuedPdu]:
        """The PDUs of the next transaction, oldest first (none: nothing to
        send, or not yet: the feed has not started)."""
        progress = self._progress
        if progress.live_from is None:
            return []
        if self._sent_upto is None:
            recorded = await self._store.get_pdu_positions(self.destination)
            self._recorded = recorded
            sent_upto = recorded.sent_upto
            if (
                sent_upto is not None
                and recorded.in_flight_upto is not None
                and recorded.in_flight_upto > sent_upto
            ):
                self._resume_upto = recorded.in_flight_upto
            if sent_upto is None and progress.filled_past_live_from:
                # Never had an event before memory starts: all in memory.
                sent_upto = progress.live_from
            if sent_upto is None or sent_upto < progress.live_from:
                self._catching_up = True
                self._pdus = []
            self._sent_upto = -1 if sent_upto is None else sent_upto
        while self._catching_up:
            added = self._added
            found = await self._store.get_catch_up_pdus(
                self.destination, self._sent_upto, MAX_PDUS_PER_TRANSACTION
            )
            self._rooms_behind = len(found)
            self._resume_upto = None
            await self._record(None)
            if found:
                return found
            if added != self._added:
                # Events came while the rows were read, and the read may not
                # have seen their rows (committed after it began): they gave
                # no wake-up of their own (add() keeps nothing while catching
                # up), so read again rather than wait for a next event.
                continue
            if progress.filled_past_live_from:
                logger.info("%s has caught up", self.destination)
                self._catching_up = False
                break
            return []
        if self._pdus and self._pdus[0].stream_ordering <= self._sent_upto:
            # Replayed by the feed, sent by the previous run.
            self._pdus = [p for p in self._pdus if p.stream_ordering > self._sent_upto]
        batch = self._pdus[:MAX_PDUS_PER_TRANSACTION]
        resume = self._resume_upto
        if resume is not None:
            if (progress.filled_upto or 0) < resume:
                # The feed has not replayed it all yet: wait for it (it wakes us).
                await self._record(None, keep_in_flight=True)
                return []
            batch = [p for p in batch if p.stream_ordering <= resume]
            self._resume_upto = None
        await self._record(batch[-1].stream_ordering if batch else None)
        return batch

    async def _record(self, in_flight_upto: int | None, keep_in_flight: bool = False) -> None:
        """Write the positions if they changed (``keep_in_flight``: leave
        the recorded in-flight position as it is)."""
        if keep_in_flight:
            in_flight_upto = self._recorded.in_flight_upto
        wanted = PduPositions(self._sent_upto, in_flight_upto)
        if self._sent_upto is None or wanted == self._recorded:
            return
        await self._store.set_pdu_positions(self.destination, wanted)
        self._recorded = wanted

    async def sent(self, pdus: Sequence[QueuedPdu]) -> None:
        """The destination took ``pdus`` (or refused them for good): forget
        them; how far it got is written with the next transaction's
        in-flight position, or when there is none (:meth:`next_batch`)."""
        if not pdus:
            return
        done = {p.event_id for p in pdus}
        self._pdus = [p for p in self._pdus if p.event_id not in done]
        upto = max(p.stream_ordering for p in pdus)
        if self._sent_upto is None or upto > self._sent_upto:
            # Written with the next transaction's in-flight position, or
            # when there is none (next_batch).
            self._sent_upto = upto
