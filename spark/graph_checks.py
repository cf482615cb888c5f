"""The event graph's checks (docs/audit.md, "The event graph").

An event is **in the graph** when it is stored and is neither an outlier
(known without the state before it), rejected nor soft-failed: only such
events move a room's forward extremities (a rejected, soft-failed or outlier
child leaves its parents where they were). Against that:

* ``missing_prev_event``: a stored event names a parent that is not stored,
  and no known gap explains it. Known gaps: the parents of an outlier (stored
  without its history) and of a backfilled event (negative stream ordering:
  backfill stops somewhere), and parents recorded as backward extremities
  when the schema has ``event_backward_extremities``;
* ``missing_auth_event``: a stored event names an auth event that is not
  stored (no exception: an event is authorised against its auth events, so
  they are stored before it, outliers' too);
* ``edge_of_unknown_event``: an ``event_edges`` or ``event_auth_edges`` row
  of an event that is not stored;
* ``extremity_has_child``: a forward extremity that an event in the graph
  names as a parent;
* ``extremity_not_in_graph``: a forward extremity that is not stored, is
  stored in another room, or is an outlier, rejected or soft-failed;
* ``missing_extremity``: an event in the graph (of the events stream:
  backfilled events are older than the room's extremities) that no event in
  the graph names as a parent, yet is no forward extremity of its room;
* ``rejected_in_state``: a rejected event in ``current_state_events`` (only
  when the schema records rejections; the report says when it does not).

Everything is joins and aggregations over the graph frames; every finding
goes through :func:`spark.frames.summarise`, so the driver collects a count
and 20 samples per kind, stream and writer, and all of it in one job.
"""

from __future__ import annotations

import functools
from typing import Any

from spark.frames import summarise
from spark.graph_source import GraphData
from spark.model import Finding
from spark.progress import Progress

#: Severity of the collected rows that count the graph's rows (not findings).
GRAPH_ROWS = "graph_rows"

_SAMPLE_FIELDS = (
    ("id", "LONG"),
    ("event_id", "STRING"),
    ("room_id", "STRING"),
    ("table", "STRING"),
    ("parent", "STRING"),
    ("reason", "STRING"),
    ("type", "STRING"),
    ("state_key", "STRING"),
)


def _faults(df: Any, kind: str, **values: Any) -> Any:
    """Rows of one kind of fault: kind, stream, writer and the sample's fields
    (``values``: columns by sample field; the rest null). ``df`` has the
    event at fault's ``so`` (stream ordering, null if not stored) and
    ``instance``."""
    from pyspark.sql import functions as F

    so = F.col("so")
    columns = [
        F.lit(kind).alias("kind"),
        F.when(so < 0, F.lit("backfill")).otherwise(F.lit("events")).alias("stream"),
        F.coalesce(F.col("instance"), F.lit("")).alias("writer"),
        F.abs(so).alias("id"),
    ]
    for name, kind_of in _SAMPLE_FIELDS[1:]:
        value = values.get(name, F.lit(None))
        columns.append(value.cast(kind_of).alias(name))
    return df.select(*columns)


