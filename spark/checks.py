"""The checks that need only the database: ids, sequences and stored positions.

Each function returns a DataFrame of :data:`spark.frames.FINDING_COLUMNS`.
Everything that touches rows runs on the executors: one ordered pass over
buckets of consecutive ids, group-bys, and joins with small broadcast tables.
No window spans a whole stream, so the job scales out.
"""

from __future__ import annotations

from typing import Any

from spark.frames import Frames, as_findings, summarise


def _repeats(other: str, frames_order: Any) -> Any:
    """The row repeats the id of its neighbour (``lag`` or ``lead``): both rows
    have ids of their own, or two instances used the id."""
    from pyspark.sql import functions as F

    def near(column: str) -> Any:
        return getattr(F, other)(column).over(frames_order)

    return (near("id") == F.col("id")) & (
        (~F.col("shares") & ~near("shares")) | (near("instance") != F.col("instance"))
    )


def id_marks(frames: Frames) -> Any:
    """The rows that repeat an id or follow a hole, from one ordered pass.

    The audit's one big shuffle: rows are partitioned by (stream, bucket) and
    sorted by id, with a row's own-id rows first and then by instance, so two
    rows of one id that conflict are always neighbours. Columns: stream,
    bucket, id, table, instance, ``previous`` (the id before, within the
    bucket), ``repeated``. The result is small (faults and one row per
    bucket), kept for the checks that read it."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = Window.partitionBy("stream", "bucket").orderBy("id", "shares", "instance")
    previous = F.lag("id").over(order)
    return (
        frames.rows.repartition(frames.partitions, "stream", "bucket")
        .select(
            "stream",
            "bucket",
            "id",
            "table",
            "instance",
            previous.alias("previous"),
            (_repeats("lag", order) | _repeats("lead", order)).alias("repeated"),
        )
        .filter(
            F.col("repeated") | F.col("previous").isNull() | (F.col("id") - F.col("previous") > 1)
        )
        .localCheckpoint(eager=True)
    )


def ids_per_stream(frames: Frames) -> Any:
    """One row per (stream, bucket, id) with the first instance (by name) that
    used it; for the position-log checks."""
    from pyspark.sql import functions as F

    return frames.rows.groupBy("stream", "bucket", "id").agg(
        F.min("instance").alias("first_instance")
    )


def duplicate_ids(marks: Any) -> Any:
    """An id on two rows of tables whose rows each have their own id, or used
    by two instances at all (the seed notes' account-data bug)."""
    from pyspark.sql import functions as F

    per_dup = (
        marks.filter("repeated")
        .groupBy("stream", "id")
        .agg(
            F.sort_array(F.collect_set("instance")).alias("instances"),
            F.sort_array(F.collect_set("table")).alias("tables"),
            F.count(F.lit(1)).alias("rows"),
        )
        .withColumn("writer", F.array_join("instances", ","))
    )
    summary = summarise(
        per_dup,
        ["stream", "writer"],
        F.struct("id", "tables", "rows"),
        {"tables": F.collect_set("tables")},
    )
    tables = F.sort_array(F.array_distinct(F.flatten("tables"))).alias("tables")
    return as_findings(
        summary, "finding", "duplicate_stream_id", F.col("writer"), F.to_json(F.struct(tables))
    )


def row_faults(frames: Frames, live: bool) -> Any:
    """The faults one row shows on its own, found in a single pass:

    * ``id_above_sequence``: an id the sequence has not handed out yet (it
      would hand it out again);
    * ``unknown_writer``: written by an instance that may not write the stream;
    * ``position_behind_rows``: a configured writer's row above its
      ``stream_positions`` value (or with none). Servers record positions
      about 100 ms after a write and at shutdown, so on a stopped server this
      is a fault; ``live`` reports it as information.
    """
    from pyspark.sql import functions as F

    allowed = frames.writers.withColumn("allowed", F.lit(True))
    tagged = (
        frames.rows.join(F.broadcast(frames.streams), "stream")
        .join(F.broadcast(allowed), ["stream", "instance"], "left")
        .join(F.broadcast(frames.stored), ["stream", "instance"], "left")
    )
    kinds = F.array_compact(
        F.array(
            F.when(F.col("id") > F.col("last_value"), F.lit("id_above_sequence")),
            F.when(F.col("allowed").isNull(), F.lit("unknown_writer")),
            F.when(
                F.coalesce(F.col("keeps"), F.lit(False))
                & (F.col("id") > F.coalesce(F.col("stored"), F.lit(0))),
                F.lit("position_behind_rows"),
            ),
        )
    )
    flagged = tagged.select("*", F.explode(kinds).alias("kind"))
    summary = summarise(
        flagged,
        ["kind", "stream", "instance"],
        F.struct("id", "table"),
        {
            "largest_id": F.max("id"),
            "tables": F.collect_set("table"),
            "sequence": F.first("sequence"),
            "last_value": F.first("last_value"),
            "stored": F.max("stored"),
            "writers": F.first("writers"),
        },
    )
    tables = F.sort_array("tables").alias("tables")
    kind = F.col("kind")
    details = (
        F.when(
            kind == "id_above_sequence",
            F.to_json(F.struct("sequence", "last_value", "largest_id", tables)),
        )
        .when(
            kind == "unknown_writer",
            F.to_json(F.struct("largest_id", tables, F.split("writers", ",").alias("configured"))),
        )
        .otherwise(F.to_json(F.struct("stored", "largest_id")))
    )
    lagging_is_info = F.lit(live) & (kind == "position_behind_rows")
    return as_findings(
        summary,
        F.when(lagging_is_info, F.lit("info")).otherwise(F.lit("finding")),
        kind,
        F.col("instance"),
        details=details,
    )


def gaps(frames: Frames, marks: Any, failed_ids: Any | None) -> Any:
    """Information: ids the sequence handed out that no row carries (failed
    transactions), as ranges. ``failed_ids`` (stream, id) from the position
    logs says how many of them are logged failures.

    No window spans a stream: :func:`id_marks` finds the holes inside each
    bucket of consecutive ids, and the largest id of the bucket before (from
    the small per-bucket aggregate) closes a hole across a boundary.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    seq = F.broadcast(frames.streams.select("stream", "last_value"))
    buckets = (
        frames.rows.join(seq, "stream")
        .filter(F.col("id") <= F.col("last_value"))
        .groupBy("stream", "bucket")
        .agg(F.max("id").alias("top"))
    )
    before = buckets.select(
        "stream",
        "bucket",
        F.lag("top").over(Window.partitionBy("stream").orderBy("bucket")).alias("before"),
    )
    inside = (
        marks.join(seq, "stream")
        .filter(F.col("id") <= F.col("last_value"))
        .join(F.broadcast(before), ["stream", "bucket"])
        .withColumn("previous", F.coalesce("previous", "before", F.lit(0)))
        .filter(F.col("id") - F.col("previous") > 1)
        .select("stream", (F.col("previous") + 1).alias("id"), (F.col("id") - 1).alias("last"))
        .distinct()  # one hole, however many rows carry the id after it
    )
    # After the largest id: up to the sequence's last value.
    tails = (
        frames.streams.join(
            buckets.groupBy("stream").agg(F.max("top").alias("top")), "stream", "left"
        )
        .withColumn("top", F.coalesce(F.col("top"), F.lit(0)))
        .filter(F.col("top") < F.col("last_value"))
        .select("stream", (F.col("top") + 1).alias("id"), F.col("last_value").alias("last"))
    )
    summary = summarise(
        inside.unionByName(tails),
        ["stream"],
        F.struct("id", "last"),
        {"missing": F.sum(F.col("last") - F.col("id") + 1)},
        n=10,
    )
    ranges = summary.withColumnRenamed("count", "ranges").withColumnRenamed("missing", "count")
    details = [F.col("ranges")]
    if failed_ids is not None:
        present = frames.rows.select("stream", "id")
        failed = (
            failed_ids.join(present, ["stream", "id"], "left_anti")
            .groupBy("stream")
            .agg(F.count(F.lit(1)).alias("logged_failed"))
        )
        ranges = ranges.join(failed, "stream", "left")
        details.append(F.coalesce(F.col("logged_failed"), F.lit(0)).alias("logged_failed"))
    return as_findings(ranges, "info", "gap", F.lit(""), F.to_json(F.struct(*details)))
