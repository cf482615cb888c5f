"""Canonical JSON, unpadded base64, signing keys and signed JSON."""

from __future__ import annotations

import os
import stat
import tempfile

from twisted.trial import unittest

from synapse_lite.federation.crypto import (
    CanonicalJsonError,
    SignatureError,
    SigningKey,
    SigningKeyFileError,
    canonical_json,
    decode_base64,
    encode_base64,
    load_or_create_signing_key,
    sign_json,
    signing_key_path,
    verify_signed_json,
)

# The spec's example key: seed of 32 zero bytes... any fixed seed makes the
# signature deterministic (ed25519 signatures are).
SEED = bytes(range(32))


class CanonicalJsonTest(unittest.TestCase):
    def test_sorted_compact_utf8(self) -> None:
        self.assertEqual(
            canonical_json({"b": 1, "a": {"d": [1, 2], "c": "é"}}),
            '{"a":{"c":"é","d":[1,2]},"b":1}'.encode(),
        )

    def test_spec_examples(self) -> None:
        self.assertEqual(canonical_json({}), b"{}")
        self.assertEqual(canonical_json({"one": 1, "two": "Two"}), b'{"one":1,"two":"Two"}')
        self.assertEqual(canonical_json({"a": "日本語"}), '{"a":"日本語"}'.encode())
        self.assertEqual(canonical_json({"a": None}), b'{"a":null}')
        self.assertEqual(canonical_json({"a": "\u0000"}), b'{"a":"\\u0000"}')

    def test_refuses_floats_and_big_integers(self) -> None:
        for bad in ({"a": 1.5}, {"a": 2**53}, {"a": [-(2**53)]}, {1: "x"}, {"a": object()}):
            with self.assertRaises(CanonicalJsonError, msg=repr(bad)):
                canonical_json(bad)
        self.assertEqual(canonical_json({"a": 2**53 - 1}), b'{"a":9007199254740991}')


class Base64Test(unittest.TestCase):
    def test_unpadded_round_trip(self) -> None:
        for data in (b"", b"a", b"ab", b"abc", b"abcd", bytes(range(256))):
            text = encode_base64(data)
            self.assertNotIn("=", text)
            self.assertEqual(decode_base64(text), data)
        self.assertEqual(decode_base64("YQ=="), b"a")  # padded input is accepted

    def test_garbage(self) -> None:
        for bad in ("!!!!", "ab cd", "é"):
            with self.assertRaises(ValueError):
                decode_base64(bad)


class SignedJsonTest(unittest.TestCase):
    def setUp(self) -> None:
        self.key = SigningKey("a_test", SEED)

    def test_sign_and_verify(self) -> None:
        signed = sign_json({"foo": "bar", "unsigned": {"x": 1}}, "a.example", self.key)
        self.assertIn("ed25519:a_test", signed["signatures"]["a.example"])
        verify_signed_json(signed, "a.example", "ed25519:a_test", self.key.verify_key_base64)
        # unsigned and other servers' signatures are outside what is signed
        signed["unsigned"] = {"changed": True}
        signed["signatures"]["other"] = {"ed25519:x": "AAAA"}
        verify_signed_json(signed, "a.example", "ed25519:a_test", self.key.verify_key_base64)

    def test_deterministic(self) -> None:
        a = sign_json({"x": 1}, "a.example", self.key)
        b = sign_json({"x": 1}, "a.example", self.key)
        self.assertEqual(a, b)

    def test_tampered_or_other_key_refused(self) -> None:
        signed = sign_json({"foo": "bar"}, "a.example", self.key)
        other = SigningKey("a_other", bytes(32))
        tampered = {**signed, "foo": "baz"}
        with self.assertRaises(SignatureError):
            verify_signed_json(tampered, "a.example", "ed25519:a_test", self.key.verify_key_base64)
        with self.assertRaises(SignatureError):
            verify_signed_json(signed, "a.example", "ed25519:a_test", other.verify_key_base64)
        with self.assertRaises(SignatureError):
            verify_signed_json(signed, "b.example", "ed25519:a_test", self.key.verify_key_base64)
        with self.assertRaises(SignatureError):
            verify_signed_json(signed, "a.example", "ed25519:nope", self.key.verify_key_base64)
        broken = {**signed, "signatures": {"a.example": {"ed25519:a_test": "not base64!"}}}
        with self.assertRaises(SignatureError):
            verify_signed_json(broken, "a.example", "ed25519:a_test", self.key.verify_key_base64)
        with self.assertRaises(SignatureError):
            verify_signed_json(signed, "a.example", "ed25519:a_test", "c2hvcnQ")


class KeyFileTest(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp()

    def test_created_once_with_0600(self) -> None:
        key = load_or_create_signing_key(self.dir, create=True)
        path = signing_key_path(self.dir)
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        self.assertEqual(load_or_create_signing_key(self.dir, create=True), key)
        self.assertEqual(load_or_create_signing_key(self.dir, create=False), key)
        with open(path) as f:
            algorithm, version, seed = f.read().split()
        self.assertEqual((algorithm, version), ("ed25519", key.version))
        self.assertEqual(decode_base64(seed), key.seed)
        self.assertEqual(os.listdir(self.dir), ["signing.key"])  # no temp file left

    def test_worker_without_key_fails_clearly(self) -> None:
        with self.assertRaises(SigningKeyFileError) as e:
            load_or_create_signing_key(self.dir, create=False)
        self.assertIn("start it before this worker", str(e.exception))

    def test_bad_file(self) -> None:
        for content in ("", "rsa a_b c", "ed25519 a_b !!!", "ed25519 a_b " + encode_base64(b"x")):
            with open(signing_key_path(self.dir), "w") as f:
                f.write(content)
            with self.assertRaises(SigningKeyFileError, msg=content):
                load_or_create_signing_key(self.dir, create=True)
