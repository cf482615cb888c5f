"""Three hosts, one homeserver: main (and the router) on one network namespace,
the events writer on another, the /sync worker on a third; PostgreSQL and
Redis reached over that network; internal HTTP (and the router's relaying)
over TLS checked against the deployment's CA; clients through the router.
Messages sent, read by /sync, the writer killed (SIGKILL) and started again:
every acknowledged message is delivered once. Nothing assumes loopback.

It needs root for ``ip netns`` (CI runs as root; elsewhere it is skipped with
the reason)."""

from __future__ import annotations

import json
import os
import tempfile
import urllib.parse
from typing import Any

import treq
import yaml
from twisted.internet import defer, protocol, task
from twisted.internet import reactor as _reactor
from twisted.trial import unittest

from tests.app.test_client_round_trip import call, messages_in, register
from tests.harness.databases import create_test_database
from tests.harness.netns import Network, require_netns
from tests.harness.processes import NO_KEEPALIVE
from tests.harness.services import postgres_args, redis_address, require_redis
from tests.harness.tls import TestCA

reactor: Any = _reactor
TIMELINE = urllib.parse.quote(json.dumps({"room": {"timeline": {"limit": 100}}}))
#: Ports are per namespace: every host can use the same ones.
TLS_PORT, PLAIN_PORT, ROUTER_PORT, ROUTER_METRICS_PORT, REPLICATION_PORT = (
    8448,
    8449,
    8008,
    8009,
    9093,
)


class _Output(protocol.ProcessProtocol):
    def __init__(self, path: str) -> None:
        self._log = open(path, "ab")
        self.ended: defer.Deferred[None] = defer.Deferred()
        self.running = True

    def outReceived(self, data: bytes) -> None:
        self._log.write(data)
        self._log.flush()

    errReceived = outReceived

    def processEnded(self, reason: Any) -> None:
        self.running = False
        self._log.close()
        self.ended.callback(None)


