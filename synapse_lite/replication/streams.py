"""A stream as one process sees it: its definition, its positions, how it reads rows.

The composition root builds one :class:`Stream` per definition. Positions come
from the stream's ID generator (database streams: the generator itself is
the view) or from the component that owns the stream's data in memory
(typing, federation, :class:`MemoryPositions`), behind one interface,
:class:`StreamPositions`. Every position here counts up, on every stream
(backfill's stored ids count down; only its ``IdSpace`` converts).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from synapse_lite.streams.definition import StreamDefinition, UpdateFunction, Updates

if TYPE_CHECKING:
    from synapse_lite.replication.http.calls import InternalCalls

logger = logging.getLogger(__name__)

#: Rows fetched per call of an update function.
TARGET_ROW_COUNT = 100


class StreamPositions(Protocol):
    """Where one process is on one stream. The verbs and readers are those of
    the ID generator and its position model
    (``storage/id_generators/``), which implement them for database streams."""

    #: True when a restart of the writer starts its positions afresh (a
    #: memory stream: typing counts in a new run, federation from 0), so they
    #: may go backwards or jump; followers then reset rather than skip.
    can_reset: bool

    #: True when every restart of the writer begins above all its earlier
    #: positions (typing: a run number that only grows, in the position's
    #: high digits), so that even on a stream that resets, a POSITION below
    #: what this process received from the writer can only be false: it is
    #: refused (``went_backwards``), never taken for a restart.
    lower_position_is_false: bool

    @property
    def has_sequence(self) -> bool:
        """True when the stream's ids come from a database sequence, so that
        :meth:`read_max_allocated` bounds what a writer can truthfully claim
        (False: a memory stream, whose claims nothing outside its writer
        bounds)."""
        ...

    def starts_run(self, position: int) -> bool:
        """Whether a run of the writer begins at ``position`` (nothing of that
        run lies before it): a follower of another run that is told a
        writer is there needs no rows to be current, only a reset."""
        ...

    def writer_position(self, writer: str) -> int:
        """``writer`` has no rows this process has not seen at or below it
        (for this process: may run ahead of its last write while it is idle)."""

    def received_position(self, writer: str) -> int:
        """How far this process has received ``writer``'s rows. Never above
        :meth:`writer_position`, which other writers' announcements may lift."""

    def newest_local_write(self) -> int:
        """The newest position this process wrote (no idle jump): what the
        streamer compares with what it last sent."""

    def persisted_upto_position(self) -> int:
        """The position /sync hands out: every row at or below it, by any
        writer, is visible here."""

    def advance_writer(self, writer: str, position: int) -> None:
        """A POSITION from ``writer``: it has nothing unsent at or below it."""

    def advance_past_row(self, writer: str, row_id: int) -> None:
        """Rows of ``writer`` at ``row_id`` arrived: that id is finished."""

    async def read_stopped_writer_position(self, writer: str) -> int:
        """The position of the last row of a writer that has stopped for good."""

    def forget_writer(self, writer: str) -> None:
        """Stop tracking a writer that has stopped for good (its rows read)."""

    async def read_max_allocated(self) -> int | None:
        """The largest position anyone can truthfully claim now (the stream's
        sequence, read from the database), or None when nothing outside the
        writer's memory bounds it."""


class MemoryPositions:
    """The position of a stream kept in memory (typing, federation): a counter
    that only the component owning the rows moves -- the writer as it hands
    out positions, a follower's copy as its row hook takes the writer's rows
    (before the receiver gets here) -- so it is always a position that
    component really reached. The component is built with its counter
    (``TypingWriterHandler.positions(run)``, ...); the stream reads it."""

    can_reset = True
    has_sequence = False

    def __init__(
        self,
        start: int = 0,
        starts_run: Callable[[int], bool] = lambda position: position == 0,
        lower_position_is_false: bool = False,
    ) -> None:
        """``starts_run``: whether a run of the writer begins at a position
        (by default runs start from 0). ``lower_position_is_false``: see
        :class:`StreamPositions` (the writer's runs begin above each other)."""
        #: The position: moved by the owning component alone.
        self.current = start
        self._starts_run = starts_run
        self.lower_position_is_false = lower_position_is_false

    def starts_run(self, position: int) -> bool:
        return self._starts_run(position)

    def writer_position(self, writer: str) -> int:
        return self.current

    def received_position(self, writer: str) -> int:
        return self.current

    def newest_local_write(self) -> int:
        return self.current

    def persisted_upto_position(self) -> int:
        return self.current

    def advance_writer(self, writer: str, position: int) -> None:
        pass

    def advance_past_row(self, writer: str, row_id: int) -> None:
        pass

    async def read_stopped_writer_position(self, writer: str) -> int:
        return self.current

    def forget_writer(self, writer: str) -> None:
        pass

    async def read_max_allocated(self) -> int | None:
        return None


class Stream:
    """One stream on one process (see the module docstring)."""

    def __init__(
        self,
        definition: StreamDefinition,
        positions: StreamPositions,
        update_function: UpdateFunction,
        local_instance: str,
    ) -> None:
        self.definition = definition
        self.name = definition.name
        self.positions = positions
        self._update_function = update_function
        self._me = local_instance
        #: What this process last sent of its own rows (the streamer's bookkeeping).
        self.last_sent_position = positions.writer_position(local_instance)

    async def rows_since(
        self, writer: str, from_token: int, upto_token: int, limit: int = TARGET_ROW_COUNT
    ) -> tuple[Updates, int, bool]:
        """Rows of ``writer`` in ``(from_token, upto_token]``, at most about
        ``limit``: ``(updates, upto, limited)``; when limited, ``upto`` is how
        far the returned rows reach."""
        if from_token == upto_token:
            return [], upto_token, False
        return await self._update_function(writer, from_token, upto_token, limit)

    async def new_local_rows(self) -> tuple[Updates, int, bool]:
        """This process's rows since :attr:`last_sent_position`, advancing it."""
        current = self.positions.writer_position(self._me)
        if self.last_sent_position >= self.positions.newest_local_write():
            # Nothing written here: the advance came from elsewhere.
            self.last_sent_position = current
            return [], current, False
        updates, upto, limited = await self.rows_since(self._me, self.last_sent_position, current)
        self.last_sent_position = upto
        return updates, upto, limited

    def skip_unsent(self) -> None:
        """Forget unsent rows (nobody is listening; they read the database)."""
        self.last_sent_position = self.positions.writer_position(self._me)


def no_rows(stream_name: str) -> UpdateFunction:
    """For a stream whose rows this process cannot read (it takes no part in
    it): catching up yields nothing."""

    async def update_function(
        writer: str, from_token: int, upto_token: int, limit: int
    ) -> tuple[Updates, int, bool]:
        return [], upto_token, False

    return update_function


def rows_from_writer(
    calls: InternalCalls, definition: StreamDefinition, writer: str
) -> UpdateFunction:
    """An update function that asks the stream's writer over internal HTTP
    (streams kept in the writer's memory)."""
    from synapse_lite.replication.http.stream_updates import GET_STREAM_UPDATES, StreamUpdatesWanted

    async def update_function(
        instance: str, from_token: int, upto_token: int, limit: int
    ) -> tuple[Updates, int, bool]:
        answer = await calls.call(
            GET_STREAM_UPDATES,
            StreamUpdatesWanted(definition.name, from_token, upto_token, limit),
            instance=writer,
        )
        updates: list[tuple[int, Any]] = [
            (token, definition.parse_row(row)) for token, row in answer.updates
        ]
        return updates, answer.upto_token, answer.limited

    return update_function
