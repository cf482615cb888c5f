"""The checks that need the position logs: positions handed out too early.

A position record says process P reported position X at time T, either of one
writer W or stream-wide (writer ``*``, the persisted-up-to position).

What a position covers:

* a writer's position X covers every id <= X allocated by that writer;
* a stream-wide position X covers every id <= X of every writer.

A covered id is a violation when it finished (committed or failed) after T: a
reader trusting the position skipped it. An id with rows but no ``finished``
record is treated as never finished, but only when the logs hold finished
records of its writer for the stream and the id is not below the first of them
(ids before logging started are not judged).

To stay exact without a range join, ids and positions are put in the buckets
of consecutive ids the rows are partitioned by (:mod:`spark.frames`). For each
id, the earliest record covering it is the earlier of (a) the earliest record
at or above it in its own bucket (a window inside the bucket) and (b) the
earliest record in any higher bucket (a suffix over the small per-bucket
aggregate).

What it costs: at audit sizes, Spark's fixed cost per job and stage, not the
records, dominates (40,000 records take PostgreSQL 0.1 s). So
:func:`check_logs` reads the rows once, only those the logs can judge (ids
from each stream's first logged one: :func:`logged_row_ids`), keeps them with
their tables so no check goes back to the rows, and brings every result (the
findings, the per-stream counts of logged outcomes, the persisted-up-to
positions) to the driver in one job.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attr

from spark.catalog import AuditCatalog
from spark.frames import Frames, as_findings, per_stream, summarise
from spark.logs import STREAM_WIDE, PositionLogs

_NEVER = 2**63 - 1  # the finish time of an id that never finished

#: Severities marking the rows of :func:`check_logs`' one collect that are
#: not findings: per-stream counts of logged outcomes, persisted-up-to.
_OUTCOME_COUNTS = "log_outcome_counts"
_PERSISTED_UPTO = "log_persisted_upto"

#: Log records per shuffle partition of the position-log checks.
RECORDS_PER_PARTITION = 1_000_000


@attr.s(slots=True, frozen=True, auto_attribs=True)
class LogResults:
    """What the position-log checks bring to the driver."""

    #: Finding rows (:data:`spark.frames.FINDING_COLUMNS`).
    found: list[Any]
    #: Per stream: ids without a row the logs say failed and committed.
    logged: dict[str, dict[str, int]]
    #: Per stream with finished records: see :func:`persisted_upto`.
    persisted: dict[str, int]


@contextmanager
def _few_shuffle_partitions(spark: Any, partitions: int) -> Iterator[None]:
    """Run the block with ``partitions`` partitions per shuffle and adaptive
    execution off (the session's settings back afterwards). Adaptive execution
    submits every shuffle stage as a job of its own and plans the rest again
    after each: with some forty small stages that costs more than the work."""
    settings = {
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.shuffle.partitions": str(partitions),
    }
    saved = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def check_logs(
    spark: Any, frames: Frames, catalog: AuditCatalog, logs: PositionLogs, live: bool
) -> LogResults:
    """Every position-log check, in one Spark job after one pass over the rows
    (with a partition per :data:`RECORDS_PER_PARTITION` log records, at least
    one per core)."""
    partitions = max(
        spark.sparkContext.defaultParallelism, -(-logs.records // RECORDS_PER_PARTITION)
    )
    with _few_shuffle_partitions(spark, partitions):
        return _check_logs(spark, frames, catalog, logs, live)


def _check_logs(
    spark: Any, frames: Frames, catalog: AuditCatalog, logs: PositionLogs, live: bool
) -> LogResults:
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    per_id = logged_row_ids(frames, logs).localCheckpoint(eager=True)
    outcomes = logged_outcomes(per_id, logs)
    counts = outcome_counts(outcomes).select(
        F.lit(_OUTCOME_COUNTS).alias("severity"),
        F.lit("").alias("kind"),
        "stream",
        F.lit("").alias("writer"),
        F.col("logged_failed").alias("count"),
        F.array("logged_committed").alias("ids"),
        F.lit("[]").alias("samples"),
        F.lit("{}").alias("details"),
    )
    persisted = persisted_upto(spark, frames, per_id, logs).select(
        F.lit(_PERSISTED_UPTO).alias("severity"),
        F.lit("").alias("kind"),
        "stream",
        F.lit("").alias("writer"),
        F.lit(0).cast("long").alias("count"),
        F.array("upto").alias("ids"),
        F.lit("[]").alias("samples"),
        F.lit("{}").alias("details"),
    )
    rows = functools.reduce(
        DataFrame.unionByName,
        [
            positions_before_finish(spark, frames, per_id, logs),
            outcome_faults(catalog, outcomes, live),
            positions_ahead_of_sequence(frames, logs, live),
            counts,
            persisted,
        ],
    ).collect()
    return LogResults(
        found=[r for r in rows if r["severity"] not in (_OUTCOME_COUNTS, _PERSISTED_UPTO)],
        logged={
            r["stream"]: {"logged_failed": int(r["count"]), "logged_committed": int(r["ids"][0])}
            for r in rows
            if r["severity"] == _OUTCOME_COUNTS
        },
        persisted={r["stream"]: int(r["ids"][0]) for r in rows if r["severity"] == _PERSISTED_UPTO},
    )


def logged_row_ids(frames: Frames, logs: PositionLogs) -> Any:
    """One row per (stream, bucket, id) carried by a row, in the streams the
    logs hold finished records of, from the stream's first logged id (no
    check judges an id below it): the first instance (by name) that used it,
    and the tables holding it."""
    from pyspark.sql import functions as F

    firsts = logs.first_finished_of_stream()
    return (
        frames.rows.filter(F.col("stream").isin(list(firsts)))
        .filter(F.col("id") >= per_stream(firsts))
        .groupBy("stream", "bucket", "id")
        .agg(
            F.min("instance").alias("first_instance"),
            F.sort_array(F.collect_set("table")).alias("tables"),
        )
    )


def id_finishes(per_id: Any, logs: PositionLogs) -> Any:
    """The ids the logs can judge: stream, writer, id, finish (ms), committed."""
    from pyspark.sql import functions as F

    finished = logs.finished.groupBy("stream", "id").agg(
        F.min("writer").alias("writer"),
        F.max("ts").alias("finished_ts"),
        F.min(F.col("committed").cast("int")).cast("boolean").alias("committed"),
    )
    rows = per_id.filter(F.col("stream").isin(list(logs.streams))).select(
        "stream", "id", F.col("first_instance").alias("instance")
    )
    joined = rows.join(finished, ["stream", "id"], "full_outer").withColumn(
        "writer", F.coalesce("writer", "instance")
    )
    return joined.filter(
        F.col("finished_ts").isNotNull()
        | (F.col("instance").isNotNull() & (F.col("id") >= per_stream(logs.first_finished)))
    ).select(
        "stream",
        "writer",
        "id",
        F.coalesce("finished_ts", F.lit(_NEVER)).alias("finish"),
        F.col("finished_ts"),
        F.coalesce("committed", F.lit(True)).alias("committed"),
    )


def positions_before_finish(spark: Any, frames: Frames, per_id: Any, logs: PositionLogs) -> Any:
    """Findings ``position_before_finish``: covered ids that finished after the
    position was handed out, grouped by stream, the id's writer, the position's
    writer and the process that handed out the earliest covering position."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    size, top = frames.bucket_size, frames.top_bucket
    ids = id_finishes(per_id, logs)
    # Each id is judged against its writer's positions and stream-wide ones.
    judged = ids.withColumn("group", F.col("writer")).unionByName(
        ids.withColumn("group", F.lit(STREAM_WIDE))
    )
    judged = judged.withColumn("bucket", F.floor(F.col("id") / size))
    record = F.struct(F.col("ts"), F.col("position"), F.col("process"), F.col("purpose")).alias(
        "record"
    )
    earliest = (
        logs.positions.withColumnRenamed("writer", "group")
        .groupBy("stream", "group", "position")
        .agg(F.min(record).alias("record"))
        .withColumn("bucket", F.least(F.floor(F.col("position") / size), F.lit(top)))
    )

    groups = earliest.select("stream", "group").distinct()
    per_bucket = earliest.groupBy("stream", "group", "bucket").agg(F.min("record").alias("record"))
    higher = Window.partitionBy("stream", "group").orderBy("bucket")
    suffix = (
        groups.crossJoin(spark.range(top + 1).withColumnRenamed("id", "bucket"))
        .join(per_bucket, ["stream", "group", "bucket"], "left")
        .withColumn(
            "above",
            F.min("record").over(higher.rowsBetween(1, Window.unboundedFollowing)),
        )
        .select("stream", "group", "bucket", "above")
    )

    within = Window.partitionBy("stream", "group", "bucket").orderBy(
        F.col("value").desc(), F.col("is_id")
    )
    merged = (
        earliest.select("stream", "group", "bucket", F.col("position").alias("value"), "record")
        .withColumn("is_id", F.lit(False))
        .unionByName(
            judged.withColumnRenamed("id", "value").withColumn("is_id", F.lit(True)),
            allowMissingColumns=True,
        )
        .withColumn(
            "inside", F.min("record").over(within.rowsBetween(Window.unboundedPreceding, 0))
        )
        .filter("is_id")
    )
    violations = (
        merged.join(F.broadcast(suffix), ["stream", "group", "bucket"], "left")
        .withColumn("cover", F.least("inside", "above"))
        .filter(F.col("cover").isNotNull() & (F.col("cover.ts") < F.col("finish")))
        .withColumnRenamed("value", "id")
    )
    tables = per_id.select("stream", "id", "tables")
    detailed = violations.join(tables, ["stream", "id"], "left").select(
        "stream",
        "writer",
        "group",
        F.col("cover.process").alias("process"),
        "id",
        F.struct(
            F.col("id"),
            F.coalesce("tables", F.array().cast("array<string>")).alias("tables"),
            F.col("committed"),
            F.col("finished_ts"),
            F.col("cover.position").alias("position"),
            F.col("cover.ts").alias("position_ts"),
            F.col("cover.purpose").alias("purpose"),
        ).alias("sample"),
    )
    summary = summarise(
        detailed,
        ["stream", "writer", "group", "process"],
        F.col("sample"),
        {"first_position_ts": F.min("sample.position_ts")},
    )
    return as_findings(
        summary,
        "finding",
        "position_before_finish",
        F.col("writer"),
        F.to_json(
            F.struct(
                F.col("group").alias("position_writer"),
                F.col("process"),
                F.col("first_position_ts"),
            )
        ),
    )


