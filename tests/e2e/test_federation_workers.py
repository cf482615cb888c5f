"""End to end: federation across workers, as real processes under
``synapse-lite run``.

* ``b.test``: the main process (no federation listener), two federation
  readers and the router with a federation port. Signed requests from
  ``a.test`` through that port (a profile query, a key request, to-device
  transactions) are answered by a reader; client paths are not served there.
* ``a.test``: the main process and two federation senders
  (``federation_sender_instances``). Besides ``b.test``, its destinations
  ``c0.test``..``c7.test`` are a recorder in this test, which answers every
  transaction as a server would and keeps what arrived. Each destination is
  sent to only by the sender the rendezvous hash gives it; a third sender
  added with ``synapse-lite reload`` while messages are queued restarts only
  the senders, takes over the destinations it now wins, and nothing is lost
  or delivered twice.

PostgreSQL with Redis replication (a production layout; the scenario runs on
one engine: docs/testing.md, "Decisions").
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, cast

import treq
import yaml
from twisted.internet import reactor, task
from twisted.trial import unittest
from twisted.web import resource, server

from synapse_lite.federation.auth import parse_auth_header, sign_request
from synapse_lite.federation.crypto import SigningKey, signing_key_path
from synapse_lite.federation.senders import sender_of
from tests.harness.client_api import ClientApi
from tests.harness.databases import (
    END_TO_END,
    create_test_database,
    one_engine_only,
)
from tests.harness.launcher import SynapseLiteCommand, temp_dir
from tests.harness.processes import NO_KEEPALIVE, free_port, layout_config
from tests.harness.services import require_redis

RECORDED = [f"c{i}.test" for i in range(8)]
DEADLINE_SECONDS = 30.0


class Recorder(resource.Resource):
    """Other servers, as far as a sender can tell: answers every
    ``PUT /_matrix/federation/v1/send/{txnId}`` 200 and keeps, per
    destination, each transaction id with the message ids it carried."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        #: destination -> txn id -> [(message_id, content)]
        self.transactions: dict[str, dict[str, list[tuple[str, Any]]]] = {}

    def render_PUT(self, request: Any) -> bytes:
        auth = parse_auth_header(request.getHeader("Authorization") or "")
        txn_id = request.path.decode().rsplit("/", 1)[-1]
        body = json.loads(request.content.read())
        messages = []
        for edu in body.get("edus", []):
            content = edu["content"]
            for devices in content["messages"].values():
                messages.append((content["message_id"], devices["*"]))
        assert auth.destination is not None
        self.transactions.setdefault(auth.destination, {})[txn_id] = messages
        request.setHeader(b"Content-Type", b"application/json")
        return b'{"pdus": {}}'

    def received(self, destination: str) -> list[Any]:
        """What ``destination`` got, in order; a message id carried by two
        different transactions (a duplicate the receiver could not dedupe
        by transaction id) counts twice."""
        return [
            c for messages in self.transactions.get(destination, {}).values() for _, c in messages
        ]