def graph_faults(graph: GraphData) -> Any:
    """Every fault of the graph, as rows of :data:`spark.frames.FINDING_COLUMNS`."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    events = graph.events.select(
        "event_id",
        "room_id",
        F.col("stream_ordering").alias("so"),
        F.col("instance_name").alias("instance"),
        (F.col("outlier") != 0).alias("outlier"),
        (F.col("rejected") != 0).alias("rejected"),
        (F.col("soft_failed") != 0).alias("soft_failed"),
    ).withColumn("member", ~(F.col("outlier") | F.col("rejected") | F.col("soft_failed")))
    parents = events.select(F.col("event_id").alias("parent_id"), F.lit(True).alias("parent_known"))
    edges = graph.edges.join(events, "event_id", "left").join(parents, "parent_id", "left")
    if graph.backward is not None:
        recorded = graph.backward.select(
            F.col("event_id").alias("parent_id"), F.lit(True).alias("recorded_gap")
        )
        edges = edges.join(recorded, "parent_id", "left")
    else:
        edges = edges.withColumn("recorded_gap", F.lit(None).cast("boolean"))
    stored, parent_missing = F.col("so").isNotNull(), F.col("parent_known").isNull()
    prev = F.col("edge_table") == "event_edges"
    known_gap = F.col("outlier") | (F.col("so") < 0) | F.coalesce("recorded_gap", F.lit(False))
    on_edge = {
        "event_id": F.col("event_id"),
        "room_id": F.col("room_id"),
        "table": F.col("edge_table"),
        "parent": F.col("parent_id"),
    }
    parts = [
        _faults(edges.filter(~stored), "edge_of_unknown_event", **on_edge),
        _faults(
            edges.filter(prev & stored & parent_missing & ~known_gap),
            "missing_prev_event",
            **on_edge,
        ),
        _faults(edges.filter(~prev & stored & parent_missing), "missing_auth_event", **on_edge),
    ]

    # Parents with a child in the graph (the smallest such child, to name one).
    with_child = (
        edges.filter(prev & F.col("member"))
        .groupBy(F.col("parent_id").alias("event_id"))
        .agg(F.min("event_id").alias("child"))
    )
    extremities = graph.extremities.select(F.col("room_id").alias("x_room"), "event_id")
    placed = extremities.join(events, "event_id", "left")
    reason = (
        F.when(F.col("so").isNull(), F.lit("not stored"))
        .when(F.col("room_id") != F.col("x_room"), F.concat(F.lit("in room "), "room_id"))
        .when(F.col("outlier"), F.lit("outlier"))
        .when(F.col("rejected"), F.lit("rejected"))
        .when(F.col("soft_failed"), F.lit("soft-failed"))
    )
    parts.append(
        _faults(
            placed.filter(reason.isNotNull()),
            "extremity_not_in_graph",
            event_id=F.col("event_id"),
            room_id=F.col("x_room"),
            reason=reason,
        )
    )
    parts.append(
        _faults(
            placed.join(with_child, "event_id"),
            "extremity_has_child",
            event_id=F.col("event_id"),
            room_id=F.col("x_room"),
            parent=F.col("child"),
        )
    )
    childless = (
        events.filter(F.col("member") & (F.col("so") > 0))
        .join(with_child, "event_id", "left_anti")
        .join(
            extremities.withColumnRenamed("x_room", "room_id"), ["event_id", "room_id"], "left_anti"
        )
    )
    parts.append(
        _faults(
            childless,
            "missing_extremity",
            event_id=F.col("event_id"),
            room_id=F.col("room_id"),
        )
    )
    if graph.schema.knows_rejections:
        in_state = graph.state.withColumnRenamed("room_id", "state_room").join(
            events.filter("rejected"), "event_id"
        )
        parts.append(
            _faults(
                in_state,
                "rejected_in_state",
                event_id=F.col("event_id"),
                room_id=F.col("state_room"),
                type=F.col("type"),
                state_key=F.col("state_key"),
            )
        )

    faults = functools.reduce(DataFrame.unionByName, parts)
    sample = F.struct(*[name for name, _ in _SAMPLE_FIELDS])
    summary = summarise(
        faults, ["kind", "stream", "writer"], sample, {"tables": F.collect_set("table")}
    )
    details = F.when(
        F.size("tables") > 0, F.to_json(F.struct(F.sort_array("tables").alias("tables")))
    ).otherwise(F.lit("{}"))
    return summary.select(
        F.lit("finding").alias("severity"),
        "kind",
        "stream",
        "writer",
        "count",
        # Events not stored have no id: their samples name them by event id.
        F.filter(F.transform("samples", lambda s: s["id"]), lambda i: i.isNotNull()).alias("ids"),
        F.to_json("samples").alias("samples"),
        details.alias("details"),
    )


def graph_counts(graph: GraphData) -> Any:
    """The rows of each graph table, as rows shaped like the findings
    (severity :data:`GRAPH_ROWS`, ``kind`` the table)."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    def counted(df: Any, name: Any) -> Any:
        return df.groupBy(name.alias("kind")).agg(F.count(F.lit(1)).alias("count"))

    parts = [
        counted(graph.events, F.lit("events")),
        counted(graph.edges, F.col("edge_table")),
        counted(graph.extremities, F.lit("event_forward_extremities")),
    ]
    return functools.reduce(DataFrame.unionByName, parts).select(
        F.lit(GRAPH_ROWS).alias("severity"),
        "kind",
        F.lit("").alias("stream"),
        F.lit("").alias("writer"),
        "count",
        F.array().cast("array<long>").alias("ids"),
        F.lit("[]").alias("samples"),
        F.lit("{}").alias("details"),
    )


def check_graph(graph: GraphData, progress: Progress) -> tuple[list[Finding], dict[str, Any]]:
    """The graph's findings, and its summary for the report: rows per table
    and the checks the schema leaves out (``not_checked``). One Spark job."""
    with progress.step("checked the event graph"):
        rows = graph_faults(graph).unionByName(graph_counts(graph)).collect()
    counts = {"events": 0, "event_edges": 0, "event_auth_edges": 0, "event_forward_extremities": 0}
    findings = []
    for row in rows:
        if row["severity"] == GRAPH_ROWS:
            counts[row["kind"]] = int(row["count"])
        else:
            findings.append(Finding.from_row(row))
    summary: dict[str, Any] = {"rows": counts, "not_checked": graph.schema.not_checked()}
    return findings, summary
