"""Reading the position logs (see :mod:`synapse_lite.position_log`) into Spark.

Lines are parsed by Spark's JSON reader, so logs of any size stay on the
executors. A line that is not a valid record (a torn last line after a crash,
a missing field, an unknown kind) is counted and reported, never fatal.
Ids and positions are made positive here (backfill counts down from -1), as
everywhere in the audit.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import attr

from synapse_lite.position_log import STREAM_WIDE

LOG_PATTERN = "positions-*.jsonl"

_SCHEMA = (
    "kind STRING, ts LONG, process STRING, stream STRING, writer STRING, id LONG,"
    " committed BOOLEAN, position LONG, purpose STRING, _corrupt_record STRING"
)


#: The largest id or position a record may carry. Sequences are 64-bit, but a
#: value near the limit is a corrupt line, not an id: Spark would overflow on
#: negating -2**63 (or adding 1 to 2**63 - 1) and stop the whole audit.
LARGEST_VALUE = 2**62


def default_log_paths(data_dir: str) -> list[str]:
    """Every position log in a data directory (what each process writes there)."""
    return sorted(glob.glob(os.path.join(data_dir, LOG_PATTERN)))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PositionLogs:
    """The records of the logs given, split by kind.

    ``finished``: stream, writer, id, ts, committed.
    ``positions``: stream, writer (or ``*``), position, ts, process, purpose.
    """

    paths: tuple[str, ...]
    finished: Any
    positions: Any
    records: int
    malformed: int
    largest_value: int
    streams: tuple[str, ...]
    #: The first (smallest) id each writer logged as finished, per stream:
    #: ids below it were allocated before logging started and are not judged.
    #: Few entries (streams times writers), so the checks use it as a literal
    #: rather than joining a frame.
    first_finished: dict[tuple[str, str], int] = attr.ib(factory=dict)

    def first_finished_of_stream(self) -> dict[str, int]:
        """The first id logged as finished per stream, by any writer."""
        firsts: dict[str, int] = {}
        for (stream, _), first in self.first_finished.items():
            firsts[stream] = min(first, firsts.get(stream, first))
        return firsts


def load_position_logs(spark: Any, paths: list[str], stream_names: list[str]) -> PositionLogs:
    """Parse ``paths``; records of streams not in ``stream_names`` (kept only in
    memory, such as typing) are ignored."""
    from pyspark.sql import functions as F

    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(f"position log not found: {', '.join(missing)}")
    raw = (
        spark.read.schema(_SCHEMA)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt_record")
        .json(list(paths))
    )
    finished_ok = (
        (F.col("kind") == "finished")
        & F.col("ts").isNotNull()
        & F.col("writer").isNotNull()
        & F.col("id").between(-LARGEST_VALUE, LARGEST_VALUE)
        & F.col("committed").isNotNull()
    )
    position_ok = (
        (F.col("kind") == "position")
        & F.col("ts").isNotNull()
        & F.col("writer").isNotNull()
        & F.col("position").between(-LARGEST_VALUE, LARGEST_VALUE)
    )
    valid = F.col("_corrupt_record").isNull() & F.col("stream").isNotNull()
    parsed = (
        raw.withColumn(
            "status",
            F.when(valid & finished_ok, "finished")
            .when(valid & position_ok, "position")
            .otherwise("malformed"),
        )
        # Made positive here, each under its own kind's condition, before the
        # checkpoint: no later filter can be pushed below it onto a line whose
        # value would overflow when negated.
        .withColumn("id", F.when(F.col("status") == "finished", F.abs("id")))
        .withColumn("position", F.when(F.col("status") == "position", F.abs("position")))
        .localCheckpoint(eager=True)  # read once: the stats and both kinds use it
    )
    # Per kind, stream and (finished records) writer: few rows, one job. A
    # malformed line's fields may be anything: they make no groups of their own.
    valid_stream = F.when(F.col("status") != "malformed", F.col("stream"))
    finished_writer = F.when(F.col("status") == "finished", F.col("writer"))
    stats = parsed.groupBy(
        "status", valid_stream.alias("stream"), finished_writer.alias("writer")
    ).agg(
        F.count(F.lit(1)).alias("n"),
        # Only valid records' values (a malformed line's are null by now).
        F.max(
            F.when(
                F.col("status") != "malformed",
                F.greatest(F.coalesce("id", F.lit(0)), F.coalesce("position", F.lit(0))),
            )
        ).alias("largest"),
        F.min("id").alias("first_finished"),
    )
    counts: dict[str, int] = {}
    largest = 0
    streams: set[str] = set()
    first_finished: dict[tuple[str, str], int] = {}
    for row in stats.collect():
        status = row["status"]
        counts[status] = counts.get(status, 0) + int(row["n"])
        largest = max(largest, int(row["largest"] or 0))
        if status != "malformed" and row["stream"] in stream_names:
            streams.add(row["stream"])
            if status == "finished":
                first_finished[(row["stream"], row["writer"])] = int(row["first_finished"])
    audited = F.col("stream").isin(stream_names)
    finished = parsed.filter((F.col("status") == "finished") & audited).select(
        "stream", "writer", "id", "ts", "committed"
    )
    positions = parsed.filter((F.col("status") == "position") & audited).select(
        "stream",
        "writer",
        "position",
        "ts",
        F.coalesce("process", F.lit("?")).alias("process"),
        F.coalesce("purpose", F.lit("")).alias("purpose"),
    )
    return PositionLogs(
        paths=tuple(paths),
        finished=finished,
        positions=positions,
        records=sum(counts.values()),
        malformed=counts.get("malformed", 0),
        largest_value=largest,
        streams=tuple(sorted(streams)),
        first_finished=first_finished,
    )


__all__ = ["LOG_PATTERN", "STREAM_WIDE", "PositionLogs", "default_log_paths", "load_position_logs"]
