"""Export a consistent snapshot of the stream tables to Parquet.

Everything is read in ONE read-only transaction, so the rows, the
``stream_positions`` table and the sequences agree with each other even while
the servers run. Only the columns the audit needs are exported: the writer's
instance name and the stream id (the table is the directory the files are in).

PostgreSQL streams each table with ``COPY (SELECT ...) TO STDOUT`` in CSV
through a pipe into pyarrow's streaming CSV reader: the server does the
formatting in C and Python never touches a row, about five times the rate of a
server-side cursor. SQLite is read with ``fetchmany``. Either way rows go out
as Parquet row groups as they arrive: the export never holds a table in
memory.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import attr
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from spark.catalog import AuditCatalog
from spark.graph_source import GraphExport, GraphSchema, graph_queries, read_graph_schema
from spark.progress import Progress
from spark.readonly import open_read_only, read_sequences, read_stream_positions
from synapse_lite.storage.database import LoggingDatabaseConnection, LoggingTransaction
from synapse_lite.storage.engines import BaseDatabaseEngine
from synapse_lite.streams.definition import StreamTable

#: Rows per SQLite fetch and per Parquet row group.
CHUNK_ROWS = 200_000
#: Bytes per block of the CSV reader (a block becomes one batch of rows).
CSV_BLOCK_BYTES = 4 << 20
#: Rows per Parquet file: files are Spark's unit of parallel reading.
FILE_ROWS = 1_000_000

ROW_SCHEMA = pa.schema([("instance", pa.string()), ("id", pa.int64())])
MANIFEST = "manifest.json"


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Snapshot:
    """What an export wrote: Parquet files per table, plus the small state."""

    directory: str
    database: str
    taken_at_ms: int
    table_files: dict[str, list[str]]
    table_rows: dict[str, int]
    stream_positions: tuple[tuple[str, str, int], ...]
    sequences: dict[str, int]
    #: None when the database stores no event graph.
    graph: GraphExport | None = None

    def save_manifest(self) -> None:
        with open(os.path.join(self.directory, MANIFEST), "w", encoding="utf-8") as f:
            json.dump(attr.asdict(self), f, indent=1)


def _select(table: StreamTable) -> str:
    return f"SELECT {table.instance_column}, {table.id_column} FROM {table.table}"


def _copy_batches(db_conn: LoggingDatabaseConnection, select: str, schema: Any) -> Iterator[Any]:
    """Record batches of ``schema`` from PostgreSQL's COPY of ``select``, in
    the open transaction.

    COPY writes into a pipe from a thread while this generator parses the
    other end, so the server and the parser work at the same time and at most
    a pipe buffer and one CSV block are in memory.
    """
    read_fd, write_fd = os.pipe()
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            with os.fdopen(write_fd, "wb", buffering=1 << 20) as sink:
                cursor = db_conn.conn.cursor()
                try:
                    cursor.copy_expert(f"COPY ({select}) TO STDOUT WITH (FORMAT csv)", sink)
                finally:
                    cursor.close()
        except BaseException as e:  # reported by the reader, below
            failure.append(e)

    producer = threading.Thread(target=produce, name="audit-copy", daemon=True)
    producer.start()
    source = os.fdopen(read_fd, "rb")
    try:
        # An empty table writes nothing, and pyarrow refuses an empty stream.
        if source.peek(1):
            yield from pa_csv.open_csv(
                source,
                read_options=pa_csv.ReadOptions(
                    column_names=schema.names, block_size=CSV_BLOCK_BYTES
                ),
                # An instance name may hold anything, a newline included (quoted).
                parse_options=pa_csv.ParseOptions(newlines_in_values=True),
                convert_options=pa_csv.ConvertOptions(
                    column_types={f.name: f.type for f in schema},
                    # CSV writes NULL as an empty field and '' as "": keep them apart.
                    strings_can_be_null=True,
                    quoted_strings_can_be_null=False,
                ),
            )
    finally:
        # Closing our end makes a producer still writing fail (EPIPE) and stop.
        source.close()
        producer.join()
    if failure:
        raise failure[0]


def _fetch_batches(txn: LoggingTransaction, select: str, schema: Any) -> Iterator[Any]:
    """Record batches of ``schema`` from SQLite's ``select``, in the open transaction."""
    txn.execute(select)
    while True:
        rows = txn.raw_cursor.fetchmany(CHUNK_ROWS)
        if not rows:
            return
        columns = zip(*rows, strict=True)
        yield pa.record_batch(
            [pa.array(values, f.type) for values, f in zip(columns, schema, strict=True)],
            schema=schema,
        )


