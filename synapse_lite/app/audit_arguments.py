"""The Spark audit's command-line arguments, for ``synapse-lite audit`` and
``spark/audit.py`` alike (``docs/audit.md`` explains each)."""

from __future__ import annotations

import argparse
import os


def add_arguments(parser: argparse.ArgumentParser, config_required: bool = True) -> None:
    """The audit's arguments (``docs/audit.md`` explains each). Without
    ``config_required`` (``synapse-lite audit``) the caller finds the config
    when ``-c`` is not given, as its other commands do."""
    parser.add_argument(
        "-c", "--config", required=config_required, help="the homeserver.yaml to audit"
    )
    parser.add_argument(
        "--master",
        help="Spark master URL (default: spark-submit's --master, else local[*]; e.g."
        " spark://host:7077 for a cluster)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON to PATH")
    parser.add_argument(
        "--position-log",
        metavar="PATH",
        action="append",
        dest="position_logs",
        help="a position log to check (repeatable; default: every positions-*.jsonl"
        " in the config's data_dir)",
    )
    parser.add_argument(
        "--no-position-logs",
        action="store_true",
        help="ignore position logs, even those in the data_dir",
    )
    parser.add_argument(
        "--jdbc-jar",
        metavar="PATH",
        help="PostgreSQL JDBC driver jar: read PostgreSQL over JDBC instead of exporting a"
        " snapshot (default: $SYNAPSE_LITE_JDBC_JAR; the audit says which route ran)",
    )
    parser.add_argument(
        "--snapshot-dir",
        metavar="DIR",
        help="where the Parquet snapshot goes (default: a temporary directory, removed"
        " afterwards); must be readable by every Spark executor on a cluster",
    )
    parser.add_argument(
        "--keep-snapshot", action="store_true", help="keep the snapshot after the audit"
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=4,
        metavar="N",
        help="JDBC partitions per table and Spark shuffle partitions (default: 4)",
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="the servers are running: stored positions lagging their rows are information",
    )
    parser.add_argument(
        "--no-event-graph",
        action="store_true",
        help="check the streams only, not the rooms' event graph (faster: no graph"
        " tables exported or read)",
    )

    parser.add_argument(
        "--verbose",
        action="store_true",
        help="keep Spark's own INFO and WARN logging (default: errors only, under the"
        " audit's progress lines)",
    )
    parser.add_argument(
        "--executor-python",
        metavar="PATH",
        default=os.environ.get("PYSPARK_PYTHON") or None,
        help="the Python the Spark executors run, as a path valid on every node"
        " (default: $PYSPARK_PYTHON; else this interpreter for a local master, and the"
        " cluster's own python3 otherwise)",
    )
