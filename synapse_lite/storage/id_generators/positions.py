"""Stream positions as pure arithmetic: no database, no reactor, no threads.

One :class:`PositionModel` per stream per process holds what this process
knows of the stream's writers, in positions (which count up on every stream:
see :class:`~synapse_lite.streams.definition.IdSpace` for a stream whose
stored ids count down):

* **allocated, in-flight and finished ids of this process.** An id is
  allocated when the sequence hands it out; it *finishes* when its transaction
  commits or fails, possibly out of order. While a sequence fetch is under way
  its ids are unknown, but they will be above the largest id seen when the
  fetch began: every id above that is unsafe until the fetch lands.
* **a writer's position**: the largest id P such that every id it allocated up
  to P has finished. A POSITION from a writer advances it (it only grows);
  so does an RDATA row, which also says its id is finished. A writer with nothing in
  flight here is as far along as the largest id anyone has allocated (it can
  only ever write above it), so this process reports itself there when idle.
* **persisted-up-to**: the largest id below which every id allocated by any
  writer has finished: the minimum of the writers' positions (this process's
  own counts only while it has something in flight), carried further over a
  run of ids known finished just above it. It never decreases.

The shell (``generator.py``) feeds it what the database says at startup and
what allocation, transactions and replication say afterwards, holding a lock
around every call; this class assumes a single caller at a time.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping


class PositionModel:
    """One process's knowledge of one stream's positions (see module docstring).

    The verbs are those of every layer above it (the generator, the stream
    views): ``advance_writer``, ``advance_past_row``, ``forget_writer``, and
    the readers ``writer_position``, ``received_position``,
    ``persisted_upto_position``, ``newest_local_write``."""

    def __init__(self, instance_name: str) -> None:
        self.instance_name = instance_name
        self._positions: dict[str, int] = {}
        self._unfinished: set[int] = set()
        #: For each sequence fetch under way, the largest id seen when it began.
        self._in_flight_fetches: list[int] = []
        #: Ids of this process that finished while a smaller one (or a fetch)
        #: was outstanding.
        self._finished: set[int] = set()
        self._persisted_upto = 0
        #: Ids known finished but above a gap in persisted-up-to.
        self._known_finished: list[int] = []
        self._max_seen_allocated = 0
        self._local_position = 0
        #: The largest id this process has finished, even above its position.
        self._max_finished_local = 0

    # Startup

    def load(
        self,
        positions: Mapping[str, int],
        persisted_upto: int,
        finished_rows: Iterable[tuple[str, int]] = (),
        writers: Iterable[str] = (),
        any_writer: bool = False,
    ) -> None:
        """Take what the database says: stored ``positions``, the
        ``persisted_upto`` they imply, the rows written after them (each id is
        finished; this process's own rows move its position) and the
        configured ``writers`` (one with no position starts at persisted-up-to:
        it has written nothing since). ``any_writer``: every process may write
        (only this process's own position is tracked until others announce)."""
        self._positions = dict(positions)
        self._persisted_upto = persisted_upto
        for instance, stream_id in sorted(finished_rows, key=lambda r: r[1]):
            self._note_finished(stream_id)
            if instance == self.instance_name:
                self._positions[instance] = max(self._positions.get(instance, 0), stream_id)
        for writer in writers:
            self._positions.setdefault(writer, self._persisted_upto)
        self._max_seen_allocated = max(
            max(self._positions.values(), default=0), self._persisted_upto
        )
        self._local_position = self._max_seen_allocated
        if any_writer:
            self._positions[self.instance_name] = self._persisted_upto

    # This process's allocations

    def begin_fetch(self) -> int:
        """A sequence fetch begins; returns its marker for :meth:`end_fetch`."""
        marker = self._max_seen_allocated
        self._in_flight_fetches.append(marker)
        return marker

    def fetched(self, ids: Iterable[int]) -> None:
        """The fetch handed out ``ids``: they are in flight until finished."""
        ids = list(ids)
        self._unfinished.update(ids)
        if ids:
            self._max_seen_allocated = max(self._max_seen_allocated, *ids)

    def end_fetch(self, marker: int) -> None:
        """The fetch begun with ``marker`` is over (with or without ids)."""
        self._in_flight_fetches.remove(marker)

    def finish(self, ids: Iterable[int]) -> None:
        """Ids of this process finished (committed or failed)."""
        ids = list(ids)
        for i in ids:
            self._unfinished.discard(i)
            self._finished.add(i)
        if ids:
            self._max_finished_local = max(self._max_finished_local, *ids)

        new_position: int | None
        if self._busy:
            first_unsafe = min(self._unfinished, default=None)
            if self._in_flight_fetches:
                fetch_floor = min(self._in_flight_fetches) + 1
                first_unsafe = (
                    fetch_floor if first_unsafe is None else min(first_unsafe, fetch_floor)
                )
            assert first_unsafe is not None
            new_position = max((i for i in self._finished if i < first_unsafe), default=None)
            self._finished = {i for i in self._finished if i >= first_unsafe}
        else:
            new_position = max(self._finished, default=None)
            self._finished.clear()

        if new_position is not None:
            me = self.instance_name
            self._positions[me] = max(self._positions.get(me, 0), new_position)
            self._local_position = max(self._local_position, new_position)
        for i in ids:
            self._note_finished(i)

    # Other writers

    def advance_writer(self, writer: str, position: int) -> None:
        """``writer`` has nothing unfinished at or below ``position`` (a
        POSITION, or an RDATA token). Not an id: it may be another writer's,
        still in flight (a restarted writer starts at the sequence head)."""
        self._positions[writer] = max(self._positions.get(writer, 0), position)
        self._max_seen_allocated = max(self._max_seen_allocated, position)
        self._recompute()

    def advance_past_row(self, writer: str, row_id: int) -> None:
        """A row of ``writer`` with ``row_id`` arrived: it is there, and that
        id is finished."""
        # advance_writer's and _note_finished's work, with one recompute.
        self._positions[writer] = max(self._positions.get(writer, 0), row_id)
        self._max_seen_allocated = max(self._max_seen_allocated, row_id)
        heapq.heappush(self._known_finished, row_id)
        self._recompute()

    def forget_writer(self, writer: str) -> bool:
        """Stop tracking a writer that has stopped for good (its rows already
        seen), so its last position no longer holds persisted-up-to back.
        False if it was not tracked."""
        if writer == self.instance_name:
            raise ValueError(f"{writer} cannot remove itself")
        if self._positions.pop(writer, None) is None:
            return False
        self._recompute()
        return True

    # Reading

    def persisted_upto_position(self) -> int:
        """Every id up to it, by any writer, has finished."""
        return self._persisted_upto

    def writer_position(self, writer: str) -> int:
        """The position of one writer: it has no unseen rows at or below it.
        For this process it may run ahead of its last write (an idle writer
        reports the largest id seen allocated); an unknown or silent writer is
        reported at least at persisted-up-to."""
        if writer == self.instance_name:
            return self._local_position
        return max(self._positions.get(writer, self._persisted_upto), self._persisted_upto)

    def newest_local_write(self) -> int:
        """The largest id this process finished writing (no idle jump). Ids
        above its position may have finished while a smaller one is
        outstanding; their rows still have to be sent."""
        own = self._positions.get(self.instance_name, self._persisted_upto)
        return max(own, self._max_finished_local)

    def known_writer_positions(self) -> dict[str, int]:
        return dict(self._positions)

    def known_position(self, writer: str) -> int:
        """The writer's known position (0: none known)."""
        return self._positions.get(writer, 0)

    def received_position(self, writer: str) -> int:
        """How far this process has received ``writer``'s rows: its known
        position (what its POSITIONs and rows said); for this process, or a
        writer not heard of, :meth:`writer_position`. Never above
        :meth:`writer_position`, which an idle writer's jump may lift."""
        if writer != self.instance_name:
            known = self._positions.get(writer)
            if known is not None:
                return known
        return self.writer_position(writer)

    def unfinished_ids(self) -> list[int]:
        """This process's allocated ids not finished yet, smallest first."""
        return sorted(self._unfinished)

    # Persisted-up-to

    @property
    def _busy(self) -> bool:
        return bool(self._unfinished or self._in_flight_fetches)

    def _note_finished(self, stream_id: int) -> None:
        heapq.heappush(self._known_finished, stream_id)
        self._recompute()

    def _recompute(self) -> None:
        me = self.instance_name
        others = [pos for name, pos in self._positions.items() if name != me]
        own = self._positions.get(me)
        if others:
            floor = min(others)
            if self._busy and own is not None:
                floor = min(floor, own)
        else:
            floor = own if own is not None else self._persisted_upto
        self._persisted_upto = max(self._persisted_upto, floor)

        # A run of finished ids just above lets us skip ahead; a gap stops it.
        heap = self._known_finished
        while heap:
            head = heap[0]
            if head <= self._persisted_upto:
                heapq.heappop(heap)
            elif head == self._persisted_upto + 1:
                heapq.heappop(heap)
                self._persisted_upto += 1
            else:
                break

        self._local_position = max(self._local_position, self._persisted_upto)
        if not self._busy:
            # Nothing of ours in flight: any future id of ours is above every
            # id seen so far, so we are as far along as anyone.
            self._local_position = max(self._local_position, self._max_seen_allocated)