def export_query(
    db_conn: LoggingDatabaseConnection,
    txn: LoggingTransaction,
    select: str,
    schema: Any,
    directory: str,
) -> tuple[list[str], int]:
    """Write the rows of ``select`` (columns as ``schema``, a pyarrow schema)
    as Parquet files of at most about :data:`FILE_ROWS` rows in ``directory``."""
    os.makedirs(directory, exist_ok=True)
    files: list[str] = []
    count = 0
    writer: pq.ParquetWriter | None = None
    if db_conn.engine.name == "postgres":
        batches = _copy_batches(db_conn, select, schema)
    else:
        batches = _fetch_batches(txn, select, schema)
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if writer is None or count >= len(files) * FILE_ROWS:
                if writer is not None:
                    writer.close()
                files.append(os.path.join(directory, f"part-{len(files):05d}.parquet"))
                writer = pq.ParquetWriter(files[-1], schema)
            writer.write_batch(batch.cast(schema) if batch.schema != schema else batch)
            count += batch.num_rows
    finally:
        if hasattr(batches, "close"):
            batches.close()  # stops a COPY still running when writing failed
        if writer is not None:
            writer.close()
    if not files:  # an empty table still has its schema
        files.append(os.path.join(directory, "part-00000.parquet"))
        pq.write_table(schema.empty_table(), files[0])
    return files, count


def export_graph(
    db_conn: LoggingDatabaseConnection,
    txn: LoggingTransaction,
    schema: GraphSchema,
    directory: str,
) -> GraphExport:
    """Write the event graph's frames (:func:`spark.graph_source.graph_queries`)
    under ``directory``, in the open transaction."""
    files: dict[str, list[str]] = {}
    rows: dict[str, int] = {}
    for name, (select, columns) in graph_queries(schema).items():
        files[name], rows[name] = export_query(
            db_conn, txn, select, columns, os.path.join(directory, "graph", name)
        )
    return GraphExport(schema=schema, files=files, rows=rows)


def export_snapshot(
    engine: BaseDatabaseEngine,
    catalog: AuditCatalog,
    directory: str,
    progress: Progress,
    live: bool = False,
    event_graph: bool = True,
) -> Snapshot:
    """Write the catalog's tables, ``stream_positions`` and sequences to
    ``directory`` (``live``: the servers may be writing), and the event
    graph's frames unless ``event_graph`` is false."""
    db_conn = open_read_only(engine, live)
    try:
        with db_conn.transaction("audit_export", read_only=True) as txn:
            taken_at_ms = int(time.time() * 1000)
            positions = read_stream_positions(txn)
            sequences = read_sequences(txn, engine, catalog.sequences())
            files: dict[str, list[str]] = {}
            counts: dict[str, int] = {}
            with progress.step(f"exported {len(catalog.tables())} tables") as step:
                for table in catalog.tables():
                    path = os.path.join(directory, "tables", table.table)
                    started = time.monotonic()
                    files[table.table], counts[table.table] = export_query(
                        db_conn, txn, _select(table), ROW_SCHEMA, path
                    )
                    if time.monotonic() - started > 2:  # only tables worth watching
                        progress.line(f"exported {table.table}: {counts[table.table]:,} rows")
                step.rows = sum(counts.values())
            graph_schema = read_graph_schema(txn, engine) if event_graph else None
            graph = None
            if graph_schema is not None:
                with progress.step("exported the event graph") as step:
                    graph = export_graph(db_conn, txn, graph_schema, directory)
                    step.rows = sum(graph.rows.values())
    finally:
        db_conn.close()
    snapshot = Snapshot(
        directory=directory,
        database=engine.describe(),
        taken_at_ms=taken_at_ms,
        table_files=files,
        table_rows=counts,
        stream_positions=tuple(positions),
        sequences=sequences,
        graph=graph,
    )
    snapshot.save_manifest()
    return snapshot
