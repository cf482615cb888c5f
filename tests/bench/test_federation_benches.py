"""The federation benchmarks (``bench/federation_latency.py``,
``bench/remote_join.py``) run end to end with tiny sizes, so CI proves they
work: four servers (two of ours, two Synapses), every pair measured, every
join seen with its members. Skipped with the reason when Synapse cannot be
installed here; a failure under ``CI=true`` (``synapse_or_skip``).

In CI's SQLite pass only: what they prove is the benchmarks' plumbing (the
servers they start, the pairs they measure, the report), the same on either
engine; federation's storage on PostgreSQL is the federation tests'."""

from __future__ import annotations

from twisted.trial import unittest

from bench import federation_latency, remote_join
from tests.harness.databases import sqlite_pass_only
from tests.harness.synapse_peer import synapse_or_skip

#: Why the PostgreSQL pass skips them (see the module docstring).
PLUMBING = "the benchmarks' plumbing, the same on either engine"


class FederationBenchesTestCase(unittest.TestCase):
    # Two Synapses start per benchmark (seconds warm, minutes cold).
    timeout = 900

    async def test_latency_every_pair(self) -> None:
        sqlite_pass_only(PLUMBING)
        await synapse_or_skip(self)
        results = await federation_latency.run(messages=3, warmup=1)
        self.assertEqual(
            [(r.sender.kind, r.receiver.kind) for r in results],
            [("ours", "ours"), ("ours", "synapse"), ("synapse", "ours"), ("synapse", "synapse")],
        )
        for r in results:
            self.assertEqual(len(r.latencies_ms), 3, r.name)
            self.assertTrue(all(ms > 0 for ms in r.latencies_ms), r.name)
        self.assertIn("p50 / Synapse→Synapse", federation_latency.report(results))

    async def test_remote_join_every_direction(self) -> None:
        sqlite_pass_only(PLUMBING)
        await synapse_or_skip(self)
        results, build_s = await remote_join.run(members=5, events=20, concurrency=2)
        self.assertEqual(
            [(r.joiner.kind, r.host.kind) for r in results],
            [("ours", "synapse"), ("synapse", "synapse"), ("ours", "ours"), ("synapse", "ours")],
        )
        for r in results:
            # Every member of the room, in the joiner's /sync.
            self.assertGreaterEqual(r.members_seen, 5, r.name)
            self.assertGreaterEqual(r.in_sync_s, 0, r.name)
        self.assertEqual(set(build_s), {"o1", "s1"})
        self.assertIn(
            "/ Synapse joining the same room", remote_join.report(results, build_s, 5, 20)
        )
