"""The router of a generated layout on Redis, as real processes (issue 34):
until the router named the deployment, every process refused its traffic as
another deployment's and said so on ``/health`` ("degraded") for 5 minutes,
and the router refused theirs, so it never heard a room-writer change.
Here: nobody takes anyone for a foreign deployment or an unsigned sender,
requests through the router work, and the router follows a room-writer
change made the real way (an events writer stopped, then
``synapse-lite retire-events-writer``): the next send to the room goes to
the room's new writer, which persists it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import uuid
from typing import Any

from twisted.internet import reactor, task
from twisted.trial import unittest

from synapse_lite.app.launch_plan import plan_processes
from synapse_lite.config.homeserver import load_config
from tests.app.test_client_round_trip import call, register
from tests.app.test_metrics import find, scrape
from tests.harness.databases import END_TO_END, TestDatabase, create_test_database, one_engine_only
from tests.harness.launcher import (
    LaunchedServer,
    SynapseLiteCommand,
    edit_config,
    generated_config,
    http_get,
    temp_dir,
)
from tests.harness.polling import eventually
from tests.harness.services import redis_address, require_redis


def on_redis(path: str) -> None:
    """Make the config at ``path`` replicate over the test Redis (a channel
    of its own)."""
    host, port = redis_address()

    def change(config: dict[str, object]) -> None:
        replication = config.setdefault("replication", {})
        assert isinstance(replication, dict)
        replication["transport"] = "redis"
        replication["redis"] = {
            "host": host,
            "port": port,
            "channel_prefix": f"test-{uuid.uuid4().hex}-",
        }

    edit_config(path, change)


def writer_of_event(test_db: TestDatabase, event_id: str) -> str:
    """The instance that persisted ``event_id`` (``events.instance_name``)."""
    placeholder = "?" if test_db.engine_name == "sqlite" else "%s"
    conn: Any = test_db.make_engine().connect()
    try:
        cursor = conn.cursor()
        cursor.execute(
            f"SELECT instance_name FROM events WHERE event_id = {placeholder}", (event_id,)
        )
        (writer,) = cursor.fetchone()
        return str(writer)
    finally:
        conn.close()


class RouterOnRedisProcessesTestCase(unittest.TestCase):
    timeout = 240

    def config_on_redis(self) -> tuple[TestDatabase, str, str]:
        """A database, a directory and the generated config in it, on Redis."""
        one_engine_only("postgres", END_TO_END)
        require_redis()
        test_db = create_test_database()
        self.addCleanup(test_db.drop)
        directory = temp_dir()
        path = generated_config(directory, test_db, enable_registration=True)
        on_redis(path)
        return test_db, directory, path

    async def test_no_process_takes_the_router_for_another_deployment(self) -> None:
        test_db, directory, path = self.config_on_redis()
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

    async def test_follows_a_room_writer_change(self) -> None:
        """persister2 runs under a launcher of its own (as on another
        machine, docs/deployment.md), so that it can be stopped for good while
        the router keeps running with the room's writer in its cache."""
        test_db, directory, path = self.config_on_redis()
        # Both launchers use the one database (SQLite too: an absolute path).
        edit_config(path, lambda config: config.update(database=test_db.config()))
        elsewhere = temp_dir()
        other_path = os.path.join(elsewhere, "homeserver.yaml")
        shutil.copy(path, other_path)

        everyone_else = [
            spec.name for spec in plan_processes(load_config(path)) if spec.name != "persister2"
        ]
        command = SynapseLiteCommand(
            self, ["run", "-c", path, "--only", ",".join(everyone_else)], directory, directory
        )
        await command.start().wait_for_line(r"processes up in")
        persister2 = SynapseLiteCommand(
            self, ["run", "-c", other_path, "--only", "persister2"], elsewhere, elsewhere
        )
        await persister2.start().wait_for_line(r"processes up in")
        server = LaunchedServer(command, path, directory, test_db)
        base = server.url("router")

        async def router_sees_persister2() -> bool:
            _, body = await http_get(server.specs()["router"].health_url)
            return bool(json.loads(body)["backends"].get("persister2") == "up")

        await eventually(router_sees_persister2, 10, "the router to see persister2 up", 0.1)
        _, alice = await register(base, "alice")

        async def send(room_id: str, txn: str) -> tuple[int, Any]:
            return await call(
                "PUT",
                f"{base}/_matrix/client/v3/rooms/{room_id}/send/m.room.message/{txn}",
                {"msgtype": "m.text", "body": txn},
                alice,
            )

        # A room of persister2's, whose writer the router now keeps.
        room_id = None
        for attempt in range(20):
            code, room = await call(
                "POST", f"{base}/_matrix/client/v3/createRoom", {"preset": "public_chat"}, alice
            )
            self.assertEqual(code, 200, room)
            code, sent = await send(room["room_id"], f"before{attempt}")
            self.assertEqual(code, 200, sent)
            if writer_of_event(test_db, sent["event_id"]) == "persister2":
                room_id = room["room_id"]
                break
        assert room_id is not None, "no room of persister2's in 20"

        persister2.signal(signal.SIGTERM)
        self.assertEqual(await persister2.wait_exit(), 0, persister2.tail())
        retire = server.run_command(self, "retire-events-writer", "persister2")
        self.assertEqual(await retire.wait_exit(), 0, retire.output())

        # Until the router hears the room moved it answers 503 (the room's
        # writer, persister2, is down): with no deployment id it never does.
        answers: list[tuple[int, Any]] = []

        async def reaches_the_new_writer() -> bool:
            answers.append(await send(room_id, f"after{len(answers)}"))
            return answers[-1][0] == 200

        await eventually(reaches_the_new_writer, 10, "a send through the router to succeed", 0.2)
        self.assertEqual([code for code, _ in answers[:-1]], [503] * (len(answers) - 1), answers)
        self.assertEqual(writer_of_event(test_db, answers[-1][1]["event_id"]), "persister1")
