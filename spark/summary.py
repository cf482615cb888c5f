"""Run every check and bring the small results to the driver.

The rows are read once into per-block bitmaps (:func:`spark.checks.id_bitmaps`).
One collect then brings the per-writer totals, the gaps and how many blocks
hold duplicates; a second pass over the rows runs only when those show a
fault (duplicates, or a writer's rows against its sequence, stored position or
configuration), and the position-log checks only with logs. Everything
collected is bounded by the number of streams, writers and faults, never by
the number of rows.
"""

from __future__ import annotations

import functools
from typing import Any

from spark import checks, log_checks
from spark.catalog import AuditCatalog
from spark.frames import build_frames
from spark.logs import PositionLogs
from spark.model import FINDING, INFO, Finding, StreamSummary, WriterSummary, describe
from spark.progress import Progress
from spark.sources import AuditData

#: Buckets the id space is cut into: enough for parallelism, few enough that
#: per-bucket aggregates stay small.
BUCKETS = 2048
#: The severities marking per-writer totals and duplicate blocks in the
#: collected rows (they are not findings).
_WRITER_ROWS = "writer_rows"
_DUPLICATE_BLOCKS = "duplicate_blocks"


def _per_writer(bitmaps: Any) -> Any:
    """Rows and largest id per stream and instance, shaped like the findings
    so that they come back in the same collect (``ids`` holds the largest)."""
    from pyspark.sql import functions as F

    return checks.per_writer(bitmaps).select(
        F.lit(_WRITER_ROWS).alias("severity"),
        F.lit("rows").alias("kind"),
        "stream",
        F.col("instance").alias("writer"),
        "count",
        F.array("largest").alias("ids"),
        F.lit("[]").alias("samples"),
        F.lit("{}").alias("details"),
    )


def _duplicate_blocks(blocks: Any) -> Any:
    """How many blocks of each stream hold a duplicate, shaped like the findings."""
    from pyspark.sql import functions as F

    return (
        blocks.filter("dups")
        .groupBy("stream")
        .agg(F.count(F.lit(1)).alias("count"))
        .select(
            F.lit(_DUPLICATE_BLOCKS).alias("severity"),
            F.lit("blocks").alias("kind"),
            "stream",
            F.lit("").alias("writer"),
            "count",
            F.array().cast("array<bigint>").alias("ids"),
            F.lit("[]").alias("samples"),
            F.lit("{}").alias("details"),
        )
    )


def _row_faults_possible(data: AuditData, catalog: AuditCatalog, per_writer: list[Any]) -> bool:
    """Whether any row can show a fault of :func:`spark.checks.row_faults`: a
    writer's largest id above its sequence or its stored position, or rows of
    a writer that may not write the stream. Decided from the totals, so a
    clean database is not read a second time."""
    stored = {(s, i): abs(p) for s, i, p in data.stream_positions}
    for row in per_writer:
        stream = catalog.stream(row["stream"])
        largest = int(row["ids"][0])
        if row["writer"] not in stream.writers:
            return True
        if largest > data.sequences[stream.sequence]:
            return True
        if stream.keeps_positions and largest > stored.get((stream.name, row["writer"]), 0):
            return True
    return False


def _ahead_of_sequence(data: AuditData, catalog: AuditCatalog) -> list[Finding]:
    """Stored positions beyond what the sequence handed out (a few rows: done here)."""
    found = []
    for stream_name, instance, stored in data.stream_positions:
        if stream_name not in catalog.stream_names():
            continue
        stream = catalog.stream(stream_name)
        last = data.sequences[stream.sequence]
        if abs(stored) > last:
            fields: dict[str, Any] = dict(
                severity=FINDING,
                kind="position_ahead_of_sequence",
                stream=stream_name,
                writer=instance,
                count=1,
                ids=(abs(stored),),
                samples=({"id": abs(stored)},),
                details={"stored": abs(stored), "sequence": stream.sequence, "last_value": last},
            )
            found.append(Finding(**fields, message=describe(**fields)))
    return found


