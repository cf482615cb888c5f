"""Run every check and bring the small results to the driver.

Three collects in all, each bounded by the number of streams, writers and
faults, never by the number of rows: the per-writer aggregates, the
persisted-up-to positions (with logs), and the union of every check's
findings.
"""

from __future__ import annotations

import functools
from contextlib import ExitStack
from typing import Any

import attr

from spark import checks, log_checks
from spark.catalog import AuditCatalog
from spark.frames import FINDING_COLUMNS, build_frames
from spark.logs import PositionLogs
from spark.model import FINDING, INFO, Finding, StreamSummary, WriterSummary, describe
from spark.progress import Progress
from spark.sources import AuditData

#: Buckets of consecutive ids the gap search works in (per stream).
GAP_BUCKETS = 2048


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
        mine = {r["instance"]: r for r in per_writer if r["stream"] == stream.name}
        names = list(stream.writers) if stream.keeps_positions else []
        names += sorted(
            n for n in set(mine) | {i for s, i in stored if s == stream.name} if n not in names
        )
        writers = tuple(
            WriterSummary(
                writer=name,
                rows=int(mine[name]["rows"]) if name in mine else 0,
                largest_id=int(mine[name]["largest"]) if name in mine else None,
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
    stack: ExitStack,
) -> tuple[list[StreamSummary], list[Finding], list[Finding]]:
    """Streams summaries, findings and information, each list sorted."""
    from pyspark import StorageLevel
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    frames = build_frames(spark, data, catalog)
    # Read the tables once (from Parquet or over JDBC); spills to disk if large.
    rows = frames.rows.persist(StorageLevel.MEMORY_AND_DISK)
    stack.callback(rows.unpersist)
    frames = attr.evolve(frames, rows=rows)
    with progress.step("loaded and aggregated rows per writer") as step:
        per_writer = (
            rows.groupBy("stream", "instance")
            .agg(F.count(F.lit(1)).alias("rows"), F.max("id").alias("largest"))
            .collect()
        )
        step.rows = sum(int(r["rows"]) for r in per_writer)

    per_id = checks.ids_per_stream(frames).persist(StorageLevel.MEMORY_AND_DISK)
    stack.callback(per_id.unpersist)
    parts = [
        checks.duplicate_ids(frames, per_id),
        checks.row_faults(frames, live),
    ]
    failed = None
    persisted: dict[str, int] = {}
    if logs is not None and logs.streams:
        failed = logs.finished.filter(~F.col("committed")).select("stream", "id")
        parts.append(log_checks.positions_before_finish(spark, rows, per_id, logs))
        with progress.step("reproduced persisted-up-to positions from the logs"):
            persisted = log_checks.persisted_upto(per_id, frames.streams, logs)
    largest = max(data.sequences.values(), default=0)
    parts.append(checks.gaps(frames, per_id, failed, max(1, -(-largest // GAP_BUCKETS))))
    with progress.step("ran the checks"):
        found = functools.reduce(DataFrame.unionByName, parts).select(*FINDING_COLUMNS).collect()

    results = [Finding.from_row(r) for r in found] + _ahead_of_sequence(data, catalog)
    if logs is not None:
        results += _malformed(logs)
    results.sort(key=lambda f: (f.kind, f.stream, f.writer, f.ids))
    findings = [f for f in results if f.severity == FINDING]
    info = [f for f in results if f.severity == INFO]
    return _summaries(catalog, data, per_writer, persisted), findings, info
