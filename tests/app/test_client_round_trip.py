"""A Matrix client against a launched homeserver: a round trip through every
process, users created with `synapse-lite register-user`, and an events writer
killed while messages are being sent, with nothing acknowledged lost or
delivered twice."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import sqlite3
import urllib.parse
from typing import Any

import treq
from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from synapse_lite.app.launch_plan import plan_processes
from synapse_lite.config.homeserver import load_config
from tests.harness.databases import END_TO_END, one_engine_only
from tests.harness.launcher import (
    SynapseLiteCommand,
    edit_config,
    free_port_block,
    http_get,
    launch,
    temp_dir,
)
from tests.harness.polling import eventually
from tests.harness.processes import NO_KEEPALIVE

#: A /sync filter: the whole timeline since the token, not its last 10 events.
TIMELINE_FILTER = urllib.parse.quote(json.dumps({"room": {"timeline": {"limit": 1000}}}))


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
        # The default command always runs on SQLite, whatever the run's engine.
        one_engine_only("sqlite", END_TO_END)
        require_client_api()
        self.dir = temp_dir()

    async def launch_default(self) -> tuple[SynapseLiteCommand, str, dict[str, str]]:
        """The default command (first run: generates the default layout)."""
        data_dir = os.path.join(self.dir, "data")
        args = ["run", "--data-dir", data_dir, "--enable-registration"]
        args += ["--base-port", str(free_port_block(10))]
        command = SynapseLiteCommand(self, args, self.dir, data_dir).start()
        await command.wait_for_line(r"6 processes up in")
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
        one_engine_only("postgres", END_TO_END)
        require_client_api()
        server = await launch(self, enable_registration=True)
        command, config_path, test_db = server.command, server.config_path, server.test_db
        main, sync_worker = server.url("main"), server.url("synchrotron1")
        _, alice = await register(main, "alice")
        code, room = await call("POST", f"{main}/_matrix/client/v3/createRoom", {}, alice)
        self.assertEqual(code, 200, room)
        room_id = room["room_id"]

        sync_url = f"{sync_worker}/_matrix/client/v3/sync?timeout=0&filter={TIMELINE_FILTER}"
        code, first = await call("GET", sync_url, token=alice)
        self.assertEqual(code, 200, first)

        acknowledged: dict[str, str] = {}  # txn id -> event id
        total = 120

        async def send(i: int) -> None:
            url = f"{sync_worker}/_matrix/client/v3/rooms/{room_id}/send/m.room.message/txn{i}"
            for _ in range(300):
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
        writer = await writer_of(room_id, test_db, config_path)
        before_kill = command.mark()
        os.kill(command.running_pids()[writer], signal.SIGKILL)
        await senders
        await command.wait_for_line(rf"Restarted {writer} \(pid \d+\)", after=before_kill)

        # Incremental syncs from before the first send deliver every
        # acknowledged event, each once.
        seen: list[str] = []
        since = first["next_batch"]
        for _ in range(100):
            code, sync = await call("GET", f"{sync_url}&since={since}", token=alice)
            self.assertEqual(code, 200, sync)
            seen += [e["event_id"] for e in messages_in(sync, room_id)]
            since = sync["next_batch"]
            if set(acknowledged.values()) <= set(seen):
                break
            await task.deferLater(reactor, 0.1, lambda: None)
        code, after = await call("GET", f"{sync_url}&since={since}", token=alice)
        seen += [e["event_id"] for e in messages_in(after, room_id)]
        self.assertEqual(sorted(seen), sorted(acknowledged.values()))
        self.assertEqual(len(seen), total)

        command.signal(signal.SIGTERM)
        self.assertEqual(await command.wait_exit(), 0, command.tail())


class EventsWriterChangesTestCase(unittest.TestCase):
    """`synapse-lite reload` adds persister3, then removes persister2, while a
    client keeps chatting: new rooms land on persister3 and every process
    serves them; persister2's rooms move on; no event is lost and
    persisted-up-to keeps advancing on every process."""

    timeout = 300

    async def test_add_and_remove_events_writers_under_use(self) -> None:
        one_engine_only("postgres", END_TO_END)
        require_client_api()
        server = await launch(self, enable_registration=True)
        command, config_path, test_db = server.command, server.config_path, server.test_db
        main, sync_worker = server.url("main"), server.url("synchrotron1")
        _, alice = await register(main, "alice")
        sent: list[str] = []

        async def send(room_id: str, text: str) -> None:
            url = f"{sync_worker}/_matrix/client/v3/rooms/{room_id}/send/m.room.message/{text}"
            for _ in range(100):
                code, answer = await call("PUT", url, {"msgtype": "m.text", "body": text}, alice)
                if code == 200:
                    sent.append(answer["event_id"])
                    return
                await task.deferLater(reactor, 0.1, lambda: None)
            raise AssertionError(f"{text} was never acknowledged")

        async def room_on(writer: str) -> str:
            for _ in range(30):
                code, room = await call("POST", f"{main}/_matrix/client/v3/createRoom", {}, alice)
                self.assertEqual(code, 200, room)
                if await writer_of(room["room_id"], test_db, config_path) == writer:
                    return str(room["room_id"])
            raise AssertionError(f"no new room went to {writer}")

        on_persister2 = await room_on("persister2")
        await send(on_persister2, "before")

        async def reload(change: Any) -> None:
            edit_config(config_path, change)
            mark = command.mark()
            request = server.run_command(self, "reload")
            self.assertEqual(await request.wait_exit(), 0, request.output())
            await command.wait_for_line(r"Reload of .* done", after=mark)

        def add(config: dict[str, Any]) -> None:
            port = config["listeners"][0]["port"] + 7  # after the router's federation port
            config["workers"]["persister3"] = {
                "listeners": [{"port": port, "resources": ["replication", "health", "metrics"]}]
            }
            config["stream_writers"]["events"].append("persister3")

        await reload(add)
        on_persister3 = await room_on("persister3")  # chosen by main, never restarted
        await send(on_persister3, "on-the-new-writer")

        def remove(config: dict[str, Any]) -> None:
            del config["workers"]["persister2"]
            config["stream_writers"]["events"].remove("persister2")

        await reload(remove)
        self.assertNotEqual(await writer_of(on_persister2, test_db, config_path), "persister2")
        await send(on_persister2, "after")
        await send(on_persister3, "still-there")

        # Every message, once, in each room's history as any process serves it.
        for base in (main, sync_worker):
            history: list[str] = []
            for room_id in (on_persister2, on_persister3):
                code, page = await call(
                    "GET",
                    f"{base}/_matrix/client/v3/rooms/{room_id}/messages?dir=b&limit=100",
                    token=alice,
                )
                self.assertEqual(code, 200, page)
                history += [e["event_id"] for e in page["chunk"] if e["type"] == "m.room.message"]
            self.assertEqual(sorted(history), sorted(sent), base)

        # Persisted-up-to has passed the last event on every process.
        last = await stream_ordering_of(sent[-1], test_db, config_path)

        async def all_past_last() -> bool:
            for spec in plan_processes(load_config(config_path)):
                if spec.reads is not None and "events" not in spec.reads:
                    continue  # the media worker and the router read no events
                _, body = await http_get(spec.metrics_url or "")
                match = re.search(
                    r'synapse_lite_stream_persisted_upto\{stream="events"\} ([0-9.e+]+)',
                    body.decode(),
                )
                if match is None or float(match.group(1)) < last:
                    return False
            return True

        await eventually(
            all_past_last, 30, "persisted-up-to to pass the last event everywhere", 0.2
        )
        command.signal(signal.SIGTERM)
        self.assertEqual(await command.wait_exit(), 0, command.tail())


def query_database(test_db: Any, config_path: str, sql: str, arg: str) -> Any:
    """One value from the homeserver's database (SQLite file or PostgreSQL)."""
    if test_db.engine_name == "sqlite":
        with sqlite3.connect(load_config(config_path).database.args["path"]) as db:
            return db.execute(sql, (arg,)).fetchone()[0]
    import psycopg2

    conn = psycopg2.connect(**test_db.args)
    try:
        with conn.cursor() as cur:
            cur.execute(sql.replace("?", "%s"), (arg,))
            return cur.fetchone()[0]
    finally:
        conn.close()


async def writer_of(room_id: str, test_db: Any, config_path: str) -> str:
    sql = "SELECT event_writer FROM rooms WHERE room_id = ?"
    return str(query_database(test_db, config_path, sql, room_id))


async def stream_ordering_of(event_id: str, test_db: Any, config_path: str) -> int:
    sql = "SELECT stream_ordering FROM events WHERE event_id = ?"
    return int(query_database(test_db, config_path, sql, event_id))
