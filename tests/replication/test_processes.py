"""Replication between real OS processes, over TCP and over the real Redis.

Five processes share one database: ``main``, two events writers
(``persister1``, ``persister2``), a ``reader1`` that writes nothing and the
media worker ``media1``, which reads the caches stream alone. What
each process knows of the events stream is read from its Prometheus metrics
(``synapse_lite_stream_position``, ``synapse_lite_stream_persisted_upto``), so
the test watches replication from the outside, as an operator would.

One room is used, so one writer works and the other stays idle: the idle one's
announcements are what let the stream-wide position reach the busy writer's.
"""

from __future__ import annotations

import re
import time

import treq
from twisted.trial import unittest

from tests.harness.client_api import ClientApi
from tests.harness.databases import END_TO_END, create_test_database, one_engine_only
from tests.harness.polling import eventually
from tests.harness.processes import NO_KEEPALIVE, ServerProcesses, layout_config
from tests.harness.services import require_redis

WRITERS = ["persister1", "persister2"]
#: Sent while reader1 is down: more than two catch-up pages of 100 rows.
BACKLOG = 250
#: Sent after the main process restarts.
AFTER_RESTART = 15
#: The issue's bound for an idle writer letting the minimum position advance.
IDLE_WRITER_SECONDS = 2.0

_SAMPLE = re.compile(r"^(\w+)(?:\{([^}]*)\})? (\S+)$")


def parse_metrics(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text format: ``name{label="value",...} number`` lines."""
    samples = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        name, labels, value = match.groups()
        pairs = frozenset(re.findall(r'(\w+)="([^"]*)"', labels or ""))
        samples[(name, pairs)] = float(value)
    return samples


class ReplicationProcessesTestCase(unittest.TestCase):
    """main, two events writers and a reader over TCP (the subclass: Redis)."""

    timeout = 180
    transport = "tcp"
    engine = "sqlite"

    async def metric(self, process: str, name: str, **labels: str) -> float | None:
        response = await treq.get(
            self.servers.url(process, "metrics") + "/metrics", pool=NO_KEEPALIVE, timeout=5
        )
        samples = parse_metrics((await response.content()).decode())
        return samples.get((name, frozenset(labels.items())))

    async def persisted_upto(self, process: str) -> float | None:
        return await self.metric(process, "synapse_lite_stream_persisted_upto", stream="events")

    async def writer_position(self, writer: str) -> float:
        value = await self.metric(
            writer, "synapse_lite_stream_position", stream="events", writer=writer
        )
        assert value is not None, f"{writer} does not report its own events position"
        return value

    async def test_positions_converge_and_a_restarted_reader_catches_up(self) -> None:
        one_engine_only(self.engine, END_TO_END)
        if self.transport == "redis":
            require_redis()
        test_db = create_test_database()
        self.addCleanup(test_db.drop)
        every = ["client", "replication", "health", "metrics"]
        config = layout_config(
            test_db,
            workers={"persister1": every, "persister2": every, "reader1": every, "media1": every},
            stream_writers={"events": WRITERS},
            transport=self.transport,
            media_instance="media1",
        )
        self.servers = ServerProcesses(self, config)
        await self.servers.start()
        alice = await ClientApi(self, self.servers.url("main")).register("alice")
        room = await alice.create_room()
        via_reader = alice.as_user(alice.token)
        via_reader.base_url = self.servers.url("reader1")
        sent = [await via_reader.send(room, f"first {i}") for i in range(5)]

        # The room's writer is whichever of the two moved; the other is idle.
        positions = {w: await self.writer_position(w) for w in WRITERS}
        busy = max(positions, key=lambda w: positions[w])
        top = positions[busy]
        started = time.monotonic()

        async def everyone_at_top() -> bool:
            for name in ("main", *WRITERS, "reader1"):
                if await self.persisted_upto(name) != top:
                    return False
            return True

        await eventually(everyone_at_top, timeout=10, what="all at the top")
        self.assertLess(time.monotonic() - started, IDLE_WRITER_SECONDS)

        # reader1 goes away; a backlog of several catch-up pages builds up.
        self.assertEqual(await self.servers.stop("reader1"), 0)
        sent += [await alice.send(room, f"backlog {i}") for i in range(BACKLOG)]
        top = await self.writer_position(busy)
        await self.servers.start("reader1")

        async def reader_caught_up() -> bool:
            return await self.persisted_upto("reader1") == top

        await eventually(reader_caught_up, timeout=30, what="reader1 catching up")
        page = await via_reader.ok("GET", f"/rooms/{room}/messages?dir=b&limit={BACKLOG + 50}")
        seen = [e["event_id"] for e in reversed(page["chunk"]) if e["type"] == "m.room.message"]
        self.assertEqual(seen, sent)

        # No process handles its own rows a second time: the busy writer sent
        # every row but received (from others) only the few rows they wrote.
        rdata_out = await self.metric(
            busy, "synapse_lite_replication_commands_sent_total", command="RDATA"
        )
        rdata_in = await self.metric(
            busy, "synapse_lite_replication_commands_received_total", command="RDATA"
        )
        self.assertGreaterEqual(rdata_out or 0, BACKLOG)
        self.assertLess(rdata_in or 0, BACKLOG / 5)

        # The media worker reads the caches stream alone (subscriptions by
        # role): no event row reached it, skipped or not, and its view of
        # the events stream stayed where it started.
        media_rdata = await self.metric(
            "media1", "synapse_lite_replication_commands_received_total", command="RDATA"
        )
        # (Following every stream, it would have received every row of the
        # BACKLOG + 5 events.)
        self.assertLess(media_rdata or 0, BACKLOG / 5)
        self.assertLess(await self.persisted_upto("media1") or 0, top)

        # One sequence read per new position in the whole cluster, on both
        # transports: the main process checks each claim; the idle writer,
        # which follows every row of the busy one, takes the main process's
        # relay (TCP) or its signed notes (Redis) and reads (almost) never.
        idle = next(w for w in WRITERS if w != busy)
        self.assertGreater(await self.sequence_reads("main"), 0)
        idle_reads = await self.sequence_reads(idle)
        self.assertLess(idle_reads, BACKLOG / 5)

        # The main process restarts (over Redis: with a new note key, which
        # the others read from the database when its first note comes).
        # Each message is followed by the idle writer before the next is
        # sent, so that each is a claim of its own to check.
        self.assertEqual(await self.servers.stop("main"), 0)
        await self.servers.start("main")
        after_restart = []
        for i in range(AFTER_RESTART):
            after_restart.append(await via_reader.send(room, f"after {i}"))
            top = await self.writer_position(busy)

            async def idle_writer_current(top: float = top) -> bool:
                return await self.persisted_upto(idle) == top

            await eventually(idle_writer_current, timeout=30, what=f"{idle} following")
        self.assertLess(await self.sequence_reads(idle) - idle_reads, AFTER_RESTART / 3)
        page = await via_reader.ok("GET", f"/rooms/{room}/messages?dir=b&limit=20")
        seen = [e["event_id"] for e in reversed(page["chunk"]) if e["type"] == "m.room.message"]
        self.assertEqual(seen[-AFTER_RESTART:], after_restart)

    async def sequence_reads(self, process: str) -> float:
        """How often ``process`` read a stream's sequence to check a claim."""
        value = await self.metric(
            process, "synapse_lite_db_transaction_seconds_count", desc="read_max_allocated"
        )
        return value or 0.0


class RedisReplicationProcessesTestCase(ReplicationProcessesTestCase):
    transport = "redis"
    engine = "postgres"
