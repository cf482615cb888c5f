"""Property test of batches (issue 35): two writers' streamers send what
each reactor turn committed as one batch per stream; a follower's command
handler applies them. Hypothesis draws the commits (one to three rows
sharing an id, ids interleaved between the writers) and where the reactor
turns end, so batches have random sizes (one commit to many, pages of the
update function included).

Checked: the follower applies every row exactly once, in each writer's
order; a batch is applied in one go (one ``on_rows``: one cache pass, one
wake-up) at its highest id, after every earlier row of its writer and
before any later one; a writer's position never goes back and ends at its
last id; and there is at most one batch per writer and turn. The follower
receives the commands in reads of random sizes (``read_started`` /
``read_done``, as its TCP protocol calls them for each read of the
socket), which may merge a writer's batches but change none of the above.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import task
from twisted.trial import unittest

from synapse_lite.clock import Clock
from synapse_lite.replication.tcp.commands import Command, command_line, parse_command_from_line
from synapse_lite.replication.tcp.handler import ReplicationCommandHandler
from synapse_lite.replication.tcp.streamer import ReplicationStreamer
from synapse_lite.streams.catalog import BUILTIN_STREAMS, ReceiptsStreamRow
from tests.replication.tcp.fakes import RecordingConnection, RecordingReceiver, fake_stream

WRITERS = ("w1", "w2")

#: A commit of one writer (its rows share one id), or the end of a reactor turn.
Step = tuple[str, int] | None

STEPS: st.SearchStrategy[list[Step]] = st.lists(
    st.one_of(
        st.none(),
        st.tuples(st.sampled_from(WRITERS), st.integers(1, 3)),
    ),
    max_size=300,
)


class _Wire:
    """The streamers' side of the connection: every command, through the
    wire format, to the follower's handler, in the order sent."""

    connected = True

    def __init__(self, deliver: Any, handler: Any, boundaries: list[bool]) -> None:
        self._deliver = deliver
        self._handler = handler
        #: For each command in turn: whether a read of the socket ends before it.
        self._boundaries = list(reversed(boundaries))

    def send_command(self, cmd: Command) -> None:
        if self._boundaries and self._boundaries.pop():
            self._handler.read_done()
            self._handler.read_started()
        self._deliver(parse_command_from_line(command_line(cmd)))

    def on_new_connection(self, callback: Any) -> None:
        pass


def receipt(writer: str, stream_id: int, n: int) -> ReceiptsStreamRow:
    return ReceiptsStreamRow("!r:x", "m.read", f"@{writer}-{n}:x", f"$e{stream_id}", None, {})


def id_of(row: ReceiptsStreamRow) -> int:
    return int(row.event_id[2:])


class BatchesPropertyTest(unittest.TestCase):
    def test_batches_of_random_sizes(self) -> None:
        #: The number of distinct ids in each batch applied, over all examples.
        sizes: list[int] = []

        @settings(max_examples=150, deadline=None)
        @given(steps=STEPS, reads=st.lists(st.booleans(), max_size=600))
        def run(steps: list[Step], reads: list[bool]) -> None:
            self.scenario(steps, reads, sizes)

        run()
        # Not a test of nothing: batches of one id and of many were applied.
        self.assertEqual(min(sizes), 1)
        self.assertGreater(max(sizes), 3)

    def scenario(self, steps: list[Step], reads: list[bool], sizes: list[int]) -> None:
        clock = task.Clock()
        follower_stream, follower_positions, _ = fake_stream(
            BUILTIN_STREAMS["receipts"], local="follower"
        )
        receiver = RecordingReceiver({"receipts": follower_stream})
        handler = ReplicationCommandHandler(
            instance_name="follower",
            clock=Clock(clock),
            streams={"receipts": follower_stream},
            receiver=receiver,  # type: ignore[arg-type]
        )
        connection = RecordingConnection("main")
        handler.new_connection(connection)
        wire = _Wire(lambda cmd: handler.on_command(connection, cmd), handler, reads)
        handler.read_started()
        writers = {}
        for name in WRITERS:
            stream, positions, rows = fake_stream(BUILTIN_STREAMS["receipts"], local=name)
            streamer = ReplicationStreamer(
                instance_name=name,
                clock=Clock(clock),
                handler=wire,  # type: ignore[arg-type]
                streams=[stream],
                position_log=None,
            )
            writers[name] = (streamer, positions, rows)
            streamer.on_notifier_poke()  # announces its position
        clock.advance(0)

        next_id = 0
        committed: dict[str, list[tuple[int, ReceiptsStreamRow]]] = {w: [] for w in WRITERS}
        turns = 1
        for step in [*steps, None]:
            if step is None:
                turns += 1
                clock.advance(0)
                continue
            name, n = step
            next_id += 1
            streamer, positions, rows = writers[name]
            for i in range(n):
                row = receipt(name, next_id, i)
                rows.add(name, next_id, row)
                committed[name].append((next_id, row))
            positions.local_write = next_id
            streamer.on_notifier_poke()
        handler.read_done()

        for name in WRITERS:
            batches = [(t, r) for _, w, t, r in receiver.applied if w == name and r]
            # Every row once, in the writer's order.
            self.assertEqual(
                [row for _, rs in batches for row in rs], [r for _, r in committed[name]]
            )
            last = 0
            for token, batch_rows in batches:
                # Applied at its highest id, after every earlier row.
                self.assertEqual(token, max(id_of(r) for r in batch_rows))
                self.assertGreater(min(id_of(r) for r in batch_rows), last)
                last = token
                sizes.append(len({id_of(r) for r in batch_rows}))
            self.assertLessEqual(len(batches), turns)
            # The position never went back, and ends at the writer's last id.
            moves = [p for _, w, p in follower_positions.calls if w == name]
            self.assertEqual(moves, sorted(moves))
            final = committed[name][-1][0] if committed[name] else 0
            self.assertEqual(follower_positions.received_position(name), final)