def persisted_upto(spark: Any, frames: Frames, per_id: Any, logs: PositionLogs) -> Any:
    """Per stream with finished records: the largest P such that every id from
    the first logged one up to P is a row or logged as finished (a smaller P
    than the sequence means an id was allocated and never finished)."""
    from pyspark.sql import functions as F

    streams = list(logs.streams)
    explained = (
        per_id.filter(F.col("stream").isin(streams))
        .select("stream", "id")
        .unionByName(logs.finished.select("stream", "id"))
        .distinct()
    )
    firsts = logs.first_finished_of_stream()
    before_first = spark.createDataFrame(
        [(stream, first - 1) for stream, first in firsts.items()], "stream STRING, id LONG"
    )
    holes = (
        explained.unionByName(before_first)
        .select("stream", (F.col("id") + 1).alias("id"))
        .join(explained, ["stream", "id"], "left_anti")
        .filter(
            (F.col("id") >= per_stream(firsts)) & (F.col("id") <= per_stream(frames.last_values))
        )
        .groupBy("stream")
        .agg((F.min("id") - 1).alias("upto"))
    )
    return holes


def logged_outcomes(per_id: Any, logs: PositionLogs) -> Any:
    """Per (stream, id) with a ``finished`` record: its writer, whether it
    committed, when it finished, whether the id has a row (``has_row``) and
    the tables holding it."""
    from pyspark.sql import functions as F

    outcomes = logs.finished.groupBy("stream", "id").agg(
        F.min("writer").alias("writer"),
        F.min(F.col("committed").cast("int")).cast("boolean").alias("committed"),
        F.max("ts").alias("finished_ts"),
    )
    present = per_id.select("stream", "id", F.lit(True).alias("has_row"), "tables")
    return outcomes.join(present, ["stream", "id"], "left").withColumn(
        "has_row", F.coalesce("has_row", F.lit(False))
    )


