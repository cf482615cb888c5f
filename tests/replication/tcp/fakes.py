"""In-memory stand-ins for the replication module tests: positions without an
ID generator, update functions without a database, connections without sockets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from synapse_lite.replication.streams import Stream
from synapse_lite.replication.tcp.commands import Command, command_line, parse_command_from_line
from synapse_lite.streams.definition import StreamDefinition, Updates


class FakePositions:
    """Positions kept in a dict; ``can_reset`` as the test wants."""

    def __init__(
        self, local: str, can_reset: bool = False, lower_position_is_false: bool = False
    ) -> None:
        self.can_reset = can_reset
        self.lower_position_is_false = lower_position_is_false
        self._local = local
        self.received: dict[str, int] = {}
        self.local_write = 0
        self.calls: list[tuple[str, str, int]] = []
        #: What the stream's sequence has handed out (None: no bound, like a
        #: stream kept in memory); ``sequence_reads`` counts the look-ups.
        self.allocated: int | None = None
        self.sequence_reads = 0
        #: How many of the next sequence look-ups fail (the database is down).
        self.sequence_failures = 0

    @property
    def has_sequence(self) -> bool:
        return self.allocated is not None

    def starts_run(self, position: int) -> bool:
        # A resetting stream's runs start at multiples of 100 here.
        return self.can_reset and position % 100 == 0

    def writer_position(self, writer: str) -> int:
        if writer == self._local:
            return self.local_write
        return self.received.get(writer, 0)

    def received_position(self, writer: str) -> int:
        return self.writer_position(writer)

    def newest_local_write(self) -> int:
        return self.local_write

    def persisted_upto_position(self) -> int:
        return min([self.local_write, *self.received.values()])

    def advance_writer(self, writer: str, position: int) -> None:
        self.calls.append(("position", writer, position))
        if self.can_reset:
            self.received[writer] = position
        else:
            self.received[writer] = max(self.received.get(writer, 0), position)

    def advance_past_row(self, writer: str, position: int) -> None:
        self.calls.append(("row", writer, position))
        self.received[writer] = max(self.received.get(writer, 0), position)

    async def read_stopped_writer_position(self, writer: str) -> int:
        return self.received.get(writer, 0)

    def forget_writer(self, writer: str) -> None:
        self.received.pop(writer, None)

    async def read_max_allocated(self) -> int | None:
        self.sequence_reads += 1
        if self.sequence_failures:
            self.sequence_failures -= 1
            raise RuntimeError("the database is unavailable")
        return self.allocated


class FakeRows:
    """An update function over rows the test puts in, by writer; counts calls
    and can be made to fail."""

    def __init__(self, resets: bool = False) -> None:
        #: Like a memory stream's writer: a ``from_token`` ahead of what it
        #: has means the asker saw its previous run, and gets everything.
        self.resets = resets
        self.rows: dict[str, list[tuple[int, Any]]] = {}
        self.calls: list[tuple[str, int, int, int]] = []
        self.failures = 0

    def add(self, writer: str, token: int, row: Any) -> None:
        self.rows.setdefault(writer, []).append((token, row))

    async def __call__(
        self, writer: str, from_token: int, upto_token: int, limit: int
    ) -> tuple[Updates, int, bool]:
        self.calls.append((writer, from_token, upto_token, limit))
        if self.failures:
            self.failures -= 1
            raise RuntimeError("the database is away")
        if self.resets and from_token > upto_token:
            from_token = 0
        found = [(t, r) for t, r in self.rows.get(writer, []) if from_token < t <= upto_token]
        if len(found) > limit:
            found = found[:limit]
            return found, found[-1][0], True
        return found, upto_token, False


def fake_stream(
    definition: StreamDefinition, local: str = "me", can_reset: bool = False
) -> tuple[Stream, FakePositions, FakeRows]:
    positions = FakePositions(local, can_reset)
    rows = FakeRows(resets=can_reset)
    return Stream(definition, positions, rows, local), positions, rows


class RecordingConnection:
    """A connection that keeps what is sent on it, through the wire format."""

    def __init__(self, name: str = "peer", vouches_for_claims: bool = False) -> None:
        """``vouches_for_claims``: act as a TCP worker's connection to the
        main process (its claims are taken as checked)."""
        self.name = name
        self.vouches_for_claims = vouches_for_claims
        self.sent: list[Command] = []

    def send_command(self, cmd: Command) -> None:
        self.sent.append(parse_command_from_line(command_line(cmd)))

    def describe(self) -> str:
        return self.name


class RecordingReceiver:
    """Stands in for ReplicationReceiver: records what would be applied."""

    def __init__(self, streams: dict[str, Stream]) -> None:
        self.streams = streams
        self.applied: list[tuple[str, str, int, list[Any]]] = []

    def add_row_hook(self, stream_name: str, hook: Any) -> None:
        raise NotImplementedError

    def on_rows(self, stream_name: str, writer: str, token: int, rows: Sequence[Any]) -> None:
        self.applied.append((stream_name, writer, token, list(rows)))
        positions = self.streams[stream_name].positions
        if rows:
            positions.advance_past_row(writer, token)
        else:
            positions.advance_writer(writer, token)
