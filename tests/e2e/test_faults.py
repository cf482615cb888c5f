"""Faults under load, against real processes: a SIGKILLed event persister,
/sync worker and typing writer, a dropped TCP replication connection and (on
PostgreSQL with Redis) a Redis restart and a PostgreSQL restart.

Each test starts the layout (main, a /sync worker, two event persisters, a
typing writer), puts it under load (4 users, 4 senders, a /sync reader per
user, one typist), injects the fault, and checks that every acknowledged
message is stored once and reached every member's /sync exactly once and in
order, that clients saw errors (not hangs) while something was down, and that
every kind of request succeeded again afterwards without help.

The layout, load and checks are ``tests/harness/fault_runs.py``,
``load.py`` and ``delivery.py``, shared with ``bench/soak.py``, which runs longer
phases and the slower faults (SIGSTOP past the ping timeout).
Like ``test_client_processes``, the SQLite/TCP cases run when the suite runs on
SQLite and the PostgreSQL/Redis cases when it runs on PostgreSQL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from twisted.trial import unittest

from tests.harness.databases import test_engine_name
from tests.harness.fault_runs import (
    FAULTS,
    WORKERS,
    Fault,
    FaultCluster,
    FaultResult,
    markdown_table,
    run_fault,
)
from tests.harness.load import SEND_TIMEOUT_SECONDS, SYNC_TIMEOUT_SECONDS

#: Short phases: enough load on each side of the fault to prove catch-up.
BEFORE_SECONDS = 1.5
AFTER_SECONDS = 2.5


def fault(name: str) -> Fault:
    [found] = [f for f in FAULTS if f.name == name]
    return found


# The mixin's tests run only in the subclasses; mypy sees it as a TestCase.
if TYPE_CHECKING:
    _Base = unittest.TestCase
else:
    _Base = object


class FaultsTestMixin(_Base):
    """The fault tests of one config; subclasses say which."""

    timeout = 120
    engine = "sqlite"
    config = "sqlite-tcp"

    async def run_one(self, name: str, private_postgres: bool = False) -> FaultResult:
        if test_engine_name() != self.engine:
            raise unittest.SkipTest(f"runs when SYNAPSE_LITE_TEST_DB={self.engine}")
        self.cluster = cluster = FaultCluster(self, self.config, private_postgres)
        await cluster.start()
        result = await run_fault(
            cluster, fault(name), "t", before=BEFORE_SECONDS, after=AFTER_SECONDS,
            deliver_timeout=30.0,
        )  # fmt: skip
        report = result.report
        detail = markdown_table([result]) + "\n" + "\n".join(report.problems)
        self.assertGreater(report.acknowledged, 20, detail)
        self.assertEqual(
            (report.lost, report.duplicated, report.misordered, report.typing_stuck),
            (0, 0, 0, 0),
            detail,
        )
        self.assertTrue(result.delivered, detail)
        # Every kind of request succeeded again soon after the repair.
        self.assertIsNotNone(result.recovered_after, detail)
        assert result.recovered_after is not None
        self.assertLess(result.recovered_after, AFTER_SECONDS, detail)
        # No client waited out its own timeout: a dead dependency gives an
        # error quickly (sends and /sync each have a client timeout far above
        # any healthy answer).
        self.assertEqual(report.errors[("send", "timeout")], 0, detail)
        self.assertEqual(report.errors[("sync", "timeout")], 0, detail)
        self.assertGreater(SEND_TIMEOUT_SECONDS, result.down, detail)
        self.assertGreater(SYNC_TIMEOUT_SECONDS, result.down, detail)
        return result

    def errors_of(self, result: FaultResult, who: str) -> int:
        return sum(n for (w, _), n in result.report.errors.items() if w == who)

    async def test_sigkill_event_persister(self) -> None:
        result = await self.run_one("SIGKILL event persister")
        # Sends to the dead persister's rooms failed while it was down.
        self.assertGreater(self.errors_of(result, "send"), 0)

    async def test_sigkill_sync_worker(self) -> None:
        result = await self.run_one("SIGKILL /sync worker")
        self.assertGreater(self.errors_of(result, "sync"), 0)

    async def test_sigkill_typing_writer(self) -> None:
        result = await self.run_one("SIGKILL typing writer")
        self.assertGreater(self.errors_of(result, "typing"), 0)
        # The restarted writer's typing reached everyone (its serial restarted at 0).
        self.assertEqual(result.report.typing_stuck, 0)


class SqliteTcpFaultsTestCase(FaultsTestMixin, unittest.TestCase):
    """SQLite, TCP replication through a proxy that can drop connections."""

    async def test_drop_tcp_replication(self) -> None:
        await self.run_one("drop TCP replication")
        assert self.cluster.proxy is not None
        # Four workers connected, were dropped and connected again by themselves.
        self.assertGreaterEqual(self.cluster.proxy.accepted, 2 * len(WORKERS))


class PostgresRedisFaultsTestCase(FaultsTestMixin, unittest.TestCase):
    """PostgreSQL, Redis replication on a private Redis that can be restarted."""

    engine = "postgres"
    config = "postgres-redis"

    async def test_restart_redis(self) -> None:
        await self.run_one("restart Redis")

    async def test_restart_postgresql(self) -> None:
        """On a private PostgreSQL cluster: requests fail with 503 while it is
        down (never a 500, never a hang) and succeed again by themselves."""
        result = await self.run_one("restart PostgreSQL", private_postgres=True)
        self.assertGreater(self.errors_of(result, "send"), 0)
        self.assertEqual({kind for (_, kind), n in result.report.errors.items() if n}, {"503"})
