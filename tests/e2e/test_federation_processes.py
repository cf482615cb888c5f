"""End to end: two homeservers, ``a.test`` and ``b.test``, each a main process
(client, federation and key APIs) and a federation sender worker, as real
processes on loopback, each on its own database.

One scenario, in steps sharing the launched servers: a to-device message
arrives exactly once; forged and replayed requests change nothing; with b
stopped, a queues; b's first request to a after it comes back resets a's
backoff (REMOTE_SERVER_UP) and everything queued arrives once, in order; a's
sender killed mid-transaction resumes without loss or duplicate.

SQLite with TCP replication (the embedded default; the scenario runs on one
engine: docs/testing.md, "Decisions").
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import treq
from twisted.internet import reactor, task
from twisted.trial import unittest

from synapse_lite.federation.auth import sign_request
from synapse_lite.federation.crypto import SigningKey, signing_key_path
from tests.harness.client_api import ClientApi
from tests.harness.databases import (
    END_TO_END,
    TestDatabase,
    create_test_database,
    one_engine_only,
)
from tests.harness.federation import to_device_transaction
from tests.harness.processes import NO_KEEPALIVE, ServerProcesses, free_port, layout_config

SENDER = "fed_sender"
MAIN_RESOURCES = ["client", "replication", "health", "federation", "keys"]
#: Far longer than any step waits: only REMOTE_SERVER_UP can end a backoff in time.
BACKOFF_SECONDS = 120
DEADLINE_SECONDS = 30.0


class Server:
    """One launched homeserver and what the test knows about it."""

    def __init__(self, name: str, db: TestDatabase, processes: ServerProcesses) -> None:
        self.name = name
        self.db = db
        self.processes = processes

    def url(self) -> str:
        return self.processes.url("main")

    def signing_key(self) -> SigningKey:
        path = signing_key_path(self.processes.config["data_dir"])
        with open(path) as f:
            return SigningKey.from_line(f.read(), path)

    def query(self, sql: str) -> list[Any]:
        conn = self.db.make_engine().connect()
        try:
            cursor = conn.cursor()
            cursor.execute(sql)
            return list(cursor.fetchall())
        finally:
            conn.close()

    def log(self, process: str) -> str:
        with open(self.processes.processes[process].log_path, errors="replace") as f:
            return f.read()


class FederationProcessesTestCase(unittest.TestCase):
    timeout = 300

    async def test_two_servers(self) -> None:
        one_engine_only("sqlite", END_TO_END)
        transport = "tcp"
        ports = {"a.test": free_port(), "b.test": free_port()}
        self.a = self.make_server("a.test", ports, transport)
        self.b = self.make_server("b.test", ports, transport)
        await self.a.processes.start()
        await self.b.processes.start()
        self.alice = await ClientApi(self, self.a.url()).register("alice")
        self.bob = await ClientApi(self, self.b.url()).register("bob")
        self.bob_since = (await self.bob.sync())["next_batch"]
        self.alice_since = (await self.alice.sync())["next_batch"]

        await self.step_exactly_once()
        await self.step_forged_and_replayed()
        await self.step_receiver_stopped()
        await self.step_sender_killed_mid_transaction()

    def make_server(self, name: str, ports: dict[str, int], transport: str) -> Server:
        db = create_test_database()
        self.addCleanup(db.drop)
        config = layout_config(
            db,
            {SENDER: ["replication", "health"]},
            {},
            transport=transport,
            server_name=name,
            listeners=[{"port": ports[name], "resources": MAIN_RESOURCES}],
            federation_sender=SENDER,
            federation={
                "destinations": {n: f"http://127.0.0.1:{p}" for n, p in ports.items()},
                "retry": {"initial_seconds": BACKOFF_SECONDS, "max_seconds": BACKOFF_SECONDS},
                "request_timeout_seconds": 30,
            },
        )
        return Server(name, db, ServerProcesses(self, config))

    # Helpers

    async def send(self, sender: ClientApi, recipient: str, contents: list[Any]) -> None:
        for content in contents:
            txn = f"t{time.monotonic_ns()}"
            messages = {recipient: {"*": content}}
            await sender.ok("PUT", f"/sendToDevice/m.test/{txn}", {"messages": messages})

    async def receive(self, who: str, count: int) -> list[Any]:
        """Wait for ``count`` to-device messages for bob (or alice) past the
        last acknowledged token; check no more follow; acknowledge them."""
        client = self.bob if who == "bob" else self.alice
        since = self.bob_since if who == "bob" else self.alice_since
        deadline = time.monotonic() + DEADLINE_SECONDS
        while True:
            response = await client.sync(since=since, timeout=1000)
            events = response["to_device"]["events"]
            if len(events) >= count:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{who} got {len(events)} of {count} messages: {events}")
        await task.deferLater(reactor, 1.0, lambda: None)  # a duplicate would show up by now
        again = await client.sync(since=since)
        self.assertEqual(again["to_device"]["events"], events)
        next_batch = again["next_batch"]
        if who == "bob":
            self.bob_since = next_batch
        else:
            self.alice_since = next_batch
        return [e["content"] for e in events]

    async def put_to_b(self, txn_id: str, body: dict[str, Any], key: SigningKey) -> tuple[int, Any]:
        path = f"/_matrix/federation/v1/send/{txn_id}"
        header = sign_request(key, "a.test", "b.test", "PUT", path, body)
        headers: dict[bytes | str, list[bytes | str]] = {
            "Content-Type": ["application/json"],
            "Authorization": [header],
        }
        response = await treq.put(
            self.b.url() + path, data=json.dumps(body).encode(), headers=headers, pool=NO_KEEPALIVE
        )
        return response.code, json.loads(await treq.content(response))

    async def wait_for(self, condition: Any, what: str, timeout: float = DEADLINE_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await task.deferLater(reactor, 0.1, lambda: None)

    # Steps

    async def step_exactly_once(self) -> None:
        await self.send(self.alice, "@bob:b.test", [{"n": i} for i in range(3)])
        self.assertEqual(await self.receive("bob", 3), [{"n": 0}, {"n": 1}, {"n": 2}])
        await self.wait_for(
            lambda: self.a.query("SELECT COUNT(*) FROM device_federation_outbox")[0][0] == 0,
            "a's outbox to empty",
        )

    async def step_forged_and_replayed(self) -> None:
        real = self.a.signing_key()
        forged = SigningKey(real.version, os.urandom(32))
        body = to_device_transaction("replayed-1", "@bob:b.test", {"replayed": True})
        code, answer = await self.put_to_b("forged-1", body, forged)
        self.assertEqual((code, answer.get("errcode")), (401, "M_UNAUTHORIZED"))
        await self.wait_for(
            lambda: "Refused an unauthenticated federation request" in self.b.log("main"),
            "b to log the refusal",
        )
        first = await self.put_to_b("replay-1", body, real)
        self.assertEqual(first, (200, {"pdus": {}}))
        self.assertEqual(await self.put_to_b("replay-1", body, real), first)
        self.assertEqual((await self.put_to_b("replay-2", body, real))[0], 200)
        self.assertEqual(await self.receive("bob", 1), [{"replayed": True}])

    async def step_receiver_stopped(self) -> None:
        for name in (SENDER, "main"):
            await self.b.processes.stop(name)
        await self.send(self.alice, "@bob:b.test", [{"queued": i} for i in range(5)])
        await self.wait_for(
            lambda: (
                self.a.query("SELECT retry_interval FROM destinations WHERE destination = 'b.test'")
                == [(BACKOFF_SECONDS * 1000,)]
            ),
            "a to back off from b",
        )
        self.assertEqual(self.a.query("SELECT COUNT(*) FROM device_federation_outbox")[0][0], 5)
        await self.b.processes.start()
        # b's first request to a: a message from bob. a sees b is up and its
        # sender stops backing off at once (the backoff would last minutes).
        started = time.monotonic()
        await self.send(self.bob, "@alice:a.test", [{"hello": "from b"}])
        self.assertEqual(await self.receive("alice", 1), [{"hello": "from b"}])
        self.assertEqual(await self.receive("bob", 5), [{"queued": i} for i in range(5)])
        self.assertLess(time.monotonic() - started, BACKOFF_SECONDS / 2)
        self.assertIn("b.test is up again", self.a.log("main"))
        self.assertIn("b.test is up again", self.a.log(SENDER))
        self.assertEqual(self.a.query("SELECT COUNT(*) FROM device_federation_outbox")[0][0], 0)

    async def step_sender_killed_mid_transaction(self) -> None:
        # b's main (which serves federation) stops reading: a's PUT hangs.
        self.b.processes.pause("main")
        resumed = False
        try:
            mark = self.a.log(SENDER).count("Sending transaction")
            await self.send(self.alice, "@bob:b.test", [{"killed": i} for i in range(3)])
            await self.wait_for(
                lambda: self.a.log(SENDER).count("Sending transaction") > mark,
                "a's sender to send a transaction",
            )
            await task.deferLater(reactor, 0.3, lambda: None)
            await self.a.processes.kill(SENDER)
            self.b.processes.resume("main")
            resumed = True
            await self.a.processes.start(SENDER)
        finally:
            if not resumed:
                self.b.processes.resume("main")
        self.assertEqual(await self.receive("bob", 3), [{"killed": i} for i in range(3)])
