"""Writing at once to a plain TCP socket (``sockets.py``): sent on
the spot when nothing is queued, queued behind what is, and any other
transport or a failing socket written to as Twisted does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer, protocol
from twisted.internet import reactor as _reactor
from twisted.internet.testing import StringTransport
from twisted.trial import unittest

from synapse_lite.sockets import write_now
from tests.harness.polling import eventually

reactor: Any = _reactor


class Collect(protocol.Protocol):
    def __init__(self) -> None:
        self.received = bytearray()

    def dataReceived(self, data: bytes) -> None:
        self.received += data


class SocketSending:
    """A socket whose ``send`` is replaced (a partial send, a failure)."""

    def __init__(self, real: Any, send: Callable[[bytes], int]) -> None:
        self._real = real
        self.send = send

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class WriteNowTestCase(unittest.TestCase):
    async def _pair(self) -> tuple[Any, Collect]:
        """A connected TCP transport and the protocol at the other end."""
        server = Collect()
        factory = protocol.Factory.forProtocol(lambda: server)
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        client = await protocol.ClientCreator(reactor, protocol.Protocol).connectTCP(
            "127.0.0.1", port.getHost().port
        )
        self.addCleanup(client.transport.loseConnection)
        return client.transport, server

    @defer.inlineCallbacks
    def test_sent_at_once_when_nothing_is_queued(self) -> Any:
        transport, server = yield defer.ensureDeferred(self._pair())
        write_now(transport, b"hello")
        # Nothing left for the reactor to write: the socket took it.
        self.assertFalse(transport._tempDataBuffer)
        self.assertFalse(transport.dataBuffer)
        yield defer.ensureDeferred(eventually(lambda: bytes(server.received) == b"hello"))

    @defer.inlineCallbacks
    def test_queued_behind_what_is_queued(self) -> Any:
        transport, server = yield defer.ensureDeferred(self._pair())
        transport.write(b"first ")
        write_now(transport, b"second")
        self.assertEqual(transport._tempDataBuffer, [b"first ", b"second"])
        yield defer.ensureDeferred(eventually(lambda: bytes(server.received) == b"first second"))

    @defer.inlineCallbacks
    def test_what_the_socket_does_not_take_is_queued(self) -> Any:
        transport, server = yield defer.ensureDeferred(self._pair())
        real = transport.socket
        transport.socket = SocketSending(real, lambda data: real.send(data[:3]))
        write_now(transport, b"abcdef")
        transport.socket = real
        self.assertEqual(transport._tempDataBuffer, [b"def"])
        yield defer.ensureDeferred(eventually(lambda: bytes(server.received) == b"abcdef"))

    @defer.inlineCallbacks
    def test_a_failing_socket_is_left_to_twisted(self) -> Any:
        transport, _ = yield defer.ensureDeferred(self._pair())
        real = transport.socket

        def broken(data: bytes) -> int:
            raise BlockingIOError()

        transport.socket = SocketSending(real, broken)
        write_now(transport, b"later")
        transport.socket = real
        self.assertEqual(transport._tempDataBuffer, [b"later"])

    def test_other_transports_are_written_to(self) -> None:
        transport = StringTransport()
        write_now(transport, b"data")
        self.assertEqual(transport.value(), b"data")

    @defer.inlineCallbacks
    def test_a_closing_connection_is_left_to_twisted(self) -> Any:
        transport, _ = yield defer.ensureDeferred(self._pair())
        transport.loseConnection()
        write_now(transport, b"late")
        # Not sent on the spot: queued, as transport.write does after loseConnection.
        self.assertEqual(transport._tempDataBuffer, [b"late"])
