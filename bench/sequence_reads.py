"""One sequence read, through a database thread and in the reactor:
``python -m bench.sequence_reads``.

The read that checks a writer's claimed position (``DatabasePool.
sequence_last_value``) ran as a one-statement interaction on the pool's
threads; on PostgreSQL it now runs on a connection the reactor drives
(``storage/reactor_reads.py``). Both ways are in the code, so one process
measures both, alternating in rounds on one PostgreSQL sequence, with a
pause of ``--gap-ms`` between reads as between events: the wall time of a
read (median, 90th percentile) and the process's CPU per read (the pause's
own cost is the same both ways; ``time.process_time``). Prints the figures
and the reactor's as a ratio of the thread's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

SEQUENCE = "bench_sequence_reads_seq"


async def measure(reactor: Any, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    from twisted.internet import task

    from synapse_lite.storage.database import DatabasePool, LoggingTransaction
    from synapse_lite.storage.engines import create_engine

    engine = create_engine(
        "postgres", {"host": args.host, "port": args.port, "user": args.user, "dbname": args.db}
    )
    db = DatabasePool(reactor, engine, max_connections=5)
    try:

        def create(txn: LoggingTransaction) -> None:
            txn.execute(f"CREATE SEQUENCE IF NOT EXISTS {SEQUENCE}")
            txn.execute(f"SELECT nextval('{SEQUENCE}')")

        await db.runInteraction("create", create)

        def read_in_thread(txn: LoggingTransaction) -> int:
            return engine.sequence_last_value(txn.raw_cursor, SEQUENCE)

        async def thread() -> None:
            await db.runInteraction("read", read_in_thread, read_only=True, db_autocommit=True)

        async def in_reactor() -> None:
            await db.sequence_last_value("read", SEQUENCE)

        ways = {"database thread": thread, "reactor": in_reactor}
        walls: dict[str, list[float]] = {name: [] for name in ways}
        cpu: dict[str, float] = dict.fromkeys(ways, 0.0)
        for way in ways.values():  # warm both
            for _ in range(50):
                await way()
        for _ in range(args.rounds):
            for name, way in ways.items():
                cpu_start = time.process_time()
                for _ in range(args.reads):
                    start = time.perf_counter()
                    await way()
                    walls[name].append(time.perf_counter() - start)
                    await task.deferLater(reactor, args.gap_ms / 1000, lambda: None)
                cpu[name] += time.process_time() - cpu_start
        reads = args.rounds * args.reads
        results = {}
        for name in ways:
            ordered = sorted(walls[name])
            results[name] = {
                "p50_us": statistics.median(ordered) * 1e6,
                "p90_us": ordered[int(len(ordered) * 0.9)] * 1e6,
                "cpu_us": cpu[name] / reads * 1e6,
            }
        return results
    finally:
        db.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5432)
    parser.add_argument("--user", default="postgres")
    parser.add_argument("--db", default="postgres")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--reads", type=int, default=300, help="reads per way and round")
    parser.add_argument("--gap-ms", type=float, default=2.0)
    args = parser.parse_args(argv)

    from twisted.internet import defer
    from twisted.internet import reactor as _reactor

    reactor: Any = _reactor
    outcome: dict[str, Any] = {}

    async def run() -> None:
        try:
            outcome["results"] = await measure(reactor, args)
        except Exception as e:
            outcome["error"] = e
        finally:
            reactor.stop()

    reactor.callWhenRunning(lambda: defer.ensureDeferred(run()))
    reactor.run()
    if "error" in outcome:
        raise outcome["error"]
    results = outcome["results"]
    print(
        f"{args.rounds} rounds x {args.reads} reads a way, {args.gap_ms:g} ms apart, one process,"
        f" PostgreSQL {args.host}:{args.port}"
    )
    print(f"  {'read':<18}{'p50 us':>9}{'p90 us':>9}{'CPU us/read':>13}")
    for name, figures in results.items():
        print(
            f"  {name:<18}{figures['p50_us']:>9.0f}{figures['p90_us']:>9.0f}"
            f"{figures['cpu_us']:>13.0f}"
        )
    thread, reactor_way = results["database thread"], results["reactor"]
    print(
        f"  reactor / thread: wall p50 {reactor_way['p50_us'] / thread['p50_us']:.2f},"
        f" CPU {reactor_way['cpu_us'] / thread['cpu_us']:.2f}"
    )


if __name__ == "__main__":
    main()
