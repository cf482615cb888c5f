"""The DataFrames every check starts from, and the one shape every check ends in.

All ids are positive here: a negative stream's ids (backfill) are negated, and
a row belongs to a stream only if its id has the stream's sign (``events``
holds both events, > 0, and backfill, < 0).

Every check returns rows of :data:`FINDING_COLUMNS`, one per group of faulty
ids, with a count and a bounded sample, so the driver only ever collects a few
rows per fault whatever the size of the tables.
"""

from __future__ import annotations

from typing import Any

import attr

from spark.catalog import AuditCatalog
from spark.sources import AuditData

#: Faulty ids listed per finding (the count covers all of them).
SAMPLE_SIZE = 20

FINDING_COLUMNS = ["severity", "kind", "stream", "writer", "count", "ids", "samples", "details"]


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Frames:
    """The inputs of the checks.

    ``rows``: stream, table, shares (the table's ``shares_ids``), instance, id,
    and bucket: ``id // bucket_size``, consecutive ids cut into a few thousand
    ranges that the id-level checks partition by.
    ``streams``: stream, sequence, last_value, writers (comma-joined).
    ``writers``: stream, instance, keeps (the stream keeps ``stream_positions``).
    ``stored``: stream, instance, stored (the ``stream_positions`` value).
    """

    rows: Any
    streams: Any
    writers: Any
    stored: Any
    bucket_size: int
    #: A bucket above every id: where positions beyond all ids go.
    top_bucket: int
    partitions: int


def build_frames(
    spark: Any, data: AuditData, catalog: AuditCatalog, largest_id: int, buckets: int
) -> Frames:
    """The checks' inputs; ``largest_id`` (at least) is cut into ``buckets``."""
    from pyspark.sql import functions as F

    # Which stream each table's rows belong to, by the sign of their id.
    placement = spark.createDataFrame(
        [(t.table, s.name, s.positive, t.shares_ids) for s in catalog.streams for t in s.tables],
        "table STRING, stream STRING, positive BOOLEAN, shares BOOLEAN",
    )
    placed = data.rows.join(F.broadcast(placement), "table").filter(
        F.when(F.col("positive"), F.col("id") > 0).otherwise(F.col("id") < 0)
    )
    bucket_size = max(1, -(-(largest_id + 1) // buckets))
    rows = placed.select(
        "stream",
        "table",
        "shares",
        F.coalesce(F.col("instance"), F.lit("")).alias("instance"),
        F.abs(F.col("id")).alias("id"),
    ).withColumn("bucket", F.floor(F.col("id") / bucket_size))
    streams = spark.createDataFrame(
        [
            (s.name, s.sequence, int(data.sequences[s.sequence]), ",".join(s.writers))
            for s in catalog.streams
        ],
        "stream STRING, sequence STRING, last_value LONG, writers STRING",
    )
    writers = spark.createDataFrame(
        [(s.name, w, s.keeps_positions) for s in catalog.streams for w in s.writers],
        "stream STRING, instance STRING, keeps BOOLEAN",
    )
    names = set(catalog.stream_names())
    stored = spark.createDataFrame(
        [(s, i, abs(p)) for s, i, p in data.stream_positions if s in names],
        "stream STRING, instance STRING, stored LONG",
    )
    return Frames(
        rows=rows,
        streams=streams,
        writers=writers,
        stored=stored,
        bucket_size=bucket_size,
        top_bucket=largest_id // bucket_size + 1,
        partitions=int(spark.conf.get("spark.sql.shuffle.partitions")),
    )


def summarise(
    df: Any, keys: list[str], sample: Any, aggregates: dict[str, Any], n: int = SAMPLE_SIZE
) -> Any:
    """Per group of ``keys``: the row count, ``aggregates``, and the ``n``
    samples with the smallest ids (``sample`` is a struct whose first field is
    ``id``; ``aggregates`` are aggregate functions, finished by the caller).

    One shuffle: a window over each group (which spills to disk rather than
    holding a large group in memory) ranks the rows and computes the
    aggregates; only the first ``n`` rows of each group go on to be gathered.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    group = Window.partitionBy(*keys)
    whole = group.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    ranked = df.select(
        *keys,
        F.row_number().over(group.orderBy("id")).alias("_rank"),
        sample.alias("_sample"),
        F.count(F.lit(1)).over(whole).alias("count"),
        *[c.over(whole).alias(k) for k, c in aggregates.items()],
    )
    return (
        ranked.filter(F.col("_rank") <= n)
        .groupBy(*keys)
        .agg(
            F.first("count").alias("count"),
            *[F.first(k).alias(k) for k in aggregates],
            F.sort_array(F.collect_list("_sample")).alias("samples"),
        )
    )


def as_findings(df: Any, severity: Any, kind: Any, writer: Any, details: Any = None) -> Any:
    """Shape a :func:`summarise` result into :data:`FINDING_COLUMNS`.

    ``severity`` and ``kind`` are strings or columns; ``details`` a JSON string
    column."""
    from pyspark.sql import functions as F

    def column(value: Any) -> Any:
        return F.lit(value) if isinstance(value, str) else value

    return df.select(
        column(severity).alias("severity"),
        column(kind).alias("kind"),
        F.col("stream"),
        writer.alias("writer"),
        F.col("count"),
        F.transform("samples", lambda s: s["id"]).alias("ids"),
        F.to_json("samples").alias("samples"),
        (F.lit("{}") if details is None else details).alias("details"),
    )
