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

    def save_manifest(self) -> None:
        with open(os.path.join(self.directory, MANIFEST), "w", encoding="utf-8") as f:
            json.dump(attr.asdict(self), f, indent=1)


def _select(table: StreamTable) -> str:
    return f"SELECT {table.instance_column}, {table.id_column} FROM {table.table}"


def _copy_batches(db_conn: LoggingDatabaseConnection, table: StreamTable) -> Iterator[Any]:
    """Record batches of ``table`` from PostgreSQL's COPY, in the open transaction.

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
                    cursor.copy_expert(f"COPY ({_select(table)}) TO STDOUT WITH (FORMAT csv)", sink)
                finally:
                    cursor.close()
        except BaseException as e:  # reported by the reader, below
            failure.append(e)

    producer = threading.Thread(target=produce, name=f"audit-copy-{table.table}", daemon=True)
    producer.start()
    source = os.fdopen(read_fd, "rb")
    try:
        # An empty table writes nothing, and pyarrow refuses an empty stream.
        if source.peek(1):
            yield from pa_csv.open_csv(
                source,
                read_options=pa_csv.ReadOptions(
                    column_names=["instance", "id"], block_size=CSV_BLOCK_BYTES
                ),
                # An instance name may hold anything, a newline included (quoted).
                parse_options=pa_csv.ParseOptions(newlines_in_values=True),
                convert_options=pa_csv.ConvertOptions(
                    column_types={"instance": pa.string(), "id": pa.int64()},
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


def _fetch_batches(txn: LoggingTransaction, table: StreamTable) -> Iterator[Any]:
    """Record batches of ``table`` from SQLite, in the open transaction."""
    txn.execute(_select(table))
    while True:
        rows = txn.raw_cursor.fetchmany(CHUNK_ROWS)
        if not rows:
            return
        instances, ids = zip(*rows, strict=True)
        yield pa.record_batch(
            [pa.array(instances, pa.string()), pa.array(ids, pa.int64())], schema=ROW_SCHEMA
        )


def _export_table(
    db_conn: LoggingDatabaseConnection,
    txn: LoggingTransaction,
    table: StreamTable,
    directory: str,
) -> tuple[list[str], int]:
    """Write ``table`` as Parquet files of at most about :data:`FILE_ROWS` rows."""
    os.makedirs(directory, exist_ok=True)
    files: list[str] = []
    count = 0
    writer: pq.ParquetWriter | None = None
    if db_conn.engine.name == "postgres":
        batches = _copy_batches(db_conn, table)
    else:
        batches = _fetch_batches(txn, table)
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if writer is None or count >= len(files) * FILE_ROWS:
                if writer is not None:
                    writer.close()
                files.append(os.path.join(directory, f"part-{len(files):05d}.parquet"))
                writer = pq.ParquetWriter(files[-1], ROW_SCHEMA)
            writer.write_batch(batch.cast(ROW_SCHEMA) if batch.schema != ROW_SCHEMA else batch)
            count += batch.num_rows
    finally:
        if hasattr(batches, "close"):
            batches.close()  # stops a COPY still running when writing failed
        if writer is not None:
            writer.close()
    if not files:  # an empty table still has its schema
        files.append(os.path.join(directory, "part-00000.parquet"))
        pq.write_table(ROW_SCHEMA.empty_table(), files[0])
    return files, count


def export_snapshot(
    engine: BaseDatabaseEngine,
    catalog: AuditCatalog,
    directory: str,
    progress: Progress,
    live: bool = False,
) -> Snapshot:
    """Write the catalog's tables, ``stream_positions`` and sequences to
    ``directory`` (``live``: the servers may be writing)."""
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
                    files[table.table], counts[table.table] = _export_table(
                        db_conn, txn, table, path
                    )
                    if time.monotonic() - started > 2:  # only tables worth watching
                        progress.line(f"exported {table.table}: {counts[table.table]:,} rows")
                step.rows = sum(counts.values())
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
    )
    snapshot.save_manifest()
    return snapshot