def _malformed(logs: PositionLogs) -> list[Finding]:
    if not logs.malformed:
        return []
    fields: dict[str, Any] = dict(
        severity=INFO,
        kind="malformed_log_lines",
        stream="",
        writer="",
        count=logs.malformed,
        ids=(),
        samples=(),
        details={"files": list(logs.paths)},
    )
    message = f"{logs.malformed} line(s) of the position logs are not valid records; ignored"
    return [Finding(**fields, message=message)]


def _summaries(
    catalog: AuditCatalog,
    data: AuditData,
    per_writer: list[Any],
    persisted: dict[str, int],
) -> list[StreamSummary]:
    stored = {(s, i): abs(p) for s, i, p in data.stream_positions}
    result = []
    for stream in catalog.streams:
        mine = {r["writer"]: r for r in per_writer if r["stream"] == stream.name}
        names = list(stream.writers) if stream.keeps_positions else []
        names += sorted(
            n for n in set(mine) | {i for s, i in stored if s == stream.name} if n not in names
        )
        writers = tuple(
            WriterSummary(
                writer=name,
                rows=int(mine[name]["count"]) if name in mine else 0,
                largest_id=int(mine[name]["ids"][0]) if name in mine else None,
                stored_position=stored.get((stream.name, name)),
                configured=name in stream.writers,
            )
            for name in names
        )
        last = data.sequences[stream.sequence]
        result.append(
            StreamSummary(
                stream=stream.name,
                sequence=stream.sequence,
                sequence_last_value=last,
                persisted_upto=min(persisted.get(stream.name, last), last),
                rows=sum(w.rows for w in writers),
                writers=writers,
            )
        )
    return result


def collect_results(
    spark: Any,
    data: AuditData,
    catalog: AuditCatalog,
    logs: PositionLogs | None,
    live: bool,
    progress: Progress,
) -> tuple[list[StreamSummary], list[Finding], list[Finding]]:
    """Streams summaries, findings and information, each list sorted."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    largest = max([*data.sequences.values(), logs.largest_value if logs else 0])
    frames = build_frames(spark, data, catalog, largest, BUCKETS)
    with progress.step("read the rows into id bitmaps"):
        # The one full pass; what it keeps is a few rows per block and writer.
        bitmaps = checks.id_bitmaps(frames).localCheckpoint(eager=True)
    blocks = checks.block_totals(bitmaps).localCheckpoint(eager=True)

    failed = None
    persisted: dict[str, int] = {}
    parts = [_per_writer(bitmaps), _duplicate_blocks(blocks)]
    if logs is not None and logs.streams:
        failed = logs.finished.filter(~F.col("committed")).select("stream", "id")
        per_id = checks.ids_per_stream(frames).localCheckpoint(eager=True)
        parts.append(log_checks.positions_before_finish(spark, frames, per_id, logs))
        with progress.step("reproduced persisted-up-to positions from the logs"):
            persisted = log_checks.persisted_upto(per_id, frames.streams, logs)
    parts.append(checks.gaps(frames, blocks, failed))
    with progress.step("ran the checks") as step:
        collected = functools.reduce(DataFrame.unionByName, parts).collect()
        per_writer = [r for r in collected if r["severity"] == _WRITER_ROWS]
        duplicates = any(r["severity"] == _DUPLICATE_BLOCKS for r in collected)
        found = [r for r in collected if r["severity"] not in (_WRITER_ROWS, _DUPLICATE_BLOCKS)]
        step.rows = sum(int(r["count"]) for r in per_writer)

    # Only a fault the totals show sends Spark back to the rows, for details.
    details = []
    if duplicates:
        details.append(checks.duplicate_ids(frames, blocks))
    if _row_faults_possible(data, catalog, per_writer):
        details.append(checks.row_faults(frames, live))
    if details:
        with progress.step("detailed the faults"):
            found += functools.reduce(DataFrame.unionByName, details).collect()

    results = [Finding.from_row(r) for r in found] + _ahead_of_sequence(data, catalog)
    if logs is not None:
        results += _malformed(logs)
    results.sort(key=lambda f: (f.kind, f.stream, f.writer, f.ids))
    findings = [f for f in results if f.severity == FINDING]
    info = [f for f in results if f.severity == INFO]
    return _summaries(catalog, data, per_writer, persisted), findings, info
