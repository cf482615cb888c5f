"""bench.client's /sync modes: bad options are refused before anything starts."""

from __future__ import annotations

import asyncio
from typing import cast

from twisted.trial import unittest

from bench.client import main
from bench.scenarios import Client, measure_throughput


class SyncModeOptionsTestCase(unittest.TestCase):
    def test_unknown_sync_mode_is_refused(self) -> None:
        with self.assertRaises(SystemExit):
            main(["--sync-modes", "none,sometimes"])

    def test_sync_every_below_one_is_refused(self) -> None:
        with self.assertRaises(SystemExit):
            main(["--sync-modes", "paced", "--sync-every", "0"])

    def test_measure_throughput_refuses_bad_modes(self) -> None:
        client = cast(Client, object())  # never reached: the check comes first
        for kwargs in ({"sync_mode": "sometimes"}, {"sync_mode": "paced", "sync_every": 0}):
            with self.assertRaises(ValueError):
                asyncio.run(measure_throughput(client, [], "", [], [], 1, 1, **kwargs))
