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
"""

from __future__ import annotations

from typing import Any

from spark.catalog import AuditCatalog
from spark.frames import Frames, as_findings, per_stream, summarise
from spark.logs import STREAM_WIDE, PositionLogs

_NEVER = 2**63 - 1  # the finish time of an id that never finished


def id_finishes(per_id: Any, logs: PositionLogs) -> Any:
    """The ids the logs can judge: stream, writer, id, finish (ms), committed."""
    from pyspark.sql import functions as F

    finished = logs.finished.groupBy("stream", "id").agg(
        F.min("writer").alias("writer"),
        F.max("ts").alias("finished_ts"),
        F.min(F.col("committed").cast("int")).cast("boolean").alias("committed"),
    )
    starts = logs.finished.groupBy("stream", "writer").agg(F.min("id").alias("logged_from"))
    rows = per_id.filter(F.col("stream").isin(list(logs.streams))).select(
        "stream", "id", F.col("first_instance").alias("instance")
    )
    joined = rows.join(finished, ["stream", "id"], "full_outer").withColumn(
        "writer", F.coalesce("writer", "instance")
    )
    return (
        joined.join(F.broadcast(starts), ["stream", "writer"], "left")
        .filter(
            F.col("finished_ts").isNotNull()
            | (F.col("instance").isNotNull() & (F.col("id") >= F.col("logged_from")))
        )
        .select(
            "stream",
            "writer",
            "id",
            F.coalesce("finished_ts", F.lit(_NEVER)).alias("finish"),
            F.col("finished_ts"),
            F.coalesce("committed", F.lit(True)).alias("committed"),
        )
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
    tables = (
        frames.rows.join(
            violations.select("stream", "id").distinct(), ["stream", "id"], "left_semi"
        )
        .groupBy("stream", "id")
        .agg(F.sort_array(F.collect_set("table")).alias("tables"))
    )
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


def persisted_upto(per_id: Any, frames_streams: Any, logs: PositionLogs) -> dict[str, int]:
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
    starts = logs.finished.groupBy("stream").agg(F.min("id").alias("logged_from"))
    seq = frames_streams.select("stream", "last_value")
    holes = (
        explained.unionByName(starts.select("stream", (F.col("logged_from") - 1).alias("id")))
        .select("stream", (F.col("id") + 1).alias("id"))
        .join(explained, ["stream", "id"], "left_anti")
        .join(F.broadcast(starts), "stream")
        .join(F.broadcast(seq), "stream")
        .filter((F.col("id") >= F.col("logged_from")) & (F.col("id") <= F.col("last_value")))
        .groupBy("stream")
        .agg((F.min("id") - 1).alias("upto"))
    )
    return {row["stream"]: int(row["upto"]) for row in holes.collect()}


def logged_outcomes(per_id: Any, logs: PositionLogs) -> Any:
    """Per (stream, id) with a ``finished`` record: its writer, whether it
    committed, when it finished, and whether the id has a row (``has_row``)."""
    from pyspark.sql import functions as F

    outcomes = logs.finished.groupBy("stream", "id").agg(
        F.min("writer").alias("writer"),
        F.min(F.col("committed").cast("int")).cast("boolean").alias("committed"),
        F.max("ts").alias("finished_ts"),
    )
    present = per_id.select("stream", "id", F.lit(True).alias("has_row"))
    return outcomes.join(present, ["stream", "id"], "left").withColumn(
        "has_row", F.coalesce("has_row", F.lit(False))
    )


def outcome_counts(outcomes: Any) -> dict[str, dict[str, int]]:
    """Per stream: the ids without a row that the logs say failed
    (``logged_failed``) and committed (``logged_committed``)."""
    from pyspark.sql import functions as F

    counts = (
        outcomes.filter(~F.col("has_row"))
        .groupBy("stream")
        .agg(
            F.count(F.when(~F.col("committed"), F.lit(1))).alias("logged_failed"),
            F.count(F.when(F.col("committed"), F.lit(1))).alias("logged_committed"),
        )
    )
    return {
        r["stream"]: {
            "logged_failed": int(r["logged_failed"]),
            "logged_committed": int(r["logged_committed"]),
        }
        for r in counts.collect()
    }


def outcome_faults(frames: Frames, catalog: AuditCatalog, outcomes: Any, live: bool) -> Any:
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
    failed = outcomes.filter(F.col("has_row") & ~F.col("committed"))
    found_in = (
        frames.rows.join(failed.select("stream", "id"), ["stream", "id"], "left_semi")
        .groupBy("stream", "id")
        .agg(F.sort_array(F.collect_set("table")).alias("tables"))
    )
    failed = failed.join(found_in, ["stream", "id"], "left").withColumn(
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
