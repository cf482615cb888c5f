"""One fault under load, from start to verdict: the layout, the faults, and the
run that injects one and checks the result. ``tests/e2e/test_faults.py`` runs
a few of them with short phases; ``bench/soak.py`` runs all of them.

Layout: main, a /sync worker, two event persisters and a typing writer (as in
``test_client_processes``). Two configs:

* ``sqlite-tcp``: SQLite, TCP replication; the workers reach the main process's
  replication port through a :class:`~tests.harness.faults.TcpProxy`, so the
  connections can be dropped.
* ``postgres-redis``: PostgreSQL, Redis replication; Redis is always a private
  server (it gets restarted); PostgreSQL is a private cluster when the
  PostgreSQL restart is wanted, else the shared test server.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import attr
from twisted.trial.unittest import SkipTest

from synapse_lite.replication.tcp.protocol import PING_TIMEOUT_SECONDS
from tests.harness.databases import TestDatabase, create_test_database
from tests.harness.delivery import DeliveryReport, check_delivery
from tests.harness.faults import PrivatePostgres, PrivateRedis, TcpProxy
from tests.harness.load import (
    HttpClient,
    LoadRun,
    Member,
    create_room,
    setup_members_and_rooms,
    sleep,
)
from tests.harness.processes import (
    SPLIT_WORKERS,
    SPLIT_WRITERS,
    Cleanups,
    ServerProcesses,
    layout_config,
)

WORKERS = SPLIT_WORKERS
WRITERS = SPLIT_WRITERS
CONFIGS = ("sqlite-tcp", "postgres-redis")
#: How long a killed process stays dead: the launcher's first restart delay.
RESTART_DELAY_SECONDS = 1.0
#: How long Redis or PostgreSQL stays down when restarted.
SERVICE_DOWN_SECONDS = 3.0


class FaultCluster:
    """A running layout for one config, its users and rooms, and the handles
    (proxy, private Redis/PostgreSQL) the faults need."""

    def __init__(self, owner: Cleanups, config_name: str, private_postgres: bool = False) -> None:
        if config_name not in CONFIGS:
            raise ValueError(f"config must be one of {CONFIGS}, not {config_name!r}")
        self.owner = owner
        self.config_name = config_name
        self.private_postgres = private_postgres
        self.proxy: TcpProxy | None = None
        self.redis: PrivateRedis | None = None
        self.postgres: PrivatePostgres | None = None
        self.client = HttpClient()
        self.members: list[Member] = []
        #: why the PostgreSQL restart cannot run here (no private cluster), if so
        self.postgres_missing: str | None = None
        self.rooms: list[str] = []

    async def start(self, users: int = 4, rooms: int = 2) -> None:
        # Cleanups run last-in first-out: the servers stop before the
        # services and proxy they use go away.
        worker_replication = None
        if self.config_name == "sqlite-tcp":
            self.db = create_test_database("sqlite")
            self.owner.addCleanup(self.db.drop)
            config = layout_config(self.db, WORKERS, WRITERS, transport="tcp")
            self.proxy = TcpProxy(config["replication"]["tcp"]["port"])
            self.owner.addCleanup(self.proxy.close)
            worker_replication = dict(
                config["replication"], tcp={"host": "127.0.0.1", "port": self.proxy.port}
            )
        else:
            self.redis = PrivateRedis()
            self.owner.addCleanup(self.redis.stop)
            await self.redis.start()
            if self.private_postgres:
                try:
                    self.postgres = PrivatePostgres()
                except SkipTest as e:
                    # The other faults can still run, on the shared server.
                    self.postgres_missing = str(e)
            if self.postgres is not None:
                self.owner.addCleanup(self.postgres.destroy)
                await self.postgres.start()
                self.db = _create_database(self.postgres)
            else:
                self.db = create_test_database("postgres")
                self.owner.addCleanup(self.db.drop)
            config = layout_config(self.db, WORKERS, WRITERS, transport="redis")
            config["replication"]["redis"].update(host="127.0.0.1", port=self.redis.port)
        self.servers = ServerProcesses(self.owner, config, worker_replication)
        await self.servers.start()
        self.owner.addCleanup(self.client.close)
        main = self.servers.url("main")
        self.members, self.rooms = await setup_members_and_rooms(self.client, main, users, rooms)
        # Both persisters must own rooms, or a persister fault proves nothing.
        while set(self.room_writers().values()) != set(WRITERS["events"]) or len(self.rooms) < 2:
            name = f"room {len(self.rooms)}"
            self.rooms.append(await create_room(self.client, main, self.members, name))

    def connect(self) -> Any:
        return self.db.make_engine().connect()

    def room_writers(self) -> dict[str, str]:
        conn = self.connect()
        try:
            cursor = conn.cursor()
            cursor.execute("SELECT room_id, event_writer FROM rooms")
            return {room: writer for room, writer in cursor.fetchall() if room in self.rooms}
        finally:
            conn.close()

    def load(self, tag: str, senders: int = 4) -> LoadRun:
        urls = self.servers.url
        return LoadRun(
            self.client,
            self.members,
            self.rooms,
            send_bases=[urls("main"), urls("sync1")],
            sync_bases=[urls("sync1"), urls("main")],
            tag=tag,
            senders=senders,
        )


def _create_database(postgres: PrivatePostgres) -> TestDatabase:
    import psycopg2

    admin = dict(postgres.connect_args(), dbname="postgres")
    conn = psycopg2.connect(**admin)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE synapse_lite_soak TEMPLATE template0")
    finally:
        conn.close()
    return TestDatabase("postgres", dict(postgres.connect_args(), dbname="synapse_lite_soak"))


async def _kill_and_restart(cluster: FaultCluster, name: str) -> None:
    await cluster.servers.kill(name)
    await sleep(RESTART_DELAY_SECONDS)
    await cluster.servers.start(name)


async def kill_persister(cluster: FaultCluster) -> None:
    await _kill_and_restart(cluster, "persister1")


async def kill_sync_worker(cluster: FaultCluster) -> None:
    await _kill_and_restart(cluster, "sync1")


async def kill_typing_writer(cluster: FaultCluster) -> None:
    await _kill_and_restart(cluster, "typing1")


async def drop_tcp_replication(cluster: FaultCluster) -> None:
    assert cluster.proxy is not None
    if cluster.proxy.drop() == 0:
        raise AssertionError("no replication connection went through the proxy to drop")


async def restart_redis(cluster: FaultCluster) -> None:
    assert cluster.redis is not None
    await cluster.redis.restart(SERVICE_DOWN_SECONDS)


async def restart_postgres(cluster: FaultCluster) -> None:
    if cluster.postgres is None:
        raise SkipTest(cluster.postgres_missing or "no private PostgreSQL to restart")
    await cluster.postgres.restart(SERVICE_DOWN_SECONDS)


async def _stop_past_ping_timeout(cluster: FaultCluster, name: str) -> None:
    # No config knob lowers the ping timeout, so this takes the real 25 s.
    cluster.servers.pause(name)
    await sleep(PING_TIMEOUT_SECONDS + 5)
    cluster.servers.resume(name)


async def stop_persister_past_ping_timeout(cluster: FaultCluster) -> None:
    await _stop_past_ping_timeout(cluster, "persister1")


async def stop_sync_worker_past_ping_timeout(cluster: FaultCluster) -> None:
    await _stop_past_ping_timeout(cluster, "sync1")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Fault:
    """A fault: its name, the configs it applies to, and how to inject it
    (returning once the fault is repaired: process back, service back...)."""

    name: str
    configs: tuple[str, ...]
    inject: Callable[[FaultCluster], Awaitable[None]]


FAULTS = [
    Fault("SIGKILL event persister", CONFIGS, kill_persister),
    Fault("SIGKILL /sync worker", CONFIGS, kill_sync_worker),
    Fault("SIGKILL typing writer", CONFIGS, kill_typing_writer),
    Fault("drop TCP replication", ("sqlite-tcp",), drop_tcp_replication),
    Fault("restart Redis", ("postgres-redis",), restart_redis),
    Fault("restart PostgreSQL", ("postgres-redis",), restart_postgres),
    Fault("SIGSTOP persister 30 s", CONFIGS, stop_persister_past_ping_timeout),
    Fault("SIGSTOP /sync worker 30 s", CONFIGS, stop_sync_worker_past_ping_timeout),
]


@attr.s(slots=True, frozen=True, auto_attribs=True)
class FaultResult:
    """A fault's run: the delivery check, and whether clients recovered."""

    fault: str
    config: str
    report: DeliveryReport
    #: seconds from injecting the fault to its repair
    down: float
    #: seconds after the repair until a send, a /sync and a typing request
    #: each succeeded again (None: one never did)
    recovered_after: float | None
    delivered: bool


