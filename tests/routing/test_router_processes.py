"""The router in front of real processes (`synapse-lite run`, sharded layout):
a room's events go straight to its writer with no internal hop, one user's
/syncs stay on one reader, and when that reader is killed (SIGKILL) the
user's next /sync is answered by the other at once."""

from __future__ import annotations

import os
import signal

from twisted.trial import unittest

from tests.app.test_client_round_trip import call, register, writer_of
from tests.app.test_metrics import find, scrape
from tests.harness.databases import END_TO_END, one_engine_only
from tests.harness.launcher import LaunchedServer, launch


async def served(
    server: LaunchedServer, servlet: str, only: list[str] | None = None
) -> dict[str, float]:
    """How many requests of ``servlet`` each process (or each of ``only``) answered."""
    counts = {}
    for name, spec in server.specs().items():
        if name == "router" or spec.metrics_url is None or (only and name not in only):
            continue
        samples = await scrape(spec.metrics_url)
        counts[name] = sum(find(samples, "synapse_lite_http_requests_total", servlet=servlet))
    return counts


class RouterProcessesTestCase(unittest.TestCase):
    timeout = 240

    async def test_routes_sticks_and_fails_over(self) -> None:
        one_engine_only("sqlite", END_TO_END)
        server = await launch(self, layout="sharded", enable_registration=True)
        base = server.url("router")
        _, alice = await register(base, "alice")
        _, bob = await register(base, "bob")
        code, room = await call(
            "POST", f"{base}/_matrix/client/v3/createRoom", {"preset": "public_chat"}, alice
        )
        self.assertEqual(code, 200, room)
        room_id = room["room_id"]
        code, _ = await call("POST", f"{base}/_matrix/client/v3/join/{room_id}", {}, bob)
        self.assertEqual(code, 200)

        # Sends: on the room's writer, which persisted them itself (the room's
        # creation, on main, was forwarded to it: counted before).
        forwarded_before = await served(server, "replication.send_events")
        for i in range(3):
            code, _ = await call(
                "PUT",
                f"{base}/_matrix/client/v3/rooms/{room_id}/send/m.room.message/t{i}",
                {"msgtype": "m.text", "body": f"hello {i}"},
                alice,
            )
            self.assertEqual(code, 200)
        writer = await writer_of(room_id, server.test_db, server.config_path)
        sends = await served(server, "send")
        self.assertEqual({n: c for n, c in sends.items() if c}, {writer: 3})
        forwarded = await served(server, "replication.send_events")
        self.assertEqual(forwarded, forwarded_before)

        # Bob's /syncs: all on one reader.
        since = None
        for _ in range(3):
            url = f"{base}/_matrix/client/v3/sync?timeout=0" + (f"&since={since}" if since else "")
            code, sync = await call("GET", url, token=bob)
            self.assertEqual(code, 200, sync)
            since = sync["next_batch"]
        syncs = await served(server, "sync")
        [(reader, count)] = [(n, c) for n, c in syncs.items() if c]
        self.assertEqual(count, 3)
        self.assertIn(reader, ("synchrotron1", "synchrotron2"))

        # Kill it: Bob's next /sync is answered by the other reader.
        os.kill(server.command.running_pids()[reader], signal.SIGKILL)
        code, sync = await call(
            "GET", f"{base}/_matrix/client/v3/sync?timeout=0&since={since}", token=bob
        )
        self.assertEqual(code, 200, sync)
        other = ({"synchrotron1", "synchrotron2"} - {reader}).pop()
        self.assertEqual(await served(server, "sync", only=[other]), {other: 1})
