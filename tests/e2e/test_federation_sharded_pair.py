"""End to end: two homeservers of ours, each with federation readers and
sharded federation senders, as real processes under ``synapse-lite run``
(issue 32's real-process tests).

Each of ``a.test`` and ``b.test``: the router (a client port and a
federation port), the main process, an events writer ``persister1``, two
federation readers (``reader1``, ``reader2``) and two federation senders
(``sender1``, ``sender2``); each reaches the other through the other's
federation port. bob of b.test joins alice's room on a.test. In steps
sharing the servers:

* **both ways**: alice and bob take turns, ten messages; each reads all ten
  in order, once;
* **a reader killed after its 200**: b's events writer is held (SIGSTOP),
  alice sends; the b reader that received it answers 200 with the PDU
  queued, and is killed with SIGKILL (the launcher restarts it); the
  writer let go persists it: bob reads it once;
* **a sender killed mid-transaction**: b's readers are held (SIGSTOP), so
  a's PUT hangs; alice sends three messages; the a sender owning b.test
  logs the transaction and is killed with SIGKILL (the launcher restarts
  it); b's readers let go: bob reads the three once (b answers the copy the
  restarted sender sends again, with the same id, from its record);
* **a third sender added with reload during traffic**: alice sends 30
  messages while ``synapse-lite reload`` adds a sender that wins b.test by
  the rendezvous hash (so b.test changes hands): bob reads the 30 in order,
  none lost, none twice, and every transaction to b.test after the reload
  (three more messages) went out from the new sender.

PostgreSQL with Redis replication (a production layout; the scenario runs on
one engine: docs/testing.md, "Decisions").
"""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.parse
from typing import Any

from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from synapse_lite.federation.senders import sender_of
from tests.e2e import test_federation_workers as workers
from tests.harness.client_api import ClientApi
from tests.harness.databases import END_TO_END, one_engine_only
from tests.harness.launcher import SynapseLiteCommand, temp_dir
from tests.harness.processes import free_port
from tests.harness.services import require_redis

DEADLINE_SECONDS = 60.0
SENDERS = ["sender1", "sender2"]
READERS = ["reader1", "reader2"]


