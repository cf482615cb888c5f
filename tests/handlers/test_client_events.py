"""Signing events served in the federation format."""

from __future__ import annotations

from twisted.trial import unittest

from synapse_lite.api.errors import SynapseError
from synapse_lite.federation.crypto import SigningKey, SigningKeyFileError, verify_signed_json
from synapse_lite.handlers.client_events import PduSigner


class PduSignerTestCase(unittest.TestCase):
    def test_signs_with_the_key_read_once(self) -> None:
        key = SigningKey.generate()
        reads: list[int] = []

        def load() -> SigningKey:
            reads.append(1)
            return key

        signer = PduSigner("a.test", load)
        event = {"type": "m.room.message", "content": {}, "depth": 2}
        signatures = signer.signatures(event)
        verify_signed_json(
            {**event, "signatures": signatures}, "a.test", key.key_id, key.verify_key_base64
        )
        # Deterministic: what makes every process serve the same signature.
        self.assertEqual(signer.signatures(event), signatures)
        self.assertEqual(len(reads), 1)

    def test_no_key_is_a_clear_503(self) -> None:
        def load() -> SigningKey:
            raise SigningKeyFileError("/data/signing.key does not exist")

        with self.assertRaises(SynapseError) as caught:
            PduSigner("a.test", load).signatures({"type": "t"})
        self.assertEqual(caught.exception.code, 503)
        self.assertIn("signing.key does not exist", caught.exception.msg)
