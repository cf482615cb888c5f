"""Duplicates and gaps found from per-block id bitmaps agree with a plain
computation over every id, around the edges of the 32,768-id blocks where the
block arithmetic could slip by one."""

from __future__ import annotations

import random
from typing import Any

from twisted.trial import unittest

from spark.catalog import AuditCatalog, AuditedStream
from spark.gaps import BLOCK_IDS
from spark.progress import Progress
from spark.sources import AuditData
from spark.summary import collect_results
from synapse_lite.streams.catalog import BACKFILL as BACKFILL_STREAM
from synapse_lite.streams.catalog import EVENTS as EVENTS_STREAM
from tests.spark.session import shared_spark

assert EVENTS_STREAM.ids is not None and BACKFILL_STREAM.ids is not None
EVENTS, BACKFILL = EVENTS_STREAM.ids, BACKFILL_STREAM.ids
WRITERS = ("main", "worker1")

Row = tuple[str, str, int]  # table, instance, id


def catalog() -> AuditCatalog:
    return AuditCatalog(
        (
            AuditedStream("events", EVENTS.sequence_name, True, EVENTS.tables, WRITERS, True),
            AuditedStream(
                "backfill", BACKFILL.sequence_name, False, BACKFILL.tables, WRITERS, True
            ),
        ),
        WRITERS,
    )


def expected_gaps(rows: list[Row], last: int) -> list[tuple[int, int]]:
    """Every range of ids from 1 to ``last`` that no events row carries."""
    present = {i for _, _, i in rows if 0 < i <= last}
    ranges: list[tuple[int, int]] = []
    for i in range(1, last + 1):
        if i in present:
            continue
        if ranges and ranges[-1][1] == i - 1:
            ranges[-1] = (ranges[-1][0], i)
        else:
            ranges.append((i, i))
    return ranges


def expected_duplicates(rows: list[Row]) -> list[int]:
    """Ids of events on two own-id rows or used by two instances."""
    by_id: dict[int, list[tuple[str, str]]] = {}
    for table, instance, i in rows:
        if i > 0:
            by_id.setdefault(i, []).append((table, instance))
    return sorted(
        i
        for i, uses in by_id.items()
        if sum(t == "events" for t, _ in uses) > 1 or len({n for _, n in uses}) > 1
    )


class AuditBlocksTestCase(unittest.TestCase):
    def audit(self, rows: list[Row], last: int) -> tuple[list[Any], list[Any]]:
        spark = shared_spark()
        data = AuditData(
            rows=spark.createDataFrame(rows, "table STRING, instance STRING, id LONG"),
            stream_positions=(("events", "main", last), ("events", "worker1", last)),
            sequences={EVENTS.sequence_name: last, BACKFILL.sequence_name: 0},
            database="test",
            route="test",
        )
        _, findings, info = collect_results(spark, data, catalog(), None, False, Progress(None))
        return findings, info

    def test_edges_of_blocks(self) -> None:
        b = BLOCK_IDS
        last = 3 * b + 5
        missing = {1, b - 1, b, b + 1, 2 * b, 2 * b + 1, 2 * b + 2, 3 * b + 3, 3 * b + 4}
        # The whole of the second block but its first id is missing too.
        missing |= set(range(b + 2, 2 * b))
        rows: list[Row] = [
            ("events", WRITERS[i % 2], i) for i in range(1, last - 1) if i not in missing
        ]
        # A shared id with one writer is fine; own-id twice, or two writers, is not.
        rows += [
            ("current_state_delta_stream", "main", 2),
            ("current_state_delta_stream", "main", 2),
        ]
        rows += [("events", "main", b + b // 2)]  # alone in the middle of a long gap
        rows += [("events", "main", 2 * b - 1), ("events", "main", 2 * b - 1)]
        rows += [("current_state_delta_stream", "main", 3 * b + 1)]  # events row by worker1
        rows += [("events", "main", last + 7)]  # above the sequence: no gap after last
        findings, info = self.audit(rows, last)

        (gap,) = [i for i in info if i.kind == "gap"]
        ranges = expected_gaps(rows, last)
        self.assertEqual(gap.count, sum(b - a + 1 for a, b in ranges))
        self.assertEqual(gap.details["ranges"], len(ranges))
        self.assertEqual([(s["id"], s["last"]) for s in gap.samples], ranges[:10])

        duplicates = sorted(i for f in findings if f.kind == "duplicate_stream_id" for i in f.ids)
        self.assertEqual(duplicates, [2 * b - 1, 3 * b + 1])
        self.assertEqual(duplicates, expected_duplicates(rows))
        kinds = sorted({f.kind for f in findings})
        self.assertEqual(
            kinds, ["duplicate_stream_id", "id_above_sequence", "position_behind_rows"]
        )

    def test_random_rows(self) -> None:
        """Random holes and repeats over three blocks, checked id by id."""
        rng = random.Random(6)
        last = 3 * BLOCK_IDS - 17
        rows: list[Row] = []
        for i in range(1, last + 1):
            if rng.random() < 0.02:
                continue
            rows.append(("events", rng.choice(WRITERS), i))
            if rng.random() < 0.001:
                rows.append(("current_state_delta_stream", rng.choice(WRITERS), i))
        findings, info = self.audit(rows, last)
        (gap,) = [i for i in info if i.kind == "gap"]
        ranges = expected_gaps(rows, last)
        self.assertEqual(
            (gap.count, gap.details["ranges"]), (sum(b - a + 1 for a, b in ranges), len(ranges))
        )
        self.assertEqual([(s["id"], s["last"]) for s in gap.samples], ranges[:10])
        (found,) = [f for f in findings if f.kind == "duplicate_stream_id"]
        expected = expected_duplicates(rows)
        self.assertEqual((found.writer, found.count), ("main,worker1", len(expected)))
        self.assertEqual(list(found.ids), expected[:20])
