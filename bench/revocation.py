"""Cost of a revocation that holds everywhere (issue 34), per logout.

A logout now answers only once every process has applied its caches
invalidation (``handlers/revocation.py``). This starts the same four-process
layout (main, a /sync worker, an events writer, a writer of the other
streams; every one serving clients) twice in one run: once from this
checkout and once from a baseline commit (``git archive`` into a temporary
directory, run with its own code), on a fresh SQLite database each, TCP
replication. For each, it times ``--logouts`` logouts, each of a fresh
device whose token every process has just used, sent through the /sync
worker (forwarded to the main process, the user's device_lists writer), and
counts the processes still accepting the token right after the answer.

Prints the median and p90 ms per logout of each tree and the ratio of this
checkout to the baseline. Figures only; nothing is asserted.

    python bench/revocation.py [--logouts 60] [--baseline 44cc180]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a script: make the checkout importable
    sys.path.insert(0, ROOT)

from twisted.internet import defer, task  # noqa: E402

from bench.soak import Cleanups  # noqa: E402
from tests.harness import processes  # noqa: E402
from tests.harness.client_api import ClientApi  # noqa: E402
from tests.harness.databases import create_test_database  # noqa: E402

RESOURCES = ["client", "replication", "health", "metrics"]
WORKERS = {"sync1": RESOURCES, "persister1": RESOURCES, "writer1": RESOURCES}
WRITERS = {
    "events": ["persister1"],
    "to_device": "writer1",
    "typing": "writer1",
    "account_data": "writer1",
    "receipts": "writer1",
    "presence": "writer1",
}
PASSWORD = "bench-pw"


def extract(commit: str) -> str:
    """The tree of ``commit`` in a new temporary directory."""
    where = tempfile.mkdtemp(prefix="synapse_lite_baseline_")
    archive = subprocess.run(
        ["git", "archive", commit, "synapse_lite"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", where], input=archive, check=True)
    return where


async def measure(source_root: str, logouts: int) -> tuple[list[float], int]:
    """ms per logout, and how many times a process accepted a logged-out token."""
    cleanups = Cleanups()
    processes.SOURCE_ROOT = source_root
    try:
        test_db = create_test_database("sqlite")
        cleanups.addCleanup(test_db.drop)
        config = processes.layout_config(test_db, WORKERS, WRITERS, transport="tcp")
        servers = processes.ServerProcesses(cleanups, config)
        await servers.start()
        names = list(servers.processes)
        main = ClientApi(None, servers.url("main"))  # type: ignore[arg-type]
        await main.register("alice", PASSWORD)
        login = {
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": "alice"},
            "password": PASSWORD,
        }
        times: list[float] = []
        accepted = 0
        for _ in range(logouts):
            token = (await main.as_user(None).ok("POST", "/login", login))["access_token"]

            async def whoami(name: str, token: str = token) -> int:
                client = ClientApi(None, servers.url(name)).as_user(token)  # type: ignore[arg-type]
                code, _ = await client.request("GET", "/account/whoami")
                return code

            await defer.gatherResults([defer.ensureDeferred(whoami(n)) for n in names])
            via = ClientApi(None, servers.url("sync1")).as_user(token)  # type: ignore[arg-type]
            started = time.perf_counter()
            await via.ok("POST", "/logout", {})
            times.append((time.perf_counter() - started) * 1000)
            codes = await defer.gatherResults([defer.ensureDeferred(whoami(n)) for n in names])
            accepted += sum(1 for code in codes if code == 200)
        return times, accepted
    finally:
        await cleanups.run()
        processes.SOURCE_ROOT = ROOT


def summary(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.9) - 1]


async def run(args: argparse.Namespace) -> None:
    baseline_root = extract(args.baseline)
    results: dict[str, Any] = {}
    try:
        # Alternate, so that a change in the machine's load falls on both.
        for label, root in [("baseline", baseline_root), ("this", ROOT)] * 2:
            times, accepted = await measure(root, args.logouts // 2)
            before_times, before_accepted = results.get(label, ([], 0))
            results[label] = (before_times + times, before_accepted + accepted)
    finally:
        shutil.rmtree(baseline_root, ignore_errors=True)
    for label in ("baseline", "this"):
        times, accepted = results[label]
        median, p90 = summary(times)
        print(
            f"{label:8} ({args.baseline if label == 'baseline' else 'checkout'}):"
            f" {len(times)} logouts, median {median:.1f} ms, p90 {p90:.1f} ms;"
            f" revoked token accepted {accepted} times by a process after the answer"
        )
    ratio = summary(results["this"][0])[0] / summary(results["baseline"][0])[0]
    print(f"ratio this / baseline, median ms per logout: {ratio:.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logouts", type=int, default=60)
    parser.add_argument("--baseline", default="44cc180")
    args = parser.parse_args(argv)
    task.react(lambda reactor: defer.ensureDeferred(run(args)))


if __name__ == "__main__":
    main()
