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

The state groups' chains (when the schema has them, delta 0081):

* ``state_group_missing_parent``: a delta whose ``prev_group`` is no stored
  group;
* ``state_group_chain_length``: a group whose ``chain_length`` is not its
  parent's + 1 (0 for a snapshot). A cycle of groups always has one (the
  lengths cannot fall all the way round);
* ``state_group_chain_too_long``: a group more than ``MAX_DELTA_CHAIN``
  deltas from its snapshot (its recorded length, which the check above
  vouches for);
* ``state_group_cycle``: the smallest group of each cycle of ``prev_group``
  links (of up to 64 groups). Looked for only when the one job found a
  wrong ``chain_length`` (never on a sound database): a second step of
  pointer doubling, :func:`group_cycles`;
* ``event_state_group_missing``: an event whose ``state_group_before`` or
  ``state_group`` is no stored group.

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
from synapse_lite.storage.databases.main.state_groups import MAX_DELTA_CHAIN

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


def _group_faults(df: Any, kind: str, reason: Any) -> Any:
    """Rows of one kind of state group fault (stream ``state_groups``, no
    writer: groups record none); ``df`` has the group's ``id``,
    ``room_id`` and ``prev_group``."""
    from pyspark.sql import functions as F

    values = {
        "room_id": F.col("room_id"),
        "parent": F.col("prev_group").cast("STRING"),
        "reason": reason,
    }
    columns = [
        F.lit(kind).alias("kind"),
        F.lit("state_groups").alias("stream"),
        F.lit("").alias("writer"),
        F.col("id").cast("LONG").alias("id"),
    ]
    for name, kind_of in _SAMPLE_FIELDS[1:]:
        columns.append(values.get(name, F.lit(None)).cast(kind_of).alias(name))
    return df.select(*columns)


def state_group_faults(graph: GraphData, events: Any) -> list[Any]:
    """The state groups' faults (see the module docstring; not the cycles)."""
    from pyspark.sql import functions as F

    groups = graph.groups.select("id", "room_id", "prev_group", "chain_length")
    parents = groups.select(
        F.col("id").alias("prev_group"), F.col("chain_length").alias("parent_length")
    )
    linked = groups.join(parents, "prev_group", "left")
    delta = F.col("prev_group").isNotNull()
    expected = F.when(delta, F.col("parent_length") + 1).otherwise(F.lit(0))
    stored_ids = groups.select(F.col("id").alias("group_id"), F.lit(True).alias("group_known"))
    pointers = events.select(
        "event_id", "room_id", "so", "instance",
        F.explode(
            F.array(
                F.struct(F.lit("state_group_before").alias("column"),
                         F.col("state_group_before").alias("group_id")),
                F.struct(F.lit("state_group").alias("column"),
                         F.col("state_group").alias("group_id")),
            )
        ).alias("pointer"),
    ).select("event_id", "room_id", "so", "instance", "pointer.*")  # fmt: skip
    dangling = pointers.filter(F.col("group_id").isNotNull()).join(stored_ids, "group_id", "left")
    return [
        _group_faults(
            linked.filter(delta & F.col("parent_length").isNull()),
            "state_group_missing_parent",
            F.lit("parent not stored"),
        ),
        _group_faults(
            linked.filter(
                ~(delta & F.col("parent_length").isNull()) & (F.col("chain_length") != expected)
            ),
            "state_group_chain_length",
            F.format_string(
                "chain_length %d, expected %d", F.col("chain_length"), expected.cast("LONG")
            ),
        ),
        _group_faults(
            linked.filter(F.col("chain_length") > MAX_DELTA_CHAIN),
            "state_group_chain_too_long",
            F.format_string(
                "%d deltas from its snapshot (at most %d)",
                F.col("chain_length"),
                F.lit(MAX_DELTA_CHAIN),
            ),
        ),
        _faults(
            dangling.filter(F.col("group_known").isNull()),
            "event_state_group_missing",
            event_id=F.col("event_id"),
            room_id=F.col("room_id"),
            reason=F.format_string("%s %d not stored", F.col("column"), F.col("group_id")),
        ),
    ]


#: Links followed by :func:`group_cycles` (2 ** its doubling steps).
CYCLE_STEPS = 64


def group_cycles(graph: GraphData) -> Any:
    """The smallest group of each cycle of ``prev_group`` links of at most
    :data:`CYCLE_STEPS` groups, as fault rows. Pointer doubling: after step
    *j* each group knows its ancestor ``2 ** j`` links up and the smallest
    id among those links; a group whose chain goes on past 64 links and
    that is the smallest of its own ones is the smallest of a cycle (a
    group before a cycle is not among its own ancestors). One small job per
    step (each step is checkpointed: the plan would double every step)."""
    from pyspark.sql import functions as F

    groups = graph.groups.select("id", "room_id", "prev_group")
    step = groups.select(
        "id", F.col("prev_group").alias("up"), F.col("prev_group").alias("least")
    ).localCheckpoint()
    links = 1
    while links < CYCLE_STEPS:
        ahead = step.select(
            F.col("id").alias("up"), F.col("up").alias("next_up"),
            F.col("least").alias("next_least"),
        )  # fmt: skip
        step = (
            step.join(ahead, "up", "left")
            .select(
                "id",
                F.col("next_up").alias("up"),
                F.least("least", "next_least").alias("least"),
            )
            .localCheckpoint()
        )
        links *= 2
    cycles = step.filter(F.col("up").isNotNull() & (F.col("least") == F.col("id")))
    return _group_faults(
        cycles.join(groups, "id"),
        "state_group_cycle",
        F.lit("its prev_group links lead back to it"),
    )


def _summarised(faults: Any) -> Any:
    """Fault rows as finding rows (:data:`spark.frames.FINDING_COLUMNS`)."""
    from pyspark.sql import functions as F

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
        "state_group_before",
        "state_group",
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

    if graph.groups is not None:
        parts.extend(state_group_faults(graph, events))
    return _summarised(functools.reduce(DataFrame.unionByName, parts))


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
    if graph.groups is not None:
        parts.append(counted(graph.groups, F.lit("state_groups")))
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
    if graph.groups is not None:
        counts["state_groups"] = 0
    findings = []
    for row in rows:
        if row["severity"] == GRAPH_ROWS:
            counts[row["kind"]] = int(row["count"])
        else:
            findings.append(Finding.from_row(row))
    if any(f.kind == "state_group_chain_length" for f in findings):
        # Only a wrong chain_length can hide a cycle: name the cycles.
        with progress.step("looked for cycles of state groups"):
            rows = _summarised(group_cycles(graph)).collect()
        findings.extend(Finding.from_row(row) for row in rows)
    summary: dict[str, Any] = {"rows": counts, "not_checked": graph.schema.not_checked()}
    return findings, summary
