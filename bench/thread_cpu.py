"""Which of the monolith's threads spends the CPU: ``python -m bench.thread_cpu``.

    python -m bench.thread_cpu [--engine sqlite|postgres] [--messages 1000]
                               [--sync-mode poll|paced|none] [--baseline DIR]...

Runs ``bench.client``'s throughput workload (8 senders, 4 users, 4 rooms
split evenly) against the monolith of this checkout and of each
``--baseline`` checkout in turn, and reads each thread's user and system
CPU from ``/proc/PID/task/*/stat`` just before and just after it: the
reactor thread (the process's first) apart from the others (the database
threads, Twisted's thread pool). Sampling profilers with ``--gil`` see only
the thread holding Python's lock; this sees what each thread costs,
hand-offs between them included. Prints CPU ms per message sent for each
tree and the ratio to the first baseline. Figures only; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from bench.client import monolith_column, monolith_throughput_options, run_layout
from bench.cluster import started_monolith
from bench.scenarios import SYNC_MODES

#: Fields of ``/proc/PID/task/TID/stat`` after the command's closing
#: parenthesis: user and system time, in clock ticks.
_UTIME, _STIME = 11, 12


def thread_ticks(pid: int) -> dict[int, tuple[int, int]]:
    """Each live thread of ``pid``: (user, system) clock ticks so far."""
    ticks: dict[int, tuple[int, int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue  # ended meanwhile
        ticks[int(tid)] = (int(fields[_UTIME]), int(fields[_STIME]))
    return ticks


def measure(source: str | None, args: argparse.Namespace) -> dict[str, float]:
    """One tree's monolith under the workload: CPU ms per message sent, of
    the reactor thread and of the other threads (user and system)."""
    with started_monolith(args.engine, source) as cluster:
        pid = cluster.processes["main"].pid
        before = thread_ticks(pid)
        results = asyncio.run(run_layout(cluster, args))[monolith_column(args.sync_mode)]
        after = thread_ticks(pid)
    per_ms = 1000 / os.sysconf("SC_CLK_TCK") / args.messages
    figures = {"sent/s": float(results["sent"])}
    for label, tids in (("reactor", [pid]), ("other threads", [t for t in after if t != pid])):
        user = sum(after[t][0] - before.get(t, (0, 0))[0] for t in tids if t in after)
        system = sum(after[t][1] - before.get(t, (0, 0))[1] for t in tids if t in after)
        figures[f"{label} user"] = user * per_ms
        figures[f"{label} system"] = system * per_ms
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.thread_cpu", description=__doc__)
    parser.add_argument("--engine", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--sync-mode", choices=SYNC_MODES, default="poll")
    parser.add_argument("--baseline", metavar="DIR", action="append", default=[])
    args = parser.parse_args(argv)
    monolith_throughput_options(args, args.sync_mode)
    trees: list[tuple[str, str | None]] = [("this", None)]
    trees += [(os.path.basename(os.path.abspath(b)), os.path.abspath(b)) for b in args.baseline]
    figures = {name: measure(source, args) for name, source in trees}
    print(f"{args.engine}, {args.messages} messages, /sync {args.sync_mode}; CPU ms per message")
    print(f"{'':24s}" + "".join(f"{n[:12]:>13s}" for n, _ in trees))
    for key in figures["this"]:
        print(f"{key:24s}" + "".join(f"{figures[n][key]:13.2f}" for n, _ in trees))
    if len(trees) > 1:
        first = trees[1][0]
        for key in ("reactor user", "other threads user"):
            base = figures[first][key]
            ratio = figures["this"][key] / base if base else float("nan")
            print(f"this / {first}, {key}: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
