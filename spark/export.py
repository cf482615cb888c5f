"""Export a consistent snapshot of the stream tables to Parquet.

Everything is read in ONE read-only transaction, so the rows, the
``stream_positions`` table and the sequences agree with each other even while
the servers run. Rows are streamed in chunks (a server-side cursor on
PostgreSQL, ``fetchmany`` on SQLite) and written as Parquet row groups: the
export never holds a whole table in memory. Only the columns the audit needs
are exported: the writer's instance name and the stream id, with the table's
name so that Spark reads every table as one dataset.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import attr
import pyarrow as pa
import pyarrow.parquet as pq

from spark.catalog import AuditCatalog
from spark.progress import Progress
from spark.readonly import open_read_only, read_sequences, read_stream_positions
from synapse_lite.storage.database import LoggingDatabaseConnection, LoggingTransaction
from synapse_lite.storage.engines import BaseDatabaseEngine
from synapse_lite.storage.stream_ids import StreamTable

#: Rows per fetch and per Parquet row group.
CHUNK_ROWS = 200_000
#: Rows per Parquet file: files are Spark's unit of parallel reading.
FILE_ROWS = 1_000_000

ROW_SCHEMA = pa.schema([("table", pa.string()), ("instance", pa.string()), ("id", pa.int64())])
MANIFEST = "manifest.json"


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Snapshot:
    """What an export wrote: one Parquet file per table, plus the small state."""

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


def _chunks(
    db_conn: LoggingDatabaseConnection, txn: LoggingTransaction, table: StreamTable
) -> Iterator[list[tuple[Any, Any]]]:
    sql = f"SELECT {table.instance_column}, {table.id_column} FROM {table.table}"
    if db_conn.engine.name == "postgres":
        # A named cursor streams from the server, inside the same transaction.
        cursor: Any = db_conn.conn.cursor(name=f"audit_export_{table.table}")  # type: ignore[call-arg]
        cursor.itersize = CHUNK_ROWS
        cursor.execute(sql)
    else:
        txn.execute(sql)
        cursor = txn.raw_cursor
    try:
        while True:
            rows = cursor.fetchmany(CHUNK_ROWS)
            if not rows:
                return
            yield rows
    finally:
        if cursor is not txn.raw_cursor:
            cursor.close()


def _export_table(
    db_conn: LoggingDatabaseConnection,
    txn: LoggingTransaction,
    table: StreamTable,
    directory: str,
) -> tuple[list[str], int]:
    """Write ``table`` as Parquet files of at most :data:`FILE_ROWS` rows."""
    os.makedirs(directory, exist_ok=True)
    files: list[str] = []
    count = 0
    writer: pq.ParquetWriter | None = None
    try:
        for rows in _chunks(db_conn, txn, table):
            if writer is None or count >= len(files) * FILE_ROWS:
                if writer is not None:
                    writer.close()
                files.append(os.path.join(directory, f"part-{len(files):05d}.parquet"))
                writer = pq.ParquetWriter(files[-1], ROW_SCHEMA)
            instances, ids = zip(*rows, strict=True)
            # Parquet stores the repeated name once per row group (dictionary).
            columns = [
                pa.repeat(table.table, len(rows)),
                pa.array(instances, pa.string()),
                pa.array(ids, pa.int64()),
            ]
            writer.write_table(pa.table(columns, schema=ROW_SCHEMA))
            count += len(rows)
    finally:
        if writer is not None:
            writer.close()
    if not files:  # an empty table still has its schema
        files.append(os.path.join(directory, "part-00000.parquet"))
        pq.write_table(ROW_SCHEMA.empty_table(), files[0])
    return files, count


def export_snapshot(
    engine: BaseDatabaseEngine, catalog: AuditCatalog, directory: str, progress: Progress
) -> Snapshot:
    """Write the catalog's tables, ``stream_positions`` and sequences to ``directory``."""
    db_conn = open_read_only(engine)
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
