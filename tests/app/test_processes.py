"""Real processes: they start, find each other over replication and stop cleanly."""

from __future__ import annotations

from twisted.trial import unittest

from tests.harness.databases import create_test_database
from tests.harness.processes import ServerProcesses, layout_config
from tests.harness.services import require_redis


class ProcessLifecycleTestCase(unittest.TestCase):
    timeout = 120
    transport = "tcp"

    async def test_main_and_worker_start_replicate_and_stop(self) -> None:
        if self.transport == "redis":
            require_redis()
        test_db = create_test_database()
        self.addCleanup(test_db.drop)
        config = layout_config(
            test_db,
            workers={"persister1": ["replication", "health"]},
            stream_writers={"events": ["persister1"]},
            transport=self.transport,
        )
        servers = ServerProcesses(self, config)
        await servers.start()
        # The worker connected, authenticated, and main has heard its position.
        for _ in range(100):
            if "Replication connection" in servers.log_tail("main", 200):
                break
            await servers.wait_healthy("main")
        self.assertIn("Replication connection", servers.log_tail("main", 200))
        self.assertEqual(await servers.stop("persister1"), 0)
        self.assertEqual(await servers.stop("main"), 0)
        self.assertIn("persister1 stopped", servers.log_tail("persister1"))


class RedisProcessLifecycleTestCase(ProcessLifecycleTestCase):
    transport = "redis"
