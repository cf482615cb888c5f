"""Run every check and bring the small results to the driver.

One collect holds everything (two with position logs), bounded by the number
of streams, writers and faults, never by the number of rows: the per-writer
totals and the union of every check's findings.
"""

from __future__ import annotations

import functools
from typing import Any

from spark import checks, log_checks
from spark.catalog import AuditCatalog
from spark.frames import Frames, build_frames
from spark.logs import PositionLogs
from spark.model import FINDING, INFO, Finding, StreamSummary, WriterSummary, describe
from spark.progress import Progress
from spark.sources import AuditData

#: Buckets the id space is cut into: enough for parallelism, few enough that
#: per-bucket aggregates stay small.
BUCKETS = 2048
#: The severity marking per-writer totals in the collected rows.
_WRITER_ROWS = "writer_rows"


def _per_writer(frames: Frames) -> Any:
    """Rows and largest id per stream and instance, shaped like the findings
    so that they come back in the same collect (``ids`` holds the largest)."""
    from pyspark.sql import functions as F

    return (
        frames.rows.groupBy("stream", "instance")
        .agg(F.count(F.lit(1)).alias("count"), F.max("id").alias("largest"))
        .select(
            F.lit(_WRITER_ROWS).alias("severity"),
            F.lit("rows").alias("kind"),
            "stream",
            F.col("instance").alias("writer"),
            "count",
            F.array("largest").alias("ids"),
            F.lit("[]").alias("samples"),
            F.lit("{}").alias("details"),
        )
    )


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

    largest = max([*data.sequences.values(), logs.largest_value if logs else 0])
    frames = build_frames(spark, data, catalog, largest, BUCKETS)
    with progress.step("ordered the ids"):
        marks = checks.id_marks(frames)
    return _collect(spark, data, catalog, logs, live, progress, frames, marks)


def _collect(
    spark: Any,
    data: AuditData,
    catalog: AuditCatalog,
    logs: PositionLogs | None,
    live: bool,
    progress: Progress,
    frames: Frames,
    marks: Any,
) -> tuple[list[StreamSummary], list[Finding], list[Finding]]:
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    parts = [
        _per_writer(frames),
        checks.duplicate_ids(marks),
        checks.row_faults(frames, live),
    ]
    failed = None
    persisted: dict[str, int] = {}
    if logs is not None and logs.streams:
        failed = logs.finished.filter(~F.col("committed")).select("stream", "id")
        per_id = checks.ids_per_stream(frames).localCheckpoint(eager=True)
        parts.append(log_checks.positions_before_finish(spark, frames, per_id, logs))
        with progress.step("reproduced persisted-up-to positions from the logs"):
            persisted = log_checks.persisted_upto(per_id, frames.streams, logs)
    parts.append(checks.gaps(frames, marks, failed))
    # One job: Spark reads each input once per branch and shares the per-id
    # shuffle between the branches that use it.
    with progress.step("ran the checks") as step:
        collected = functools.reduce(DataFrame.unionByName, parts).collect()
        per_writer = [r for r in collected if r["severity"] == _WRITER_ROWS]
        found = [r for r in collected if r["severity"] != _WRITER_ROWS]
        step.rows = sum(int(r["count"]) for r in per_writer)

    results = [Finding.from_row(r) for r in found] + _ahead_of_sequence(data, catalog)
    if logs is not None:
        results += _malformed(logs)
    results.sort(key=lambda f: (f.kind, f.stream, f.writer, f.ids))
    findings = [f for f in results if f.severity == FINDING]
    info = [f for f in results if f.severity == INFO]
    return _summaries(catalog, data, per_writer, persisted), findings, info