class ShardedPairTestCase(unittest.TestCase):
    timeout = 600

    # The two-server helpers of the federation workers test (borrowed:
    # subclassing it would run its test here too).
    write_config: Any = workers.FederationWorkersTestCase.write_config
    load: Any = workers.FederationWorkersTestCase.load
    edit: Any = workers.FederationWorkersTestCase.edit
    run_server: Any = workers.FederationWorkersTestCase.run_server
    client_url: Any = workers.FederationWorkersTestCase.client_url
    query: Any = workers.FederationWorkersTestCase.query

    async def test_two_sharded_servers(self) -> None:
        one_engine_only("postgres", END_TO_END)
        transport = "redis"
        require_redis()
        federation_ports = {"a.test": free_port(), "b.test": free_port()}
        self.paths = {
            name: self.server_config(name, transport, federation_ports) for name in federation_ports
        }
        self.runs = {name: await self.run_server(path) for name, path in self.paths.items()}
        urls = {name: self.client_url(self.load(path)) for name, path in self.paths.items()}
        self.alice = await ClientApi(self, urls["a.test"]).register("alice")
        self.bob = await ClientApi(self, urls["b.test"]).register("bob")
        self.room_id = await self.alice.create_room(preset="public_chat")
        quoted = urllib.parse.quote(self.room_id)
        await self.bob.ok("POST", f"/join/{quoted}?server_name=a.test", {})
        self.read = {self.alice.user_id: 0, self.bob.user_id: 0}

        await self.step_both_ways()
        await self.step_reader_killed_after_answering()
        await self.step_sender_killed_mid_transaction()
        await self.step_third_sender_added_during_traffic()

    # Steps

    async def step_both_ways(self) -> None:
        sent = []
        for i in range(10):
            client = self.alice if i % 2 == 0 else self.bob
            body = f"turn {i}"
            await client.send(self.room_id, body)
            sent.append(body)
            self.read[client.user_id] += 1  # its own message
            # A turn waits for the other side to have read the last one.
            other = self.bob if client is self.alice else self.alice
            await self.reads(other, [body])
        self.assertEqual(await self.messages(self.alice), sent)
        self.assertEqual(await self.messages(self.bob), sent)

    async def step_reader_killed_after_answering(self) -> None:
        b_run = self.runs["b.test"]
        writer = b_run.running_pids()["persister1"]
        os.kill(writer, signal.SIGSTOP)
        self.addCleanup(self.resume, writer)
        mark = b_run.mark()
        held = await self.alice.send(self.room_id, "held")
        line = await b_run.wait_for_line(
            r" (reader\d) INFO .*did not take the queue of .*: it will",
            after=mark,
            timeout=DEADLINE_SECONDS,
        )
        reader = line.group(1)
        await self.until(lambda: self.rows("b.test", "inbound_pdu_queue", held) == 1)
        self.assertEqual(self.rows("b.test", "events", held), 0)
        os.kill(b_run.running_pids()[reader], signal.SIGKILL)
        await b_run.wait_for_line(rf"{reader} \(pid \d+\) died", after=mark)
        self.resume(writer)
        await self.reads(self.bob, ["held"])
        self.assertEqual(self.rows("b.test", "inbound_pdu_queue", held), 0)
        self.assertEqual(self.rows("b.test", "events", held), 1)

    async def step_sender_killed_mid_transaction(self) -> None:
        a_run, b_run = self.runs["a.test"], self.runs["b.test"]
        owner = sender_of("b.test", SENDERS)
        # The reader killed before is restarted by the launcher.
        await self.until(lambda: all(r in b_run.running_pids() for r in READERS))
        await task.deferLater(reactor, 2.0, lambda: None)  # and listening
        readers = [b_run.running_pids()[r] for r in READERS]
        for pid in readers:
            os.kill(pid, signal.SIGSTOP)
            self.addCleanup(self.resume, pid)
        try:
            mark = a_run.mark()
            for i in range(3):
                await self.alice.send(self.room_id, f"killed {i}")
            line = await a_run.wait_for_line(
                rf" {owner} INFO .*Sending transaction (\S+) to b\.test: [1-9]",
                after=mark,
                timeout=DEADLINE_SECONDS,
            )
            txn_id = line.group(1)
            await task.deferLater(reactor, 0.5, lambda: None)
            os.kill(a_run.running_pids()[owner], signal.SIGKILL)
            await a_run.wait_for_line(rf"{owner} \(pid \d+\) died", after=mark)
        finally:
            for pid in readers:
                self.resume(pid)
        await self.reads(self.bob, [f"killed {i}" for i in range(3)])
        # The transaction in flight was applied by b once.
        pattern = rf"Received transaction {re.escape(txn_id)} from a\.test"
        received = re.findall(pattern, b_run.output())
        self.assertLessEqual(len(received), 1, received)

    async def step_third_sender_added_during_traffic(self) -> None:
        a_run = self.runs["a.test"]
        # A name that wins b.test, so b.test changes hands.
        third = next(
            n
            for n in (f"sender{i}" for i in range(3, 100))
            if sender_of("b.test", [*SENDERS, n]) == n
        )

        def add_sender(config: dict[str, Any]) -> None:
            config["workers"][third] = {
                "listeners": [{"port": free_port(), "resources": ["health"]}]
            }
            config["federation_sender_instances"].append(third)

        bodies = [f"during reload {i}" for i in range(30)]
        traffic = defer.ensureDeferred(self.send_slowly(bodies))
        await task.deferLater(reactor, 0.5, lambda: None)
        self.edit(self.paths["a.test"], add_sender)
        mark = a_run.mark()
        reload = SynapseLiteCommand(
            self, ["reload", "-c", self.paths["a.test"]], temp_dir(), temp_dir()
        ).start()
        self.assertEqual(await reload.wait_exit(), 0, reload.output())
        line = await a_run.wait_for_line(r"Reloading .*: stopping", after=mark)
        self.assertIn(f"starting sender1, sender2, {third}", line.string)
        await a_run.wait_for_line(r"Reload of .* done", after=mark)
        done = a_run.mark()
        await traffic
        later = [f"after reload {i}" for i in range(3)]
        await self.send_slowly(later)
        await self.reads(self.bob, bodies + later)
        after = re.findall(
            r" (\S+) INFO .*Sending transaction \S+ to b\.test:", "\n".join(a_run.lines[done:])
        )
        self.assertTrue(after)
        self.assertEqual(set(after), {third})

    # Helpers

    def server_config(self, name: str, transport: str, federation_ports: dict[str, int]) -> str:
        peer = next(n for n in federation_ports if n != name)
        path: str = self.write_config(
            name,
            transport,
            {
                "persister1": ["client", "replication", "health"],
                **{r: ["federation", "keys", "health"] for r in READERS},
                **{s: ["health"] for s in SENDERS},
            },
            router={
                "listeners": [
                    {"port": free_port(), "resources": ["client", "health"]},
                    {"port": federation_ports[name], "resources": ["federation"]},
                ]
            },
            federation_sender_instances=list(SENDERS),
            federation={
                "destinations": {peer: f"http://127.0.0.1:{federation_ports[peer]}"},
                "retry": {"initial_seconds": 1, "max_seconds": 2},
            },
        )
        self.edit(path, lambda c: c.update(stream_writers={"events": ["persister1"]}))
        return path

    async def send_slowly(self, bodies: list[str]) -> None:
        for body in bodies:
            await self.alice.send(self.room_id, body)
            await task.deferLater(reactor, 0.1, lambda: None)

    def resume(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def rows(self, server: str, table: str, event_id: str) -> int:
        sql = f"SELECT COUNT(*) FROM {table} WHERE event_id = '{event_id}'"
        return int(self.query(self.paths[server], sql)[0][0])

    async def until(self, check: Any) -> None:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError("not in time")
            await task.deferLater(reactor, 0.2, lambda: None)

    async def messages(self, client: ClientApi) -> list[str]:
        """The room's messages as ``client`` reads them, oldest first."""
        answer = await client.ok(
            "GET", f"/rooms/{urllib.parse.quote(self.room_id)}/messages?dir=b&limit=200"
        )
        return [
            e["content"]["body"] for e in reversed(answer["chunk"]) if e["type"] == "m.room.message"
        ]

    async def reads(self, client: ClientApi, bodies: list[str]) -> None:
        """Until ``client`` reads ``bodies`` after what it read before, in
        order; then check nothing more (a duplicate) follows."""
        read = self.read[client.user_id]
        expected_len = read + len(bodies)
        deadline = time.monotonic() + DEADLINE_SECONDS
        got: list[str] = []
        while time.monotonic() < deadline:
            got = await self.messages(client)
            if len(got) >= expected_len:
                break
            self.assertEqual(got[read:], bodies[: len(got) - read])
            await task.deferLater(reactor, 0.2, lambda: None)
        await task.deferLater(reactor, 1.0, lambda: None)  # a duplicate would show up by now
        got = await self.messages(client)
        self.assertEqual(got[read:], bodies, got)
        self.read[client.user_id] = len(got)
