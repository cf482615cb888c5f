"""Homeservers serving the client API inside the test process, and a small
HTTP client to call them.

``start_cluster`` builds one or more processes on one database, serves each
one's client and replication resources on 127.0.0.1 (a free port, written into
the shared config's ``instance_map`` so internal HTTP reaches it) and joins
them on an in-memory replication bus.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Sequence
from typing import Any, cast

import treq
from twisted.internet import reactor
from twisted.trial import unittest
from twisted.web.client import HTTPConnectionPool

from synapse_lite.config.homeserver import InstanceLocation
from synapse_lite.http.server import make_site
from synapse_lite.server import HomeServer
from synapse_lite.storage.id_generators import generator as id_generators
from tests.harness.databases import TestDatabase
from tests.harness.polling import eventually
from tests.harness.server import (
    BusEndpoint,
    DatabaseTestCase,
    LoopbackBus,
    make_config,
    make_homeserver,
)

_reactor = cast(Any, reactor)


def q(value: str | None) -> str:
    """An id as one segment of a request path (percent-escaped)."""
    assert value is not None
    return urllib.parse.quote(value, safe="")


class ClientApi:
    """Calls one process's client API; remembers one user's access token."""

    def __init__(self, testcase: unittest.TestCase, base_url: str) -> None:
        self.base_url = base_url
        self.token: str | None = None
        self.user_id: str | None = None
        self.device_id: str | None = None
        self._pool = HTTPConnectionPool(reactor, persistent=False)

    def as_user(self, token: str | None) -> ClientApi:
        """A client for the same process with another token."""
        other = ClientApi.__new__(ClientApi)
        other.base_url, other._pool = self.base_url, self._pool
        other.token, other.user_id, other.device_id = token, None, None
        return other

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        raw: bytes | None = None,
        token: str | None = "default",
        headers: dict[str, list[str]] | None = None,
    ) -> tuple[int, Any]:
        """``(status, json body)``; the body is None when it is not JSON."""
        all_headers: dict[bytes | str, list[bytes | str]] = {
            "Content-Type": ["application/json"],
            **(headers or {}),  # type: ignore[dict-item]
        }
        use_token = self.token if token == "default" else token
        if use_token is not None:
            all_headers["Authorization"] = [f"Bearer {use_token}"]
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        url = self.base_url + (path if path.startswith("/_") else "/_matrix/client/v3" + path)
        response = await treq.request(
            method, url, data=data, headers=all_headers, pool=self._pool, reactor=_reactor
        )
        content = await treq.content(response)
        try:
            return response.code, json.loads(content)
        except ValueError:
            return response.code, None

    async def ok(self, method: str, path: str, body: Any = None) -> Any:
        """A request that must succeed; its JSON body."""
        code, result = await self.request(method, path, body)
        if code != 200:
            raise AssertionError(f"{method} {path} -> {code} {result}")
        return result

    async def register(self, username: str, password: str = "secret-pw") -> ClientApi:
        """Register (dummy auth) and use the new user's token from now on."""
        result = await self.ok(
            "POST",
            "/register",
            {"username": username, "password": password, "auth": {"type": "m.login.dummy"}},
        )
        self.token, self.user_id = result["access_token"], result["user_id"]
        self.device_id = result["device_id"]
        return self

    async def membership(self, room_id: str, user_id: str | None) -> str | None:
        """``user_id``'s membership in ``room_id`` as this user reads the
        room's state (None when it has no member event for them)."""
        code, event = await self.request(
            "GET", f"/rooms/{q(room_id)}/state/m.room.member/{q(user_id)}"
        )
        return str(event["membership"]) if code == 200 else None

    async def create_room(self, **body: Any) -> str:
        return (await self.ok("POST", "/createRoom", body))["room_id"]

    async def send(self, room_id: str, body: str, txn_id: str | None = None) -> str:
        import uuid

        txn_id = txn_id or uuid.uuid4().hex
        result = await self.ok(
            "PUT",
            f"/rooms/{room_id}/send/m.room.message/{txn_id}",
            {"msgtype": "m.text", "body": body},
        )
        return result["event_id"]

    async def sync(self, since: str | None = None, timeout: int = 0, **params: Any) -> Any:
        query = f"?timeout={timeout}" + (f"&since={since}" if since else "")
        for key, value in params.items():
            query += f"&{key}={value}"
        return await self.ok("GET", "/sync" + query)