def outcome_counts(outcomes: Any) -> Any:
    """Per stream: the ids without a row that the logs say failed
    (``logged_failed``) and committed (``logged_committed``)."""
    from pyspark.sql import functions as F

    return (
        outcomes.filter(~F.col("has_row"))
        .groupBy("stream")
        .agg(
            F.count(F.when(~F.col("committed"), F.lit(1))).alias("logged_failed"),
            F.count(F.when(F.col("committed"), F.lit(1))).alias("logged_committed"),
        )
    )


def outcome_faults(catalog: AuditCatalog, outcomes: Any, live: bool) -> Any:
    """Findings from what the logs say became of each id:

    * ``failed_id_has_row``: logged as failed, yet a row carries it (the
      commit's acknowledgement was lost: the write happened, the writer
      believes it did not);
    * ``committed_row_missing``: logged as committed, and no row carries it,
      in a stream whose tables never remove rows (``StreamTable.rows_removed``).
      With ``live`` this is information: the row may have committed after the
      database was read and before the logs were.
    """
    from pyspark.sql import functions as F

    keeps_rows = [s.name for s in catalog.streams if not any(t.rows_removed for t in s.tables)]
    tables_of = {s.name: ",".join(t.table for t in s.tables) for s in catalog.streams}
    failed = outcomes.filter(F.col("has_row") & ~F.col("committed")).withColumn(
        "kind", F.lit("failed_id_has_row")
    )
    missing = (
        outcomes.filter(~F.col("has_row") & F.col("committed") & F.col("stream").isin(keeps_rows))
        .withColumn("tables", F.split(per_stream(tables_of), ","))  # type: ignore[arg-type]
        .withColumn("kind", F.lit("committed_row_missing"))
    )
    faults = failed.unionByName(missing)
    summary = summarise(
        faults,
        ["kind", "stream", "writer"],
        F.struct("id", "tables", "committed", "finished_ts"),
        {"tables": F.collect_set("tables")},
    )
    info = F.lit(live) & (F.col("kind") == "committed_row_missing")
    tables = F.sort_array(F.array_distinct(F.flatten("tables"))).alias("tables")
    return as_findings(
        summary,
        F.when(info, F.lit("info")).otherwise(F.lit("finding")),
        F.col("kind"),
        F.col("writer"),
        F.to_json(F.struct(tables)),
    )


def positions_ahead_of_sequence(frames: Frames, logs: PositionLogs, live: bool) -> Any:
    """Findings ``logged_position_ahead_of_sequence``: a position handed out
    beyond the sequence's last value, so a reader holding it skips the ids the
    sequence hands out next, grouped by stream, the position's writer and the
    process. With ``live`` it is information: the logs are read after the
    database, and the sequence may have moved on in between."""
    from pyspark.sql import functions as F

    ahead = (
        logs.positions.join(F.broadcast(frames.streams), "stream")
        .filter(F.col("position") > F.col("last_value"))
        .withColumn("id", F.col("position"))
    )
    summary = summarise(
        ahead,
        ["stream", "writer", "process"],
        F.struct("id", "ts", "purpose"),
        {
            "sequence": F.first("sequence"),
            "last_value": F.first("last_value"),
            "largest_position": F.max("position"),
            "first_ts": F.min("ts"),
        },
    )
    return as_findings(
        summary,
        "info" if live else "finding",
        "logged_position_ahead_of_sequence",
        F.col("writer"),
        F.to_json(
            F.struct(
                F.col("writer").alias("position_writer"),
                "process",
                "sequence",
                "last_value",
                "largest_position",
                "first_ts",
            )
        ),
    )
