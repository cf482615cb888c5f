"""Benchmark of MultiWriterIdGenerator: startup cost and write throughput.

Run from the checkout root::

    python bench/id_generators.py [--engine sqlite|postgres|both] [--rows 1000000]

For each engine, on a throwaway database (``tests.harness.databases``; the
PostgreSQL server is the one the tests use, see ``SYNAPSE_LITE_TEST_PG_*``):

a. **Startup**: the time a process takes to open its startup connection and
   build the generators of every stream in ``schema/full.sql``, with an empty
   ``events`` table and again with ``--rows`` events, and the ratio (target:
   at most 1.5, since startup must not read the tables).
b. **Writes**: sequential single-writer loops of ``--writes`` one-row writes:
   a raw loop with the plain driver (INSERT + COMMIT, id from a Python
   counter), the same insert through ``DatabasePool.runInteraction`` (the
   pool's own cost, no generator), ``get_next`` with the insert in its own
   transaction, and ``get_next_txn`` inside the insert's transaction; the
   ratio of each to the raw loop (target: at least 0.6) and how many
   ``stream_positions`` upserts the generator made per 1000 writes.

Figures only: nothing here asserts on time. See ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a script: make the checkout importable
    sys.path.insert(0, ROOT)

from twisted.internet import defer, task  # noqa: E402
from twisted.internet.interfaces import IReactorCore  # noqa: E402

from synapse_lite.replication.notifier import ReplicationNotifier  # noqa: E402
from synapse_lite.storage.database import (  # noqa: E402
    DatabasePool,
    LoggingTransaction,
    make_startup_connection,
)
from synapse_lite.storage.engines import BaseDatabaseEngine  # noqa: E402
from synapse_lite.storage.id_generators import MultiWriterIdGenerator  # noqa: E402
from synapse_lite.storage.prepare_database import prepare_database  # noqa: E402
from synapse_lite.streams.definition import IdSpace, StreamTable  # noqa: E402
from tests.harness.databases import TestDatabase, create_test_database  # noqa: E402

INSTANCE = "writer1"
WRITERS = ["writer1", "writer2"]
STARTUP_RUNS = 9
REPETITIONS = 3
STARTUP_TARGET = 1.5
WRITE_TARGET = 0.6


def _ids(sequence: str, *tables: tuple[str, str], positive: bool = True) -> IdSpace:
    """An id space over ``(table, id_column)`` pairs (instance column ``instance_name``)."""
    return IdSpace(sequence, tuple(StreamTable(t, id_column=c) for t, c in tables), positive)


#: Every stream of schema/full.sql: name -> generator arguments.
STREAMS: dict[str, dict[str, Any]] = {
    "events": {
        "ids": _ids(
            "events_stream_seq",
            ("events", "stream_ordering"),
            ("current_state_delta_stream", "stream_id"),
        ),
    },
    "backfill": {
        "ids": _ids("events_backfill_stream_seq", ("events", "stream_ordering"), positive=False),
    },
    "caches": {
        "ids": _ids(
            "cache_invalidation_stream_seq", ("cache_invalidation_stream_by_instance", "stream_id")
        ),
        "writers": [],
    },
    "receipts": {"ids": _ids("receipts_sequence", ("receipts_linearized", "stream_id"))},
    "account_data": {
        "ids": _ids(
            "account_data_sequence",
            ("account_data", "stream_id"),
            ("room_account_data", "stream_id"),
            ("room_tags_revisions", "stream_id"),
        ),
    },
    "to_device": {
        "ids": _ids(
            "device_inbox_sequence",
            ("device_inbox", "stream_id"),
            ("device_federation_outbox", "stream_id"),
        ),
    },
    "presence": {"ids": _ids("presence_stream_sequence", ("presence_stream", "stream_id"))},
    "device_lists": {"ids": _ids("device_lists_sequence", ("device_lists_stream", "stream_id"))},
}


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# a. Startup


def build_all_generators(engine: BaseDatabaseEngine, db: DatabasePool) -> tuple[float, int]:
    """Build every stream's generator as a starting process does; return the
    seconds taken and the rows read after the stored positions."""
    start = time.perf_counter()
    conn = make_startup_connection(engine)
    try:
        gens = [
            MultiWriterIdGenerator(
                db_conn=conn,
                db=db,
                notifier=ReplicationNotifier(),
                stream_name=name,
                instance_name=INSTANCE,
                **{"writers": WRITERS, **spec},
            )
            for name, spec in STREAMS.items()
        ]
    finally:
        conn.close()
    return time.perf_counter() - start, sum(g.startup_rows_read for g in gens)


def compare_startup(empty: DatabasePool, full: DatabasePool) -> tuple[float, float, int]:
    """Median startup seconds on the empty and the full database, and the rows
    the full one read. Runs alternate, so a change of machine load during the
    benchmark hits both alike."""
    seconds: dict[str, list[float]] = {"empty": [], "full": []}
    rows_read = 0
    for run in range(STARTUP_RUNS + 1):
        for name, db in (("empty", empty), ("full", full)):
            elapsed, rows_read = build_all_generators(db.engine, db)
            if run:  # the first run only warms the server's and the OS's caches
                seconds[name].append(elapsed)
    return statistics.median(seconds["empty"]), statistics.median(seconds["full"]), rows_read


def fill_events(engine: BaseDatabaseEngine, rows: int) -> None:
    """``rows`` events from two writers, the sequence past them, and stored
    positions a little behind the top, as a running server leaves them."""
    conn = make_startup_connection(engine)
    try:
        with conn.transaction("fill_events") as txn:
            columns = (
                "stream_ordering, topological_ordering, event_id, room_id, type, sender,"
                " origin_server_ts, content, instance_name"
            )
            values = (
                "i, i, '$ev' || i, '!room' || (i / 50) || ':bench', 'm.room.message',"
                " '@user:bench', 1700000000000 + i, '{}',"
                f" CASE WHEN (i / 2) * 2 = i THEN '{WRITERS[0]}' ELSE '{WRITERS[1]}' END"
            )
            cur = txn.raw_cursor
            if engine.name == "postgres":
                cur.execute(
                    f"INSERT INTO events ({columns}) SELECT {values}"
                    f" FROM generate_series(1, {rows}) AS i"
                )
            else:
                cur.execute(
                    f"WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq"
                    f" WHERE i < {rows}) INSERT INTO events ({columns}) SELECT {values} FROM seq"
                )
            engine.sequence_set_at_least(cur, "events_stream_seq", rows)
            for writer, lag in ((WRITERS[0], 2), (WRITERS[1], 7)):
                txn.execute(
                    "INSERT INTO stream_positions (stream_name, instance_name, stream_id)"
                    " VALUES ('events', ?, ?)",
                    (writer, rows - lag),
                )
    finally:
        conn.close()


def analyze(engine: BaseDatabaseEngine) -> None:
    """Gather planner statistics, as autovacuum (PostgreSQL) or a server's
    maintenance would have: a bulk load nobody analyzed yet is not typical."""
    conn = make_startup_connection(engine)
    try:
        with conn.transaction("analyze") as txn:
            txn.execute("ANALYZE")
    finally:
        conn.close()


# b. Writes


def create_bench_tables(engine: BaseDatabaseEngine) -> None:
    conn = make_startup_connection(engine)
    try:
        with conn.transaction("bench_tables") as txn:
            for table in ("bench_stream", "bench_raw"):
                txn.execute(
                    f"CREATE TABLE {table} (stream_id BIGINT NOT NULL,"
                    " instance_name TEXT NOT NULL, data TEXT NOT NULL)"
                )
                txn.execute(f"CREATE UNIQUE INDEX {table}_id ON {table} (stream_id)")
            for statement in engine.create_sequence_sql("bench_seq"):
                txn.execute(statement)
    finally:
        conn.close()


def _insert_txn(txn: LoggingTransaction, stream_id: int) -> None:
    txn.execute(
        "INSERT INTO bench_stream (stream_id, instance_name, data) VALUES (?, ?, 'payload')",
        (stream_id, INSTANCE),
    )


class RawLoop:
    """INSERT + COMMIT per row with the plain driver, ids from a counter."""

    def __init__(self, test_db: TestDatabase) -> None:
        self._next_id = 1
        self.conn: Any
        if test_db.engine_name == "sqlite":
            # As the engine configures its connections: WAL, synchronous=NORMAL.
            self.conn = sqlite3.connect(test_db.args["path"], isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.run = self._run_sqlite
        else:
            import psycopg2

            self.conn = psycopg2.connect(**test_db.args)
            self.run = self._run_postgres

    def _run_sqlite(self, writes: int) -> float:
        cur = self.conn.cursor()
        start = time.perf_counter()
        for _ in range(writes):
            cur.execute("BEGIN IMMEDIATE")
            cur.execute(
                "INSERT INTO bench_raw (stream_id, instance_name, data) VALUES (?, ?, 'payload')",
                (self._next_id, INSTANCE),
            )
            cur.execute("COMMIT")
            self._next_id += 1
        return time.perf_counter() - start

    def _run_postgres(self, writes: int) -> float:
        cur = self.conn.cursor()
        start = time.perf_counter()
        for _ in range(writes):
            cur.execute(
                "INSERT INTO bench_raw (stream_id, instance_name, data) VALUES (%s, %s, 'payload')",
                (self._next_id, INSTANCE),
            )
            self.conn.commit()
            self._next_id += 1
        return time.perf_counter() - start

    def close(self) -> None:
        self.conn.close()


class GeneratorLoop:
    """Sequential writes through a single-writer generator, counting its
    ``stream_positions`` upserts."""

    def __init__(self, engine: BaseDatabaseEngine, db: DatabasePool) -> None:
        self._db = db
        conn = make_startup_connection(engine)
        try:
            self.id_gen = MultiWriterIdGenerator(
                db_conn=conn,
                db=db,
                notifier=ReplicationNotifier(),
                stream_name="bench",
                instance_name=INSTANCE,
                ids=_ids("bench_seq", ("bench_stream", "stream_id")),
                writers=[INSTANCE],
            )
        finally:
            conn.close()
        self.upserts = 0
        self._pool_id = 0
        upsert = self.id_gen._upsert_position_txn

        def counting_upsert(txn: LoggingTransaction, position: int) -> None:
            self.upserts += 1
            upsert(txn, position)

        # _write_position looks the method up on the instance at each write.
        self.id_gen._upsert_position_txn = counting_upsert  # type: ignore[method-assign]

    async def run_pool_only(self, writes: int) -> float:
        """The same writes through the pool, ids from a counter: what the pool
        costs without the generator."""
        start = time.perf_counter()
        for _ in range(writes):
            self._pool_id -= 1  # negative: clear of the generator's ids
            await self._db.runInteraction("bench_write", _insert_txn, self._pool_id)
        return time.perf_counter() - start

    def _write_in_txn(self, txn: LoggingTransaction) -> None:
        _insert_txn(txn, self.id_gen.get_next_txn(txn))

    async def run(self, writes: int, in_txn: bool) -> tuple[float, int]:
        """Seconds for ``writes`` writes, and the upserts they caused."""
        await self.id_gen.flush_stream_positions()
        upserts_before = self.upserts
        start = time.perf_counter()
        for _ in range(writes):
            if in_txn:
                await self._db.runInteraction("bench_write", self._write_in_txn)
            else:
                async with self.id_gen.get_next() as stream_id:
                    await self._db.runInteraction("bench_write", _insert_txn, stream_id)
        elapsed = time.perf_counter() - start
        # The last writes' upsert belongs to this loop too.
        await self.id_gen.flush_stream_positions()
        return elapsed, self.upserts - upserts_before


async def bench_writes(test_db: TestDatabase, db: DatabasePool, writes: int) -> list[str]:
    engine = db.engine
    create_bench_tables(engine)
    raw = RawLoop(test_db)
    gen = GeneratorLoop(engine, db)
    try:
        # Warm up connections, caches and the pool's threads.
        raw.run(200)
        await gen.run_pool_only(200)
        await gen.run(200, in_txn=False)
        await gen.run(200, in_txn=True)
        seconds: dict[str, list[float]] = {
            "raw": [],
            "pool": [],
            "get_next": [],
            "get_next_txn": [],
        }
        upserts = {"get_next": 0, "get_next_txn": 0}
        # The writes of each loop are split into interleaved runs, so that a
        # change of machine load hits every loop alike.
        per_run = writes // REPETITIONS
        for _ in range(REPETITIONS):
            seconds["raw"].append(raw.run(per_run))
            seconds["pool"].append(await gen.run_pool_only(per_run))
            for variant in ("get_next", "get_next_txn"):
                elapsed, count = await gen.run(per_run, in_txn=variant == "get_next_txn")
                seconds[variant].append(elapsed)
                upserts[variant] += count
    finally:
        raw.close()
    rate = {name: per_run / statistics.median(runs) for name, runs in seconds.items()}
    lines = [
        f"writes: {writes} sequential one-row writes per loop, in {REPETITIONS} interleaved"
        " runs (median); ratios to the raw loop",
        f"  raw driver loop (INSERT+COMMIT)  {rate['raw']:8.0f} writes/s",
        f"  pool only (runInteraction)       {rate['pool']:8.0f} writes/s"
        f"  ratio {rate['pool'] / rate['raw']:.2f}  (no id generator: the pool's own cost)",
    ]
    labels = {
        "get_next": "get_next, then insert txn  ",
        "get_next_txn": "get_next_txn in insert txn ",
    }
    for variant, label in labels.items():
        ratio = rate[variant] / rate["raw"]
        per_1000 = 1000 * upserts[variant] / (per_run * REPETITIONS)
        lines.append(
            f"  {label}      {rate[variant]:8.0f} writes/s  ratio {ratio:.2f}"
            f" (target >= {WRITE_TARGET}: {verdict(ratio >= WRITE_TARGET)});"
            f" stream_positions upserts per 1000 writes: {per_1000:.1f}"
        )
    return lines


# Driver


async def bench_engine(
    reactor: IReactorCore, engine_name: str, rows: int, writes: int, max_connections: int
) -> None:
    print(f"== {engine_name} ==", flush=True)
    # Two databases with the full schema: one stays empty, one gets the events.
    test_dbs = [create_test_database(engine_name) for _ in range(2)]
    pools = [
        DatabasePool(reactor, t.make_engine(), name="bench", max_connections=max_connections)
        for t in test_dbs
    ]
    try:
        for db in pools:
            conn = make_startup_connection(db.engine)
            try:
                prepare_database(conn, is_main=True)
            finally:
                conn.close()
        fill_start = time.perf_counter()
        fill_events(pools[1].engine, rows)
        fill_seconds = time.perf_counter() - fill_start
        for db in pools:
            analyze(db.engine)

        empty, full, rows_read = compare_startup(pools[0], pools[1])
        ratio = full / empty
        print(
            f"startup: {len(STREAMS)} generators, median of {STARTUP_RUNS} runs\n"
            f"  empty events table             {empty * 1000:8.1f} ms\n"
            f"  {rows:>9,} events ({fill_seconds:.0f} s to load)"
            f" {full * 1000:6.1f} ms  ({rows_read} rows read after stored positions)\n"
            f"  ratio {ratio:.2f} (target <= {STARTUP_TARGET}: {verdict(ratio <= STARTUP_TARGET)})",
            flush=True,
        )
        for line in await bench_writes(test_dbs[0], pools[0], writes):
            print(line, flush=True)
    finally:
        for db in pools:
            db.close()
        for test_db in test_dbs:
            test_db.drop()


async def run(reactor: IReactorCore, args: argparse.Namespace) -> None:
    engines = ["sqlite", "postgres"] if args.engine == "both" else [args.engine]
    for engine_name in engines:
        await bench_engine(reactor, engine_name, args.rows, args.writes, args.max_connections)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--engine", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--rows", type=int, default=1_000_000, help="events for the startup run")
    parser.add_argument("--writes", type=int, default=3000, help="writes per loop")
    parser.add_argument(
        "--max-connections",
        type=int,
        default=5,
        help="threads (connections) of the pool, 5 by default as in DatabasePool",
    )
    args = parser.parse_args(argv)

    def start(reactor: IReactorCore) -> defer.Deferred[None]:
        return defer.ensureDeferred(run(reactor, args))

    task.react(start)


if __name__ == "__main__":
    main()
