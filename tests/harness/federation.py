"""Federation tests' shared parts: request bodies sent by hand (forged,
replayed, hostile), and :class:`LoopbackServers`, real servers of ours on
loopback that find each other through ``federation.destinations``."""

from __future__ import annotations

import json
from typing import Any, cast

import treq
from twisted.internet import reactor
from twisted.trial import unittest

from synapse_lite.config.homeserver import InstanceLocation
from synapse_lite.federation.auth import sign_request
from synapse_lite.federation.crypto import SigningKey, load_or_create_signing_key
from synapse_lite.http.server import make_site
from synapse_lite.server import HomeServer
from synapse_lite.storage.id_generators import generator as id_generators
from tests.harness.client_api import ClientApi
from tests.harness.databases import create_test_database
from tests.harness.processes import NO_KEEPALIVE
from tests.harness.server import LoopbackBus, make_config, make_homeserver

_reactor = cast(Any, reactor)
#: What each process's listener serves.
RESOURCES = ("client", "replication", "federation", "keys")


class LoopbackServers(unittest.TestCase):
    """A test case making servers of ours (each a main process and workers,
    with its own database) on loopback HTTP; each knows where the others
    are once :meth:`connect` ran."""

    def make_server(self, name: str, workers: list[str], **extra: Any) -> dict[str, HomeServer]:
        """Server ``name``: its processes by instance name (``extra``: more
        of its config, as ``make_config`` takes it)."""
        if not hasattr(self, "urls"):
            self.urls: dict[str, str] = {}
        db = create_test_database(with_schema=True)
        self.addCleanup(db.drop)
        config = make_config(
            db,
            workers=workers,
            server_name=name,
            enable_registration=True,
            rate_limiting={"enabled": False},
            resources=RESOURCES,
            **extra,
        )
        servers: dict[str, HomeServer] = {}
        bus = LoopbackBus()
        for instance in ["main", *workers]:
            hs = make_homeserver(self, config, instance)
            site = make_site(hs.listeners.resources.tree(RESOURCES), 1_048_576)
            port = _reactor.listenTCP(0, site, interface="127.0.0.1")
            self.addCleanup(port.stopListening)
            number = port.getHost().port
            hs.config.instance_map[instance] = InstanceLocation("127.0.0.1", number)
            servers[instance] = hs
            bus.join(hs)
            self.urls[name] = f"http://127.0.0.1:{number}"
        return servers

    async def signed_request(
        self,
        key: SigningKey,
        origin: str,
        destination: str,
        method: str,
        path: str,
        body: Any = None,
    ) -> tuple[int, Any]:
        """A federation request to ``destination`` signed as ``origin``
        with ``key``: its status and JSON answer."""
        header = sign_request(key, origin, destination, method, path, body)
        headers: dict[bytes | str, list[bytes | str]] = {
            "Authorization": [header],
            "Content-Type": ["application/json"],
        }
        response = await treq.request(
            method,
            self.urls[destination] + path,
            data=None if body is None else json.dumps(body).encode(),
            headers=headers,
            pool=NO_KEEPALIVE,
        )
        return response.code, json.loads(await treq.content(response))

    def connect(self, *servers: dict[str, HomeServer]) -> None:
        """Tell every process of ``servers`` where each server is."""
        for processes in servers:
            for hs in processes.values():
                hs.config.federation.destinations.update(self.urls)


class TwoServers(LoopbackServers):
    """``a.test`` (a main process) and ``b.test`` (a main process, its events
    writer, and ``fed1``), connected; stream positions written at once;
    ``a_key`` is a.test's signing key (to speak for it in signed requests)."""

    def setUp(self) -> None:
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)
        self.a = self.make_server("a.test", [])
        self.b = self.make_server("b.test", ["fed1"])
        self.connect(self.a, self.b)
        self.a_key = load_or_create_signing_key(self.a["main"].config.data_dir, create=False)

    def client(self, server: dict[str, HomeServer], instance: str = "main") -> ClientApi:
        """A client of ``server``'s process ``instance``."""
        return ClientApi(self, server[instance].config.instance_map[instance].base_url)


def to_device_transaction(
    message_id: str, recipient: str, content: Any, origin_server_ts: int = 0
) -> dict[str, Any]:
    """A transaction from ``a.test`` carrying one to-device EDU from
    ``@alice:a.test`` to every device of ``recipient``."""
    return {
        "origin": "a.test",
        "origin_server_ts": origin_server_ts,
        "pdus": [],
        "edus": [
            {
                "edu_type": "m.direct_to_device",
                "content": {
                    "sender": "@alice:a.test",
                    "type": "m.test",
                    "message_id": message_id,
                    "messages": {recipient: {"*": content}},
                },
            }
        ],
    }
