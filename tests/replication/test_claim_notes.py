"""The main process's signed CHECKED notes spare Redis followers the sequence
read (``replication/claim_notes.py``): only the main process's key is
believed, a follower waits a bounded time for a note and then reads itself,
and a note is never taken where none is expected (the handler over in-memory
connections, on a fake clock)."""

from __future__ import annotations

from typing import Any

from nacl.signing import SigningKey
from twisted.internet import defer, task
from twisted.trial import unittest

from synapse_lite.clock import Clock
from synapse_lite.replication.claim_notes import (
    BAD_NOTE,
    KEY_RELOAD_INTERVAL_SECONDS,
    ClaimNoteSigner,
    ClaimNoteVerifier,
)
from synapse_lite.replication.claims import NOTE_NOT_EXPECTED, NOTE_WAIT_SECONDS, PeerClaims
from synapse_lite.replication.tcp.commands import (
    CheckedCommand,
    CommandParseError,
    PositionCommand,
    RdataCommand,
    claim_stream,
    command_line,
    parse_command_from_line,
)
from synapse_lite.replication.tcp.handler import ReplicationCommandHandler
from synapse_lite.streams.catalog import BUILTIN_STREAMS
from tests.replication.tcp.fakes import RecordingConnection, RecordingReceiver, fake_stream
from tests.replication.test_claims import receipt, refused

DEPLOYMENT = "d1"


class CheckedCommandTestCase(unittest.TestCase):
    def test_a_note_survives_the_wire_and_names_its_stream(self) -> None:
        note = ClaimNoteSigner(DEPLOYMENT).note("events", 1234)
        line = command_line(note)
        self.assertEqual(parse_command_from_line(line), note)
        self.assertEqual(claim_stream(line.encode()), b"events")

    def test_a_note_with_a_missing_field_does_not_parse(self) -> None:
        with self.assertRaises(CommandParseError):
            parse_command_from_line("CHECKED events 12 keyid")
        with self.assertRaises(CommandParseError):
            parse_command_from_line("CHECKED events twelve keyid sig")


class NotesTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.clock = task.Clock()
        self.receipts, self.positions, _ = fake_stream(BUILTIN_STREAMS["receipts"])
        self.positions.allocated = 10
        self.typing, _, _ = fake_stream(BUILTIN_STREAMS["typing"], can_reset=True)
        self.streams = {"receipts": self.receipts, "typing": self.typing}
        self.key = SigningKey.generate()
        self.signer = ClaimNoteSigner(DEPLOYMENT, self.key)
        self.recorded: tuple[str, str] | None = ("main", self.signer.verify_key)
        self.key_reads = 0

        async def load_key() -> tuple[str, str] | None:
            self.key_reads += 1
            return self.recorded

        self.verifier = ClaimNoteVerifier(DEPLOYMENT, load_key, Clock(self.clock))
        self.claims = PeerClaims(
            Clock(self.clock),
            self.streams,
            lambda stream: {"receipts": ("w1", "main"), "typing": ("tw",)}.get(stream, ()),
            notes=self.verifier,
        )
        self.handler = ReplicationCommandHandler(
            instance_name="me",
            clock=Clock(self.clock),
            streams=self.streams,
            receiver=RecordingReceiver(self.streams),  # type: ignore[arg-type]
            claims=self.claims,
        )
        self.bus = RecordingConnection("redis")
        self.handler.new_connection(self.bus)

    def command(self, cmd: Any) -> None:
        self.handler.on_command(self.bus, cmd)

    def test_a_claim_covered_by_the_main_process_note_needs_no_read(self) -> None:
        self.command(PositionCommand("receipts", "w1", 0, 5))
        self.command(RdataCommand("receipts", "w1", 6, receipt(6)))
        self.command(RdataCommand("receipts", "w1", 7, receipt(7)))
        self.assertEqual(self.positions.received, {})  # waiting for a note
        self.command(self.signer.note("receipts", 7))
        self.assertEqual(self.positions.received, {"w1": 7})
        self.assertEqual(self.positions.sequence_reads, 0)
        self.assertEqual(self.key_reads, 1)
        # The note's value is believed from then on: no wait at all.
        self.command(self.signer.note("receipts", 9))
        self.command(RdataCommand("receipts", "w1", 9, receipt(9)))
        self.assertEqual(self.positions.received, {"w1": 9})
        self.assertEqual(self.positions.sequence_reads, 0)
        self.assertEqual(self.key_reads, 1)

    def test_a_note_that_arrives_first_covers_the_claim_at_once(self) -> None:
        self.command(self.signer.note("receipts", 8))
        self.command(PositionCommand("receipts", "w1", 0, 8))
        self.assertEqual(self.positions.received, {"w1": 8})
        self.assertEqual(self.positions.sequence_reads, 0)

    def test_without_a_note_the_follower_reads_the_sequence_after_the_wait(self) -> None:
        self.command(PositionCommand("receipts", "w1", 0, 5))
        self.clock.advance(NOTE_WAIT_SECONDS - 0.01)
        self.assertEqual(self.positions.received, {})
        with self.assertLogs("synapse_lite.replication.claims", "INFO") as logs:
            self.clock.advance(0.02)
        self.assertIn("No CHECKED note covered receipts 5", logs.output[0])
        self.assertEqual(self.positions.received, {"w1": 5})
        self.assertEqual(self.positions.sequence_reads, 1)
        # Then at once, without waiting, until a note comes again.
        self.positions.allocated = 12
        self.command(RdataCommand("receipts", "w1", 11, receipt(11)))
        self.command(RdataCommand("receipts", "w1", 12, receipt(12)))
        self.assertEqual(self.positions.received, {"w1": 12})
        self.assertEqual(self.positions.sequence_reads, 2)
        self.command(self.signer.note("receipts", 13))
        self.command(RdataCommand("receipts", "w1", 14, receipt(14)))
        self.assertEqual(self.positions.received, {"w1": 12})  # waits again
        self.command(self.signer.note("receipts", 14))
        self.assertEqual(self.positions.received, {"w1": 14})
        self.assertEqual(self.positions.sequence_reads, 2)

    def test_a_note_below_the_claim_leaves_it_waiting_then_the_read_refuses_it(self) -> None:
        self.command(PositionCommand("receipts", "w1", 0, 5))
        self.command(self.signer.note("receipts", 5))
        self.command(RdataCommand("receipts", "w1", 50, receipt(50)))
        self.command(self.signer.note("receipts", 10))
        self.assertEqual(self.positions.received, {"w1": 5})
        with self.assertLogs("synapse_lite.replication.claims", "WARNING") as logs:
            self.clock.advance(NOTE_WAIT_SECONDS)
        self.assertIn("not_allocated", "\n".join(logs.output))
        self.assertEqual(self.positions.received, {"w1": 5})
        self.assertEqual(self.positions.sequence_reads, 1)

    def test_the_main_process_claims_come_with_their_note(self) -> None:
        self.command(PositionCommand("receipts", "main", 0, 5))
        self.command(self.signer.note("receipts", 5))
        self.assertEqual(self.positions.received, {"main": 5})
        self.assertEqual(self.positions.sequence_reads, 0)

    def test_a_stream_without_a_sequence_waits_for_nothing(self) -> None:
        self.command(PositionCommand("typing", "tw", 0, 5))
        self.assertEqual(self.handler.streams["typing"].positions.received_position("tw"), 5)

    def test_a_note_signed_by_another_key_is_refused_and_never_believed(self) -> None:
        forged = ClaimNoteSigner(DEPLOYMENT, SigningKey.generate())
        before = refused("receipts", BAD_NOTE)
        self.command(PositionCommand("receipts", "w1", 0, 5))
        with self.assertLogs("synapse_lite.replication.claims", "WARNING") as logs:
            self.command(forged.note("receipts", 10**6))
        self.assertIn("bad_note", logs.output[0])
        self.assertEqual(refused("receipts", BAD_NOTE), before + 1)
        self.assertEqual(self.positions.received, {})
        self.clock.advance(NOTE_WAIT_SECONDS)
        self.assertEqual(self.positions.received, {"w1": 5})
        self.assertEqual(self.positions.sequence_reads, 1)
        # The unknown key made the recorded key be read once; a flood of
        # forged notes reads it at most once per interval.
        for n in range(20):
            self.command(forged.note("receipts", 100 + n))
        self.assertEqual(self.key_reads, 1)
        self.clock.advance(KEY_RELOAD_INTERVAL_SECONDS)
        self.command(forged.note("receipts", 200))
        self.assertEqual(self.key_reads, 2)

    def test_a_note_with_the_right_key_id_and_a_wrong_signature_is_refused(self) -> None:
        good = self.signer.note("receipts", 10)
        self.command(good)  # the key is read here
        self.command(PositionCommand("receipts", "w1", 0, 5))
        self.assertEqual(self.positions.received, {"w1": 5})
        tampered = CheckedCommand("receipts", 10**6, good.key_id, good.signature)
        before = refused("receipts", BAD_NOTE)
        with self.assertLogs("synapse_lite.replication.claims", "WARNING"):
            self.command(tampered)
        self.assertEqual(refused("receipts", BAD_NOTE), before + 1)
        self.command(RdataCommand("receipts", "w1", 11, receipt(11)))
        self.clock.advance(NOTE_WAIT_SECONDS)
        # Read, and refused: the sequence handed out only 10.
        self.assertEqual(self.positions.received, {"w1": 5})

    def test_a_note_of_another_deployment_is_refused(self) -> None:
        # The main process's own key, but another deployment's note.
        other = ClaimNoteSigner("d2", self.key)
        with self.assertLogs("synapse_lite.replication.claims", "WARNING"):
            self.command(other.note("receipts", 10))
        self.command(PositionCommand("receipts", "w1", 0, 5))
        self.assertEqual(self.positions.received, {})

    def test_a_new_main_process_key_is_read_when_its_first_note_comes(self) -> None:
        self.command(self.signer.note("receipts", 3))
        self.clock.advance(KEY_RELOAD_INTERVAL_SECONDS)
        restarted = ClaimNoteSigner(DEPLOYMENT)
        self.recorded = ("main", restarted.verify_key)
        self.command(PositionCommand("receipts", "w1", 0, 5))
        self.command(restarted.note("receipts", 6))
        self.assertEqual(self.positions.received, {"w1": 5})
        self.assertEqual(self.positions.sequence_reads, 0)
        self.assertEqual(self.key_reads, 2)

    def test_notes_waiting_for_the_key_are_checked_once_it_is_read(self) -> None:
        reading: defer.Deferred[tuple[str, str] | None] = defer.Deferred()

        async def slow_load() -> tuple[str, str] | None:
            self.key_reads += 1
            return await reading

        self.verifier._load_key = slow_load
        self.command(PositionCommand("receipts", "w1", 0, 5))
        self.command(self.signer.note("receipts", 4))
        self.command(self.signer.note("receipts", 6))
        self.assertEqual(self.key_reads, 1)
        reading.callback(("main", self.signer.verify_key))
        self.assertEqual(self.positions.received, {"w1": 5})
        self.assertEqual(self.positions.sequence_reads, 0)

    def test_an_unreadable_recorded_key_believes_no_note(self) -> None:
        self.recorded = ("main", "not base64!")
        with self.assertLogs("synapse_lite.replication.claim_notes", "WARNING") as logs:
            self.command(self.signer.note("receipts", 10))
        self.assertIn("not an ed25519 key", logs.output[0])
        self.command(PositionCommand("receipts", "w1", 0, 5))
        self.clock.advance(NOTE_WAIT_SECONDS)
        self.assertEqual(self.positions.sequence_reads, 1)


