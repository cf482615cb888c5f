"""What every replication stream is: a name, a row type, positions per writer,
and an update function that reads rows between two positions."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from synapse_lite.storage.util.id_generators import MultiWriterIdGenerator

logger = logging.getLogger(__name__)

#: ``(instance_name, from_token, upto_token, limit) -> (updates, upto, limited)``
#: where updates are ``(token, row)`` with rows in wire form (JSON-able lists).
Updates = list[tuple[int, Any]]
UpdateFunction = Callable[[str, int, int, int], Awaitable[tuple[Updates, int, bool]]]

#: Rows fetched per call of an update function.
TARGET_ROW_COUNT = 100


class InvalidRow(ValueError):
    """A row received over replication does not fit the stream's row type."""


class Stream:
    """A stream as one process sees it.

    Subclasses set ``NAME`` and ``ROW_TYPE`` (a frozen attrs class whose fields,
    in order, are the row's wire form) and implement :meth:`current_token`.
    """

    NAME: ClassVar[str]
    ROW_TYPE: ClassVar[type]

    def __init__(self, local_instance_name: str, update_function: UpdateFunction) -> None:
        self.local_instance_name = local_instance_name
        self.update_function = update_function
        #: What this process last sent for the stream (streamer's bookkeeping).
        self.last_token = self.current_token(local_instance_name)

    @classmethod
    def parse_row(cls, row: Any) -> Any:
        """Build the row type from its wire form; :class:`InvalidRow` if it does
        not fit (wrong length or types)."""
        if not isinstance(row, list):
            raise InvalidRow(f"a {cls.NAME} row must be a JSON list, not {type(row).__name__}")
        try:
            return cls.ROW_TYPE(*row)
        except (TypeError, ValueError) as e:
            raise InvalidRow(f"bad {cls.NAME} row: {e}") from None

    def current_token(self, instance_name: str) -> int:
        """The position of ``instance_name``: it has no rows this process has
        not seen at or below it."""
        raise NotImplementedError

    def minimal_local_current_token(self) -> int:
        """Where this process's own last write is (no idle jump)."""
        return self.current_token(self.local_instance_name)

    def processed_position(self, instance_name: str) -> int:
        """How far this process has taken ``instance_name``'s rows (and
        positions): every row of it at or below has been processed here. Never
        above :meth:`current_token`, which may be lifted past it by other
        writers' announcements."""
        return self.current_token(instance_name)

    def can_discard_position(self, instance_name: str, prev_token: int, new_token: int) -> bool:
        """Whether a POSITION brings nothing new (for a stream that never resets)."""
        return False

    def discard_updates_and_advance(self) -> None:
        """Forget unsent updates (nobody is listening)."""
        self.last_token = self.current_token(self.local_instance_name)

    async def get_updates(self) -> tuple[Updates, int, bool]:
        """This process's new rows since :attr:`last_token`, advancing it."""
        current = self.current_token(self.local_instance_name)
        if self.last_token >= self.minimal_local_current_token():
            # Nothing written here: the advance came from elsewhere.
            self.last_token = current
            return [], current, False
        updates, upto, limited = await self.get_updates_since(
            self.local_instance_name, self.last_token, current
        )
        self.last_token = upto
        return updates, upto, limited

    async def get_updates_since(
        self, instance_name: str, from_token: int, upto_token: int, limit: int = TARGET_ROW_COUNT
    ) -> tuple[Updates, int, bool]:
        """Rows of ``instance_name`` in ``(from_token, upto_token]``, at most
        about ``limit``; ``(updates, upto, limited)``: when limited, ``upto`` is
        how far the returned rows reach."""
        if from_token == upto_token:
            return [], upto_token, False
        updates, upto, limited = await self.update_function(
            instance_name, from_token, upto_token, limit
        )
        # Store update functions return rows as tuples; the wire (and every
        # receiver's parse_row) takes lists.
        return [(t, list(r) if isinstance(r, tuple) else r) for t, r in updates], upto, limited


class StreamFromIdGen(Stream):
    """A stream whose positions are those of a :class:`MultiWriterIdGenerator`."""

    def __init__(
        self,
        local_instance_name: str,
        update_function: UpdateFunction,
        id_gen: MultiWriterIdGenerator,
    ) -> None:
        self.id_gen = id_gen
        super().__init__(local_instance_name, update_function)

    def current_token(self, instance_name: str) -> int:
        return self.id_gen.get_current_token_for_writer(instance_name)

    def minimal_local_current_token(self) -> int:
        return self.id_gen.get_minimal_local_current_token()

    def processed_position(self, instance_name: str) -> int:
        if instance_name == self.local_instance_name:
            return self.current_token(instance_name)
        own = self.id_gen.get_positions().get(instance_name)
        return self.current_token(instance_name) if own is None else own

    def can_discard_position(self, instance_name: str, prev_token: int, new_token: int) -> bool:
        return new_token <= self.processed_position(instance_name)

    def row_received(self, instance_name: str, token: int) -> None:
        """A row of ``instance_name`` at ``token`` arrived: that id is finished
        (a POSITION's token need not be; see ``advance_past_row``)."""
        self.id_gen.advance_past_row(instance_name, token)

    async def get_stopped_writer_token(self, instance_name: str) -> int:
        """The token of the last row of a writer that has stopped for good."""
        return await self.id_gen.get_stopped_writer_position(instance_name)


def no_update_function(stream_name: str) -> UpdateFunction:
    """For a stream whose rows this process cannot read (it is not the writer
    and has no way to fetch them): catching up yields nothing."""

    async def update_function(
        instance_name: str, from_token: int, upto_token: int, limit: int
    ) -> tuple[Updates, int, bool]:
        return [], upto_token, False

    return update_function
