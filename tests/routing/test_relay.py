"""The router's relay on real sockets, with in-process stand-ins for the
processes behind it: routing by role, stickiness, failover (a process that
stops, one that freezes), streaming both ways, long-polls, pipelining,
keep-alive, bad requests, and the client's address passed on with the proof."""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any, cast

import treq
from twisted.internet import defer, protocol
from twisted.internet import reactor as _reactor
from twisted.trial import unittest
from twisted.web import resource, server
from twisted.web.client import HTTPConnectionPool

from synapse_lite.api.access_tokens import generate_access_token
from synapse_lite.config.homeserver import HomeServerConfig, read_homeserver_config
from synapse_lite.http.forwarded import router_proof
from synapse_lite.http.tls import InternalTlsClient
from synapse_lite.routing.backends import HealthChecks, backends_of
from synapse_lite.routing.relay import Relay
from synapse_lite.routing.room_writers import RoomWriters
from synapse_lite.routing.router import Router
from synapse_lite.routing.table import RoutingTable
from synapse_lite.storage.database import DatabasePool
from tests.harness.polling import eventually

reactor: Any = _reactor
SECRET = "relay-test-secret"
ROOM = "!room:test"


class FakeProcess(resource.Resource):
    """Answers every request with its name; remembers what it was asked."""

    isLeaf = True

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.requests: list[dict[str, Any]] = []
        #: The connections requests came on (other than /health's).
        self.channels: set[int] = set()
        self.frozen = False
        self.held: list[server.Request] = []
        self.release = defer.Deferred[None]()
        self.finished_early: list[str] = []

    def render(self, request: server.Request) -> Any:
        path = request.path.decode()
        if self.frozen:
            return server.NOT_DONE_YET  # never answers, /health neither
        if path == "/health":
            return b'{"status":"ok"}'
        headers = {
            k.decode().lower(): [x.decode() for x in v]
            for k, v in request.requestHeaders.getAllRawHeaders()
        }
        body = request.content.read() if request.content else b""
        self.channels.add(id(request.channel))
        self.requests.append(
            {"path": path, "method": request.method.decode(), "headers": headers, "body": body}
        )
        request.notifyFinish().addErrback(lambda _: self.finished_early.append(path))
        if path.endswith("/hold"):
            # A long-poll: the first part now, the rest when released.
            request.write(b'{"part":1}')
            self.held.append(request)
            self.release.addCallback(lambda _: (request.write(b'{"part":2}'), request.finish()))
            return server.NOT_DONE_YET
        request.setHeader(b"Content-Type", b"application/json")
        return json.dumps({"served_by": self.name, "body_bytes": len(body)}).encode()


def _config(ports: dict[str, int], router_port: int) -> HomeServerConfig:
    def listener(port: int, *resources: str) -> dict[str, Any]:
        return {"port": port, "bind_address": "127.0.0.1", "resources": list(resources)}

    # The federation readers, where the test has them.
    federation_readers: dict[str, Any] = {
        name: {"listeners": [listener(ports[name], "federation", "keys", "health")]}
        for name in ("fed1", "fed2")
        if name in ports
    }
    data = {
        "server_name": "test",
        "worker_replication_secret": SECRET,
        "database": {"engine": "sqlite", "args": {"path": "unused.db"}},
        "replication": {"tcp": {"port": 0}},
        "listeners": [listener(ports["main"], "client", "replication", "health")],
        "router": {"listeners": [listener(router_port, "client", "health")]},
        "stream_writers": {"events": ["writer1"]},
        "workers": {
            "reader1": {"listeners": [listener(ports["reader1"], "client", "health")]},
            "reader2": {"listeners": [listener(ports["reader2"], "client", "health")]},
            "writer1": {
                "listeners": [listener(ports["writer1"], "client", "replication", "health")]
            },
            **federation_readers,
        },
    }
    return read_homeserver_config(data, os.path.join(tempfile.mkdtemp(), "homeserver.yaml"))


