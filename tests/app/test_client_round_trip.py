"""A Matrix client against a launched homeserver: a round trip through every
process, users created with `synapse-lite register-user`, and an events writer
killed while messages are being sent, with nothing acknowledged lost or
delivered twice."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sqlite3
from typing import Any

import treq
from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from synapse_lite.app.launch_plan import plan_processes
from synapse_lite.config.homeserver import load_config
from tests.harness.databases import create_test_database
from tests.harness.launcher import SynapseLiteCommand, free_port_block, generated_config, temp_dir
from tests.harness.processes import NO_KEEPALIVE


def require_client_api() -> None:
    if importlib.util.find_spec("synapse_lite.handlers.sync") is None:
        raise unittest.SkipTest(
            "needs the Client-Server API (branch client-api), not merged into main yet"
        )


async def call(
    method: str, url: str, body: Any = None, token: str | None = None
) -> tuple[int, dict[str, Any]]:
    headers: dict[bytes | str, bytes | str] = {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    response = await treq.request(
        method,
        url,
        data=None if body is None else json.dumps(body).encode(),
        headers=headers,
        pool=NO_KEEPALIVE,
        timeout=30,
    )
    content = await treq.content(response)
    return response.code, json.loads(content) if content else {}


async def register(base: str, user: str) -> tuple[str, str]:
    """Register with m.login.dummy; (user_id, access_token)."""
    body: dict[str, Any] = {"username": user, "password": "correct horse battery"}
    body["auth"] = {"type": "m.login.dummy"}
    code, answer = await call("POST", f"{base}/_matrix/client/v3/register", body)
    if code == 401 and "session" in answer:
        body["auth"]["session"] = answer["session"]
        code, answer = await call("POST", f"{base}/_matrix/client/v3/register", body)
    assert code == 200, (code, answer)
    return answer["user_id"], answer["access_token"]


def messages_in(sync: dict[str, Any], room_id: str) -> list[dict[str, Any]]:
    room = sync.get("rooms", {}).get("join", {}).get(room_id, {})
    events: list[dict[str, Any]] = room.get("timeline", {}).get("events", [])
    return [e for e in events if e.get("type") == "m.room.message"]


class ClientRoundTripTestCase(unittest.TestCase):
    timeout = 240

    def setUp(self) -> None:
        require_client_api()
        self.dir = temp_dir()

    async def launch_default(self) -> tuple[SynapseLiteCommand, str, dict[str, str]]:
        """The default command (first run: generates the default layout)."""
        data_dir = os.path.join(self.dir, "data")
        args = ["run", "--data-dir", data_dir, "--enable-registration"]
        args += ["--base-port", str(free_port_block(10))]
        command = SynapseLiteCommand(self, args, self.dir, data_dir).start()
        await command.wait_for_line(r"4 processes up in")
        config_path = os.path.join(data_dir, "homeserver.yaml")
        urls = {}
        for spec in plan_processes(load_config(config_path)):
            try:
                urls[spec.name] = spec.url_of("client")
            except KeyError:
                pass
        return command, config_path, urls

    async def test_round_trip_through_every_process(self) -> None:
        command, config_path, urls = await self.launch_default()
        main, sync_worker = urls["main"], urls["synchrotron1"]
        _, alice = await register(main, "alice")
        _, bob = await register(sync_worker, "bob")
        code, room = await call(
            "POST", f"{main}/_matrix/client/v3/createRoom", {"preset": "public_chat"}, alice
        )
        self.assertEqual(code, 200, room)
        room_id = room["room_id"]
        code, _ = await call("POST", f"{sync_worker}/_matrix/client/v3/join/{room_id}", {}, bob)
        self.assertEqual(code, 200)
        code, first = await call("GET", f"{sync_worker}/_matrix/client/v3/sync", token=bob)
        self.assertEqual(code, 200, first)
        code, sent = await call(
            "PUT",
            f"{sync_worker}/_matrix/client/v3/rooms/{room_id}/send/m.room.message/t1",
            {"msgtype": "m.text", "body": "hello through the workers"},
            alice,
        )
        self.assertEqual(code, 200, sent)
        code, later = await call(
            "GET",
            f"{sync_worker}/_matrix/client/v3/sync?timeout=10000&since={first['next_batch']}",
            token=bob,
        )
        self.assertEqual(
            [e["event_id"] for e in messages_in(later, room_id)], [sent["event_id"]], later
        )
        # An events writer persisted it, not the process the client spoke to.
        database = load_config(config_path).database.args["path"]
        with sqlite3.connect(database) as db:
            (writer,) = db.execute(
                "SELECT instance_name FROM events WHERE event_id = ?", (sent["event_id"],)
            ).fetchone()
        self.assertIn(writer, ("persister1", "persister2"))

        command.signal(signal.SIGTERM)
        self.assertEqual(await command.wait_exit(), 0, command.tail())
        self.assertEqual(command.running_pids(), {})

        # Nothing lost: after a restart the message is still there for bob.
        again, _, urls = await self.launch_default()
        code, full = await call("GET", f"{urls['synchrotron1']}/_matrix/client/v3/sync", token=bob)
        self.assertIn(sent["event_id"], [e["event_id"] for e in messages_in(full, room_id)])
        again.signal(signal.SIGTERM)
        self.assertEqual(await again.wait_exit(), 0, again.tail())

    async def test_register_user_command(self) -> None:
        _, config_path, urls = await self.launch_default()
        register_user = SynapseLiteCommand(
            self,
            ["register-user", "-c", config_path, "carol", "-p", "s3cret pass", "--admin"],
            self.dir,
            os.path.dirname(config_path),
        )
        self.assertEqual(await register_user.start().wait_exit(), 0, register_user.output())
        self.assertIn("Registered @carol:localhost (admin)", register_user.output())
        code, login = await call(
            "POST",
            f"{urls['main']}/_matrix/client/v3/login",
            {
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": "carol"},
                "password": "s3cret pass",
            },
        )
        self.assertEqual(code, 200, login)


class KilledWriterUnderLoadTestCase(unittest.TestCase):
    """An events writer killed with SIGKILL while a client sends: the launcher
    restarts it, it catches up, and every acknowledged event is there once."""

    timeout = 300

    async def test_no_acknowledged_event_lost_or_repeated(self) -> None:
        require_client_api()
        test_db = create_test_database()
        self.addCleanup(test_db.drop)
        directory = temp_dir()
        config_path = generated_config(directory, test_db, enable_registration=True)
        command = SynapseLiteCommand(self, ["run", "-c", config_path], directory, directory)
        await command.start().wait_for_line(r"processes up in")
        specs = {s.name: s for s in plan_processes(load_config(config_path))}
        main, sync_worker = specs["main"].url_of("client"), specs["synchrotron1"].url_of("client")
        _, alice = await register(main, "alice")
        code, room = await call("POST", f"{main}/_matrix/client/v3/createRoom", {}, alice)
        self.assertEqual(code, 200, room)
        room_id = room["room_id"]

        acknowledged: dict[str, str] = {}  # txn id -> event id
        total = 120

        async def send(i: int) -> None:
            url = f"{sync_worker}/_matrix/client/v3/rooms/{room_id}/send/m.room.message/txn{i}"
            for _ in range(200):
                try:
                    code, answer = await call(
                        "PUT", url, {"msgtype": "m.text", "body": f"#{i}"}, alice
                    )
                except Exception:
                    code, answer = 0, {}
                if code == 200:
                    acknowledged[f"txn{i}"] = answer["event_id"]
                    return
                await task.deferLater(reactor, 0.1, lambda: None)
            raise AssertionError(f"message {i} never acknowledged")

        async def sender(start: int) -> None:
            for i in range(start, total, 4):
                await send(i)

        senders = defer.gatherResults([defer.ensureDeferred(sender(s)) for s in range(4)])
        while len(acknowledged) < total // 3:
            await task.deferLater(reactor, 0.05, lambda: None)
        writer = await self.writer_of(room_id, test_db, config_path)
        os.kill(command.running_pids()[writer], signal.SIGKILL)
        await senders
        await command.wait_for_line(rf"Restarted {writer} \(pid \d+\)")

        # Every acknowledged event, once, for a client reading from scratch.
        seen: list[str] = []
        since = None
        for _ in range(100):
            query = "timeout=0" + (f"&since={since}" if since else "")
            code, sync = await call(
                "GET", f"{sync_worker}/_matrix/client/v3/sync?{query}", token=alice
            )
            self.assertEqual(code, 200, sync)
            seen += [e["event_id"] for e in messages_in(sync, room_id)]
            if since == sync["next_batch"] or set(acknowledged.values()) <= set(seen):
                break
            since = sync["next_batch"]
        self.assertEqual(sorted(seen), sorted(acknowledged.values()))
        self.assertEqual(len(seen), len(set(seen)))

        command.signal(signal.SIGTERM)
        self.assertEqual(await command.wait_exit(), 0, command.tail())

    async def writer_of(self, room_id: str, test_db: Any, config_path: str) -> str:
        if test_db.engine_name == "sqlite":
            path = load_config(config_path).database.args["path"]
            with sqlite3.connect(path) as db:
                row = db.execute("SELECT event_writer FROM rooms WHERE room_id = ?", (room_id,))
                return str(row.fetchone()[0])
        import psycopg2

        conn = psycopg2.connect(**test_db.args)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT event_writer FROM rooms WHERE room_id = %s", (room_id,))
                return str(cur.fetchone()[0])
        finally:
            conn.close()
