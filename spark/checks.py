"""The checks that need only the database: ids, sequences and stored positions.

The rows are read once, by :func:`id_words`: one aggregation (Spark combines
it on each executor before anything is shuffled) down to a 64-bit bitmap of
the ids present in each word of 64 consecutive ids, per writer, with counts
and extremes. Later steps work on those words and on blocks of 512 words
(32,768 ids), and read the rows again only to detail a fault they show:

* duplicates: a word where rows outnumber distinct ids among the tables
  whose rows each have their own id, or where the writers' distinct ids add
  up to more than the word's distinct ids;
* gaps: a block whose distinct ids fall short of its span hands its words
  to the driver, which reads the missing ids off them (:mod:`spark.gaps`), so
  gaps never need the rows again;
* row faults: per-writer totals (largest id against the sequence and the
  stored position, writers not configured) say whether any exists.

Functions returning findings return DataFrames of
:data:`spark.frames.FINDING_COLUMNS`. Every step is an aggregation or a join
with a small broadcast table: no window spans more than one id, so the job
scales out.
"""

from __future__ import annotations

from typing import Any

from spark.catalog import AuditCatalog
from spark.frames import Frames, as_findings, per_stream, stray_rows, summarise
from spark.gaps import BLOCK_IDS, WORD_IDS
from spark.sources import AuditData


def id_words(frames: Frames) -> Any:
    """The one pass over the rows, per stream, word of 64 consecutive ids
    (``word``: ``id div 64``) and instance: the rows ``n``, the largest id
    ``top_all``, the rows of tables giving each row its own id ``own_rows``,
    and bitmaps of the word's ids (bit ``id % 64``): all of them
    (``all_bits``), those on own-id rows (``own_bits``) and those at most the
    sequence's last value (``kept_bits``, with their smallest and largest,
    ``low`` and ``top``).

    Every aggregate is fixed-width, so Spark uses its hash aggregation and
    combines rows on each executor before the shuffle: about 1/64 of the rows
    per writer go on (a 4 KB bitmap per block instead would need a sort of
    every row)."""
    from pyspark.sql import functions as F

    own = ~F.col("shares")
    kept = F.col("id") <= per_stream(frames.last_values)
    bit = F.expr(f"shiftleft(1L, cast(id % {WORD_IDS} AS INT))")
    return frames.rows.groupBy(
        "stream", F.expr(f"id div {WORD_IDS}").alias("word"), "instance"
    ).agg(
        F.count(F.lit(1)).alias("n"),
        F.max("id").alias("top_all"),
        F.count(F.when(own, F.lit(1))).alias("own_rows"),
        F.bit_or(bit).alias("all_bits"),
        F.bit_or(F.when(own, bit)).alias("own_bits"),
        F.bit_or(F.when(kept, bit)).alias("kept_bits"),
        F.min(F.when(kept, F.col("id"))).alias("low"),
        F.max(F.when(kept, F.col("id"))).alias("top"),
    )


def word_totals(words: Any) -> Any:
    """Per stream and word (with its ``block``): ``dups`` (an id of the word
    is a duplicate) and, over the ids at most the sequence's last value, their
    bitmap ``kept``, count ``ids`` and smallest and largest (``low``, ``top``)."""
    from pyspark.sql import functions as F

    totals = words.groupBy("stream", "word").agg(
        F.sum("own_rows").alias("own_rows"),
        F.bit_count(F.bit_or("own_bits")).alias("own_ids"),
        F.sum(F.bit_count("all_bits")).alias("instance_ids"),
        F.bit_count(F.bit_or("all_bits")).alias("all_ids"),
        F.bit_or("kept_bits").alias("kept"),
        F.min("low").alias("low"),
        F.max("top").alias("top"),
    )
    # Two own rows of one id make more own rows than own ids; one id used by
    # two writers counts once per writer but once in the word.
    dups = (F.col("own_rows") > F.col("own_ids")) | (F.col("instance_ids") > F.col("all_ids"))
    return totals.select(
        "stream",
        F.expr(f"word div {BLOCK_IDS // WORD_IDS}").alias("block"),
        "word",
        dups.alias("dups"),
        F.coalesce(F.col("kept"), F.lit(0)).alias("kept"),
        F.coalesce(F.bit_count("kept"), F.lit(0)).cast("long").alias("ids"),
        "low",
        "top",
    )


