"""CI's list of the slowest test modules (tests/harness/timing.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from twisted.trial import unittest

from tests.harness.timing import TEST_TIMES_ENV, module_times


class ModuleTimesTestCase(unittest.TestCase):
    def test_sums_per_module_and_skips_malformed_lines(self) -> None:
        totals = module_times(
            [
                "1.5\ttests.rest.test_sync.SyncTestCase.test_a\n",
                "2.0\ttests.rest.test_sync.OtherTestCase.test_b\n",
                "0.25\ttests.test_events.EventsTestCase.test_c\n",
                "not-a-number\ttests.rest.test_sync.SyncTestCase.test_d\n",
                "garbage\n",
            ]
        )
        self.assertEqual(totals, {"tests.rest.test_sync": 3.5, "tests.test_events": 0.25})


class TimedRunTestCase(unittest.TestCase):
    def test_a_timed_trial_run_writes_each_test_and_the_summary_names_it(self) -> None:
        """Runs trial on this module's other test case with the variable set,
        then the summary command on what it wrote."""
        directory = Path(tempfile.mkdtemp())
        env = {**os.environ, TEST_TIMES_ENV: str(directory)}
        subprocess.run(
            [
                sys.executable,
                "-m",
                "twisted.trial",
                "tests.test_harness_timing.ModuleTimesTestCase",
            ],
            env=env,
            check=True,
            capture_output=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        lines = [line for p in directory.glob("*.tsv") for line in p.read_text().splitlines()]
        self.assertTrue(lines)
        self.assertTrue(
            all(
                line.split("\t")[1].startswith("tests.test_harness_timing.ModuleTimesTestCase.")
                for line in lines
            )
        )
        summary = subprocess.run(
            [sys.executable, "-m", "tests.harness.timing", str(directory)],
            check=True,
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        ).stdout
        self.assertIn("tests.test_harness_timing", summary)
        self.assertIn(f"{len(lines)} tests timed", summary)
