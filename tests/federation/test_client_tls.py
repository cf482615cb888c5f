"""Other homeservers over HTTPS: their certificates are checked against the
system's CAs and ``federation.extra_ca_paths`` (a private federation's CA, or
SyTest's), for the host in the server name."""

from __future__ import annotations

import json
import tempfile
from typing import Any, cast

from twisted.internet import reactor
from twisted.trial import unittest
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from synapse_lite.config.federation import FederationConfig
from synapse_lite.federation.client import FederationClient, FederationRequestError
from synapse_lite.federation.crypto import load_or_create_signing_key
from tests.harness.tls import TestCA

_reactor = cast(Any, reactor)


class _KeyDocument(Resource):
    isLeaf = True

    def render_GET(self, request: Request) -> bytes:
        return json.dumps({"server_name": "peer"}).encode("utf-8")


class FederationClientTlsTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp()
        self.ca = TestCA(self.dir)
        self.signing_key = load_or_create_signing_key(self.dir, create=True)
        port = _reactor.listenSSL(
            0,
            Site(_KeyDocument()),
            self.ca.server_options("peer", ["127.0.0.1"]),
            interface="127.0.0.1",
        )
        self.addCleanup(port.stopListening)
        self.destination = f"127.0.0.1:{port.getHost().port}"

    def client(self, config: FederationConfig) -> FederationClient:
        client = FederationClient(config, _reactor, self.signing_key, "us.test")
        self.addCleanup(client.close)
        return client

    async def test_extra_ca_is_trusted(self) -> None:
        client = self.client(FederationConfig(extra_ca_paths=(self.ca.ca_path,)))
        answer = await client.get_json(self.destination, "/_matrix/key/v2/server", signed=False)
        self.assertEqual(answer, {"server_name": "peer"})

    async def test_unknown_ca_is_refused(self) -> None:
        client = self.client(FederationConfig())
        with self.assertRaises(FederationRequestError) as raised:
            await client.get_json(self.destination, "/_matrix/key/v2/server", signed=False)
        self.assertIn("certificate verify failed", str(raised.exception))

    async def test_certificate_for_another_host_is_refused(self) -> None:
        """Trusting a CA does not mean trusting every certificate it issued
        for any host: the name must match the destination."""
        other = TestCA(tempfile.mkdtemp(), "a second CA")
        port = _reactor.listenSSL(
            0,
            Site(_KeyDocument()),
            other.server_options("elsewhere", ["192.0.2.1"]),
            interface="127.0.0.1",
        )
        self.addCleanup(port.stopListening)
        client = self.client(FederationConfig(extra_ca_paths=(other.ca_path,)))
        with self.assertRaises(FederationRequestError):
            await client.get_json(
                f"127.0.0.1:{port.getHost().port}", "/_matrix/key/v2/server", signed=False
            )