def serve(testcase: unittest.TestCase, hs: HomeServer) -> str:
    """Serve ``hs``'s client and replication resources on a free local port;
    returns its base URL."""
    resources = ("client", "replication")
    site = make_site(
        hs.listeners.resources.tree(resources),
        hs.config.limits.max_request_body_bytes,
        hs.listeners.resources.upload_routes(resources),
    )
    port = _reactor.listenTCP(0, site, interface="127.0.0.1")
    number = port.getHost().port
    hs.config.instance_map[hs.instance_name] = InstanceLocation("127.0.0.1", number)
    testcase.addCleanup(port.stopListening)
    return f"http://127.0.0.1:{number}"


def start_cluster(
    testcase: unittest.TestCase,
    test_db: TestDatabase,
    workers: list[str] = (),  # type: ignore[assignment]
    stream_writers: dict[str, Any] | None = None,
    **config_extra: Any,
) -> tuple[dict[str, HomeServer], dict[str, ClientApi], LoopbackBus]:
    """Processes (main first, then ``workers``) sharing one database, served
    over HTTP and replicating over an in-memory bus."""
    testcase.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)
    extra: dict[str, Any] = {"enable_registration": True, "rate_limiting": {"enabled": False}}
    extra.update(config_extra)
    config = make_config(test_db, workers=workers, stream_writers=stream_writers, **extra)
    servers: dict[str, HomeServer] = {}
    clients: dict[str, ClientApi] = {}
    for name in ["main", *workers]:
        hs = make_homeserver(testcase, config, name)
        servers[name] = hs
        clients[name] = ClientApi(testcase, serve(testcase, hs))
    bus = LoopbackBus()
    endpoints = [bus.join(hs) for hs in servers.values()]
    # Run before the processes stop (cleanups run last first): a process
    # stopping must not be handed the others' commands after its database
    # pool has closed.
    testcase.addCleanup(_leave_bus, bus, endpoints)
    return servers, clients, bus


async def caught_up(servers: dict[str, HomeServer], writer: str) -> None:
    """Wait until every process has read the events ``writer`` wrote so far
    (a read on any of them then sees them)."""
    upto = servers[writer].store.get_room_max_token()
    await eventually(
        lambda: all(hs.store.get_room_max_token() == upto for hs in servers.values()),
        what=f"every process caught up with {writer}",
    )


async def caught_up_with_writers(servers: dict[str, HomeServer], writers: Sequence[str]) -> None:
    """Wait until every process has read what each of the events ``writers``
    wrote so far (its own position; the writers' tokens may differ elsewhere)."""

    def done() -> bool:
        return all(
            hs.store.get_room_max_token().get_position(w)
            >= servers[w].store.get_room_max_token().get_position(w)
            for w in writers
            for hs in servers.values()
        )

    await eventually(done, what=f"every process caught up with {', '.join(writers)}")


async def caught_up_on_every_stream(servers: dict[str, HomeServer]) -> None:
    """Wait until every process has every stream's rows the main process
    has (the events token and each other stream's position, but the
    federation and caches streams'): reads that answer from a process's
    memory then agree with the database."""
    main = servers["main"]

    def done() -> bool:
        for hs in servers.values():
            if hs.store.get_room_max_token() != main.store.get_room_max_token():
                return False
            for name, stream in main.streams.items():
                other = hs.streams.get(name)
                if other is None or name in ("federation", "caches"):
                    continue
                if (
                    other.positions.persisted_upto_position()
                    != stream.positions.persisted_upto_position()
                ):
                    return False
        return True

    await eventually(done, what="every process caught up with main")


def _leave_bus(bus: LoopbackBus, endpoints: list[BusEndpoint]) -> None:
    for endpoint in endpoints:
        if endpoint in bus.endpoints:
            bus.leave(endpoint)


class ThreeUsersTestCase(DatabaseTestCase):
    """The main process alone (or with ``workers``), served over HTTP, with
    ``alice``, ``bob`` and ``eve`` registered (``self.servers`` holds the
    processes). With workers, each user talks to another process: alice to
    the main process, bob to the last worker, eve to one in the middle, so
    that their writes are forwarded to the writers that own them."""

    workers: list[str] = []
    stream_writers: dict[str, Any] = {}

    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(
            self, self.test_db, workers=self.workers, stream_writers=self.stream_writers
        )
        names = list(clients)
        self.alice = await ClientApi(self, clients[names[0]].base_url).register("alice")
        self.bob = await ClientApi(self, clients[names[-1]].base_url).register("bob")
        middle = clients[names[len(names) // 2]].base_url
        self.eve = await ClientApi(self, middle).register("eve")


#: The default layout's processes and events writers (besides main), for a
#: ``ThreeUsersTestCase`` run through workers.
DEFAULT_LAYOUT_WORKERS = ["synchrotron1", "persister1", "persister2"]
DEFAULT_LAYOUT_STREAM_WRITERS = {"events": ["persister1", "persister2"]}
