"""What an audit found, as plain Python values: the report's contents.

A :class:`Finding` is a fault (severity ``finding``: the exit code becomes 1)
or information (severity ``info``: gaps left by failed transactions, positions
lagging on a live server). Each carries the stream, the writer, a bounded
sample of the ids involved with their count, and a message for people.
"""

from __future__ import annotations

import datetime
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


def who(writer: str) -> str:
    """An instance name for a message: the empty name (the main process of an
    unnamed config) shown as ``''``, not as nothing."""
    return writer if writer else "''"


def iso_time(ms: Any) -> str:
    """A position log time (epoch milliseconds) as an ISO date, to the millisecond."""
    if ms is None:
        return "?"
    try:
        moment = datetime.datetime.fromtimestamp(int(ms) / 1000, datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return f"{ms} ms"
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _ids(ids: tuple[int, ...], count: int) -> str:
    shown = ", ".join(str(i) for i in ids)
    return shown if count <= len(ids) else f"{shown} ... ({count} in all)"


#: The event graph's kinds (spark/graph_checks.py): what each says, before
#: the events named.
GRAPH_FAULTS = {
    "missing_prev_event": "name prev_events that are not stored, and no known gap"
    " (an outlier's or a backfilled event's parents, a recorded backward extremity) explains",
    "missing_auth_event": "name auth_events that are not stored",
    "edge_of_unknown_event": "have edges (prev or auth events) but are not stored",
    "extremity_has_child": "are forward extremities but have a child in the graph",
    "extremity_not_in_graph": "are forward extremities but not events of the room's graph"
    " (not stored, in another room, outliers, rejected or soft-failed)",
    "missing_extremity": "are in the graph with no child, yet no forward extremity of their room",
    "rejected_in_state": "are in current_state_events but were rejected",
    "event_state_group_missing": "name a state group (before or after them) that is not stored",
}


#: The state groups' kinds (spark/graph_checks.py), likewise.
STATE_GROUP_FAULTS = {
    "state_group_missing_parent": "are deltas whose prev_group is not stored",
    "state_group_chain_length": "have a chain_length that is not their parent's + 1"
    " (0 for a snapshot)",
    "state_group_chain_too_long": "are more deltas from their snapshot than the bound allows",
    "state_group_cycle": "are on a cycle of prev_group links (the smallest group of each)",
}


def _group_sample(sample: dict[str, Any]) -> str:
    """One group of a state group finding: its id, room, parent and what is wrong."""
    text = f"group {sample.get('id')} in {sample.get('room_id')}"
    if sample.get("parent") is not None:
        text += f" (parent {sample['parent']})"
    if sample.get("reason"):
        text += f" ({sample['reason']})"
    return text


def _graph_sample(sample: dict[str, Any]) -> str:
    """One event of a graph finding: its id, room, and what is wrong with it."""
    text = f"{sample.get('event_id')} in {sample.get('room_id')}"
    if sample.get("parent") and sample.get("table"):
        what = "parent" if sample["table"] == "event_edges" else "auth event"
        text += f" ({what} {sample['parent']})"
    elif sample.get("parent"):
        text += f" (child {sample['parent']})"
    if sample.get("reason"):
        text += f" ({sample['reason']})"
    if sample.get("type") is not None:
        text += f" (state {sample['type']} {sample.get('state_key')!r})"
    return text


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
    """One sentence saying what is wrong and where: the stream, the writer,
    the tables and the ids."""
    listed = _ids(ids, count)
    name = who(writer)
    tables = ", ".join(details.get("tables", []))
    if kind == "duplicate_stream_id":
        return (
            f"{count} id(s) of stream {stream} used more than once by {name} in {tables}: {listed}"
        )
    if kind == "id_above_sequence":
        return (
            f"{name} wrote {count} row(s) of stream {stream} in {tables} with ids above sequence"
            f" {details.get('sequence')} (last value {details.get('last_value')}): {listed}"
        )
    if kind == "id_wrong_sign":
        sign = "count up from 1" if details.get("positive", True) else "count down from -1"
        return (
            f"{name} wrote {count} row(s) in {tables} with ids that belong to no stream:"
            f" stream {stream}'s ids {sign}, so no reader's `> token` query returns them:"
            f" {listed}"
        )
    if kind == "position_ahead_of_sequence":
        return (
            f"stream_positions says {name} reached {details.get('stored')} on stream {stream},"
            f" but sequence {details.get('sequence')} only handed out up to"
            f" {details.get('last_value')}"
        )
    if kind == "position_wrong_sign":
        stored = details.get("stored")
        expected = "positive" if details.get("positive", True) else "negative (counting down)"
        return (
            f"stream_positions holds {stored} for {name} on stream {stream}, whose stored"
            f" positions are {expected}: the servers read it as position {details.get('read_as')}"
        )
    if kind == "unexpected_stream_position":
        reason = details.get("reason")
        if reason == "unknown_stream":
            why = "no stream of that name exists (the servers never read it)"
        elif reason == "keeps_no_positions":
            why = "the stream keeps no positions"
        else:
            why = f"{name} is not one of its writers ({', '.join(details.get('writers', []))})"
        return (
            f"stream_positions has a row for {name} on stream {stream!r}"
            f" (value {details.get('stored')}), but {why}"
        )
    if kind == "position_behind_rows":
        stored = details.get("stored")
        where = "has no stream_positions row" if stored is None else f"is stored at {stored}"
        return f"{name} {where} on stream {stream} but wrote {count} row(s) above it: {listed}"
    if kind == "unknown_writer":
        configured = ", ".join(details.get("configured", []))
        return (
            f"{name} wrote {count} row(s) of stream {stream} in {tables} but is not one of its"
            f" writers ({configured}): {listed}"
        )
    if kind == "position_before_finish":
        whose = (
            "stream-wide"
            if details.get("position_writer") == "*"
            else f"{who(details.get('position_writer') or '')}'s"
        )
        first = samples[0] if samples else {}
        return (
            f"{who(details.get('process') or '')} handed out {whose} positions of stream"
            f" {stream} covering {count} id(s) of {name} before they finished (first: position"
            f" {first.get('position')} at {iso_time(first.get('position_ts'))} covered id"
            f" {first.get('id')} in {', '.join(first.get('tables') or []) or 'no table'},"
            f" finished at {iso_time(first.get('finished_ts'))}): {listed}"
        )
    if kind == "logged_position_ahead_of_sequence":
        whose = (
            "stream-wide"
            if details.get("position_writer") == "*"
            else f"{who(details.get('position_writer') or '')}'s"
        )
        last = details.get("last_value")
        return (
            f"{who(details.get('process') or '')} handed out {whose} positions of stream"
            f" {stream} up to {details.get('largest_position')}, beyond anything sequence"
            f" {details.get('sequence')} produced ({last}; first at"
            f" {iso_time(details.get('first_ts'))}): a reader holding it skips the next"
            f" {int(details.get('largest_position') or 0) - int(last or 0)} id(s): {listed}"
        )
    if kind == "failed_id_has_row":
        return (
            f"{count} id(s) of stream {stream} that {name} logged as failed have rows in"
            f" {tables} (a lost commit acknowledgement: the write committed): {listed}"
        )
    if kind == "committed_row_missing":
        return (
            f"{count} id(s) of stream {stream} that {name} logged as committed have no row,"
            f" though rows of {tables} are never removed: {listed}"
        )
    if kind in STATE_GROUP_FAULTS:
        shown = "; ".join(_group_sample(sample) for sample in samples[:3])
        more = f" ... ({count} in all)" if count > 3 else ""
        return f"{count} state group(s) {STATE_GROUP_FAULTS[kind]}: {shown}{more}"
    if kind in GRAPH_FAULTS:
        shown = "; ".join(_graph_sample(sample) for sample in samples[:3])
        more = f" ... ({count} in all)" if count > 3 else ""
        writer_part = f" written by {name}" if writer else ""
        what = GRAPH_FAULTS[kind]
        return f"{count} event(s) of stream {stream}{writer_part} {what}: {shown}{more}"
    if kind == "gap":
        ranges = ", ".join(
            str(s["id"]) if s["id"] == s["last"] else f"{s['id']}-{s['last']}" for s in samples
        )
        more = "" if details.get("ranges", 0) <= len(samples) else " ..."
        removed = details.get("removed") or {}
        why = "; ".join(
            [f"{table}: rows {reason}" for table, reason in removed.items()]
            + ["or failed transactions" if removed else "failed transactions"]
        )
        known = []
        if details.get("logged_failed") is not None:
            known.append(f"{details['logged_failed']} logged as failed")
        if details.get("logged_committed") is not None:
            known.append(f"{details['logged_committed']} logged as committed")
        logged = f"; {', '.join(known)}" if known else ""
        return (
            f"{count} id(s) of stream {stream} handed out by its sequence have no row"
            f" ({why}) in {details.get('ranges')} range(s): {ranges}{more}{logged}"
        )
    return f"{kind} on stream {stream} ({name}): {listed}"


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
    #: The event graph's rows per table and the checks left out (None: the
    #: database stores no graph).
    graph: dict[str, Any] | None = attr.ib(default=None, hash=False)

    @property
    def exit_code(self) -> int:
        return 1 if self.findings else 0
