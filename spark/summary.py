"""Run every check and bring the small results to the driver.

The rows are read once into 64-bit bitmaps of ids (:func:`spark.checks.id_words`).
From those the driver takes the per-writer totals and one record per block of
32,768 ids (streamed, for the gaps and to know which blocks hold duplicates),
and the bitmap words of the blocks with gaps inside.
A second pass over the rows runs only when those show a fault (duplicates, or
a writer's rows against its sequence, stored position or configuration), and
the position-log checks only with logs. What the driver holds is bounded by
the number of streams, writers and faults and by the id space / 32,768, never
by the number of rows.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from spark import checks, log_checks
from spark.catalog import AuditCatalog
from spark.frames import STRAY, build_frames
from spark.gaps import StreamGaps, stream_gaps
from spark.logs import PositionLogs
from spark.model import FINDING, INFO, Finding, StreamSummary, WriterSummary, describe
from spark.progress import Progress
from spark.sources import AuditData

#: Buckets the id space is cut into: enough for parallelism, few enough that
#: per-bucket aggregates stay small.
BUCKETS = 2048
#: The severity marking per-writer totals in the collected rows.
_WRITER_ROWS = "writer_rows"


def _per_writer(words: Any) -> Any:
    """Rows and largest id per stream and instance, shaped like the findings
    (``ids`` holds the largest)."""
    from pyspark.sql import functions as F

    return checks.per_writer(words).select(
        F.lit(_WRITER_ROWS).alias("severity"),
        F.lit("rows").alias("kind"),
        "stream",
        F.col("instance").alias("writer"),
        "count",
        F.array("largest").alias("ids"),
        F.lit("[]").alias("samples"),
        F.lit("{}").alias("details"),
    )


def _gap_findings(
    found: dict[str, StreamGaps],
    catalog: AuditCatalog,
    logged: dict[str, dict[str, int]] | None,
) -> list[Finding]:
    """Gaps as information, each saying why its stream's ids may lack a row:
    per table whose rows are removed (``StreamTable.rows_removed``), and
    failed transactions; with logs, how many ids they say failed or committed."""
    result = []
    for stream, gaps in found.items():
        details: dict[str, Any] = {"ranges": gaps.ranges}
        removed = {t.table: t.rows_removed for t in catalog.stream(stream).tables if t.rows_removed}
        if removed:
            details["removed"] = removed
        if logged is not None:
            counts = logged.get(stream, {})
            details["logged_failed"] = counts.get("logged_failed", 0)
            details["logged_committed"] = counts.get("logged_committed", 0)
        fields: dict[str, Any] = dict(
            severity=INFO,
            kind="gap",
            stream=stream,
            writer="",
            count=gaps.missing,
            ids=tuple(first for first, _ in gaps.first),
            samples=tuple({"id": first, "last": last} for first, last in gaps.first),
            details=details,
        )
        result.append(Finding(**fields, message=describe(**fields)))
    return result


def _row_fault_suspects(
    data: AuditData, catalog: AuditCatalog, per_writer: list[Any]
) -> dict[tuple[str, str], int]:
    """Per (stream, instance) whose rows may show a fault of
    :func:`spark.checks.row_faults`: the id above which they may (0 for a
    writer that may not write the stream). Decided from the totals: a writer
    whose largest id is within its sequence and stored position is left out,
    and a clean database is not read a second time."""
    stored = {(s, i): abs(p) for s, i, p in data.stream_positions}
    suspects = {}
    for row in per_writer:
        stream = catalog.stream(row["stream"])
        key = (stream.name, row["writer"])
        largest = int(row["ids"][0])
        if row["writer"] not in stream.writers:
            suspects[key] = 0
            continue
        above = data.sequences[stream.sequence]
        if stream.keeps_positions:
            above = min(above, stored.get(key, 0))
        if largest > above:
            suspects[key] = above
    return suspects


def _finding(severity: str, kind: str, stream: str, writer: str, **fields: Any) -> Finding:
    values: dict[str, Any] = dict(
        severity=severity,
        kind=kind,
        stream=stream,
        writer=writer,
        count=fields.pop("count", 1),
        ids=tuple(fields.pop("ids", ())),
        samples=tuple(fields.pop("samples", ())),
        details=fields.pop("details", {}),
    )
    assert not fields, fields
    return Finding(**values, message=describe(**values))


def _stored_position_faults(data: AuditData, catalog: AuditCatalog) -> list[Finding]:
    """What is wrong with ``stream_positions`` on its own (a few rows: done
    here): a row of no stream or of an instance that is not the stream's
    writer, a value of the wrong sign for its stream, a value beyond what the
    sequence handed out."""
    found = []
    names = catalog.stream_names()
    for stream_name, instance, stored in data.stream_positions:
        if stream_name not in names:
            found.append(
                _finding(
                    FINDING,
                    "unexpected_stream_position",
                    stream_name,
                    instance,
                    details={"reason": "unknown_stream", "stored": stored},
                )
            )
            continue
        stream = catalog.stream(stream_name)
        if not stream.keeps_positions or instance not in stream.writers:
            reason = "keeps_no_positions" if not stream.keeps_positions else "not_a_writer"
            found.append(
                _finding(
                    FINDING,
                    "unexpected_stream_position",
                    stream_name,
                    instance,
                    details={"reason": reason, "stored": stored, "writers": list(stream.writers)},
                )
            )
        # Positions of a stream counting down are stored negative (0: none yet).
        if (stored < 0) if stream.positive else (stored > 0):
            found.append(
                _finding(
                    FINDING,
                    "position_wrong_sign",
                    stream_name,
                    instance,
                    ids=(stored,),
                    samples=({"id": stored},),
                    details={
                        "stored": stored,
                        "positive": stream.positive,
                        "read_as": stored if stream.positive else -stored,
                    },
                )
            )
        last = data.sequences[stream.sequence]
        if abs(stored) > last:
            found.append(
                _finding(
                    FINDING,
                    "position_ahead_of_sequence",
                    stream_name,
                    instance,
                    ids=(abs(stored),),
                    samples=({"id": abs(stored)},),
                    details={
                        "stored": abs(stored),
                        "sequence": stream.sequence,
                        "last_value": last,
                    },
                )
            )
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
        # The one full pass; what it keeps is about one row per 64 ids and writer.
        all_words = checks.id_words(frames).localCheckpoint(eager=True)
        words = all_words.filter(~F.col("stream").startswith(STRAY))

    with progress.step("ran the checks") as step:
        per_writer = []
        stray = False
        for row in _per_writer(all_words).collect():
            if row["stream"].startswith(STRAY):
                stray = True
            else:
                per_writer.append(row)
        step.rows = sum(int(r["count"]) for r in per_writer)
        # Streamed a partition at a time: the driver keeps a few numbers a block.
        spans, short, marked = [], [], []
        for row in checks.block_totals(words).toLocalIterator():
            if row["dups"]:
                marked.append((row["stream"], int(row["block"])))
            if row["ids"]:
                low, top = int(row["low"]), int(row["top"])
                spans.append((row["stream"], int(row["block"]), low, top))
                if top - low + 1 > int(row["ids"]):
                    short.append((row["stream"], int(row["block"])))
        short_words: Iterable[Any] = []
        if short:
            wanted = spark.createDataFrame(short, "stream STRING, block LONG")
            short_words = checks.block_words(words, wanted).toLocalIterator()
        gaps = stream_gaps(spans, short_words, frames.last_values)

    found: list[Any] = []
    logged: dict[str, dict[str, int]] | None = None
    persisted: dict[str, int] = {}
    if logs is not None and logs.streams:
        with progress.step("checked the position logs"):
            checked = log_checks.check_logs(spark, frames, catalog, logs, live)
            found += checked.found
            logged, persisted = checked.logged, checked.persisted

    # Only a fault the totals show sends Spark back to the rows, for details.
    details = []
    if marked:
        blocks = spark.createDataFrame(marked, "stream STRING, block LONG")
        details.append(checks.duplicate_ids(frames, blocks))
    if stray:
        details.append(checks.stray_ids(data, catalog))
    suspects = _row_fault_suspects(data, catalog, per_writer)
    if suspects:
        details.append(checks.row_faults(frames, live, suspects))
    if details:
        with progress.step("detailed the faults"):
            found += functools.reduce(DataFrame.unionByName, details).collect()

    results = [Finding.from_row(r) for r in found] + _stored_position_faults(data, catalog)
    results += _gap_findings(gaps, catalog, logged)
    if logs is not None:
        results += _malformed(logs)
    results.sort(key=lambda f: (f.kind, f.stream, f.writer, f.ids))
    findings = [f for f in results if f.severity == FINDING]
    info = [f for f in results if f.severity == INFO]
    return _summaries(catalog, data, per_writer, persisted), findings, info
