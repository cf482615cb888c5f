"""Benchmark: the Spark audit against the same aggregates in plain SQL.

    python bench/audit.py --rows 1000000 [--rows 10000000] [--jdbc-jar PATH] [--reuse]

For each size, seeds a PostgreSQL events table (two writers, a few planted
gaps; INSERT ... SELECT generate_series, indexes built afterwards), then times
in the same run:

(a) plain SQL inside PostgreSQL: rows and largest id per writer, duplicate ids,
    gaps (a window over the ids), stored positions against the sequence;
(a') with position logs (``--log-records``, 40,000 by default): the audit's
    position-log checks in plain SQL over the same records;
(b) the whole audit command as an operator runs it (``python spark/audit.py``,
    Spark start included), over a Parquet export and, with a JDBC jar, over
    JDBC.

Prints wall time, rows/s, the ratio to plain SQL against the 3x target, the
peak RSS of the audit's processes (Python driver and JVM together, sampled
from /proc), the audit's CPU seconds and the load average (the machine may be
shared: a loaded one inflates every figure).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from synapse_lite.storage.database import make_startup_connection  # noqa: E402
from synapse_lite.storage.engines import create_engine  # noqa: E402
from synapse_lite.storage.prepare_database import prepare_database  # noqa: E402

TARGET_RATIO = 3.0
DEFAULT_JAR = "/usr/share/java/postgresql.jar"
WRITERS = ("main", "worker1")
EVENT_INDEXES = ("events_stream_ordering", "events_event_id", "events_room_stream")

SQL_AGGREGATES = {
    "per-writer count and largest id": (
        "SELECT instance_name, COUNT(*), MAX(stream_ordering) FROM events"
        " WHERE stream_ordering > 0 GROUP BY instance_name"
    ),
    "duplicate ids": (
        "SELECT stream_id, COUNT(*) FROM (SELECT stream_ordering AS stream_id FROM events"
        " WHERE stream_ordering > 0 UNION ALL SELECT stream_id FROM current_state_delta_stream)"
        " AS ids GROUP BY stream_id HAVING COUNT(*) > 1"
    ),
    "gaps": (
        "SELECT COUNT(*), SUM(stream_ordering - previous - 1) FROM (SELECT stream_ordering,"
        " LAG(stream_ordering, 1, 0::bigint) OVER (ORDER BY stream_ordering) AS previous"
        " FROM events WHERE stream_ordering > 0) AS ordered WHERE stream_ordering - previous > 1"
    ),
    "positions against the sequence": (
        "SELECT p.instance_name, p.stream_id, s.last_value FROM stream_positions AS p,"
        " events_stream_seq AS s WHERE p.stream_name = 'events'"
    ),
}


#: The position-log checks in plain SQL over the same records, loaded into
#: ``log_finished`` (writer, id, ts, committed) and ``log_positions``
#: (writer, position, ts): what the audit's "checked the position logs" step does.
SQL_LOG_CHECKS = {
    # One sort: ids and positions by value, descending (a position before an
    # id of the same value); the running minimum of position times is the
    # earliest position covering each id.
    "positions before finish": (
        "SELECT COUNT(*) FROM (SELECT is_id, finish, MIN(position_ts) OVER (ORDER BY value"
        " DESC, is_id ROWS UNBOUNDED PRECEDING) AS first_ts FROM (SELECT id AS value,"
        " TRUE AS is_id, ts AS finish, NULL::BIGINT AS position_ts FROM log_finished"
        " UNION ALL SELECT position, FALSE, NULL, ts FROM log_positions WHERE writer = '*')"
        " AS merged) AS covered WHERE is_id AND first_ts < finish"
    ),
    "failed ids with rows": (
        "SELECT COUNT(*) FROM log_finished AS f JOIN events AS e ON e.stream_ordering = f.id"
        " WHERE NOT f.committed"
    ),
    "committed ids without rows": (
        "SELECT COUNT(*) FROM log_finished AS f WHERE f.committed AND NOT EXISTS"
        " (SELECT 1 FROM events AS e WHERE e.stream_ordering = f.id)"
    ),
    "positions beyond the sequence": (
        "SELECT COUNT(*) FROM log_positions AS p, events_stream_seq AS s"
        " WHERE p.position > s.last_value"
    ),
}


def write_logs(directory: str, rows: int, records: int, gaps: set[int]) -> list[tuple[Any, ...]]:
    """Position logs of the last ``records // 2`` ids, as two writers log them:
    each id's ``finished`` record (a gap's as failed), then the stream-wide
    position it completes. A clean run: every position follows the finishes
    it covers. Returns the records, for the plain SQL to load."""
    ids = range(max(1, rows - records // 2 + 1), rows + 1)
    files = {w: open(os.path.join(directory, f"positions-{w}.jsonl"), "w") for w in WRITERS}
    loaded = []
    try:
        for ts, stream_id in enumerate(ids, start=1_795_000_000_000):
            writer = WRITERS[stream_id % 2]
            committed = stream_id not in gaps
            for record in (
                {
                    "kind": "finished",
                    "ts": ts,
                    "process": writer,
                    "stream": "events",
                    "writer": writer,
                    "id": stream_id,
                    "committed": committed,
                },
                {
                    "kind": "position",
                    "ts": ts + 1,
                    "process": writer,
                    "stream": "events",
                    "writer": "*",
                    "position": stream_id,
                    "purpose": "sync",
                },
            ):
                files[writer].write(json.dumps(record) + "\n")
            loaded.append((writer, stream_id, ts, committed, ts + 1))
    finally:
        for f in files.values():
            f.close()
    return loaded


def time_sql_log_checks(args: dict[str, Any], loaded: list[tuple[Any, ...]]) -> float:
    """The log checks in plain SQL, warm; the records are loaded untimed."""
    import psycopg2

    conn = psycopg2.connect(**args)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS log_finished, log_positions")
        cur.execute("CREATE TABLE log_finished (writer TEXT, id BIGINT, ts BIGINT, committed BOOL)")
        cur.execute("CREATE TABLE log_positions (writer TEXT, position BIGINT, ts BIGINT)")
        cur.executemany("INSERT INTO log_finished VALUES (%s, %s, %s, %s)", [r[:4] for r in loaded])
        cur.executemany(
            "INSERT INTO log_positions VALUES ('*', %s, %s)", [(r[1], r[4]) for r in loaded]
        )
        cur.execute("CREATE INDEX ON log_positions (position)")
        cur.execute("ANALYZE log_finished")
        cur.execute("ANALYZE log_positions")
        total = 0.0
        for name, sql in SQL_LOG_CHECKS.items():
            start = time.monotonic()
            cur.execute(sql)
            cur.fetchall()
            seconds = time.monotonic() - start
            print(f"  plain SQL log check {name}: {seconds:.2f} s", flush=True)
            total += seconds
        cur.execute("DROP TABLE log_finished, log_positions")
    conn.close()
    return total


def admin_connection() -> Any:
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres")
    conn.autocommit = True
    return conn


def gap_ids(rows: int) -> list[int]:
    """The ids the seeded events table lacks (failed transactions)."""
    return [rows // 3, rows // 2, rows // 2 + 1, rows - 10]


def seed(dbname: str, rows: int) -> dict[str, Any]:
    """A fresh database with ``rows`` events rows by two writers, and gaps."""
    admin = admin_connection()
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
        cur.execute(f"CREATE DATABASE {dbname} TEMPLATE template0")
    admin.close()
    args = {"host": "127.0.0.1", "port": 5432, "user": "postgres", "dbname": dbname}
    engine = create_engine("postgres", args)
    conn = make_startup_connection(engine)
    prepare_database(conn, is_main=True)
    gaps = gap_ids(rows)
    with conn.transaction("bench_seed") as txn:
        for index in EVENT_INDEXES:
            txn.execute(f"DROP INDEX {index}")
        txn.execute(
            "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id, type,"
            " sender, origin_server_ts, content, instance_name)"
            " SELECT g, g, '$e' || g, '!room' || (g % 100), 'm.room.message', '@u:bench', 0, '{}',"
            " CASE WHEN g % 2 = 0 THEN 'main' ELSE 'worker1' END"
            " FROM generate_series(1, ?) AS g WHERE g NOT IN (?, ?, ?, ?)",
            (rows, *gaps),
        )
        txn.execute("CREATE UNIQUE INDEX events_stream_ordering ON events (stream_ordering)")
        txn.execute("CREATE UNIQUE INDEX events_event_id ON events (event_id)")
        txn.execute("CREATE INDEX events_room_stream ON events (room_id, stream_ordering)")
        # Rooms as lines, as delta 0080 migrates them: the audit's graph
        # checks then find nothing either.
        txn.execute(
            "INSERT INTO event_edges (event_id, prev_event_id) SELECT event_id, prev FROM"
            " (SELECT event_id, LAG(event_id) OVER (PARTITION BY room_id ORDER BY"
            " stream_ordering) AS prev FROM events) AS linear WHERE prev IS NOT NULL"
        )
        txn.execute(
            "INSERT INTO event_forward_extremities (room_id, event_id)"
            " SELECT DISTINCT ON (room_id) room_id, event_id FROM events"
            " ORDER BY room_id, stream_ordering DESC"
        )
        txn.execute("SELECT setval('events_stream_seq', ?)", (rows,))
        for writer in ("main", "worker1"):
            txn.execute(
                "INSERT INTO stream_positions (stream_name, instance_name, stream_id)"
                " VALUES ('events', ?, ?)",
                (writer, rows),
            )
    conn.conn.autocommit = True  # type: ignore[attr-defined]
    conn.conn.cursor().execute("VACUUM ANALYZE events")
    conn.close()
    return args


def time_sql(args: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """Each aggregate once, warm (the table was just vacuumed)."""
    import psycopg2

    conn = psycopg2.connect(**args)
    times = {}
    with conn.cursor() as cur:
        for name, sql in SQL_AGGREGATES.items():
            start = time.monotonic()
            cur.execute(sql)
            cur.fetchall()
            times[name] = time.monotonic() - start
    conn.close()
    return sum(times.values()), times


def write_config(directory: str, args: dict[str, Any]) -> str:
    import yaml

    config = {
        "server_name": "bench",
        "data_dir": directory,
        "database": {"engine": "postgres", "args": args},
        "worker_replication_secret": "bench",
        "listeners": [{"port": 18200, "resources": ["client", "replication"]}],
        "workers": {"worker1": {"listeners": [{"port": 18201, "resources": ["replication"]}]}},
        "stream_writers": {"events": ["main", "worker1"]},
    }
    path = os.path.join(directory, "homeserver.yaml")
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f)
    return path


def tree_usage(root: int) -> dict[int, tuple[int, float]]:
    """Per process of ``root``'s tree (the audit's Python driver and the JVM it
    starts), from /proc: RSS in bytes and CPU seconds used so far."""
    parents: dict[int, int] = {}
    usage: dict[int, tuple[int, float]] = {}
    ticks = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended meanwhile
        parents[int(entry)] = int(fields[1])
        cpu = (int(fields[11]) + int(fields[12])) / ticks
        usage[int(entry)] = (int(fields[21]) * resource.getpagesize(), cpu)
    tree = {root}
    grew = True
    while grew:
        found = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= found
        grew = bool(found)
    return {pid: usage[pid] for pid in tree if pid in usage}


def time_audit(
    config: str, extra: list[str]
) -> tuple[float, float, float, dict[str, Any], int, str]:
    """The audit command end to end; wall time, CPU seconds (its Python and
    JVM, not PostgreSQL's), peak RSS in MB of its Python and JVM together
    (both sampled every 0.2 s), report, exit code, progress."""
    report = config + ".report.json"
    command = [sys.executable, os.path.join(ROOT, "spark", "audit.py"), "-c", config]
    command += ["--json", report, *extra]
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0.0
    cpu_by_pid: dict[int, float] = {}
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.wait(0.2):
            usage = tree_usage(process.pid)
            peak = max(peak, sum(rss for rss, _ in usage.values()) / 2**20)
            cpu_by_pid.update((pid, cpu) for pid, (_, cpu) in usage.items())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = process.communicate()
    stop.set()
    sampler.join()
    done = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    elapsed, cpu = time.monotonic() - start, sum(cpu_by_pid.values())
    if done.returncode not in (0, 1):
        raise SystemExit(f"audit failed ({done.returncode}):\n{done.stderr}")
    with open(report, encoding="utf-8") as f:
        return elapsed, cpu, peak, json.load(f), done.returncode, done.stderr


def seeded(dbname: str, rows: int) -> dict[str, Any] | None:
    """The connection arguments of ``dbname`` if an earlier run seeded it with
    ``rows`` rows (a count of the table: not a proof that nobody changed it)."""
    import psycopg2

    args = {"host": "127.0.0.1", "port": 5432, "user": "postgres", "dbname": dbname}
    try:
        conn = psycopg2.connect(**args)
    except psycopg2.OperationalError:
        return None
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*), MAX(stream_ordering) FROM events")
            count, largest = cur.fetchone()
    except psycopg2.Error:
        return None
    finally:
        conn.close()
    return args if (count, largest) == (rows - 4, rows) else None


def bench(rows: int, jar: str | None, master: str, reuse: bool, log_records: int = 0) -> list[str]:
    lines = []
    print(f"== {rows:,} events rows", flush=True)
    start = time.monotonic()
    args = seeded("synapse_lite_bench_audit", rows) if reuse else None
    if args is None:
        args = seed("synapse_lite_bench_audit", rows)
        print(f"seeded in {time.monotonic() - start:.1f} s", flush=True)
    else:
        print("reusing the database seeded by an earlier run", flush=True)
    print(f"  load average {os.getloadavg()[0]:.1f} before plain SQL", flush=True)
    sql_total, sql_times = time_sql(args)
    for name, seconds in sql_times.items():
        print(f"  plain SQL {name}: {seconds:.2f} s", flush=True)
    rate = rows / sql_total
    lines.append(f"{rows:>12,}  plain SQL (PostgreSQL)   {sql_total:7.1f} s  {rate:>12,.0f} rows/s")
    routes: list[tuple[str, list[str]]] = [("parquet export", [])]
    if jar:
        routes.append(("JDBC", ["--jdbc-jar", jar]))
    with tempfile.TemporaryDirectory(prefix="synapse_lite_bench_audit_") as directory:
        config = write_config(directory, args)
        sql_logs = 0.0
        if log_records:
            loaded = write_logs(directory, rows, log_records, set(gap_ids(rows)))
            sql_logs = time_sql_log_checks(args, loaded)
            lines.append(
                f"{rows:>12,}  plain SQL log checks      {sql_logs:7.1f} s"
                f"  over {2 * len(loaded):,} log records"
            )
        for name, extra in routes:
            load = os.getloadavg()[0]
            elapsed, cpu, peak, report, code, progress = time_audit(
                config, ["--master", master, *extra]
            )
            print(progress, end="", flush=True)
            print(f"  audit CPU {cpu:.1f} s; load average {load:.1f} when it started", flush=True)
            gaps = [i for i in report["info"] if i["kind"] == "gap"]
            missing = sum(g["count"] for g in gaps)
            ratio = elapsed / sql_total
            verdict = "PASS" if ratio <= TARGET_RATIO else "FAIL"
            logs_step = [
                float(line.rsplit(" in ", 1)[1].split(" s")[0])
                for line in progress.splitlines()
                if line.startswith("audit: checked the position logs in ")
            ]
            if log_records and logs_step:
                log_ratio = logs_step[0] / max(sql_logs, 1e-3)
                lines.append(
                    f"{rows:>12,}  audit log checks, {name:<7} {logs_step[0]:7.1f} s"
                    f"  {log_ratio:5.1f}x SQL  "
                    + ("PASS" if log_ratio <= TARGET_RATIO else "FAIL")
                    + f" (target {TARGET_RATIO:.0f}x)"
                )
            lines.append(
                f"{rows:>12,}  audit, {name:<16} {elapsed:7.1f} s  {rows / elapsed:>12,.0f} rows/s"
                f"  {ratio:5.1f}x SQL  {verdict} (target {TARGET_RATIO:.0f}x)"
                f"  exit {code}, {len(report['findings'])} findings, {missing} gap ids,"
                f" peak RSS {peak:,.0f} MB"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, action="append", help="events rows (repeatable)")
    parser.add_argument("--jdbc-jar", default=os.environ.get("SYNAPSE_LITE_JDBC_JAR", DEFAULT_JAR))
    parser.add_argument("--master", default="local[*]")
    parser.add_argument(
        "--log-records",
        type=int,
        default=40_000,
        metavar="N",
        help="position-log records of a clean two-writer run over the last ids, checked by"
        " the audit and, for comparison, by plain SQL (default 40,000; 0: none)",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the database an earlier run seeded with as many rows (saves the seeding)",
    )
    options = parser.parse_args()
    jar = options.jdbc_jar if options.jdbc_jar and os.path.isfile(options.jdbc_jar) else None
    if jar is None:
        print("no JDBC jar (apt-get install libpostgresql-jdbc-java): Parquet route only")
    lines = []
    for rows in options.rows or [1_000_000]:
        lines += bench(rows, jar, options.master, options.reuse, options.log_records)
    print("\n".join(["", "rows          what                        wall      throughput", *lines]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
