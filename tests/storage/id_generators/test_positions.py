"""The pure position model: the reference scenarios stated in numbers, and a
property test over thousands of random interleavings of three writers and a
reader (no database, no reactor: each example runs in microseconds)."""

from __future__ import annotations

from typing import Any

import attr
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial import unittest

from synapse_lite.storage.id_generators.positions import PositionModel

WRITERS = ("first", "second", "third")


def model(name: str, positions: dict[str, int], persisted: int, writers: Any = ()) -> PositionModel:
    m = PositionModel(name)
    m.load(positions, persisted, writers=writers)
    return m


def allocate(m: PositionModel, ids: list[int]) -> None:
    marker = m.begin_fetch()
    m.fetched(ids)
    m.end_fetch(marker)


class ScenarioTestCase(unittest.TestCase):
    """The reference's ID generator scenarios, on the model directly."""

    def test_out_of_order_finish(self) -> None:
        m = model("master", {"master": 7}, 7, ["master"])
        allocate(m, [8, 9, 10, 11])
        positions = []
        for finished in (9, 8, 11, 10):
            m.finish([finished])
            positions.append(m.known_writer_positions()["master"])
        self.assertEqual(positions, [7, 9, 9, 11])

    def test_get_persisted_upto_position(self) -> None:
        m = model("reader", {"first": 3, "second": 5}, 3)
        seen = [m.persisted_upto_position()]
        for writer, position in (("first", 6), ("second", 7), ("second", 9), ("first", 8)):
            m.advance_writer(writer, position)
            seen.append(m.persisted_upto_position())
        # first at 6 holds the stream back until it reaches 8.
        self.assertEqual(seen, [3, 5, 6, 6, 8])
        m.advance_past_row("first", 8)
        m.advance_writer("first", 11)
        m.advance_writer("second", 15)
        self.assertEqual(m.persisted_upto_position(), 11)

    def test_rows_run_persisted_up_to_over_a_gap_filled_late(self) -> None:
        m = model("reader", {"first": 7, "second": 7}, 7)
        m.advance_past_row("second", 9)  # 8 is first's, still unseen
        self.assertEqual(m.persisted_upto_position(), 7)
        m.advance_past_row("first", 8)
        self.assertEqual(m.persisted_upto_position(), 9)

    def test_a_position_is_not_an_id(self) -> None:
        """A POSITION says nothing of that id finishing (it may be another
        writer's, in flight); an RDATA row does."""
        m = model("reader", {"first": 5, "second": 5}, 5)
        m.advance_writer("first", 7)
        self.assertEqual(m.persisted_upto_position(), 5)  # second may have 6 or 7 in flight
        m.advance_past_row("second", 6)
        m.advance_past_row("second", 7)
        self.assertEqual(m.persisted_upto_position(), 7)

    def test_current_token_gap(self) -> None:
        """An idle writer jumps to the largest id it has seen allocated; one
        with a write in flight does not."""
        second = model("second", {"first": 7, "second": 7, "third": 7}, 7, WRITERS)
        second.advance_writer("first", 9)
        self.assertEqual(
            (second.writer_position("first"), second.writer_position("second")), (9, 9)
        )
        self.assertEqual(second.persisted_upto_position(), 7)  # third lags
        allocate(second, [12])
        second.advance_writer("first", 11)
        self.assertEqual(second.writer_position("second"), 9)
        second.finish([12])
        self.assertEqual(second.writer_position("second"), 12)
        self.assertEqual(second.persisted_upto_position(), 7)

    def test_an_id_in_a_fetch_under_way_holds_the_position(self) -> None:
        m = model("first", {"first": 5, "second": 5}, 5, ["first", "second"])
        marker = m.begin_fetch()  # may return anything above 5
        allocate(m, [6])
        m.finish([6])
        self.assertEqual(m.known_writer_positions()["first"], 5)
        self.assertEqual(m.newest_local_write(), 6)  # but its row must still be sent
        m.fetched([7])
        m.end_fetch(marker)
        m.finish([7])
        self.assertEqual(m.known_writer_positions()["first"], 7)

    def test_removed_writer_no_longer_holds_the_stream_back(self) -> None:
        m = model("reader", {"first": 3, "second": 9}, 3)
        self.assertTrue(m.forget_writer("first"))
        self.assertEqual(m.persisted_upto_position(), 9)
        self.assertFalse(m.forget_writer("first"))
        with self.assertRaises(ValueError):
            m.forget_writer("reader")

    def test_new_writer_starts_at_persisted_upto(self) -> None:
        m = model("third", {"first": 3, "second": 7}, 3, ["first", "second", "third"])
        self.assertEqual(m.known_writer_positions()["third"], 3)
        self.assertEqual(m.writer_position("fourth"), 3)

    def test_loaded_rows_after_the_stored_positions(self) -> None:
        m = PositionModel("first")
        m.load({"first": 3, "second": 3}, 3, [("second", 5), ("first", 4), ("second", 6)])
        self.assertEqual(m.known_writer_positions()["first"], 4)
        self.assertEqual(m.persisted_upto_position(), 6)


# The property test.


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Op:
    kind: str
    writer: int
    target: int
    n: int
    commit: bool


ops = st.builds(
    Op,
    kind=st.sampled_from(
        ["allocate", "begin", "land", "finish", "announce", "row", "restart", "pause"]
    ),
    writer=st.integers(0, 2),
    target=st.integers(0, 3),
    n=st.integers(1, 3),
    commit=st.booleans(),
)


