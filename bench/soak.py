"""The fault soak: ``python -m bench.soak``.

Starts the split layout (main, a /sync worker, two event persisters, a typing
writer) for each config, puts it under steady client load (4 users, 4
senders, /sync readers on the worker and the main process), and injects one
fault at a time: SIGKILL of an event persister, of the /sync worker and of the
typing writer (each restarted after 1 s), a dropped TCP replication connection
(sqlite-tcp), a Redis restart and a PostgreSQL restart (postgres-redis, on
private servers), and an event persister SIGSTOPped past the replication ping
timeout. Prints one row per fault; see bench/README.md for the columns.

The load, the check, the faults and the runs are ``tests/harness/load.py``,
``delivery.py``, ``faults.py`` and ``fault_runs.py``, which the e2e fault tests
use too. Exits 1 if any fault lost, duplicated or reordered a
message or left a client unrecovered.
"""

from __future__ import annotations

import argparse
import inspect
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

from twisted.internet import defer, task
from twisted.trial.unittest import SkipTest

SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if SOURCE_ROOT not in sys.path:
    sys.path.insert(0, SOURCE_ROOT)

from tests.harness.fault_runs import (  # noqa: E402
    CONFIGS,
    FAULTS,
    FaultCluster,
    FaultResult,
    markdown_table,
    run_fault,
)


class Cleanups:
    """``addCleanup`` for a benchmark: the callables run last-first in :meth:`run`."""

    def __init__(self) -> None:
        self._calls: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []

    def addCleanup(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._calls.append((f, args, kwargs))

    async def run(self) -> None:
        while self._calls:
            f, args, kwargs = self._calls.pop()
            try:
                result = f(*args, **kwargs)
                if inspect.isawaitable(result):
                    await result
            except Exception as e:  # one failed cleanup must not leak the rest
                print(f"cleanup {f!r} failed: {e}", file=sys.stderr)


async def soak_config(
    config: str, args: argparse.Namespace, skipped: list[str]
) -> list[FaultResult]:
    cleanups = Cleanups()
    results = []
    try:
        cluster = FaultCluster(cleanups, config, private_postgres=True)
        started = time.monotonic()
        await cluster.start(users=args.users, rooms=args.rooms)
        print(f"{config}: started in {time.monotonic() - started:.1f} s ({cluster.servers.dir})")
        for n, fault in enumerate(FAULTS):
            if config not in fault.configs or (args.faults and fault.name not in args.faults):
                continue
            try:
                result = await run_fault(
                    cluster, fault, f"f{n}", before=args.before, after=args.after,
                    deliver_timeout=args.deliver_timeout,
                )  # fmt: skip
            except SkipTest as e:
                print(f"| {config} | {fault.name} | skipped: {e} |", flush=True)
                skipped.append(f"{config} {fault.name}: {e}")
                continue
            results.append(result)
            print(markdown_table([result]).splitlines()[-1], flush=True)
            for problem in result.report.problems[:10]:
                print(f"    {problem}")
    finally:
        await cleanups.run()
    return results


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"{os.cpu_count()} cores, load average {one:.1f} (1 min) / {five:.1f} (5 min)"


async def soak(args: argparse.Namespace) -> int:
    results: list[FaultResult] = []
    skipped: list[str] = []
    for config in args.config:
        results += await soak_config(config, args, skipped)
    print()
    print(
        f"## Fault soak, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}:"
        f" {load_note()}; {args.users} users, 4 senders, {args.rooms}+ rooms;"
        f" {args.before:.0f} s load before each fault, {args.after:.0f} s after"
        f" ({platform.python_implementation()} {platform.python_version()})"
    )
    print()
    print(markdown_table(results))
    for reason in skipped:
        print(f"skipped: {reason}")
    failed = [
        r for r in results if not (r.report.ok and r.delivered and r.recovered_after is not None)
    ]
    print()
    print("overall: " + ("FAIL: " + ", ".join(r.fault for r in failed) if failed else "PASS"))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument(
        "--config", action="append", choices=CONFIGS, help="repeatable; default: both"
    )
    parser.add_argument(
        "--fault", dest="faults", action="append", choices=[f.name for f in FAULTS],
        help="repeatable; default: every fault of the config",
    )  # fmt: skip
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--rooms", type=int, default=2)
    parser.add_argument("--before", type=float, default=5.0, help="seconds of load before")
    parser.add_argument("--after", type=float, default=10.0, help="seconds of load after")
    parser.add_argument("--deliver-timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    args.config = args.config or list(CONFIGS)

    async def run() -> None:
        # react() exits the process; a SystemExit's code becomes the exit code.
        raise SystemExit(await soak(args))

    task.react(lambda reactor: defer.ensureDeferred(run()))
    return 0  # not reached: react() exits


if __name__ == "__main__":
    sys.exit(main())