async def run_fault(
    cluster: FaultCluster,
    fault: Fault,
    tag: str,
    before: float = 3.0,
    after: float = 5.0,
    deliver_timeout: float = 60.0,
) -> FaultResult:
    """Load for ``before`` s, the fault, load for ``after`` s after its repair,
    then wait for delivery and check."""
    run = cluster.load(tag)
    await run.start()
    try:
        await sleep(before)
        injected = time.monotonic()
        await fault.inject(cluster)
        repaired = time.monotonic()
        await sleep(after)
        await run.stop_sending()
        delivered = await run.wait_delivered(deliver_timeout)
    finally:
        await run.stop()
    return FaultResult(
        fault.name,
        cluster.config_name,
        check_delivery(run, cluster.connect, repaired),
        repaired - injected,
        run.recovered_after(repaired),
        delivered,
    )


COLUMNS = [
    "config", "fault", "acked", "lost", "dup", "misordered", "down s", "catch-up s",
    "max lag s", "max send s", "recovered s", "typing stuck", "client errors",
]  # fmt: skip


def table_row(result: FaultResult) -> list[str]:
    r = result.report
    recovered = "never" if result.recovered_after is None else f"{result.recovered_after:.1f}"
    return [
        result.config, result.fault, str(r.acknowledged), str(r.lost), str(r.duplicated),
        str(r.misordered), f"{result.down:.1f}", f"{r.catch_up:.1f}", f"{r.max_lag:.1f}",
        f"{r.max_send:.1f}", recovered, str(r.typing_stuck), r.errors_text(),
    ]  # fmt: skip


def markdown_table(results: list[FaultResult]) -> str:
    rows = [COLUMNS, *(table_row(r) for r in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
             for row in rows]  # fmt: skip
    lines.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return "\n".join(lines)
