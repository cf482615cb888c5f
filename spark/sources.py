"""Where the audit's rows come from: a Parquet snapshot, or PostgreSQL over JDBC.

Either way the result is an :class:`AuditData`: one DataFrame of
``(table, instance, id)`` holding every stream table, plus the small state read in the same
snapshot (``stream_positions`` and each sequence's last value).

The JDBC route reads every table in partitions on its id column, each
partition on its own connection. They all join one PostgreSQL snapshot,
exported by the read-only transaction that also reads ``stream_positions`` and
the sequences (``pg_export_snapshot``), so the result is as consistent as the
Parquet export. The transaction stays open while :func:`jdbc_source`'s context
lasts, so any later read of the rows sees the same snapshot.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attr

from spark.catalog import AuditCatalog
from spark.export import Snapshot
from spark.graph_source import GraphData, graph_from_export, graph_over_jdbc, read_graph_schema
from spark.readonly import open_read_only, read_sequences, read_stream_positions
from synapse_lite.storage.engines import BaseDatabaseEngine

#: Rows per round trip of a JDBC partition's cursor (bounded executor memory).
JDBC_FETCH_SIZE = 10_000


@attr.s(slots=True, frozen=True, auto_attribs=True)
class AuditData:
    """The rows and state one audit checks."""

    rows: Any  # DataFrame(table string, instance string, id long)
    stream_positions: tuple[tuple[str, str, int], ...]
    sequences: dict[str, int]
    database: str
    route: str  # "parquet" or "jdbc"
    #: The event graph's frames; None when the database stores no graph.
    graph: GraphData | None = None


def snapshot_source(spark: Any, snapshot: Snapshot) -> AuditData:
    """Read an exported snapshot.

    One read per table, its name a literal column: Spark folds every
    expression on the table name into a constant per table instead of
    evaluating it (or joining on it) row by row. Empty tables are not read.
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    parts = [
        spark.read.schema("instance STRING, id LONG")
        .parquet(*paths)
        .select(F.lit(table).alias("table"), "instance", "id")
        for table, paths in snapshot.table_files.items()
        if snapshot.table_rows.get(table, 1) > 0
    ]
    rows = (
        functools.reduce(DataFrame.unionByName, parts)
        if parts
        else spark.createDataFrame([], "table STRING, instance STRING, id LONG")
    )
    return AuditData(
        rows=rows,
        stream_positions=snapshot.stream_positions,
        sequences=dict(snapshot.sequences),
        database=snapshot.database,
        route="parquet",
        graph=graph_from_export(spark, snapshot.graph) if snapshot.graph else None,
    )


def _jdbc_url(args: dict[str, Any]) -> str:
    host, port = args.get("host", "localhost"), args.get("port", 5432)
    return f"jdbc:postgresql://{host}:{port}/{args['dbname']}"


@contextmanager
def jdbc_source(
    spark: Any,
    engine: BaseDatabaseEngine,
    catalog: AuditCatalog,
    partitions: int,
    event_graph: bool = True,
) -> Iterator[AuditData]:
    """Read the tables over JDBC (the driver jar must be in ``spark.jars``),
    and the event graph's unless ``event_graph`` is false."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    if engine.name != "postgres":
        raise ValueError("the JDBC route reads PostgreSQL only")
    db_conn = open_read_only(engine)
    try:
        with db_conn.transaction("audit_jdbc_snapshot", read_only=True) as txn:
            txn.execute("SELECT pg_export_snapshot()")
            (snapshot_id,) = txn.fetchone()
            positions = read_stream_positions(txn)
            sequences = read_sequences(txn, engine, catalog.sequences())
            bounds: dict[str, tuple[int, int]] = {}
            for table in catalog.tables():
                txn.execute(
                    f"SELECT MIN({table.id_column}), MAX({table.id_column}) FROM {table.table}"
                )
                low, high = txn.fetchone()
                bounds[table.table] = (int(low or 0), int(high or 0))
            properties = {
                "driver": "org.postgresql.Driver",
                "user": str(engine.args.get("user", "postgres")),
                "password": str(engine.args.get("password", "")),
                "fetchsize": str(JDBC_FETCH_SIZE),
                # Each partition joins the exported snapshot before reading.
                "sessionInitStatement": (
                    "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;"
                    f" SET TRANSACTION SNAPSHOT '{snapshot_id}'"
                ),
            }
            parts = []
            for table in catalog.tables():
                low, high = bounds[table.table]
                query = (
                    f"(SELECT {table.instance_column} AS instance, {table.id_column} AS id"
                    f" FROM {table.table}) AS audit_rows"
                )
                part = spark.read.jdbc(
                    _jdbc_url(engine.args),
                    query,
                    column="id",
                    lowerBound=low,
                    upperBound=max(high, low + 1),
                    numPartitions=partitions if high > low else 1,
                    properties=properties,
                )
                parts.append(part.select(F.lit(table.table).alias("table"), "instance", "id"))
            # Not cached: the checks read the rows in one pass (the database is
            # read again only to detail a fault), and every read joins the
            # snapshot, which stays open while this context lasts.
            rows = functools.reduce(DataFrame.unionByName, parts)
            graph_schema = read_graph_schema(txn, engine) if event_graph else None
            graph = None
            if graph_schema is not None:
                graph = graph_over_jdbc(
                    spark, txn, graph_schema, _jdbc_url(engine.args), properties, partitions
                )
            yield AuditData(
                rows=rows,
                stream_positions=tuple(positions),
                sequences=sequences,
                database=engine.describe(),
                route="jdbc",
                graph=graph,
            )
    finally:
        db_conn.close()
