"""The audit's output: a table for the terminal and a JSON report.

The JSON format is described in ``docs/audit.md``; ``format`` is bumped on any
incompatible change.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any, TextIO

import attr

from spark.model import AuditReport

REPORT_FORMAT = 1


def _table(headers: Sequence[str], rows: list[Sequence[object]]) -> list[str]:
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]

    def fmt(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if i else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ).rstrip()

    return [fmt(headers), fmt(["-" * w for w in widths]), *(fmt(r) for r in cells)]


def render_text(report: AuditReport) -> str:
    """The terminal report: positions per stream and writer, then findings."""
    lines = [f"Audit of {report.database} (route: {report.route}, {report.duration_s:.1f} s)", ""]
    rows: list[Sequence[object]] = []
    for s in report.streams:
        rows.append(
            [s.stream, "(all)", s.rows, None, None, s.sequence_last_value, s.persisted_upto]
        )
        for w in s.writers:
            name = w.writer if w.configured else f"{w.writer} (not a writer)"
            rows.append(["", name, w.rows, w.largest_id, w.stored_position, None, None])
    headers = ["stream", "writer", "rows", "largest id", "stored", "sequence", "persisted"]
    lines += _table(headers, rows)
    logs = report.position_logs
    if logs.get("files"):
        lines += [
            "",
            f"Position logs: {len(logs['files'])} file(s), {logs['records']:,} records,"
            f" {logs['malformed']} malformed line(s)",
        ]
    if report.graph is not None:
        counts = report.graph["rows"]
        lines += [
            "",
            f"Event graph: {counts['events']:,} events, {counts['event_edges']:,} edges,"
            f" {counts['event_auth_edges']:,} auth edges,"
            f" {counts['event_forward_extremities']:,} forward extremities"
            + (f", {counts['state_groups']:,} state groups" if "state_groups" in counts else ""),
        ]
        lines += [
            f"  not checked: {check}: {why}" for check, why in report.graph["not_checked"].items()
        ]
    for title, items in (("Findings", report.findings), ("Information", report.info)):
        lines += ["", f"{title}: {len(items)}" if items else f"{title}: none"]
        lines += [f"  [{f.kind}] {f.message}" for f in items]
    lines += ["", "Result: " + ("FINDINGS (exit 1)" if report.findings else "clean (exit 0)")]
    return "\n".join(lines) + "\n"


def report_json(report: AuditReport) -> dict[str, Any]:
    """The JSON report as a dict."""
    return {
        "format": REPORT_FORMAT,
        "exit_code": report.exit_code,
        "database": report.database,
        "route": report.route,
        "started_at": report.started_at,
        "duration_s": round(report.duration_s, 3),
        "streams": [attr.asdict(s) for s in report.streams],
        "findings": [f.to_json() for f in report.findings],
        "info": [f.to_json() for f in report.info],
        "position_logs": report.position_logs,
        "graph": report.graph,
    }


def error_json(reason: str) -> dict[str, Any]:
    """The JSON report of an audit that could not run (exit 2)."""
    return {"format": REPORT_FORMAT, "exit_code": 2, "error": reason}


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write atomically, so a reader never sees half a report."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def print_text(report: AuditReport, out: TextIO) -> None:
    out.write(render_text(report))
    out.flush()
