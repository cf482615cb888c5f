"""The checks that need only the database: ids, sequences and stored positions.

The rows are read once, by :func:`id_bitmaps`: one aggregation (Spark
combines it on each executor before anything is shuffled) down to a bitmap of
the ids present in each block of 32,768 consecutive ids, per writer, with
counts and extremes. Every later step works on those blocks, 1/32,768 of the
id space, and reads the rows again only to detail a fault the blocks show:

* duplicates: a block where rows outnumber distinct ids among the tables
  whose rows each have their own id, or where the writers' distinct ids add
  up to more than the block's distinct ids;
* gaps: a block whose distinct ids fall short of its span; the missing ids
  are read off the bitmap, so gaps never need the rows again;
* row faults: per-writer totals (largest id against the sequence and the
  stored position, writers not configured) say whether any exists.

Functions returning findings return DataFrames of
:data:`spark.frames.FINDING_COLUMNS`. No window spans more than a stream's
block totals, so the job scales out.
"""

from __future__ import annotations

from typing import Any

from spark.frames import Frames, as_findings, per_stream, summarise

#: Ids per bitmap block (Spark's bitmap functions: 4 KB, one bit an id).
BLOCK_IDS = 32768


def id_bitmaps(frames: Frames) -> Any:
    """The one pass over the rows: per stream, block (``block``, 1 for ids
    1 to 32768), instance, ``own`` (the table gives each row its own id) and
    ``above`` (the id is above the sequence's last value): the rows ``n``,
    the smallest and largest id (``low``, ``top``) and the bitmap of ids
    (``bits``). A few rows per block and writer, whatever the row count."""
    from pyspark.sql import functions as F

    return frames.rows.groupBy(
        "stream",
        F.expr("bitmap_bucket_number(id)").alias("block"),
        "instance",
        (~F.col("shares")).alias("own"),
        (F.col("id") > per_stream(frames.last_values)).alias("above"),
    ).agg(
        F.count(F.lit(1)).alias("n"),
        F.min("id").alias("low"),
        F.max("id").alias("top"),
        F.expr("bitmap_construct_agg(bitmap_bit_position(id))").alias("bits"),
    )


def block_totals(bitmaps: Any) -> Any:
    """Per stream and block: ``dups`` (some id of the block is a duplicate),
    and over the ids up to the sequence's last value their bitmap ``kept``,
    count ``ids``, ``low`` and ``top`` (null when there are none)."""
    from pyspark.sql import functions as F

    kept = ~F.col("above")
    per_instance = bitmaps.groupBy("stream", "block", "instance").agg(
        F.expr("bitmap_count(bitmap_or_agg(bits))").alias("distinct"),
        F.sum(F.when(F.col("own"), F.col("n"))).alias("own_rows"),
        F.expr("bitmap_or_agg(CASE WHEN own THEN bits END)").alias("own_bits"),
        F.expr("bitmap_or_agg(bits)").alias("all_bits"),
        F.expr("bitmap_or_agg(CASE WHEN NOT above THEN bits END)").alias("kept_bits"),
        F.min(F.when(kept, F.col("low"))).alias("low"),
        F.max(F.when(kept, F.col("top"))).alias("top"),
    )
    totals = per_instance.groupBy("stream", "block").agg(
        F.coalesce(F.sum("own_rows"), F.lit(0)).alias("own_rows"),
        F.expr("bitmap_count(bitmap_or_agg(own_bits))").alias("own_ids"),
        F.sum("distinct").alias("instance_ids"),
        F.expr("bitmap_count(bitmap_or_agg(all_bits))").alias("all_ids"),
        F.expr("bitmap_or_agg(kept_bits)").alias("kept"),
        F.min("low").alias("low"),
        F.max("top").alias("top"),
    )
    # Two own rows of one id make more own rows than own ids; one id used by
    # two writers is counted once per writer but once in the block.
    dups = (F.col("own_rows") > F.col("own_ids")) | (F.col("instance_ids") > F.col("all_ids"))
    return totals.select(
        "stream",
        "block",
        dups.alias("dups"),
        "kept",
        F.expr("bitmap_count(kept)").alias("ids"),
        "low",
        "top",
    )


def per_writer(bitmaps: Any) -> Any:
    """Rows and largest id per stream and instance."""
    from pyspark.sql import functions as F

    return bitmaps.groupBy("stream", "instance").agg(
        F.sum("n").alias("count"), F.max("top").alias("largest")
    )


def ids_per_stream(frames: Frames) -> Any:
    """One row per (stream, bucket, id) with the first instance (by name) that
    used it; for the position-log checks."""
    from pyspark.sql import functions as F

    return frames.rows.groupBy("stream", "bucket", "id").agg(
        F.min("instance").alias("first_instance")
    )


