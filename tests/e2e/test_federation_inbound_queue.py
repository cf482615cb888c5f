"""End to end: the durable inbound queue (docs/federation.md, "Inbound: the
durable queue") with real processes under ``synapse-lite run``.

* ``b.test``: the main process, an events writer ``writer1``, two
  federation readers and the router with a federation port.
* ``a.test``: a main process serving federation, sending to ``b.test``.

bob of ``b.test`` joins alice's room on ``a.test``. Then ``writer1`` is
stopped (SIGSTOP: held back, as a writer that is slow or hung) and alice
sends a message: the reader that receives the transaction queues the PDU,
waits for the writer in vain and answers 200 ``{}``; once that answer is
recorded, the reader is killed with SIGKILL (the launcher restarts it).
The PDU is still queued and not persisted. ``writer1`` is let go (SIGCONT):
its sweep persists the PDU, bob sees the message once, and the queue is
empty.

SQLite with TCP replication (the embedded default; the scenario runs on one
engine: docs/testing.md, "Decisions").
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any
from urllib.parse import quote

from twisted.internet import reactor, task
from twisted.trial import unittest

from tests.e2e import test_federation_workers as workers
from tests.harness.client_api import ClientApi
from tests.harness.databases import END_TO_END, one_engine_only
from tests.harness.processes import free_port

DEADLINE_SECONDS = 60.0


class InboundQueueProcessesTestCase(unittest.TestCase):
    timeout = 300

    # The two-server helpers of the federation workers test (its methods,
    # borrowed: subclassing it would run its test here too).
    write_config: Any = workers.FederationWorkersTestCase.write_config
    load: Any = workers.FederationWorkersTestCase.load
    edit: Any = workers.FederationWorkersTestCase.edit
    run_server: Any = workers.FederationWorkersTestCase.run_server
    client_url: Any = workers.FederationWorkersTestCase.client_url
    query: Any = workers.FederationWorkersTestCase.query

    async def test_a_reader_killed_after_answering_loses_nothing(self) -> None:
        one_engine_only("sqlite", END_TO_END)
        transport = "tcp"
        a_port, b_federation = free_port(), free_port()
        self.b_path = self.write_config(
            "b.test",
            transport,
            {
                "writer1": ["client", "replication", "health"],
                "reader1": ["federation", "keys", "health"],
                "reader2": ["federation", "keys", "health"],
            },
            router={
                "listeners": [
                    {"port": free_port(), "resources": ["client", "health"]},
                    {"port": b_federation, "resources": ["federation"]},
                ]
            },
            federation={"destinations": {"a.test": f"http://127.0.0.1:{a_port}"}},
        )
        self.edit(self.b_path, lambda c: c.update(stream_writers={"events": ["writer1"]}))
        self.a_path = self.write_config(
            "a.test",
            transport,
            {},
            listeners=[
                {
                    "port": a_port,
                    "resources": ["client", "replication", "health", "federation", "keys"],
                }
            ],
            federation={
                "destinations": {"b.test": f"http://127.0.0.1:{b_federation}"},
                "retry": {"initial_seconds": 1, "max_seconds": 2},
            },
        )
        b_run = await self.run_server(self.b_path)
        a_run = await self.run_server(self.a_path)
        alice = await ClientApi(self, self.client_url(self.load(self.a_path))).register("alice")
        bob = await ClientApi(self, self.client_url(self.load(self.b_path))).register("bob")
        room_id = await alice.create_room(preset="public_chat")
        await bob.ok("POST", f"/join/{quote(room_id)}?server_name=a.test", {})
        await alice.send(room_id, "before")
        await self.seen_by(bob, room_id, ["before"])

        writer_pid = b_run.running_pids()["writer1"]
        os.kill(writer_pid, signal.SIGSTOP)
        self.addCleanup(self.resume, writer_pid)
        mark = len(b_run.lines)
        held = await alice.send(room_id, "held")
        line = await b_run.wait_for_line(
            r" (reader\d) INFO .*did not take the queue of .*: it will",
            after=mark,
            timeout=DEADLINE_SECONDS,
        )
        reader = line.group(1)
        # Answered: its response (the PDU accepted, {}) is recorded.
        await self.until(lambda: self.recorded_answer(held) is not None)
        self.assertEqual(self.recorded_answer(held), {})
        self.assertEqual(self.queued(), [held])
        self.assertEqual(self.stored(held), 0)
        os.kill(b_run.running_pids()[reader], signal.SIGKILL)
        await b_run.wait_for_line(rf"{reader} \(pid \d+\) died", after=mark)

        self.resume(writer_pid)
        await self.seen_by(bob, room_id, ["before", "held"])
        self.assertEqual(self.queued(), [])
        self.assertEqual(self.stored(held), 1)
        del a_run

    # Helpers

    def resume(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def queued(self) -> list[str]:
        rows = self.query(self.b_path, "SELECT event_id FROM inbound_pdu_queue ORDER BY queue_id")
        return [str(r[0]) for r in rows]

    def stored(self, event_id: str) -> int:
        rows = self.query(self.b_path, f"SELECT COUNT(*) FROM events WHERE event_id = '{event_id}'")
        return int(rows[0][0])

    def recorded_answer(self, event_id: str) -> Any:
        """b.test's recorded answer for ``event_id`` in a transaction from
        a.test, if any."""
        rows = self.query(
            self.b_path,
            "SELECT response_json FROM received_transactions WHERE origin = 'a.test'",
        )
        for (text,) in rows:
            pdus = json.loads(text).get("pdus", {})
            if event_id in pdus:
                return pdus[event_id]
        return None

    async def until(self, check: Any) -> None:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError("not in time")
            await task.deferLater(reactor, 0.2, lambda: None)

    async def seen_by(self, client: ClientApi, room_id: str, bodies: list[str]) -> None:
        """Until ``client`` reads exactly ``bodies`` (in order) as the
        room's messages."""
        deadline = time.monotonic() + DEADLINE_SECONDS
        got: list[str] = []
        while time.monotonic() < deadline:
            code, answer = await client.request(
                "GET", f"/rooms/{quote(room_id)}/messages?dir=b&limit=50"
            )
            if code == 200:
                got = [
                    e["content"]["body"]
                    for e in reversed(answer["chunk"])
                    if e["type"] == "m.room.message"
                ]
                if got == bodies:
                    return
                self.assertEqual(got, bodies[: len(got)])
            await task.deferLater(reactor, 0.3, lambda: None)
        raise AssertionError(f"{client.user_id} read {got}, not {bodies}")
