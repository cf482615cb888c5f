"""``/.well-known/matrix/server`` and ``/client``: served as configured,
404 otherwise, and read back by our own discovery over real HTTP."""

from __future__ import annotations

import json
from typing import Any, cast

import treq
from twisted.internet import reactor
from twisted.trial import unittest
from twisted.web.resource import Resource
from twisted.web.server import Site

from synapse_lite.config.federation import FederationConfig
from synapse_lite.federation.discovery import parse_well_known
from synapse_lite.federation.server import well_known_resource
from tests.harness.databases import create_test_database
from tests.harness.processes import NO_KEEPALIVE
from tests.harness.server import make_config, make_homeserver

_reactor = cast(Any, reactor)


class WellKnownTestCase(unittest.TestCase):
    def serve(self, config: FederationConfig) -> str:
        resource = well_known_resource(config)
        root = Resource()
        root.putChild(b".well-known", resource)
        port = _reactor.listenTCP(0, Site(root), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        return f"http://127.0.0.1:{port.getHost().port}"

    async def get(self, url: str) -> tuple[int, bytes, Any]:
        response = await treq.get(url, pool=NO_KEEPALIVE)
        return response.code, await treq.content(response), response.headers

    async def test_nothing_configured_answers_404_with_cors(self) -> None:
        base = self.serve(FederationConfig())
        for path in ("/.well-known/matrix/server", "/.well-known/matrix/client"):
            code, body, headers = await self.get(base + path)
            self.assertEqual((code, json.loads(body)["errcode"]), (404, "M_NOT_FOUND"), path)
            self.assertEqual(headers.getRawHeaders(b"Access-Control-Allow-Origin"), [b"*"], path)

    async def test_server_delegation(self) -> None:
        base = self.serve(FederationConfig(well_known_server="fed.a.test:443"))
        code, body, _ = await self.get(base + "/.well-known/matrix/server")
        self.assertEqual(parse_well_known(code, body), "fed.a.test:443")
        code, body, _ = await self.get(base + "/.well-known/matrix/client")
        self.assertEqual(code, 404)
        self.assertEqual(json.loads(body)["errcode"], "M_NOT_FOUND")

    async def test_client_discovery_with_cors(self) -> None:
        document = {
            "m.homeserver": {"base_url": "https://matrix.a.test"},
            "org.example.extra": {"x": 1},
        }
        base = self.serve(FederationConfig(well_known_client=document))
        code, body, headers = await self.get(base + "/.well-known/matrix/client")
        self.assertEqual((code, json.loads(body)), (200, document))
        self.assertEqual(headers.getRawHeaders(b"access-control-allow-origin"), [b"*"])
        code, _, _ = await self.get(base + "/.well-known/matrix/server")
        self.assertEqual(code, 404)

    async def test_served_by_a_process_on_client_and_federation_listeners(self) -> None:
        db = create_test_database()
        self.addCleanup(db.drop)
        config = make_config(db, federation={"well_known_server": "fed.test.local:443"})
        hs = make_homeserver(self, config)
        for resources, served in [
            (("client",), True),
            (("federation", "keys"), True),
            (("replication",), False),
        ]:
            site = Site(hs.listeners.resources.tree(resources))
            port = _reactor.listenTCP(0, site, interface="127.0.0.1")
            self.addCleanup(port.stopListening)
            base = f"http://127.0.0.1:{port.getHost().port}"
            code, body, _ = await self.get(base + "/.well-known/matrix/server")
            if served:
                self.assertEqual(parse_well_known(code, body), "fed.test.local:443")
            else:
                self.assertEqual(code, 404, resources)