class FederationWorkersTestCase(unittest.TestCase):
    timeout = 300

    async def test_readers_and_sharded_senders(self) -> None:
        one_engine_only("postgres", END_TO_END)
        transport = "redis"
        require_redis()
        self.recorder = Recorder()
        port: Any = cast(Any, reactor).listenTCP(
            0, server.Site(self.recorder), interface="127.0.0.1"
        )
        self.addCleanup(port.stopListening)
        recorder_url = f"http://127.0.0.1:{port.getHost().port}"

        a_port, b_federation = free_port(), free_port()
        self.b_path = self.write_config(
            "b.test",
            transport,
            {
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
        self.a_path = self.write_config(
            "a.test",
            transport,
            {"sender1": ["health"], "sender2": ["health"]},
            listeners=[
                {
                    "port": a_port,
                    "resources": [
                        "client",
                        "replication",
                        "health",
                        "metrics",
                        "federation",
                        "keys",
                    ],
                }
            ],
            federation_sender_instances=["sender1", "sender2"],
            federation={
                "destinations": {
                    "b.test": f"http://127.0.0.1:{b_federation}",
                    **{name: recorder_url for name in RECORDED},
                },
                "retry": {"initial_seconds": 1, "max_seconds": 2},
            },
        )
        self.b_run = await self.run_server(self.b_path)
        self.a_run = await self.run_server(self.a_path)
        b_config, a_config = self.load(self.b_path), self.load(self.a_path)
        self.b_federation = f"http://127.0.0.1:{b_federation}"
        self.alice = await ClientApi(self, self.client_url(a_config)).register("alice")
        self.bob = await ClientApi(self, self.client_url(b_config)).register("bob")
        self.bob_since = (await self.bob.sync())["next_batch"]

        await self.step_signed_requests_answered_by_a_reader(a_config)
        await self.step_each_destination_by_its_sender()
        await self.step_a_third_sender_added_by_reload()

    # Steps

    async def step_signed_requests_answered_by_a_reader(self, a_config: dict[str, Any]) -> None:
        # b's main process has no federation listener: only a reader can answer.
        key = self.signing_key(a_config)
        code, answer = await self.signed_get(
            key, "/_matrix/federation/v1/query/profile?user_id=%40bob%3Ab.test"
        )
        self.assertEqual(code, 200, answer)
        self.assertIsInstance(answer, dict)
        code, answer = await self.signed_get(key, "/_matrix/federation/v1/query/profile")
        self.assertEqual(code, 400, answer)  # the reader's own refusal, not a 404
        code, answer = await self.get(self.b_federation + "/_matrix/key/v2/server")
        self.assertEqual((code, answer["server_name"]), (200, "b.test"))
        code, _ = await self.get(self.b_federation + "/_matrix/client/versions")
        self.assertEqual(code, 404)

    async def step_each_destination_by_its_sender(self) -> None:
        await self.send_batch("first")
        await self.wait_delivered("first")
        senders = ["sender1", "sender2"]
        owners = {d: sender_of(d, senders) for d in [*RECORDED, "b.test"]}
        self.assertEqual(set(owners.values()), set(senders))  # both have some
        self.check_senders(self.a_run.output(), owners)
        # Every transaction of a.test reached b.test through one reader.
        received = re.findall(
            r" (\S+) INFO .*Received transaction \S+ from a\.test", self.b_run.output()
        )
        self.assertTrue(received)
        self.assertEqual(len(set(received)), 1, received)
        self.assertIn(received[0], ("reader1", "reader2"))

    async def step_a_third_sender_added_by_reload(self) -> None:
        # Queued, and perhaps in flight, while the senders restart.
        await self.send_batch("second")

        def add_sender(config: dict[str, Any]) -> None:
            config["workers"]["sender3"] = {
                "listeners": [{"port": free_port(), "resources": ["health"]}]
            }
            config["federation_sender_instances"].append("sender3")

        self.edit(self.a_path, add_sender)
        mark = len(self.a_run.lines)
        reload = SynapseLiteCommand(
            self, ["reload", "-c", self.a_path], temp_dir(), temp_dir()
        ).start()
        self.assertEqual(await reload.wait_exit(), 0, reload.output())
        line = await self.a_run.wait_for_line(r"Reloading .*: stopping", after=mark)
        self.assertIn("stopping sender1, sender2; starting sender1, sender2, sender3", line.string)
        await self.a_run.wait_for_line(r"Reload of .* done", after=mark)
        mark = len(self.a_run.lines)
        await self.send_batch("third")
        await self.wait_delivered("second", "third")
        senders = ["sender1", "sender2", "sender3"]
        before = {d: sender_of(d, ["sender1", "sender2"]) for d in [*RECORDED, "b.test"]}
        owners = {d: sender_of(d, senders) for d in [*RECORDED, "b.test"]}
        moved = {d for d in owners if owners[d] != before[d]}
        self.assertTrue(moved)
        self.assertEqual({owners[d] for d in moved}, {"sender3"})  # only to the new one
        self.check_senders("\n".join(self.a_run.lines[mark:]), owners)
        outbox = self.query(self.a_path, "SELECT COUNT(*) FROM device_federation_outbox")
        self.assertEqual(outbox, [(0,)])

    # Helpers

    def write_config(
        self, name: str, transport: str, workers: dict[str, list[str]], **extra: Any
    ) -> str:
        db = create_test_database()
        self.addCleanup(db.drop)
        directory = temp_dir()
        config = layout_config(db, workers, {}, transport=transport, server_name=name, **extra)
        config["data_dir"] = directory
        config["position_log"] = False
        path = f"{directory}/homeserver.yaml"
        with open(path, "w") as f:
            yaml.safe_dump(config, f, sort_keys=False)
        self.databases = getattr(self, "databases", {})
        self.databases[path] = db
        return path

    def load(self, path: str) -> dict[str, Any]:
        with open(path) as f:
            loaded: dict[str, Any] = yaml.safe_load(f)
        return loaded

    def edit(self, path: str, change: Any) -> None:
        config = self.load(path)
        change(config)
        with open(path, "w") as f:
            yaml.safe_dump(config, f, sort_keys=False)

    async def run_server(self, path: str) -> SynapseLiteCommand:
        directory = self.load(path)["data_dir"]
        command = SynapseLiteCommand(self, ["run", "-c", path], directory, directory).start()
        await command.wait_for_line(r"processes up in", timeout=120)
        return command

    def client_url(self, config: dict[str, Any]) -> str:
        listeners = config["router"]["listeners"] if "router" in config else config["listeners"]
        port = next(lst["port"] for lst in listeners if "client" in lst["resources"])
        return f"http://127.0.0.1:{port}"

    def signing_key(self, config: dict[str, Any]) -> SigningKey:
        path = signing_key_path(config["data_dir"])
        with open(path) as f:
            return SigningKey.from_line(f.read(), path)

    def query(self, path: str, sql: str) -> list[Any]:
        conn = self.databases[path].make_engine().connect()
        try:
            cursor = conn.cursor()
            cursor.execute(sql)
            return list(cursor.fetchall())
        finally:
            conn.close()

    async def get(
        self, url: str, headers: dict[bytes | str, bytes | str] | None = None
    ) -> tuple[int, Any]:
        response = await treq.get(url, headers=headers, pool=NO_KEEPALIVE)
        body = await treq.content(response)
        try:
            return response.code, json.loads(body)
        except ValueError:
            return response.code, body

    async def signed_get(self, key: SigningKey, path: str) -> tuple[int, Any]:
        header = sign_request(key, "a.test", "b.test", "GET", path)
        return await self.get(self.b_federation + path, {"Authorization": header})

    async def send_batch(self, batch: str) -> None:
        messages = {f"@u:{d}": {"*": {"batch": batch}} for d in RECORDED}
        messages["@bob:b.test"] = {"*": {"batch": batch}}
        body = {"messages": messages}
        await self.alice.ok("PUT", f"/sendToDevice/m.test/{batch}", body)

    async def wait_delivered(self, *batches: str) -> None:
        """Until every destination has every message of ``batches``; then
        check nothing came twice."""
        expected = [{"batch": b} for b in batches]
        deadline = time.monotonic() + DEADLINE_SECONDS
        while True:
            got = {d: [c for c in self.recorder.received(d) if c in expected] for d in RECORDED}
            if all(len(v) >= len(expected) for v in got.values()):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"not delivered in time: {got}")
            await task.deferLater(reactor, 0.1, lambda: None)
        await task.deferLater(reactor, 0.5, lambda: None)  # a duplicate would show up by now
        for destination in RECORDED:
            got_now = [c for c in self.recorder.received(destination) if c in expected]
            self.assertEqual(got_now, expected, destination)
        # bob's side: through b's router and a reader, to his /sync, once each.
        events: list[Any] = []
        while time.monotonic() < deadline + DEADLINE_SECONDS:
            response = await self.bob.sync(since=self.bob_since, timeout=1000)
            events = [e["content"] for e in response["to_device"]["events"]]
            if len(events) >= len(expected):
                break
        self.assertEqual(events, expected)
        self.bob_since = response["next_batch"]

    def check_senders(self, output: str, owners: dict[str, str]) -> None:
        """Every transaction logged in ``output`` went out from its
        destination's owner."""
        sent = re.findall(r" (sender\d) INFO .*Sending transaction \S+ to (\S+):", output)
        self.assertTrue(sent)
        for sender, destination in sent:
            self.assertEqual(sender, owners[destination], destination)
        self.assertEqual({d for _, d in sent}, set(owners))
