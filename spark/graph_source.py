"""Where the event-graph checks' rows come from (docs/audit.md, "The event graph").

The graph is read in the same read-only transaction (or, over JDBC, the same
exported PostgreSQL snapshot) as the stream tables: the events with the flags
that decide whether an event belongs to the graph, the edges (``prev_events``
and ``auth_events``), the forward extremities and the current state.

Which flags exist depends on the schema, so it is read first
(:func:`read_graph_schema`): ``events.outlier`` always; rejections from a
``rejections`` table (``event_id``) or an ``events.rejected`` BOOLEAN column;
soft failures from an ``events.soft_failed`` BOOLEAN column; recorded
backward extremities (parents known to be missing) from an
``event_backward_extremities`` table (``event_id``); and the state groups
(delta 0081: ``state_groups`` and the events' ``state_group_before`` and
``state_group``). Whatever is absent reads as "none", and the report says
which checks that leaves out.
"""

from __future__ import annotations

from typing import Any

import attr
import pyarrow as pa

from synapse_lite.storage.database import LoggingTransaction
from synapse_lite.storage.engines import BaseDatabaseEngine

#: The tables the graph is stored in (schema delta 0080).
GRAPH_TABLES = ("event_edges", "event_auth_edges", "event_forward_extremities")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class GraphSchema:
    """What the database records about the graph beyond delta 0080."""

    #: A ``rejections`` table (event_id).
    rejections_table: bool = False
    #: An ``events.rejected`` column.
    rejected_column: bool = False
    #: An ``events.soft_failed`` column.
    soft_failed_column: bool = False
    #: An ``event_backward_extremities`` table (event_id).
    backward_extremities: bool = False
    #: A ``state_groups`` table and the events' group columns (delta 0081).
    state_groups: bool = False

    @property
    def knows_rejections(self) -> bool:
        return self.rejections_table or self.rejected_column

    def not_checked(self) -> dict[str, str]:
        """Checks this schema leaves out, and why (for the report)."""
        left_out = {}
        if not self.knows_rejections:
            left_out["rejected_in_state"] = (
                "the database records no rejections (no rejections table,"
                " no events.rejected column)"
            )
        if not self.state_groups:
            left_out["state_groups"] = (
                "the database has no state groups (no state_groups table or"
                " events.state_group column)"
            )
        return left_out


def _columns(txn: LoggingTransaction, engine: BaseDatabaseEngine, table: str) -> set[str]:
    """The columns of ``table`` (empty when it does not exist)."""
    if engine.name == "postgres":
        txn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = ?",
            (table,),
        )
    else:
        txn.execute(f"PRAGMA table_info({table})")
        return {str(row[1]) for row in txn.fetchall()}
    return {str(row[0]) for row in txn.fetchall()}


def read_graph_schema(txn: LoggingTransaction, engine: BaseDatabaseEngine) -> GraphSchema | None:
    """What the graph tables hold, or None if the database has none (a schema
    before delta 0080: the graph checks are left out)."""
    if not all(_columns(txn, engine, table) for table in GRAPH_TABLES):
        return None
    events = _columns(txn, engine, "events")
    return GraphSchema(
        rejections_table="event_id" in _columns(txn, engine, "rejections"),
        rejected_column="rejected" in events,
        soft_failed_column="soft_failed" in events,
        backward_extremities="event_id" in _columns(txn, engine, "event_backward_extremities"),
        state_groups={"id", "room_id", "prev_group", "chain_length"}
        <= _columns(txn, engine, "state_groups")
        and {"state_group_before", "state_group"} <= events,
    )


def _flag(condition: str | None) -> str:
    return f"CASE WHEN {condition} THEN 1 ELSE 0 END" if condition else "0"


