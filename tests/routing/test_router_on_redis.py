"""The router of a generated layout on Redis, as real processes (issue 34):
until the router named the deployment, every process refused its traffic as
another deployment's and said so on ``/health`` ("degraded") for 5 minutes,
and the router refused theirs, so it never heard a room-writer change.
The following itself is shown over a real Redis by
``test_room_writers.RouterOnRedisTestCase``; here: nobody takes anyone for a
foreign deployment or an unsigned sender, and requests through the router
work."""

from __future__ import annotations

import json
import uuid

from twisted.internet import reactor, task
from twisted.trial import unittest

from tests.app.test_client_round_trip import call, register
from tests.app.test_metrics import find, scrape
from tests.harness.databases import create_test_database
from tests.harness.launcher import (
    LaunchedServer,
    SynapseLiteCommand,
    edit_config,
    generated_config,
    http_get,
    temp_dir,
)
from tests.harness.services import redis_address, require_redis


class RouterOnRedisProcessesTestCase(unittest.TestCase):
    timeout = 240

    async def test_no_process_takes_the_router_for_another_deployment(self) -> None:
        require_redis()
        host, port = redis_address()
        test_db = create_test_database()
        self.addCleanup(test_db.drop)
        directory = temp_dir()
        path = generated_config(directory, test_db, enable_registration=True)

        def on_redis(config: dict[str, object]) -> None:
            replication = config.setdefault("replication", {})
            assert isinstance(replication, dict)
            replication["transport"] = "redis"
            replication["redis"] = {
                "host": host,
                "port": port,
                "channel_prefix": f"test-{uuid.uuid4().hex}-",
            }

        edit_config(path, on_redis)
        command = SynapseLiteCommand(self, ["run", "-c", path], directory, directory)
        await command.start().wait_for_line(r"processes up in")
        server = LaunchedServer(command, path, directory, test_db)

        base = server.url("router")
        _, alice = await register(base, "alice")
        code, room = await call(
            "POST", f"{base}/_matrix/client/v3/createRoom", {"preset": "public_chat"}, alice
        )
        self.assertEqual(code, 200, room)
        code, _ = await call(
            "PUT",
            f"{base}/_matrix/client/v3/rooms/{room['room_id']}/send/m.room.message/t1",
            {"msgtype": "m.text", "body": "hello"},
            alice,
        )
        self.assertEqual(code, 200)
        # The router subscribed, published REPLICATE, and heard everyone's
        # answers by now; give the last messages time to arrive.
        await task.deferLater(reactor, 1.0, lambda: None)

        for name, spec in server.specs().items():
            code, body = await http_get(spec.health_url)
            health = json.loads(body)
            self.assertEqual(health.get("status"), "ok", (name, health))
            if spec.metrics_url is None:
                continue
            samples = await scrape(spec.metrics_url)
            for reason in ("foreign_deployment", "bad_mac"):
                refused = sum(
                    find(samples, "synapse_lite_replication_claims_refused_total", reason=reason)
                )
                self.assertEqual(refused, 0, (name, reason))
