"""What an audit found, as plain Python values: the report's contents.

A :class:`Finding` is a fault (severity ``finding``: the exit code becomes 1)
or information (severity ``info``: gaps left by failed transactions, positions
lagging on a live server). Each carries the stream, the writer, a bounded
sample of the ids involved with their count, and a message for people.
"""

from __future__ import annotations

import json
from typing import Any

import attr

FINDING = "finding"
INFO = "info"


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Finding:
    severity: str
    kind: str
    stream: str
    writer: str
    count: int
    ids: tuple[int, ...]
    samples: tuple[dict[str, Any], ...]
    details: dict[str, Any] = attr.ib(hash=False)
    message: str

    @classmethod
    def from_row(cls, row: Any) -> Finding:
        """From a row of :data:`spark.frames.FINDING_COLUMNS`."""
        details = json.loads(row["details"] or "{}")
        samples = tuple(json.loads(row["samples"] or "[]"))
        ids = tuple(int(i) for i in row["ids"] or ())
        fields = dict(
            severity=row["severity"],
            kind=row["kind"],
            stream=row["stream"],
            writer=row["writer"],
            count=int(row["count"]),
            ids=ids,
            samples=samples,
            details=details,
        )
        return cls(**fields, message=describe(**fields))

    def to_json(self) -> dict[str, Any]:
        return attr.asdict(self, recurse=False) | {
            "ids": list(self.ids),
            "samples": list(self.samples),
        }


def _ids(ids: tuple[int, ...], count: int) -> str:
    shown = ", ".join(str(i) for i in ids)
    return shown if count <= len(ids) else f"{shown} ... ({count} in all)"


def describe(
    *,
    severity: str,
    kind: str,
    stream: str,
    writer: str,
    count: int,
    ids: tuple[int, ...],
    samples: tuple[dict[str, Any], ...],
    details: dict[str, Any],
) -> str:
    """One sentence saying what is wrong and where."""
    listed = _ids(ids, count)
    if kind == "duplicate_stream_id":
        return (
            f"{count} id(s) of stream {stream} used more than once by {writer}"
            f" in {', '.join(details.get('tables', []))}: {listed}"
        )
    if kind == "id_above_sequence":
        return (
            f"{writer} wrote {count} row(s) of stream {stream} with ids above sequence"
            f" {details.get('sequence')} (last value {details.get('last_value')}): {listed}"
        )
    if kind == "position_ahead_of_sequence":
        return (
            f"stream_positions says {writer} reached {details.get('stored')} on stream {stream},"
            f" but sequence {details.get('sequence')} only handed out up to"
            f" {details.get('last_value')}"
        )
    if kind == "position_behind_rows":
        stored = details.get("stored")
        where = "has no stream_positions row" if stored is None else f"is stored at {stored}"
        return f"{writer} {where} on stream {stream} but wrote {count} row(s) above it: {listed}"
    if kind == "unknown_writer":
        configured = ", ".join(details.get("configured", []))
        return (
            f"{writer} wrote {count} row(s) of stream {stream} but is not one of its"
            f" writers ({configured}): {listed}"
        )
    if kind == "position_before_finish":
        whose = (
            "stream-wide"
            if details.get("position_writer") == "*"
            else f"{details.get('position_writer')}'s"
        )
        first = samples[0] if samples else {}
        return (
            f"{details.get('process')} handed out {whose} positions of stream {stream} covering"
            f" {count} id(s) of {writer} before they finished (first: position"
            f" {first.get('position')} at {first.get('position_ts')} covered id"
            f" {first.get('id')}, finished at {first.get('finished_ts')}): {listed}"
        )
    if kind == "gap":
        ranges = ", ".join(
            str(s["id"]) if s["id"] == s["last"] else f"{s['id']}-{s['last']}" for s in samples
        )
        more = "" if details.get("ranges", 0) <= len(samples) else " ..."
        failed = details.get("logged_failed")
        known = "" if failed is None else f"; {failed} logged as failed"
        return (
            f"{count} id(s) of stream {stream} handed out by its sequence have no row"
            f" (failed transactions) in {details.get('ranges')} range(s): {ranges}{more}{known}"
        )
    return f"{kind} on stream {stream} ({writer}): {listed}"


@attr.s(slots=True, frozen=True, auto_attribs=True)
class WriterSummary:
    """One instance's rows of one stream and its stored position."""

    writer: str
    rows: int
    largest_id: int | None
    stored_position: int | None
    configured: bool


@attr.s(slots=True, frozen=True, auto_attribs=True)
class StreamSummary:
    """A stream's positions as reproduced from the rows (ids positive)."""

    stream: str
    sequence: str
    sequence_last_value: int
    persisted_upto: int
    rows: int
    writers: tuple[WriterSummary, ...]


@attr.s(slots=True, frozen=True, auto_attribs=True)
class AuditReport:
    """Everything one audit run produced."""

    database: str
    route: str
    started_at: str
    duration_s: float
    streams: tuple[StreamSummary, ...]
    findings: tuple[Finding, ...]
    info: tuple[Finding, ...]
    position_logs: dict[str, Any] = attr.ib(hash=False)

    @property
    def exit_code(self) -> int:
        return 1 if self.findings else 0
