"""The DataFrames every check starts from, and the one shape every check ends in.

All ids are positive here: a negative stream's ids (backfill) are negated, and
a row belongs to a stream only if its id has the stream's sign (``events``
holds both events, > 0, and backfill, < 0).

Every check that finds faults returns rows of :data:`FINDING_COLUMNS`, one per
group of faulty ids, with a count and a bounded sample, so the driver only
ever collects a few rows per fault whatever the size of the tables (the gaps
are worked out on the driver from block totals: :mod:`spark.gaps`).
"""

from __future__ import annotations

from collections.abc import Mapping
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
    ranges that the position-log checks partition by.
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
    #: Each stream's sequence's last value.
    last_values: dict[str, int]


def _by_table(catalog: AuditCatalog, value: Any) -> Any:
    """A column: ``value(stream, table)`` for the stream a row belongs to (by
    its table and the sign of its id), null for a row of no stream.

    An expression rather than a join with a placement table: each table is
    read with its name as a literal, so Spark folds this to a constant per
    table (and drops the rows of no stream before anything else happens).
    """
    from pyspark.sql import functions as F

    result: Any = None
    for stream in catalog.streams:
        sign = F.col("id") > 0 if stream.positive else F.col("id") < 0
        for table in stream.tables:
            condition = (F.col("table") == table.table) & sign
            literal = F.lit(value(stream, table))
            result = (
                F.when(condition, literal) if result is None else result.when(condition, literal)
            )
    return result if result is not None else F.lit(None)


#: Prefix of the pseudo-stream a row of no stream is counted under (see
#: :func:`build_frames`); no stream name starts with it.
STRAY = "!"


def _owner(catalog: AuditCatalog) -> Any:
    """A column: the stream a row of its table should belong to whatever its
    id (the positive one where a table holds two), for a row of no stream."""
    from pyspark.sql import functions as F

    owners: dict[str, str] = {}
    for stream in sorted(catalog.streams, key=lambda s: not s.positive):
        for stream_table in stream.tables:
            owners.setdefault(stream_table.table, stream.name)
    result: Any = None
    for table_name, name in owners.items():
        condition = F.col("table") == table_name
        result = (
            F.when(condition, F.lit(name))
            if result is None
            else result.when(condition, F.lit(name))
        )
    return result if result is not None else F.lit(None)


def stray_rows(data: AuditData, catalog: AuditCatalog) -> Any:
    """The rows whose id has no stream: 0, or the sign of no stream of their
    table (a receipt with id -3). No reader's ``> token`` query returns them.
    Columns: stream (the table's), table, instance, id (positive, to sort
    on), stored_id (as stored)."""
    from pyspark.sql import functions as F

    return data.rows.filter(_by_table(catalog, lambda s, t: s.name).isNull()).select(
        _owner(catalog).alias("stream"),
        "table",
        F.coalesce(F.col("instance"), F.lit("")).alias("instance"),
        F.abs(F.col("id")).alias("id"),
        F.col("id").alias("stored_id"),
    )


def build_frames(
    spark: Any, data: AuditData, catalog: AuditCatalog, largest_id: int, buckets: int
) -> Frames:
    """The checks' inputs; ``largest_id`` (at least) is cut into ``buckets``."""
    from pyspark.sql import functions as F

    bucket_size = max(1, -(-(largest_id + 1) // buckets))
    # A row of no stream (id 0, or the wrong sign) is kept under the pseudo-stream
    # STRAY + its table's stream, so the one pass over the rows counts it too;
    # the checks of real streams filter these out (see :attr:`Frames.rows`).
    stream = F.coalesce(
        _by_table(catalog, lambda s, t: s.name), F.concat(F.lit(STRAY), _owner(catalog))
    )
    rows = (
        data.rows.select(
            stream.alias("stream"),
            "table",
            F.coalesce(_by_table(catalog, lambda s, t: t.shares_ids), F.lit(True)).alias("shares"),
            F.coalesce(F.col("instance"), F.lit("")).alias("instance"),
            F.abs(F.col("id")).alias("id"),
        )
        .filter(F.col("stream").isNotNull())
        .withColumn("bucket", F.expr(f"id div {bucket_size}"))
    )
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
        last_values={s.name: int(data.sequences[s.sequence]) for s in catalog.streams},
    )


def per_stream(values: Mapping[str, int] | Mapping[tuple[str, str], int]) -> Any:
    """A column: ``values[stream]`` for the row's stream, or, keyed by pairs,
    ``values[(stream, writer)]`` (a CASE over the few streams and writers,
    cheaper per row than a join, and no Spark job to build it); null for
    others."""
    from pyspark.sql import functions as F

    result: Any = None
    for key, value in values.items():
        if isinstance(key, tuple):
            condition = (F.col("stream") == key[0]) & (F.col("writer") == key[1])
        else:
            condition = F.col("stream") == key
        result = (
            F.when(condition, F.lit(value))
            if result is None
            else result.when(condition, F.lit(value))
        )
    return result if result is not None else F.lit(None)


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