class MainProcessTestCase(unittest.TestCase):
    """The main process publishes each sequence read as a note; with no
    verifier (TCP, or the main process itself) a note is refused."""

    def setUp(self) -> None:
        self.clock = task.Clock()
        self.receipts, self.positions, _ = fake_stream(BUILTIN_STREAMS["receipts"])
        self.positions.allocated = 10
        self.signer = ClaimNoteSigner(DEPLOYMENT)
        self.published: list[CheckedCommand] = []
        self.claims = PeerClaims(
            Clock(self.clock),
            {"receipts": self.receipts},
            lambda stream: ("w1",),
            publish_read=lambda s, a: self.published.append(self.signer.note(s, a)),
        )

    def test_each_sequence_read_is_published_once(self) -> None:
        first = self.claims.check(PositionCommand("receipts", "w1", 0, 5), "w1")
        second = self.claims.check(PositionCommand("receipts", "w1", 5, 7), "w1")
        self.assertTrue(self.successResultOf(defer.maybeDeferred(lambda: first)))
        self.assertIs(second, True)  # covered by what the first read saw
        self.assertEqual([(n.stream_name, n.allocated) for n in self.published], [("receipts", 10)])
        self.assertEqual(self.positions.sequence_reads, 1)

    def test_a_note_is_refused_where_none_is_taken(self) -> None:
        before = refused("receipts", NOTE_NOT_EXPECTED)
        with self.assertLogs("synapse_lite.replication.claims", "WARNING"):
            self.claims.on_note(self.signer.note("receipts", 10**6), "w1")
        self.assertEqual(refused("receipts", NOTE_NOT_EXPECTED), before + 1)
        self.assertIsNot(
            self.claims.check(PositionCommand("receipts", "w1", 10, 10**6), "w1"), True
        )
