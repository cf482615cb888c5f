"""``python -m bench.route_matching`` runs and prints a figure per request."""

from __future__ import annotations

import contextlib
import io

from twisted.trial import unittest

from bench.route_matching import REQUESTS, main


class RouteMatchingBenchTestCase(unittest.TestCase):
    def test_python_m_bench_route_matching_prints_each_request(self) -> None:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(main(["--calls", "10"]), 0)
        lines = out.getvalue().splitlines()
        self.assertIn("client API routes", lines[0])
        figures = [line for line in lines[2:] if line.strip()]
        self.assertEqual(len(figures), len(REQUESTS))
        for (method, path), line in zip(REQUESTS, figures, strict=True):
            self.assertTrue(line.startswith(f"{method.decode()} {path}"), line)
            this, before, ratio = (float(x) for x in line.split()[-3:])
            # Rounded to two places from figures rounded to one.
            self.assertLess(abs(ratio - this / before), 0.01 + this / before * 0.1)
            self.assertGreater(this, 0)
            self.assertGreater(before, 0)