def graph_queries(schema: GraphSchema) -> dict[str, tuple[str, pa.Schema]]:
    """Per graph frame, the query reading it and its columns."""
    text, long, flag = pa.string(), pa.int64(), pa.int32()
    rejected = " OR ".join(
        (["e.rejected"] if schema.rejected_column else [])
        + (
            ["EXISTS (SELECT 1 FROM rejections AS r WHERE r.event_id = e.event_id)"]
            if schema.rejections_table
            else []
        )
    )
    groups = (
        "e.state_group_before, e.state_group"
        if schema.state_groups
        else "CAST(NULL AS BIGINT) AS state_group_before, CAST(NULL AS BIGINT) AS state_group"
    )
    queries = {
        "events": (
            "SELECT e.event_id, e.room_id, e.stream_ordering, e.instance_name,"
            f" {_flag('e.outlier')} AS outlier, {_flag(rejected)} AS rejected,"
            f" {_flag('e.soft_failed' if schema.soft_failed_column else None)} AS soft_failed,"
            f" {groups} FROM events AS e",
            pa.schema(
                [
                    ("event_id", text),
                    ("room_id", text),
                    ("stream_ordering", long),
                    ("instance_name", text),
                    ("outlier", flag),
                    ("rejected", flag),
                    ("soft_failed", flag),
                    ("state_group_before", long),
                    ("state_group", long),
                ]
            ),
        ),
        "edges": (
            # Both kinds of edge in one frame: the checks join it once.
            "SELECT 'event_edges' AS edge_table, event_id, prev_event_id AS parent_id"
            " FROM event_edges UNION ALL"
            " SELECT 'event_auth_edges', event_id, auth_id FROM event_auth_edges",
            pa.schema([("edge_table", text), ("event_id", text), ("parent_id", text)]),
        ),
        "extremities": (
            "SELECT room_id, event_id FROM event_forward_extremities",
            pa.schema([("room_id", text), ("event_id", text)]),
        ),
        "state": (
            "SELECT room_id, type, state_key, event_id FROM current_state_events",
            pa.schema([("room_id", text), ("type", text), ("state_key", text), ("event_id", text)]),
        ),
    }
    if schema.state_groups:
        queries["groups"] = (
            "SELECT id, room_id, prev_group, chain_length FROM state_groups",
            pa.schema(
                [("id", long), ("room_id", text), ("prev_group", long), ("chain_length", long)]
            ),
        )
    if schema.backward_extremities:
        queries["backward"] = (
            "SELECT DISTINCT event_id FROM event_backward_extremities",
            pa.schema([("event_id", text)]),
        )
    return queries


@attr.s(slots=True, frozen=True, auto_attribs=True)
class GraphExport:
    """The graph's Parquet files, per frame of :func:`graph_queries`."""

    schema: GraphSchema
    files: dict[str, list[str]]
    rows: dict[str, int]


@attr.s(slots=True, frozen=True, auto_attribs=True)
class GraphData:
    """The graph frames one audit checks (columns as :func:`graph_queries`)."""

    schema: GraphSchema
    events: Any
    edges: Any
    extremities: Any
    state: Any
    #: None without an ``event_backward_extremities`` table.
    backward: Any
    #: The state groups (id, room_id, prev_group, chain_length); None
    #: without them.
    groups: Any = None


def _ddl(columns: pa.Schema) -> str:
    names = {pa.string(): "STRING", pa.int64(): "LONG", pa.int32(): "INT"}
    return ", ".join(f"{f.name} {names[f.type]}" for f in columns)


def graph_from_export(spark: Any, export: GraphExport) -> GraphData:
    queries = graph_queries(export.schema)
    frames = {
        name: spark.read.schema(_ddl(queries[name][1])).parquet(*paths)
        for name, paths in export.files.items()
    }
    return GraphData(
        schema=export.schema,
        events=frames["events"],
        edges=frames["edges"],
        extremities=frames["extremities"],
        state=frames["state"],
        backward=frames.get("backward"),
        groups=frames.get("groups"),
    )


def graph_over_jdbc(
    spark: Any,
    txn: LoggingTransaction,
    schema: GraphSchema,
    url: str,
    properties: dict[str, str],
    partitions: int,
) -> GraphData:
    """The graph frames read by Spark over JDBC (``properties`` join the
    exported snapshot). The events are read in ``partitions`` partitions on
    ``stream_ordering``; the edge and extremity tables, keyed by text ids, in
    one each."""
    txn.execute("SELECT MIN(stream_ordering), MAX(stream_ordering) FROM events")
    low, high = (int(v or 0) for v in txn.fetchone())
    frames: dict[str, Any] = {}
    for name, (select, _) in graph_queries(schema).items():
        table = f"({select}) AS audit_graph"
        if name == "events":
            frames[name] = spark.read.jdbc(
                url,
                table,
                column="stream_ordering",
                lowerBound=low,
                upperBound=max(high, low + 1),
                numPartitions=partitions if high > low else 1,
                properties=properties,
            )
        else:
            frames[name] = spark.read.jdbc(url, table, properties=properties)
    return GraphData(
        schema=schema,
        events=frames["events"],
        edges=frames["edges"],
        extremities=frames["extremities"],
        state=frames["state"],
        backward=frames.get("backward"),
        groups=frames.get("groups"),
    )


__all__ = [
    "GraphData",
    "GraphExport",
    "GraphSchema",
    "graph_from_export",
    "graph_over_jdbc",
    "graph_queries",
    "read_graph_schema",
]
