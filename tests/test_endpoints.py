"""Every listener goes through ``synapse_lite/endpoints.py``: plain TCP and
TLS on real sockets, a port that is taken, a certificate that cannot be
read."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from twisted.internet import defer, protocol
from twisted.internet import reactor as _reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.error import CannotListenError
from twisted.trial import unittest

from synapse_lite.config.homeserver import TlsFiles
from synapse_lite.endpoints import describe_listener, listen
from synapse_lite.http.tls import InternalTlsClient, TlsSetupError
from tests.harness.tls import TestCA

reactor: Any = _reactor


class _Echo(protocol.Protocol):
    def dataReceived(self, data: bytes) -> None:
        self.transport.write(data)  # type: ignore[union-attr]


class _Client(protocol.Protocol):
    """Says hello, closes once it hears it back; ``closed`` fires with what
    it heard when the connection is gone."""

    def __init__(self, say: bytes = b"hello") -> None:
        self.say = say
        self.received = b""
        self.closed: defer.Deferred[bytes] = defer.Deferred()

    def connectionMade(self) -> None:
        self.transport.write(self.say)  # type: ignore[union-attr]

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        if self.received == self.say:
            self.transport.loseConnection()  # type: ignore[union-attr]

    def connectionLost(self, reason: Any = None) -> None:
        self.closed.callback(self.received)


class EndpointListenersTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.directory = tempfile.mkdtemp()
        self.ca = TestCA(self.directory)

    def listen(self, tls: TlsFiles | None, port: int = 0) -> Any:
        listening = listen(reactor, port, "127.0.0.1", tls, protocol.Factory.forProtocol(_Echo))
        self.addCleanup(listening.stopListening)
        return listening

    async def echo(self, port: int, tls: bool) -> bytes:
        endpoint = InternalTlsClient(self.ca.ca_path).endpoint(reactor, "127.0.0.1", port, tls)
        client = await connectProtocol(endpoint, _Client())
        return await client.closed

    async def test_plain_tcp(self) -> None:
        listening = self.listen(None)
        port = listening.getHost().port
        self.assertNotEqual(port, 0)  # any free port, told back
        self.assertEqual(await self.echo(port, tls=False), b"hello")
        self.assertEqual(
            describe_listener(listening, "127.0.0.1", ("client", "health"), None),
            f"127.0.0.1:{port} (client, health)",
        )

    async def test_tls_with_the_listeners_certificate(self) -> None:
        files = TlsFiles(*self.ca.issue("main", ["127.0.0.1"]))
        listening = self.listen(files)
        port = listening.getHost().port
        self.assertEqual(await self.echo(port, tls=True), b"hello")
        self.assertEqual(
            describe_listener(listening, "127.0.0.1", ("replication",), files),
            f"127.0.0.1:{port} (replication; TLS)",
        )

    async def test_a_plain_client_gets_nothing_from_a_tls_listener(self) -> None:
        port = self.listen(TlsFiles(*self.ca.issue("main", ["127.0.0.1"]))).getHost().port
        plain = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
        # Not a TLS handshake: the listener closes without echoing anything.
        client = await connectProtocol(plain, _Client(b"GET / HTTP/1.1\r\n\r\n"))
        self.assertEqual(await client.closed, b"")

    def test_a_taken_port_fails_at_once(self) -> None:
        port = self.listen(None).getHost().port
        with self.assertRaises(CannotListenError):
            self.listen(None, port)

    def test_unreadable_certificate_fails_at_once(self) -> None:
        missing = os.path.join(self.directory, "missing.pem")
        with self.assertRaises(TlsSetupError) as cm:
            self.listen(TlsFiles(missing, missing))
        self.assertIn(missing, str(cm.exception))