def duplicate_ids(frames: Frames, blocks: Any) -> Any:
    """An id on two rows of tables whose rows each have their own id, or used
    by two instances at all (the seed notes' account-data bug). Reads only
    the rows of the blocks :func:`block_totals` marked."""
    from pyspark.sql import functions as F

    marked = blocks.filter("dups").select("stream", "block")
    per_id = (
        frames.rows.withColumn("block", F.expr("bitmap_bucket_number(id)"))
        .join(F.broadcast(marked), ["stream", "block"], "left_semi")
        .groupBy("stream", "id")
        .agg(
            F.sort_array(F.collect_set("instance")).alias("instances"),
            F.sort_array(F.collect_set("table")).alias("tables"),
            F.count(F.lit(1)).alias("rows"),
            F.count(F.when(~F.col("shares"), F.lit(1))).alias("own_rows"),
        )
        .filter((F.col("own_rows") > 1) | (F.size("instances") > 1))
        .withColumn("writer", F.array_join("instances", ","))
    )
    summary = summarise(
        per_id,
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


def gaps(frames: Frames, blocks: Any, failed_ids: Any | None) -> Any:
    """Information: ids the sequence handed out that no row carries (failed
    transactions), as ranges. ``failed_ids`` (stream, id) from the position
    logs says how many of them are logged failures.

    From the block totals alone: a range between two blocks' ids comes from
    the largest id of the block before (a window over a stream's blocks), one
    after the largest id runs to the sequence's last value, and a range inside
    a block is read off its bitmap, for the blocks whose ids fall short of
    their span.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    present = blocks.filter(F.col("ids") > 0)
    before = F.lag("top").over(Window.partitionBy("stream").orderBy("block"))
    between = (
        present.select("stream", "low", F.coalesce(before, F.lit(0)).alias("before"))
        .filter(F.col("low") > F.col("before") + 1)
        .select("stream", (F.col("before") + 1).alias("id"), (F.col("low") - 1).alias("last"))
    )
    # After the largest id: up to the sequence's last value.
    tails = (
        frames.streams.join(
            present.groupBy("stream").agg(F.max("top").alias("top")), "stream", "left"
        )
        .withColumn("top", F.coalesce(F.col("top"), F.lit(0)))
        .filter(F.col("top") < F.col("last_value"))
        .select("stream", (F.col("top") + 1).alias("id"), F.col("last_value").alias("last"))
    )
    # Inside a block: each byte of the bitmap that is not 0xff holds a
    # missing id; runs of consecutive missing ids become ranges.
    first_id = (F.col("block") - 1) * BLOCK_IDS + 1
    missing = (
        present.filter(F.col("top") - F.col("low") + 1 > F.col("ids"))
        .select("stream", "block", "low", "top", F.hex("kept").alias("hex"))
        .select("*", F.explode(F.sequence(F.lit(0), F.lit(BLOCK_IDS // 8 - 1))).alias("byte"))
        .withColumn("bits", F.conv(F.expr("substring(hex, byte * 2 + 1, 2)"), 16, 10).cast("int"))
        .filter(F.col("bits") != 255)
        .select("*", F.explode(F.sequence(F.lit(0), F.lit(7))).alias("bit"))
        .filter(F.expr("shiftright(bits, bit) & 1 = 0"))
        .select(
            "stream",
            "block",
            "low",
            "top",
            (first_id + F.col("byte") * 8 + F.col("bit")).alias("id"),
        )
        .filter((F.col("id") > F.col("low")) & (F.col("id") < F.col("top")))
    )
    run = F.col("id") - F.row_number().over(Window.partitionBy("stream", "block").orderBy("id"))
    inside = (
        missing.withColumn("run", run)
        .groupBy("stream", "block", "run")
        .agg(F.min("id").alias("id"), F.max("id").alias("last"))
        .select("stream", "id", "last")
    )
    summary = summarise(
        between.unionByName(inside).unionByName(tails),
        ["stream"],
        F.struct("id", "last"),
        {"missing": F.sum(F.col("last") - F.col("id") + 1)},
        n=10,
    )
    ranges = summary.withColumnRenamed("count", "ranges").withColumnRenamed("missing", "count")
    details = [F.col("ranges")]
    if failed_ids is not None:
        present_ids = frames.rows.select("stream", "id")
        failed = (
            failed_ids.join(present_ids, ["stream", "id"], "left_anti")
            .groupBy("stream")
            .agg(F.count(F.lit(1)).alias("logged_failed"))
        )
        ranges = ranges.join(failed, "stream", "left")
        details.append(F.coalesce(F.col("logged_failed"), F.lit(0)).alias("logged_failed"))
    return as_findings(ranges, "info", "gap", F.lit(""), F.to_json(F.struct(*details)))
