"""Where one send's time goes on the monolith: ``python -m bench.send_profile``.

    python -m bench.send_profile [--engine sqlite|postgres] [--messages 3000]
                                 [--baseline DIR]... [--rate 250]
                                 [--sync-mode poll|paced|none] [--keep DIR]

Runs ``bench.client``'s throughput workload (8 senders, 4 users long-polling
/sync, 4 rooms split evenly) against the monolith of this checkout and of
each ``--baseline`` checkout in turn, with ``py-spy record --gil`` sampling
the main process (only the thread holding the GIL: the process's Python
time, whichever thread spends it; needs ``pip install py-spy``). Prints,
per tree, the microseconds of GIL time per message sent in each stage of
the send path (a stage's samples are those whose stack shows its frame,
so they include the stages under it; a coroutine resumed by a database
callback shows only its own frame and below, so the outer rows undercount,
and the transaction runs on a database thread, under no handler), the /sync
requests the same messages cost, and the process's CPU seconds. Samples
are of the whole run (set-up and the wake-up rounds too), so compare trees
measured alike, not absolute figures. Prints figures only; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from bench.client import monolith_column, monolith_throughput_options, run_layout
from bench.cluster import started_monolith
from bench.scenarios import SYNC_MODES

#: (label, a frame name the stage's samples contain), in the send's order.
STAGES = (
    ("send request (all of it)", "register_servlets.<locals>.send "),
    ("  size check", "check_events"),
    ("  on the writer: persist_as_writer", "persist_as_writer"),
    ("    auth state read", "_load_auth_state"),
    ("    place in graph (auth selection, event id hash)", "place_in_graph"),
    ("      event id (content hash, reference hash)", "EventSpec.to_persist"),
    ("      auth event selection", "select_auth_event_ids"),
    ("    core authorisation", "_authorise_with_core"),
    ("    push actions", "PushActionsHandler.actions_for"),
    ("    persist, reactor side (dispatch, callbacks)", "EventsStore.persist_events"),
    ("    persist transaction (database thread)", "_persist_events_txn"),
    ("        edges, auth edges, extremities", "_insert_graph_txn"),
    ("        state groups", "_state_groups_txn"),
    ("        auth chain index", "_index_auth_chains_txn"),
    ("        events row, room row", "_insert_events_txn"),
    ("        search index", "index_events_txn"),
    ("        transaction id", "_record_txn_id_txn"),
    ("        stream id", "get_next_mult_txn"),
    ("      SQLite commit", "Sqlite3Engine.commit"),
    ("      PostgreSQL commit", "PostgresEngine.commit"),
    ("  wake /sync (notifier)", "Notifier.notify"),
    ("outbound federation feed", "RoomEventsFeed"),
    ("/sync requests (all of them)", "register_servlets.<locals>.sync "),
)


def stage_samples(path: str) -> tuple[int, collections.Counter[str]]:
    """All samples of a py-spy raw (collapsed) file, and each stage's."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            if not stack:
                continue
            total += int(n)
            for label, frame in STAGES:
                if frame in stack:
                    counts[label] += int(n)
    return total, counts


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def profile(source: str | None, args: argparse.Namespace, out: str) -> dict[str, float]:
    """Run the workload on one tree's monolith under py-spy; its figures."""
    with started_monolith(args.engine, source) as cluster:
        pid = cluster.processes["main"].pid
        spy = subprocess.Popen(
            [args.py_spy, "record", "--pid", str(pid), "--rate", str(args.rate),
             "--native" if args.native else "--gil",
             "--nonblocking", "--format", "raw", "--output", out],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1)  # py-spy attaches
        results = asyncio.run(run_layout(cluster, args))[monolith_column(args.sync_mode)]
        cpu = cpu_seconds(pid)
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
    return {"sent": results["sent"], "syncs": results["syncs"], "cpu": cpu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.send_profile", description=__doc__)
    parser.add_argument("--engine", choices=("postgres", "sqlite"), default="sqlite")
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--baseline", metavar="DIR", action="append", default=[])
    parser.add_argument(
        "--sync-mode",
        choices=SYNC_MODES,
        default="poll",
        help="how the users read /sync while sending (bench.client's --sync-modes): none"
        " profiles the sends alone",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="sample every running thread with its C frames (py-spy --native) instead of the"
        " GIL holder: shows the database engine's own work (SQLite runs without the GIL)",
    )
    parser.add_argument(
        "--keep", metavar="DIR", help="keep each tree's py-spy samples in DIR (NAME.txt)"
    )
    args = parser.parse_args(argv)
    args.py_spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(args.py_spy):
        raise SystemExit("needs py-spy: pip install py-spy")
    monolith_throughput_options(args, args.sync_mode)
    tmp = args.keep or tempfile.mkdtemp(prefix="send_profile_")
    os.makedirs(tmp, exist_ok=True)
    trees: list[tuple[str, str | None]] = [("this", None)]
    trees += [(os.path.basename(os.path.abspath(b)), os.path.abspath(b)) for b in args.baseline]
    figures, stages = {}, {}
    for name, source in trees:
        out = os.path.join(tmp, f"{name}.txt")
        figures[name] = profile(source, args, out)
        stages[name] = stage_samples(out)
    per_send = 1e6 / args.rate / args.messages
    print(f"{args.engine}, {args.messages} messages; µs of GIL time per message sent")
    print(f"{'stage':56s}" + "".join(f"{n[:12]:>13s}" for n, _ in trees))
    for label, _ in STAGES:
        row = "".join(f"{stages[n][1][label] * per_send:13.0f}" for n, _ in trees)
        print(f"{label:56s}{row}")
    print(f"{'all samples':56s}" + "".join(f"{stages[n][0] * per_send:13.0f}" for n, _ in trees))
    for key in ("sent", "syncs", "cpu"):
        print(f"{key:56s}" + "".join(f"{figures[n][key]:13.1f}" for n, _ in trees))
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