def block_totals(words: Any) -> Any:
    """Per stream and block of 32,768 ids: ``dups`` (the block holds a
    duplicate) and over the ids at most the sequence's last value how many
    (``ids``) and the smallest and largest (``low``, ``top``)."""
    from pyspark.sql import functions as F

    return (
        word_totals(words)
        .groupBy("stream", "block")
        .agg(
            F.max("dups").alias("dups"),
            F.sum("ids").alias("ids"),
            F.min("low").alias("low"),
            F.max("top").alias("top"),
        )
    )


def block_words(words: Any, blocks: Any) -> Any:
    """The words (stream, block, word, kept) of the ``blocks`` given (stream,
    block), each block's words together and in order, for the driver to
    stream."""
    from pyspark.sql import functions as F

    return (
        word_totals(words)
        .join(F.broadcast(blocks), ["stream", "block"], "left_semi")
        .select("stream", "block", "word", "kept")
        .repartition("stream", "block")
        .sortWithinPartitions("stream", "block", "word")
    )


def per_writer(words: Any) -> Any:
    """Rows and largest id per stream and instance."""
    from pyspark.sql import functions as F

    return words.groupBy("stream", "instance").agg(
        F.sum("n").alias("count"), F.max("top_all").alias("largest")
    )


def duplicate_ids(frames: Frames, marked: Any) -> Any:
    """An id on two rows of tables whose rows each have their own id, or used
    by two instances at all (the seed notes' account-data bug). Reads only
    the rows of the blocks ``marked`` (stream, block) that
    :func:`block_totals` found a duplicate in."""
    from pyspark.sql import functions as F

    per_id = (
        frames.rows.withColumn("block", F.expr(f"id div {BLOCK_IDS}"))
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


def row_faults(frames: Frames, live: bool, suspects: dict[tuple[str, str], int]) -> Any:
    """The faults one row shows on its own, found in a single pass over the
    rows of ``suspects``: per (stream, instance), the id above which its rows
    may show one (the rest are filtered out before any join):

    * ``id_above_sequence``: an id the sequence has not handed out yet (it
      would hand it out again);
    * ``unknown_writer``: written by an instance that may not write the stream;
    * ``position_behind_rows``: a configured writer's row above its
      ``stream_positions`` value (or with none). Servers record positions
      about 100 ms after a write and at shutdown, so on a stopped server this
      is a fault; ``live`` reports it as information.
    """
    from pyspark.sql import functions as F

    suspect = F.lit(False)
    for (stream, instance), above in suspects.items():
        suspect = suspect | (
            (F.col("stream") == stream) & (F.col("instance") == instance) & (F.col("id") > above)
        )
    allowed = frames.writers.withColumn("allowed", F.lit(True))
    tagged = (
        frames.rows.filter(suspect)
        .join(F.broadcast(frames.streams), "stream")
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


def stray_ids(data: AuditData, catalog: AuditCatalog) -> Any:
    """Findings ``id_wrong_sign``: rows whose id is 0 or has a sign no stream
    of their table has, per table's stream and writer (a second read of the
    rows, only when the first pass counted such rows)."""
    from pyspark.sql import functions as F

    positive = {s.name: s.positive for s in catalog.streams}
    rows = stray_rows(data, catalog)
    summary = summarise(
        rows,
        ["stream", "instance"],
        # The ids as stored (0, -3), not made positive: they are what is wrong.
        F.struct(F.col("stored_id").alias("id"), "table"),
        {"tables": F.collect_set("table")},
    )
    sign = per_stream({name: int(p) for name, p in positive.items()}) == 1
    details = F.to_json(
        F.struct(
            F.sort_array("tables").alias("tables"),
            sign.alias("positive"),
        )
    )
    return as_findings(summary, "finding", "id_wrong_sign", F.col("instance"), details)
