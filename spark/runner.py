"""One audit run: from a config file to an :class:`AuditReport`.

The database is read before Spark starts, so a bad config or an unreachable
database fails fast. Every failure the operator can meet becomes an
:class:`AuditError` with the reason (exit code 2).
"""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import attr

from spark.catalog import build_catalog
from spark.export import Snapshot, export_snapshot
from spark.graph_checks import check_graph
from spark.logs import PositionLogs, default_log_paths, load_position_logs
from spark.model import AuditReport
from spark.progress import Progress
from spark.readonly import DatabaseUnavailable, open_read_only
from spark.session import SparkUnavailable, jars_of_spark_submit, resolve_master, start_session
from spark.sources import AuditData, jdbc_source, snapshot_source
from spark.summary import collect_results
from synapse_lite.config.homeserver import HomeServerConfig, read_homeserver_config
from synapse_lite.config.validation import ConfigError, load_yaml_file
from synapse_lite.storage.engines import BaseDatabaseEngine, create_engine
from synapse_lite.streams.catalog import BUILTIN_STREAMS
from synapse_lite.streams.definition import StreamCatalog


class AuditError(RuntimeError):
    """The audit could not run; the message says why."""


@attr.s(slots=True, frozen=True, auto_attribs=True)
class AuditOptions:
    config_path: str
    #: None: spark-submit's ``--master``, else ``local[*]``.
    master: str | None = None
    #: None: every positions-*.jsonl in the config's data_dir.
    position_logs: tuple[str, ...] | None = None
    use_position_logs: bool = True
    jdbc_jar: str | None = None
    #: Where the jar came from, for the line saying which route ran.
    jdbc_jar_from: str = "--jdbc-jar"
    snapshot_dir: str | None = None
    keep_snapshot: bool = False
    partitions: int = 4
    live: bool = False
    #: Check the rooms' event graph too (``--no-event-graph``: the streams only).
    event_graph: bool = True
    #: Keep Spark's own INFO and WARN logging.
    verbose: bool = False
    #: The Python the executors run (``PYSPARK_PYTHON``); None: this interpreter
    #: on a local master, the cluster's default otherwise.
    executor_python: str | None = None
    #: The stream definitions the servers run (their built-in catalog unless a
    #: caller adds streams of its own).
    streams: StreamCatalog = BUILTIN_STREAMS


def _load(options: AuditOptions) -> tuple[HomeServerConfig, BaseDatabaseEngine]:
    try:
        config = read_homeserver_config(
            load_yaml_file(options.config_path), options.config_path, options.streams
        )
    except ConfigError as e:
        raise AuditError(f"bad config:\n{e}") from e
    except OSError as e:
        raise AuditError(f"cannot read config {options.config_path}: {e}") from e
    try:
        engine = create_engine(config.database.engine, config.database.args)
    except Exception as e:
        raise AuditError(f"cannot use the {config.database.engine} database: {e}") from e
    return config, engine


def _log_paths(options: AuditOptions, config: HomeServerConfig) -> list[str]:
    if not options.use_position_logs:
        return []
    if options.position_logs is not None:
        return list(options.position_logs)
    return default_log_paths(config.data_dir)


@contextmanager
def _snapshot_dir(options: AuditOptions) -> Iterator[str]:
    if options.snapshot_dir:
        os.makedirs(options.snapshot_dir, exist_ok=True)
        yield options.snapshot_dir
        return
    directory = tempfile.mkdtemp(prefix="synapse_lite_audit_")
    try:
        yield directory
    finally:
        if not options.keep_snapshot:
            shutil.rmtree(directory, ignore_errors=True)