class _World:
    """Three writer processes and a reader, one sequence, one table of rows."""

    def __init__(self) -> None:
        self.sequence = 0
        self.stored: dict[str, int] = {}  # stream_positions
        self.committed: list[list[int]] = [[] for _ in WRITERS]  # rows on disk, per writer
        self.in_flight: list[list[int]] = [[] for _ in WRITERS]
        self.fetches: list[list[int]] = [[] for _ in WRITERS]  # markers of open fetches
        self.delivered: list[dict[int, set[int]]] = [dict() for _ in range(4)]
        self.high: list[tuple[int, dict[str, int]]] = [(0, {}) for _ in range(4)]
        self.models: list[PositionModel] = [self._fresh(name, writes=True) for name in WRITERS] + [
            self._fresh("reader", writes=False)
        ]

    def _fresh(self, name: str, writes: bool) -> PositionModel:
        """A process starting: what the generator's loading reads."""
        m = PositionModel(name)
        positions = dict(self.stored)
        if writes:
            positions[name] = self.sequence  # a starting writer has nothing in flight
        low = min(positions.values(), default=None)
        rows = []
        if low is None:
            persisted = max((i for ids in self.committed for i in ids), default=0)
        else:
            persisted = low
            rows = [
                (WRITERS[w], i) for w, ids in enumerate(self.committed) for i in ids if i >= low
            ]
        m.load(positions, persisted, rows, writers=WRITERS)
        if writes:
            # In the table before it allocates anything (as the generator does).
            own = m.known_writer_positions()[name]
            self.stored[name] = max(self.stored.get(name, 0), own)
        return m

    def unfinished(self, w: int | None = None) -> list[int]:
        writers = range(3) if w is None else [w]
        return [i for x in writers for i in self.in_flight[x]]

    def run(self, op: Op) -> None:
        w = op.writer
        me = self.models[w]
        if op.kind == "allocate":
            ids = list(range(self.sequence + 1, self.sequence + 1 + op.n))
            self.sequence += op.n
            marker = me.begin_fetch()
            me.fetched(ids)
            me.end_fetch(marker)
            self.in_flight[w].extend(ids)
        elif op.kind == "begin":
            self.fetches[w].append(me.begin_fetch())
        elif op.kind == "land" and self.fetches[w]:
            marker = self.fetches[w].pop(0)
            ids = list(range(self.sequence + 1, self.sequence + 1 + op.n))
            self.sequence += op.n
            me.fetched(ids)
            me.end_fetch(marker)
            self.in_flight[w].extend(ids)
        elif op.kind == "finish" and self.in_flight[w]:
            i = self.in_flight[w].pop(op.n % len(self.in_flight[w]))
            me.finish([i])
            if op.commit:
                self.committed[w].append(i)
            # The writer records its position outside the data transaction.
            own = me.known_writer_positions()[WRITERS[w]]
            self.stored[WRITERS[w]] = max(self.stored.get(WRITERS[w], 0), own)
        elif op.kind == "announce" and op.target != w:
            self.models[op.target].advance_writer(WRITERS[w], me.writer_position(WRITERS[w]))
        elif op.kind == "row" and op.target != w:
            # RDATA: this writer's committed rows up to its position, in order.
            position = me.writer_position(WRITERS[w])
            seen = self.delivered[op.target].setdefault(w, set())
            for i in sorted(self.committed[w]):
                if i <= position and i not in seen:
                    seen.add(i)
                    self.models[op.target].advance_past_row(WRITERS[w], i)
        elif op.kind == "restart" and not self.in_flight[w] and not self.fetches[w]:
            before = me.writer_position(WRITERS[w])
            self.models[w] = self._fresh(WRITERS[w], writes=True)
            self.delivered[w] = {}
            # Never going back is a property of one process's run, not across runs.
            self.high[w] = (0, {})
            assert self.models[w].writer_position(WRITERS[w]) >= before, "restart went back"

    def check(self) -> None:
        for index, m in enumerate(self.models):
            upto, writer_positions = self.high[index]
            assert m.persisted_upto_position() >= upto, "persisted-up-to went back"
            now = {name: m.writer_position(name) for name in WRITERS}
            for name, position in writer_positions.items():
                assert now[name] >= position, f"{name}'s position went back"
            self.high[index] = (m.persisted_upto_position(), now)
            for unfinished in self.unfinished():
                assert m.persisted_upto_position() < unfinished, (
                    "persisted-up-to passed an unfinished id"
                )
            for w, name in enumerate(WRITERS):
                for unfinished in self.unfinished(w):
                    assert m.known_writer_positions().get(name, 0) < unfinished, (
                        f"{name}'s position covers its unfinished id {unfinished}"
                    )

    def settle(self) -> None:
        """Finish everything, then replicate until nothing changes: every
        process agrees that everything up to the sequence's head is persisted."""
        for w in range(3):
            while self.fetches[w]:
                self.run(Op("land", w, 0, 1, True))
            while self.in_flight[w]:
                self.run(Op("finish", w, 0, 0, True))
        for _ in range(3):
            for w in range(3):
                for target in range(4):
                    self.run(Op("row", w, target, 0, True))
                    self.run(Op("announce", w, target, 0, True))
        for m in self.models:
            assert m.persisted_upto_position() == self.sequence, (
                m.instance_name,
                m.persisted_upto_position(),
            )
            for name in WRITERS:
                assert m.writer_position(name) == self.sequence


class PositionsPropertyTestCase(unittest.TestCase):
    @settings(max_examples=3000, deadline=None)
    @given(st.lists(ops, max_size=60))
    def test_random_interleavings(self, program: list[Op]) -> None:
        world = _World()
        for op in program:
            world.run(op)
            world.check()
        world.settle()
        world.check()
