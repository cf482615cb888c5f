"""The Spark audit's entry point.

    synapse-lite audit -c homeserver.yaml [--master URL] [--json report.json]
    spark-submit spark/audit.py -c homeserver.yaml ...
    python spark/audit.py -c homeserver.yaml ...

Order of work: load the config, read the database (export a snapshot, or open
the JDBC snapshot), start Spark, run every check, collect the small results,
print the report. Exit 0 when clean, 1 with findings, 2 when the audit could
not run (the reason goes to stderr).
"""

from __future__ import annotations

import argparse
import os
import sys

if __package__ in (None, ""):
    # Run as a script (python or spark-submit spark/audit.py): import from the
    # source tree rather than from this directory, whose modules are not top-level.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.path.insert(0, os.path.dirname(_here))

from typing import Any, TextIO

from spark.progress import Progress
from spark.report import error_json, print_text, report_json, write_json
from spark.runner import AuditError, AuditOptions, run_audit
from synapse_lite.app.audit_arguments import add_arguments


def options_from_args(args: argparse.Namespace) -> AuditOptions:
    jar, source = args.jdbc_jar, "--jdbc-jar"
    if not jar and os.environ.get("SYNAPSE_LITE_JDBC_JAR"):
        jar, source = os.environ["SYNAPSE_LITE_JDBC_JAR"], "$SYNAPSE_LITE_JDBC_JAR"
    return AuditOptions(
        config_path=args.config,
        master=args.master,
        position_logs=tuple(args.position_logs) if args.position_logs else None,
        use_position_logs=not args.no_position_logs,
        jdbc_jar=jar,
        jdbc_jar_from=source,
        snapshot_dir=args.snapshot_dir,
        keep_snapshot=args.keep_snapshot,
        partitions=args.partitions,
        live=args.live,
        event_graph=not args.no_event_graph,
        verbose=args.verbose,
        executor_python=args.executor_python,
    )


def run(
    args: argparse.Namespace,
    spark: Any = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Audit, print and write the report; the exit code. ``spark``: an existing
    SparkSession to use (it is left running)."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        report = run_audit(options_from_args(args), Progress(err), spark=spark)
    except AuditError as e:
        err.write(f"audit: error: {e}\n")
        if args.json:
            write_json(args.json, error_json(str(e)))
        return 2
    print_text(report, out)
    if args.json:
        write_json(args.json, report_json(report))
    return report.exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="audit",
        description="Reproduce every stream's positions offline and report what the rows"
        " on disk do not support.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
