"""Real processes: they start, find each other over replication and stop cleanly."""

from __future__ import annotations

import os
from typing import Any

from twisted.internet import reactor
from twisted.trial import unittest
from twisted.web.server import Site

from synapse_lite.app.listeners import HealthResource
from tests.harness.databases import END_TO_END, create_test_database, one_engine_only
from tests.harness.processes import ServerProcesses, free_port, layout_config, listens_on
from tests.harness.services import require_redis


def main_and_persister(test: unittest.TestCase, transport: str = "tcp") -> dict[str, Any]:
    """A config of main and one events writer, on a fresh database."""
    test_db = create_test_database()
    test.addCleanup(test_db.drop)
    return layout_config(
        test_db,
        workers={"persister1": ["replication", "health"]},
        stream_writers={"events": ["persister1"]},
        transport=transport,
    )


class ProcessLifecycleTestCase(unittest.TestCase):
    timeout = 120
    transport = "tcp"
    engine = "sqlite"

    async def test_main_and_worker_start_replicate_and_stop(self) -> None:
        one_engine_only(self.engine, END_TO_END)
        if self.transport == "redis":
            require_redis()
        servers = ServerProcesses(self, main_and_persister(self, self.transport))
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
    engine = "postgres"


class ForeignHealthTestCase(unittest.TestCase):
    timeout = 120

    async def test_another_process_answering_health_is_not_main(self) -> None:
        """main's port already taken by a listener answering /health 200 (two
        tests handed one free port): the harness never takes main for started,
        so no worker starts against a schema main has not prepared; main
        cannot listen, exits, and the failure says so."""
        config = main_and_persister(self)
        port = config["listeners"][0]["port"]
        any_reactor: Any = reactor
        other = any_reactor.listenTCP(port, Site(HealthResource("main")), interface="127.0.0.1")
        self.addCleanup(other.stopListening)
        servers = ServerProcesses(self, config)
        with self.assertRaises(AssertionError) as caught:
            await servers.start()
        self.assertIn("main exited with 1", str(caught.exception))
        self.assertIn("cannot listen", str(caught.exception))
        self.assertIsNone(servers.processes["persister1"].proto)  # never started


class ListensOnTestCase(unittest.TestCase):
    def test_a_reaped_process_listens_on_nothing(self) -> None:
        """A process that is gone is "not listening" (False), never "cannot
        say" (None): the harness took None for a yes, and a main that could
        not listen and had exited passed for started (CI, stop 42)."""
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        self.assertIs(listens_on(pid, 1), False)

    def test_this_process_listening_is_seen(self) -> None:
        any_reactor: Any = reactor
        port = any_reactor.listenTCP(0, Site(HealthResource("main")), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        number = port.getHost().port
        self.assertIs(listens_on(os.getpid(), number), True)
        self.assertIs(listens_on(os.getpid(), free_port()), False)
