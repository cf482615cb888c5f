"""TLS between processes on real sockets: TCP replication and internal calls
over TLS, each side checking the other's certificate against the configured
CA and the address it connected to; a certificate from another CA, or for
another address, is refused."""

from __future__ import annotations

import os
import tempfile
from typing import Any, cast

from twisted.internet import reactor
from twisted.trial import unittest

from synapse_lite.api.errors import SynapseError
from synapse_lite.clock import Clock
from synapse_lite.config.homeserver import (
    HomeServerConfig,
    InstanceLocation,
    TlsFiles,
    read_homeserver_config,
)
from synapse_lite.config.validation import ConfigError
from synapse_lite.http.server import make_site
from synapse_lite.http.tls import InternalTlsClient, TlsSetupError, server_tls_options
from synapse_lite.replication.http.calls import InternalCalls
from synapse_lite.replication.tcp.commands import PositionCommand
from synapse_lite.replication.tcp.tcp_client import ReplicationClientFactory
from synapse_lite.replication.tcp.tcp_server import ReplicationServerFactory
from synapse_lite.replication.transports import replication_endpoint
from tests.harness.tls import TestCA
from tests.replication.http.test_calls import ECHO, Echo, _Locations, _Waiter
from tests.replication.tcp.recording_receiver import RecordingReceiver, wait_until

_reactor = cast(Any, reactor)
SECRET = "tls-secret"


def config_with(
    directory: str, ca_path: str, replication_port: int, tls: TlsFiles
) -> HomeServerConfig:
    data = {
        "server_name": "hs.test",
        "worker_replication_secret": SECRET,
        "replication": {
            "tcp": {
                "host": "127.0.0.1",
                "port": replication_port,
                "tls_certificate_path": tls.certificate_path,
                "tls_private_key_path": tls.private_key_path,
            }
        },
        "internal_tls": {"ca_path": ca_path},
        "listeners": [{"port": 1, "resources": ["replication"]}],
        "workers": {"writer": {"listeners": [{"port": 2, "resources": ["replication"]}]}},
        "stream_writers": {"typing": "writer"},
    }
    return read_homeserver_config(data, os.path.join(directory, "homeserver.yaml"))


class TlsTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.directory = tempfile.mkdtemp()
        self.ca = TestCA(self.directory)
        self.files = TlsFiles(*self.ca.issue("main", ["127.0.0.1", "localhost"]))

    def listen_replication(self, files: TlsFiles) -> tuple[ReplicationServerFactory, int]:
        receiver = RecordingReceiver()
        server = ReplicationServerFactory("hs.test", SECRET, receiver, _reactor)
        port = _reactor.listenSSL(0, server, server_tls_options(files), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.addCleanup(
            wait_until, lambda: not server.open_protocols, what="server connections to close"
        )
        return server, port.getHost().port

    def connect_worker(
        self, config: HomeServerConfig
    ) -> tuple[ReplicationClientFactory, RecordingReceiver]:
        receiver = RecordingReceiver()
        client = ReplicationClientFactory(
            "hs.test", "writer", SECRET, receiver, _reactor, initial_delay=0.05, max_delay=1
        )
        client.connect(replication_endpoint(config, _reactor))
        self.addCleanup(client.stop)
        return client, receiver

    async def test_replication_over_tls(self) -> None:
        server, port = self.listen_replication(self.files)
        config = config_with(self.directory, self.ca.ca_path, port, self.files)
        _, receiver = self.connect_worker(config)
        await wait_until(lambda: bool(server.connections), what="the worker to connect")
        position = PositionCommand("events", "main", 1, 5)
        server.send_command(position)
        await wait_until(lambda: position in receiver.commands, what="a command over TLS")

    async def test_replication_refuses_a_certificate_from_another_ca(self) -> None:
        stranger = TestCA(tempfile.mkdtemp(), "somebody else")
        server, port = self.listen_replication(TlsFiles(*stranger.issue("main", ["127.0.0.1"])))
        config = config_with(self.directory, self.ca.ca_path, port, self.files)
        client, receiver = self.connect_worker(config)
        # Each refused attempt is reported lost a moment after it is made:
        # wait for two attempts that have both ended, not just begun.
        await wait_until(
            lambda: client.connections_made >= 2 and len(receiver.connections("lost")) >= 2,
            what="two refused connections, each lost",
        )
        # The handshake failed before anything (the secret first) went out.
        self.assertEqual(server.connections, ())
        self.assertEqual(receiver.commands, [])
        self.assertLessEqual(
            len(receiver.connections("new")) - len(receiver.connections("lost")), 1
        )

    async def test_internal_call_over_https(self) -> None:
        config = config_with(self.directory, self.ca.ca_path, 9, self.files)
        locations = _Locations()

        def calls(name: str) -> InternalCalls:
            made = InternalCalls(
                config=config,
                instance_name=name,
                clock=Clock(_reactor),
                reactor=_reactor,
                locations=locations,
                waiter=_Waiter(),
            )
            self.addCleanup(made.close)
            return made

        writer = calls("writer")

        async def echo(request: Echo) -> Echo:
            return Echo(request.text.upper())

        writer.serve(ECHO, echo)
        site = make_site(writer.resource(), 65536)
        port = _reactor.listenSSL(0, site, server_tls_options(self.files), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        number = port.getHost().port
        locations.places["writer"] = [InstanceLocation("127.0.0.1", number, tls=True)]
        self.assertEqual(await calls("main").call(ECHO, Echo("hi")), Echo("HI"))
        # The address must be in the certificate.
        other = TlsFiles(*self.ca.issue("elsewhere", ["10.9.9.9"]))
        port2 = _reactor.listenSSL(
            0, make_site(writer.resource(), 65536), server_tls_options(other), interface="127.0.0.1"
        )
        self.addCleanup(port2.stopListening)
        locations.places["writer"] = [InstanceLocation("127.0.0.1", port2.getHost().port, tls=True)]
        with self.assertRaises(SynapseError) as raised:
            await calls("main").call(ECHO, Echo("hi"))
        self.assertEqual(raised.exception.code, 503)

    def test_tls_without_a_ca_is_a_config_error(self) -> None:
        data = {
            "server_name": "hs.test",
            "worker_replication_secret": SECRET,
            "listeners": [
                {
                    "port": 1,
                    "resources": ["replication"],
                    "tls_certificate_path": self.files.certificate_path,
                    "tls_private_key_path": self.files.private_key_path,
                }
            ],
            "workers": {"w": {"listeners": [{"port": 2, "resources": ["replication"]}]}},
        }
        with self.assertRaises(ConfigError) as raised:
            read_homeserver_config(data, os.path.join(self.directory, "homeserver.yaml"))
        self.assertIn("internal_tls.ca_path", str(raised.exception))
        data["listeners"][0]["tls_private_key_path"] = "/nonexistent.key"  # type: ignore[index]
        data["internal_tls"] = {"ca_path": self.ca.ca_path}
        with self.assertRaises(ConfigError) as raised:
            read_homeserver_config(data, os.path.join(self.directory, "homeserver.yaml"))
        self.assertIn("cannot read /nonexistent.key", str(raised.exception))

    def test_unusable_files_are_named(self) -> None:
        with self.assertRaises(TlsSetupError) as raised:
            server_tls_options(TlsFiles(self.files.certificate_path, self.files.certificate_path))
        self.assertIn(self.files.certificate_path, str(raised.exception))
        with self.assertRaises(TlsSetupError) as raised:
            InternalTlsClient(None).options_for("10.0.0.1")
        self.assertIn("internal_tls.ca_path is not set", str(raised.exception))
