"""The federation scaling benchmarks of issue 32 run end to end with tiny
sizes, so CI proves they work: ``bench/inbound_readers.py`` (real federation
reader processes feeding one events writer) and ``bench/federation_burst.py
--reference`` (the burst through our sender and through the reference's
federation sender worker, about 30 s here, most of it the reference
creating its database). The reference needs its worker extras
(``install_synapse_workers``), PostgreSQL and Redis: skipped with the
reason without them, a failure under ``CI=true``."""

from __future__ import annotations

import argparse
import os
import socket

from twisted.internet import threads
from twisted.trial import unittest

from bench import federation_burst, inbound_readers
from tests.harness.synapse_install import SynapseUnavailable, install_synapse_workers


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class FederationScalingBenchesTestCase(unittest.TestCase):
    # A cold install of the reference takes minutes; a warm run ~30 s.
    timeout = 900

    def _skip(self, reason: str) -> None:
        if os.environ.get("CI") == "true":
            self.fail(f"CI needs {reason}")
        raise unittest.SkipTest(reason)

    async def test_inbound_readers(self) -> None:
        args = argparse.Namespace(readers=[1, 2], rooms=2, pdus=10, txn=5, engine="sqlite")
        results = await inbound_readers.main_async(args)
        self.assertEqual(list(results), [1, 2])
        for r in results.values():
            self.assertGreater(r["persisted_per_s"], 0)
            self.assertGreater(r["writer_cpu_us_per_pdu"], 0)

    async def test_burst_beside_reference(self) -> None:
        if not (_listening(5432) and _listening(6379)):
            self._skip("PostgreSQL and Redis on 127.0.0.1 for the reference's workers")
        try:
            python = await threads.deferToThread(install_synapse_workers)
        except SynapseUnavailable as e:
            self._skip(f"the reference with its worker extras: {e}")
        args = argparse.Namespace(
            events=10, servers=2, senders=[1], engine="postgres", reference=python
        )
        results = await federation_burst.measure(args)
        self.assertEqual(list(results), ["ours, 1", "Synapse, 1"])
        for label, r in results.items():
            # Every event at every server, once.
            self.assertEqual(r["duplicates"], 0, label)
            self.assertGreater(r["delivered_s"], 0, label)
        self.assertIn("Synapse's sender / ours", federation_burst.report(args, results))