class MultiHostTestCase(unittest.TestCase):
    timeout = 240

    def setUp(self) -> None:
        require_netns()
        require_redis()
        self.dir = tempfile.mkdtemp(prefix="synapse_lite_hosts_")
        self.net = Network(self, ["main", "writer", "sync"])
        self.processes: dict[str, tuple[Any, _Output]] = {}

    def write_config(self) -> str:
        db = create_test_database("postgres")
        self.addCleanup(db.drop)
        pg = postgres_args()
        pg_host, pg_port = self.net.forward(str(pg["host"]), int(str(pg["port"])))
        redis_host, redis_port = self.net.forward(*redis_address())
        ca = TestCA(self.dir)
        addresses = self.net.addresses

        def listeners(host: str, tls_resources: list[str]) -> list[dict[str, Any]]:
            certificate, key = ca.issue(host, [addresses[host]])
            return [
                {
                    "port": TLS_PORT,
                    "bind_address": addresses[host],
                    "resources": tls_resources,
                    "tls_certificate_path": certificate,
                    "tls_private_key_path": key,
                },
                {
                    "port": PLAIN_PORT,
                    "bind_address": addresses[host],
                    "resources": ["health", "metrics"],
                },
            ]

        config = {
            "server_name": "hosts.test",
            "data_dir": os.path.join(self.dir, "data"),
            "database": {
                "engine": "postgres",
                "args": dict(db.args, host=pg_host, port=pg_port),
            },
            "replication": {
                "transport": "redis",
                "redis": {
                    "host": redis_host,
                    "port": redis_port,
                    "channel_prefix": f"hosts-{os.getpid()}-",
                },
            },
            "worker_replication_secret": "three-hosts-secret",
            "enable_registration": True,
            "rate_limiting": {"enabled": False},
            "internal_tls": {"ca_path": ca.ca_path},
            "listeners": listeners("main", ["client", "replication"]),
            "router": {
                "listeners": [
                    {
                        "port": ROUTER_PORT,
                        "bind_address": addresses["main"],
                        "resources": ["client", "health"],
                    },
                    {
                        "port": ROUTER_METRICS_PORT,
                        "bind_address": addresses["main"],
                        "resources": ["metrics"],
                    },
                ]
            },
            "stream_writers": {"events": ["persister1"]},
            "workers": {
                "persister1": {"listeners": listeners("writer", ["client", "replication"])},
                "synchrotron1": {"listeners": listeners("sync", ["client"])},
            },
        }
        path = os.path.join(self.dir, "homeserver.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f, sort_keys=False)
        return path

    async def start(self, name: str, host: str, args: list[str], health: str) -> None:
        output = _Output(os.path.join(self.dir, f"{name}.log"))
        transport = self.net.spawn(host, output, args, self.dir)
        self.processes[name] = (transport, output)
        for _ in range(600):
            if not output.running:
                raise AssertionError(f"{name} exited:\n{self.log(name)}")
            try:
                response = await treq.get(health, timeout=1, pool=NO_KEEPALIVE)
                await treq.content(response)
                if response.code == 200:
                    return
            except Exception:
                pass
            await task.deferLater(reactor, 0.1, lambda: None)
        raise AssertionError(f"{name} did not come up:\n{self.log(name)}")

    def log(self, name: str) -> str:
        with open(os.path.join(self.dir, f"{name}.log"), errors="replace") as f:
            return "".join(f.readlines()[-40:])

    async def stop_everything(self) -> None:
        for transport, output in reversed(list(self.processes.values())):
            if output.running:
                transport.signalProcess("TERM")
                try:
                    await output.ended.addTimeout(20, reactor)
                except defer.TimeoutError:
                    transport.signalProcess("KILL")
                    await output.ended

    async def test_three_hosts(self) -> None:
        config = self.write_config()
        self.addCleanup(self.stop_everything)
        a = self.net.addresses

        def health(host: str, port: int = PLAIN_PORT) -> str:
            return f"http://{a[host]}:{port}/health"

        main_args = ["-m", "synapse_lite.app.homeserver", "-c", config]
        writer_args = [
            "-m",
            "synapse_lite.app.generic_worker",
            "-c",
            config,
            "--worker-name",
            "persister1",
        ]
        sync_args = [
            "-m",
            "synapse_lite.app.generic_worker",
            "-c",
            config,
            "--worker-name",
            "synchrotron1",
        ]
        await self.start("main", "main", main_args, health("main"))
        await self.start("persister1", "writer", writer_args, health("writer"))
        await self.start("synchrotron1", "sync", sync_args, health("sync"))
        await self.start(
            "router",
            "main",
            ["-m", "synapse_lite.app.router", "-c", config],
            health("main", ROUTER_PORT),
        )

        base = f"http://{a['main']}:{ROUTER_PORT}"
        _, alice = await register(base, "alice")
        _, bob = await register(base, "bob")
        code, room = await call(
            "POST", f"{base}/_matrix/client/v3/createRoom", {"preset": "public_chat"}, alice
        )
        self.assertEqual(code, 200, room)
        room_id = room["room_id"]
        code, _ = await call("POST", f"{base}/_matrix/client/v3/join/{room_id}", {}, bob)
        self.assertEqual(code, 200)
        code, first = await call("GET", f"{base}/_matrix/client/v3/sync?timeout=0", token=bob)
        self.assertEqual(code, 200, first)

        acknowledged: list[str] = []

        async def send(i: int) -> None:
            url = f"{base}/_matrix/client/v3/rooms/{room_id}/send/m.room.message/txn{i}"
            for _ in range(300):  # while the writer is down: 503, then retry
                try:
                    code, answer = await call(
                        "PUT", url, {"msgtype": "m.text", "body": f"#{i}"}, alice
                    )
                except Exception:
                    code, answer = 0, {}
                if code == 200:
                    acknowledged.append(answer["event_id"])
                    return
                await task.deferLater(reactor, 0.1, lambda: None)
            raise AssertionError(f"message {i} was never acknowledged")

        for i in range(5):
            await send(i)
        # The writer dies; sends wait for it; it comes back on its host.
        transport, output = self.processes["persister1"]
        transport.signalProcess("KILL")
        await output.ended
        sending = defer.ensureDeferred(send(5))
        await task.deferLater(reactor, 0.5, lambda: None)
        await self.start("persister1", "writer", writer_args, health("writer"))
        await sending
        for i in range(6, 10):
            await send(i)

        seen: list[str] = []
        since = first["next_batch"]
        for _ in range(100):
            url = f"{base}/_matrix/client/v3/sync?timeout=2000&filter={TIMELINE}&since={since}"
            code, sync = await call("GET", url, token=bob)
            self.assertEqual(code, 200, sync)
            seen += [e["event_id"] for e in messages_in(sync, room_id)]
            since = sync["next_batch"]
            if set(acknowledged) <= set(seen):
                break
        self.assertEqual(sorted(seen), sorted(acknowledged))
        self.assertEqual(len(acknowledged), 10)

        # The events went straight to the writer's host, over TLS.
        self.assertIn("Listening on", self.log("persister1"))
        self.assertIn("; TLS)", self.log("persister1"))
