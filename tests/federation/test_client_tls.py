"""Other homeservers over HTTPS: their certificates are checked against the
system's CAs and ``federation.extra_ca_paths`` (a private federation's CA, or
SyTest's), for the name discovery says; the ``Host`` header is the one the
spec says; discovered addresses are checked against the deny and allow
lists; ``verify_certificates: false`` checks nothing (tests only)."""

from __future__ import annotations

import ipaddress
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
from synapse_lite.federation.discovery import ServerDiscovery, SrvRecord, WellKnownAnswer
from tests.harness.tls import TestCA

_reactor = cast(Any, reactor)


LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)


class _KeyDocument(Resource):
    """Answers with the Host header it was sent."""

    isLeaf = True

    def render_GET(self, request: Request) -> bytes:
        host = (request.requestHeaders.getRawHeaders(b"host") or [b""])[0].decode()
        return json.dumps({"server_name": "peer", "host": host}).encode("utf-8")


class _NoSrv:
    async def lookup_srv(self, name: str) -> list[SrvRecord]:
        return []


class _Delegating:
    def __init__(self, delegations: dict[str, str]) -> None:
        self._delegations = delegations

    async def fetch(self, hostname: str) -> WellKnownAnswer:
        to = self._delegations.get(hostname)
        if to is None:
            return WellKnownAnswer(404, b"", {})
        return WellKnownAnswer(200, json.dumps({"m.server": to}).encode(), {})


async def _resolve_to_loopback(host: str, port: int) -> list[str]:
    if host.endswith(".test"):
        return ["127.0.0.1"]
    raise OSError(f"unknown host {host}")


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

    def client(
        self, config: FederationConfig, delegations: dict[str, str] | None = None
    ) -> FederationClient:
        discovery = ServerDiscovery(
            clock_time=_reactor.seconds,
            srv=_NoSrv(),
            well_known=_Delegating(delegations or {}),
            overrides=config.destinations,
        )
        client = FederationClient(
            config,
            _reactor,
            self.signing_key,
            "us.test",
            discovery=discovery,
            resolve_addresses=_resolve_to_loopback,
        )
        self.addCleanup(client.close)
        return client

    async def test_extra_ca_is_trusted(self) -> None:
        client = self.client(
            FederationConfig(extra_ca_paths=(self.ca.ca_path,), ip_range_allowlist=LOOPBACK)
        )
        answer = await client.get_json(self.destination, "/_matrix/key/v2/server", signed=False)
        self.assertEqual(answer, {"server_name": "peer", "host": self.destination})

    async def test_delegated_name_is_in_host_and_certificate(self) -> None:
        """``peer.test`` delegates to ``fed.peer.test:<port>``: the request
        goes there with that Host, and the certificate must name
        ``fed.peer.test`` (sent as SNI) rather than ``peer.test``."""
        port = self.listen(self.ca, "fed", ["fed.peer.test"])
        client = self.client(
            FederationConfig(extra_ca_paths=(self.ca.ca_path,), ip_range_allowlist=LOOPBACK),
            {"peer.test": f"fed.peer.test:{port}", "wrong.test": f"other.test:{port}"},
        )
        answer = await client.get_json("peer.test", "/_matrix/key/v2/server", signed=False)
        self.assertEqual(answer["host"], f"fed.peer.test:{port}")
        with self.assertRaises(FederationRequestError):
            await client.get_json("wrong.test", "/_matrix/key/v2/server", signed=False)

    async def test_private_addresses_are_refused_by_default(self) -> None:
        client = self.client(FederationConfig(extra_ca_paths=(self.ca.ca_path,)))
        with self.assertRaises(FederationRequestError) as raised:
            await client.get_json(self.destination, "/_matrix/key/v2/server", signed=False)
        self.assertIn("federation.ip_range_denylist", str(raised.exception))
        port = self.listen(self.ca, "fed", ["fed.peer.test"])
        with self.assertRaises(FederationRequestError) as raised:
            await client.get_json(f"fed.peer.test:{port}", "/_matrix/key/v2/server", signed=False)
        self.assertIn("fed.peer.test at 127.0.0.1", str(raised.exception))

    async def test_operator_destinations_are_not_address_checked(self) -> None:
        config = FederationConfig(
            extra_ca_paths=(self.ca.ca_path,),
            destinations={"named.test": f"https://{self.destination}"},
        )
        answer = await self.client(config).get_json(
            "named.test", "/_matrix/key/v2/server", signed=False
        )
        self.assertEqual(answer["host"], self.destination)

    async def test_verification_off_accepts_anything_and_says_so(self) -> None:
        other = TestCA(tempfile.mkdtemp(), "an unknown CA")
        port = self.listen(other, "x", ["elsewhere"])
        with self.assertLogs("synapse_lite.federation.client", "WARNING") as logs:
            client = self.client(
                FederationConfig(verify_certificates=False, ip_range_allowlist=LOOPBACK)
            )
        self.assertIn("are NOT checked", logs.output[0])
        answer = await client.get_json(f"127.0.0.1:{port}", "/_matrix/key/v2/server", signed=False)
        self.assertEqual(answer["server_name"], "peer")

    def listen(self, ca: TestCA, name: str, hosts: list[str]) -> int:
        port = _reactor.listenSSL(
            0, Site(_KeyDocument()), ca.server_options(name, hosts), interface="127.0.0.1"
        )
        self.addCleanup(port.stopListening)
        return int(port.getHost().port)

    async def test_unknown_ca_is_refused(self) -> None:
        client = self.client(FederationConfig(ip_range_allowlist=LOOPBACK))
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
        client = self.client(
            FederationConfig(extra_ca_paths=(other.ca_path,), ip_range_allowlist=LOOPBACK)
        )
        with self.assertRaises(FederationRequestError):
            await client.get_json(
                f"127.0.0.1:{port.getHost().port}", "/_matrix/key/v2/server", signed=False
            )