class RoomsInTheDatabase:
    """Stands in for the database pool: ``rooms.event_writer`` of known rooms."""

    def __init__(self, rooms: dict[str, str | None]) -> None:
        self.rooms = rooms
        self.lookups = 0

    async def select(self, desc: str, sql: str, room_id: str) -> list[tuple[Any, ...]]:
        self.lookups += 1
        return [(self.rooms[room_id],)] if room_id in self.rooms else []

    def close(self) -> None:
        pass


class RelayTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.processes: dict[str, FakeProcess] = {}
        self.sites: dict[str, server.Site] = {}
        self.ports: dict[str, Any] = {}
        for name in ("main", "reader1", "reader2", "writer1", "fed1", "fed2"):
            self.processes[name] = FakeProcess(name)
            self.sites[name] = server.Site(self.processes[name])
            self.sites[name].noisy = False
            self.ports[name] = reactor.listenTCP(0, self.sites[name], interface="127.0.0.1")
            self.addCleanup(self._stop, name)
        # The router's own port is not read from the config here.
        self.config = _config({n: p.getHost().port for n, p in self.ports.items()}, 1)
        table = RoutingTable.build(self.config)
        self.backends = backends_of(self.config, table.instances())
        self.database = RoomsInTheDatabase({ROOM: "writer1", "!old:test": None})
        room_writers = RoomWriters(self.config, cast(DatabasePool, self.database))
        self.router = Router(table, self.backends, room_writers)
        tls = InternalTlsClient(None)
        self.relay = Relay(
            reactor, self.router, tls, router_proof(SECRET), 30.0, self.router.local_page
        )
        self.health = HealthChecks(
            reactor,
            list(self.backends.values()),
            tls,
            lambda b: self.relay.backend_down(b) if not b.up else None,
            interval=0.1,
            timeout=0.3,
        )
        self.router.health = self.health
        self.health.start()
        self.addCleanup(self.health.stop)
        listening = reactor.listenTCP(
            0, self.relay.factory(("client", "health"), False), interface="127.0.0.1"
        )
        self.addCleanup(listening.stopListening)
        self.addCleanup(self.relay.pool.close_all)
        self.addCleanup(self.relay.close_clients)
        self.url = f"http://127.0.0.1:{listening.getHost().port}"
        federation = reactor.listenTCP(
            0, self.relay.factory(("federation",), False), interface="127.0.0.1"
        )
        self.addCleanup(federation.stopListening)
        self.federation_url = f"http://127.0.0.1:{federation.getHost().port}"
        self.http_pool = HTTPConnectionPool(reactor, persistent=True)
        self.addCleanup(self.http_pool.closeCachedConnections)

    def _stop(self, name: str) -> defer.Deferred[None]:
        port = self.ports.pop(name, None)
        if port is None:
            return defer.succeed(None)
        for request in self.processes[name].held:
            if not request.finished and not request._disconnected:
                request.finish()
        return cast(defer.Deferred[None], port.stopListening())

    async def stop_process(self, name: str) -> None:
        """As if it died: no more connections, and its open ones cut."""
        await self._stop(name)
        self.processes[name].frozen = True  # and whatever is under way never ends well
        for connection in list(self.relay.pool._all):
            if connection.backend.name == name:
                connection.abort()

    async def raw_client(self) -> RawClient:
        client = await RawClient.connect(self.url)
        self.addCleanup(client.close)
        return client

    async def request(
        self,
        method: str,
        path: str,
        user: str | None = None,
        body: bytes | None = None,
        base: str | None = None,
        **kw: Any,
    ) -> tuple[int, Any, Any]:
        headers = dict(kw.pop("headers", {}))
        if user is not None:
            headers["Authorization"] = "Bearer " + generate_access_token(f"@{user}:test")
        response = await treq.request(
            method, (base or self.url) + path, headers=headers, data=body, pool=self.http_pool, **kw
        )
        content = await treq.content(response)
        try:
            parsed = json.loads(content)
        except ValueError:
            parsed = content
        return response.code, parsed, response.headers

    # Routing

    async def test_each_request_goes_to_its_role(self) -> None:
        code, answer, _ = await self.request("GET", "/_matrix/client/v3/sync", "alice")
        self.assertEqual(code, 200)
        self.assertIn(answer["served_by"], ("reader1", "reader2"))
        code, answer, _ = await self.request(
            "PUT", f"/_matrix/client/v3/rooms/{ROOM}/send/m.room.message/1", "alice", b"{}"
        )
        self.assertEqual(answer["served_by"], "writer1")
        # The room's writer was read once, then kept.
        await self.request(
            "PUT", f"/_matrix/client/v3/rooms/{ROOM}/send/m.room.message/2", "alice", b"{}"
        )
        self.assertEqual(self.database.lookups, 1)
        # A room the database does not have: main answers (its 404).
        _, answer, _ = await self.request(
            "POST", "/_matrix/client/v3/join/!nope:test", "alice", b"{}"
        )
        self.assertEqual(answer["served_by"], "main")
        # A room from before writers were recorded: the stable hash.
        _, answer, _ = await self.request(
            "POST", "/_matrix/client/v3/join/!old:test", "alice", b"{}"
        )
        self.assertEqual(answer["served_by"], "writer1")
        _, answer, _ = await self.request("POST", "/_matrix/client/v3/login", body=b"{}")
        self.assertEqual(answer["served_by"], "main")

    async def test_the_client_address_is_passed_on_with_the_proof(self) -> None:
        await self.request(
            "GET",
            "/_matrix/client/v3/login",
            headers={"X-Forwarded-For": "6.6.6.6", "X-Synapse-Lite-Router": "forged"},
        )
        [seen] = self.processes["main"].requests
        self.assertEqual(seen["headers"]["x-forwarded-for"], ["127.0.0.1"])
        self.assertEqual(seen["headers"]["x-synapse-lite-router"], [router_proof(SECRET)])
        self.assertEqual(seen["headers"]["x-forwarded-proto"], ["http"])
        self.assertIn("host", seen["headers"])

    async def test_internal_paths_and_bad_requests_are_refused(self) -> None:
        code, answer, _ = await self.request(
            "POST", "/_synapse/replication/send_events", body=b"{}"
        )
        self.assertEqual((code, answer["errcode"]), (404, "M_UNRECOGNIZED"))
        self.assertEqual(sum(len(p.requests) for p in self.processes.values()), 0)
        raw = await self.raw_client()
        raw.send(b"PUT /x HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n")
        await raw.closed
        self.assertTrue(raw.received.startswith(b"HTTP/1.1 400 "), raw.received)

    async def test_health_page(self) -> None:
        code, answer, _ = await self.request("GET", "/health")
        self.assertEqual((code, answer["status"]), (200, "ok"))
        self.assertEqual(
            set(answer["backends"]), {"main", "reader1", "reader2", "writer1", "fed1", "fed2"}
        )

    async def test_the_federation_front_door(self) -> None:
        """Other servers' requests go to the federation readers, each origin
        to one; /.well-known to main; the federation port serves nothing else."""
        placed: dict[str, set[str]] = {}
        for i in range(12):
            origin = f"server{i}.test"
            auth = f'X-Matrix origin="{origin}",destination="test",key="ed25519:a",sig="x"'
            for url in (self.url, self.federation_url, self.federation_url):
                code, answer, _ = await self.request(
                    "GET",
                    "/_matrix/federation/v1/version",
                    base=url,
                    headers={"Authorization": auth},
                )
                self.assertEqual(code, 200)
                placed.setdefault(origin, set()).add(answer["served_by"])
        self.assertTrue(all(len(readers) == 1 for readers in placed.values()), placed)
        self.assertEqual({r for readers in placed.values() for r in readers}, {"fed1", "fed2"})
        _, answer, _ = await self.request("GET", "/_matrix/key/v2/server", base=self.federation_url)
        self.assertIn(answer["served_by"], ("fed1", "fed2"))
        _, answer, _ = await self.request(
            "GET", "/.well-known/matrix/server", base=self.federation_url
        )
        self.assertEqual(answer["served_by"], "main")
        before = sum(len(p.requests) for p in self.processes.values())
        code, _, _ = await self.request(
            "GET", "/_matrix/client/v3/sync", "alice", base=self.federation_url
        )
        self.assertEqual(code, 404)
        self.assertEqual(sum(len(p.requests) for p in self.processes.values()), before)

    # Stickiness and failover

    async def test_each_user_stays_on_one_reader(self) -> None:
        placed: dict[str, set[str]] = {}
        for user in [f"user{i}" for i in range(16)]:
            for _ in range(3):
                _, answer, _ = await self.request("GET", "/_matrix/client/v3/sync", user)
                placed.setdefault(user, set()).add(answer["served_by"])
        self.assertTrue(all(len(readers) == 1 for readers in placed.values()), placed)
        used = {next(iter(readers)) for readers in placed.values()}
        self.assertEqual(used, {"reader1", "reader2"})

    async def _user_on(self, reader: str) -> str:
        for i in range(100):
            _, answer, _ = await self.request("GET", "/_matrix/client/v3/sync", f"u{i}")
            if answer["served_by"] == reader:
                return f"u{i}"
        raise AssertionError(f"no user hashes to {reader}")

    async def test_a_stopped_reader_s_users_move_at_once(self) -> None:
        user = await self._user_on("reader1")
        other = await self._user_on("reader2")
        await self.stop_process("reader1")
        code, answer, _ = await self.request("GET", "/_matrix/client/v3/sync", user)
        self.assertEqual((code, answer["served_by"]), (200, "reader2"))
        self.assertFalse(self.backends["reader1"].up)
        # Nobody else moved.
        _, answer, _ = await self.request("GET", "/_matrix/client/v3/sync", other)
        self.assertEqual(answer["served_by"], "reader2")
        await self.stop_process("reader2")
        code, answer, headers = await self.request("GET", "/_matrix/client/v3/sync", user)
        self.assertEqual(code, 503)
        self.assertEqual(headers.getRawHeaders("Retry-After"), ["5"])
        _, health, _ = await self.request("GET", "/health")
        self.assertEqual(health["status"], "degraded")
        self.assertIn("no process serving readers is up", health["reasons"])

    async def test_a_frozen_reader_s_requests_move_within_the_health_timeout(self) -> None:
        user = await self._user_on("reader1")
        self.processes["reader1"].frozen = True
        started = time.monotonic()
        code, answer, _ = await self.request("GET", "/_matrix/client/v3/sync", user)
        took = time.monotonic() - started
        self.assertEqual((code, answer["served_by"]), (200, "reader2"))
        self.assertLess(took, 5.0)
        self.assertFalse(self.backends["reader1"].up)
        # Back when it answers again.
        self.processes["reader1"].frozen = False
        await eventually(lambda: self.backends["reader1"].up)

    # Streaming

    async def test_a_long_poll_streams_and_stays_open(self) -> None:
        raw = await self.raw_client()
        token = generate_access_token("@poller:test")
        raw.send(
            b"GET /_matrix/client/v3/sync/hold HTTP/1.1\r\nHost: t\r\n"
            b"Authorization: Bearer " + token.encode() + b"\r\n\r\n"
        )
        await eventually(lambda: b'{"part":1}' in raw.received)
        self.assertNotIn(b'{"part":2}', raw.received)
        for process in self.processes.values():
            if process.held:
                process.release.callback(None)
        await eventually(lambda: raw.received.endswith(b"0\r\n\r\n"))
        self.assertIn(b'{"part":2}', raw.received)

    async def test_an_upload_streams_to_the_process(self) -> None:
        # A process that shows what reached it, as it reached it.
        received = bytearray()

        class Recorder(protocol.Protocol):
            def dataReceived(self, data: bytes) -> None:
                received.extend(data)

        await self.stop_process("main")
        port = reactor.listenTCP(
            self.backends["main"].client.port,
            protocol.Factory.forProtocol(Recorder),
            interface="127.0.0.1",
        )
        self.addCleanup(port.stopListening)
        self.health.stop()
        self.backends["main"].up = True
        raw = await self.raw_client()
        raw.send(
            b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 20000\r\n\r\n" + b"a" * 10000
        )

        def body() -> bytes:
            return bytes(received).partition(b"\r\n\r\n")[2]

        await eventually(lambda: body() == b"a" * 10000)
        raw.send(b"b" * 10000)
        await eventually(lambda: body() == b"a" * 10000 + b"b" * 10000)

    async def test_a_client_that_leaves_ends_the_request_behind(self) -> None:
        raw = await self.raw_client()
        raw.send(b"GET /_matrix/client/v3/sync/hold HTTP/1.1\r\nHost: t\r\n\r\n")
        await eventually(lambda: b'{"part":1}' in raw.received)
        assert raw.transport is not None
        raw.transport.loseConnection()
        await eventually(lambda: any(p.finished_early for p in self.processes.values()))

    # Connections

    async def test_pipelined_requests_are_answered_in_order(self) -> None:
        raw = await self.raw_client()
        raw.send(
            b"GET /_matrix/client/v3/login HTTP/1.1\r\nHost: t\r\n\r\n"
            b"GET /_matrix/client/v3/sync HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        )
        await raw.closed
        first = raw.received.index(b'"served_by": "main"')
        second = max(
            raw.received.find(b'"served_by": "reader1"'),
            raw.received.find(b'"served_by": "reader2"'),
        )
        self.assertLess(first, second)
        self.assertEqual(raw.received.count(b"HTTP/1.1 200 OK"), 2)

    async def test_expect_100_continue_and_head(self) -> None:
        raw = await self.raw_client()
        raw.send(
            b"PUT /_matrix/client/v3/login HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        await eventually(lambda: raw.received.startswith(b"HTTP/1.1 100 Continue\r\n"))
        raw.send(b"{}")
        await eventually(lambda: b'"body_bytes": 2' in raw.received)
        raw.send(b"HEAD /_matrix/client/v3/login HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        await raw.closed
        last = raw.received.rsplit(b"HTTP/1.1 ", 1)[1]
        self.assertTrue(last.startswith(b"200 OK"), raw.received)
        self.assertTrue(last.endswith(b"\r\n\r\n"), last)  # no body after a HEAD

    async def test_clients_over_tls(self) -> None:
        from synapse_lite.config.homeserver import TlsFiles
        from synapse_lite.http.tls import server_tls_options
        from tests.harness.tls import TestCA

        ca = TestCA(tempfile.mkdtemp())
        files = TlsFiles(*ca.issue("router", ["127.0.0.1"]))
        listening = reactor.listenSSL(
            0,
            self.relay.factory(("client",), True),
            server_tls_options(files),
            interface="127.0.0.1",
        )
        self.addCleanup(listening.stopListening)
        client = RawClient()
        options = InternalTlsClient(ca.ca_path).options_for("127.0.0.1")
        await protocol.ClientCreator(reactor, lambda: client).connectSSL(
            "127.0.0.1", listening.getHost().port, options
        )
        self.addCleanup(client.close)
        client.send(
            b"GET /_matrix/client/v3/login HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        )
        await client.closed
        self.assertIn(b'"served_by": "main"', client.received)
        [seen] = self.processes["main"].requests
        self.assertEqual(seen["headers"]["x-forwarded-proto"], ["https"])

    async def test_connections_to_a_process_are_kept_alive(self) -> None:
        for i in range(5):
            await self.request("GET", f"/_matrix/client/v3/login?i={i}")
        self.assertEqual(len(self.processes["main"].channels), 1)


class RawClient(protocol.Protocol):
    """A client that sends bytes as given and keeps all it receives."""

    def __init__(self) -> None:
        self.received = b""
        self.closed: defer.Deferred[None] = defer.Deferred()

    @classmethod
    async def connect(cls, url: str) -> RawClient:
        port = int(url.rsplit(":", 1)[1])
        client = cls()
        await protocol.ClientCreator(reactor, lambda: client).connectTCP("127.0.0.1", port)
        return client

    async def close(self) -> None:
        if not self.closed.called:
            cast(Any, self.transport).abortConnection()
            await self.closed

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Any = None) -> None:
        self.closed.callback(None)