class _SessionStarter:
    """Starts Spark in a thread, so the JVM's start (5-15 s) overlaps the
    export instead of following it; :meth:`session` waits for it."""

    def __init__(self, options: AuditOptions, jars: list[str], progress: Progress) -> None:
        self._options = options
        self._jars = jars
        self._progress = progress
        self._result: tuple[Any, bool] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name="audit-spark-start", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            master = resolve_master(self._options.master)
            with self._progress.step(f"started Spark ({master})"):
                self._result = start_session(
                    master,
                    self._jars,
                    {"spark.sql.shuffle.partitions": str(max(1, self._options.partitions))},
                    verbose=self._options.verbose,
                    executor_python=self._options.executor_python,
                )
        except BaseException as e:  # raised in the caller's thread by session()
            self._error = e

    def session(self) -> Any:
        """The SparkSession, once started; raises what the start raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result[0]

    def stop(self) -> None:
        """Stop the session if this started it (waiting for a start under way)."""
        self._thread.join()
        if self._result is not None and self._result[1]:
            self._result[0].stop()


def run_audit(options: AuditOptions, progress: Progress, spark: Any = None) -> AuditReport:
    """Audit the database and logs of ``options.config_path``."""
    started = time.monotonic()
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    config, engine = _load(options)
    catalog = build_catalog(config)
    log_paths = _log_paths(options, config)
    jar = options.jdbc_jar
    if jar and not os.path.isfile(jar):
        raise AuditError(
            f"JDBC driver jar not found: {jar} (apt-get install libpostgresql-jdbc-java)"
        )
    use_jdbc = bool(jar) and engine.name == "postgres"
    if use_jdbc and jar and spark is None:
        submitted = jars_of_spark_submit()
        if submitted is not None and os.path.realpath(jar) not in submitted:
            raise AuditError(
                f"under spark-submit the JDBC driver must be given to spark-submit too:"
                f" spark-submit --jars {jar} ... spark/audit.py ... (a jar only the audit"
                " names reaches the executors, not the driver, whose JVM is already running)"
            )
    if use_jdbc:
        progress.line(
            f"route: jdbc (Spark reads {engine.describe()} over JDBC with {jar},"
            f" from {options.jdbc_jar_from})"
        )
    elif jar:
        progress.line(
            f"route: parquet (the JDBC jar from {options.jdbc_jar_from} is for PostgreSQL;"
            f" exporting the {engine.name} database)"
        )
    else:
        progress.line(f"route: parquet (exporting a snapshot of {engine.describe()})")
    try:
        with ExitStack() as stack:
            # The database first: an unreachable one fails before Spark starts.
            open_read_only(engine, options.live).close()
            starter: _SessionStarter | None = None
            if spark is None:
                starter = _SessionStarter(options, [jar] if use_jdbc and jar else [], progress)
                stack.callback(starter.stop)
            snapshot: Snapshot | None = None
            if not use_jdbc:
                directory = stack.enter_context(_snapshot_dir(options))
                snapshot = export_snapshot(
                    engine, catalog, directory, progress, options.live, options.event_graph
                )
            session = spark if starter is None else starter.session()
            logs: PositionLogs | None = None
            if log_paths:
                with progress.step(f"read {len(log_paths)} position log(s)"):
                    logs = load_position_logs(session, log_paths, catalog.stream_names())
            if use_jdbc:
                data: AuditData = stack.enter_context(
                    jdbc_source(
                        session,
                        engine,
                        catalog,
                        max(1, options.partitions),
                        options.event_graph,
                    )
                )
            else:
                assert snapshot is not None
                data = snapshot_source(session, snapshot)
            with progress.watch_spark(session):
                streams, findings, info = collect_results(
                    session, data, catalog, logs, options.live, progress
                )
                graph = None
                if data.graph is not None:
                    graph_findings, graph = check_graph(data.graph, progress)
                    findings = sorted(
                        findings + graph_findings,
                        key=lambda f: (f.kind, f.stream, f.writer, f.ids),
                    )
                elif not options.event_graph:
                    progress.line("the event graph's checks are left out (--no-event-graph)")
                else:
                    progress.line("the database stores no event graph: its checks are left out")
    except (DatabaseUnavailable, SparkUnavailable, FileNotFoundError) as e:
        raise AuditError(str(e)) from e
    except AuditError:
        raise
    except Exception as e:
        raise AuditError(f"the audit failed: {type(e).__name__}: {e}") from e
    return AuditReport(
        database=engine.describe(),
        route=data.route,
        started_at=started_at,
        duration_s=time.monotonic() - started,
        streams=tuple(streams),
        findings=tuple(findings),
        info=tuple(info),
        position_logs={
            "files": list(log_paths),
            "records": logs.records if logs else 0,
            "malformed": logs.malformed if logs else 0,
        },
        graph=graph,
    )


__all__ = ["AuditError", "AuditOptions", "run_audit"]
