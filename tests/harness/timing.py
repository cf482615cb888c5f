"""Wall time of every test, for CI's list of the slowest modules.

When ``SYNAPSE_LITE_TEST_TIMES`` names a directory, every test's wall time
(set-up, body and tear-down, as trial runs it) is appended to a file of that
directory named after the process (trial's ``-j`` workers each write their
own): ``<seconds>\t<test id>`` per line. ``python -m tests.harness.timing
DIR`` prints the modules that took longest, which CI prints after each pass:
the list to look at when the run nears its time budget. Unset, nothing is
installed and nothing is timed.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

TEST_TIMES_ENV = "SYNAPSE_LITE_TEST_TIMES"


def install() -> None:
    """Time every trial test of this process into ``TEST_TIMES_ENV``'s
    directory, if it is set (called by ``tests/__init__.py`` when it is)."""
    directory = os.environ.get(TEST_TIMES_ENV)
    if not directory:
        return
    from twisted.trial import unittest

    out = Path(directory) / f"{os.getpid()}.tsv"
    untimed_run = unittest.SynchronousTestCase.run
    if getattr(untimed_run, "timed", False):
        return

    def run(self: unittest.SynchronousTestCase, result: Any) -> None:
        started = time.monotonic()
        try:
            untimed_run(self, result)
        finally:
            with out.open("a") as f:
                f.write(f"{time.monotonic() - started:.3f}\t{self.id()}\n")

    run.timed = True  # type: ignore[attr-defined]
    unittest.SynchronousTestCase.run = run  # type: ignore[method-assign]


def module_times(lines: Iterable[str]) -> dict[str, float]:
    """Seconds per test module (a test id without its class and method)
    from ``<seconds>\\t<test id>`` lines; malformed lines are skipped."""
    totals: dict[str, float] = defaultdict(float)
    for line in lines:
        seconds, _, test_id = line.rstrip("\n").partition("\t")
        parts = test_id.split(".")
        if len(parts) < 3:
            continue
        try:
            totals[".".join(parts[:-2])] += float(seconds)
        except ValueError:
            continue
    return dict(totals)


def main() -> None:
    parser = argparse.ArgumentParser(description="The slowest test modules of a timed run.")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    lines: list[str] = []
    for path in sorted(args.directory.glob("*.tsv")):
        lines.extend(path.read_text().splitlines())
    totals = module_times(lines)
    everything = sum(totals.values())
    print(f"{len(lines)} tests timed, {everything:.0f} s of test time in all; slowest modules:")
    for module, seconds in sorted(totals.items(), key=lambda item: -item[1])[: args.top]:
        print(f"  {seconds:7.1f} s  {100 * seconds / max(everything, 1e-9):4.1f}%  {module}")


if __name__ == "__main__":
    main()
