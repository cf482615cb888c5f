"""Client activity is passed on at most once per (token, address, user
agent) every LAST_SEEN_GRANULARITY_MS, and carries the token's hash only."""

from __future__ import annotations

from twisted.internet import task
from twisted.trial import unittest

from synapse_lite.clock import Clock
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.client_ips import LAST_SEEN_GRANULARITY_MS, ClientIpRecorder
from synapse_lite.replication.tcp.commands import (
    UserIpCommand,
    command_line,
    parse_command_from_line,
)

ALICE = Requester("@alice:test.local", "DEV", "a" * 64)
ALICE_OTHER_TOKEN = Requester("@alice:test.local", "DEV2", "b" * 64)


class ClientIpRecorderTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.reactor = task.Clock()
        self.reactor.advance(1_000)  # 1,000 s after the epoch
        self.sent: list[UserIpCommand] = []
        self.recorder = ClientIpRecorder(Clock(self.reactor), self.sent.append)

    def test_throttled_per_token_address_and_agent(self) -> None:
        self.recorder.on_request(ALICE, "10.0.0.1", "app/1")
        self.recorder.on_request(ALICE, "10.0.0.1", "app/1")  # same key: dropped
        self.recorder.on_request(ALICE, "10.0.0.2", "app/1")  # new address
        self.recorder.on_request(ALICE, "10.0.0.1", "app/2")  # new user agent
        self.recorder.on_request(ALICE_OTHER_TOKEN, "10.0.0.1", "app/1")  # new token
        self.assertEqual(len(self.sent), 4)
        self.reactor.advance(LAST_SEEN_GRANULARITY_MS / 1000 - 1)
        self.recorder.on_request(ALICE, "10.0.0.1", "app/1")
        self.assertEqual(len(self.sent), 4)
        self.reactor.advance(1)
        self.recorder.on_request(ALICE, "10.0.0.1", "app/1")
        self.assertEqual(len(self.sent), 5)
        self.assertEqual(self.sent[-1].last_seen, 1_000_000 + LAST_SEEN_GRANULARITY_MS)

    def test_command_fields(self) -> None:
        self.recorder.on_request(ALICE, "10.0.0.1", "x" * 2_000 + "\x00")
        [cmd] = self.sent
        self.assertEqual(
            (cmd.user_id, cmd.access_token, cmd.ip, cmd.device_id, cmd.last_seen),
            ("@alice:test.local", "a" * 64, "10.0.0.1", "DEV", 1_000_000),
        )
        # Bounded, and no NUL (PostgreSQL text cannot hold it).
        self.assertEqual(cmd.user_agent, "x" * 512)
        # It survives the wire.
        self.assertEqual(parse_command_from_line(command_line(cmd)), cmd)
