"""The X-Matrix Authorization header."""

from __future__ import annotations

from twisted.trial import unittest

from synapse_lite.federation.auth import (
    AuthHeaderError,
    XMatrixAuth,
    parse_auth_header,
    request_json,
    sign_request,
)
from synapse_lite.federation.crypto import SigningKey, canonical_json, verify_signature

KEY = SigningKey("a_test", bytes(range(32)))


class ParseTest(unittest.TestCase):
    def test_spec_example(self) -> None:
        auth = parse_auth_header(
            'X-Matrix origin="origin.hs.example.com",destination="destination.hs.example.com",'
            'key="ed25519:key1",sig="ABCDEF..."'
        )
        self.assertEqual(
            auth,
            XMatrixAuth(
                "origin.hs.example.com", "ed25519:key1", "ABCDEF...", "destination.hs.example.com"
            ),
        )

    def test_unquoted_spaces_escapes_and_case(self) -> None:
        auth = parse_auth_header(b'x-matrix Origin=a.example:8448, key = "ed25519:k\\"1" ,sig=c2ln')
        self.assertEqual(auth, XMatrixAuth("a.example:8448", 'ed25519:k"1', "c2ln", None))

    def test_round_trip(self) -> None:
        auth = XMatrixAuth('we"ird', "ed25519:k", "c2ln", "b.example")
        self.assertEqual(parse_auth_header(auth.to_header()), auth)

    def test_malformed(self) -> None:
        for header in (
            "",
            "Bearer abc",
            "X-Matrix",
            'X-Matrix origin="a",key="k"',
            'X-Matrix origin="a,key="k",sig="s"',
            'X-Matrix origin="a" key="k",sig="s"',
            'X-Matrix origin="a",origin="b",key="k",sig="s"',
            "X-Matrix origin",
            b"X-Matrix origin=\xff,key=k,sig=s",
            "X-Matrix origin=" + "a" * 5000 + ",key=k,sig=s",
        ):
            with self.assertRaises(AuthHeaderError, msg=repr(header)):
                parse_auth_header(header)


class SignRequestTest(unittest.TestCase):
    def test_signature_covers_method_uri_origin_destination_content(self) -> None:
        content = {"edus": [], "origin": "a.example"}
        header = sign_request(KEY, "a.example", "b.example", "PUT", "/x/1", content)
        auth = parse_auth_header(header)
        self.assertEqual(
            (auth.origin, auth.destination, auth.key_id), ("a.example", "b.example", KEY.key_id)
        )
        good = canonical_json(request_json("PUT", "/x/1", "a.example", "b.example", content))
        verify_signature(good, auth.signature, KEY.verify_key_base64)
        for changed in (
            request_json("GET", "/x/1", "a.example", "b.example", content),
            request_json("PUT", "/x/2", "a.example", "b.example", content),
            request_json("PUT", "/x/1", "a.example", "c.example", content),
            request_json("PUT", "/x/1", "a.example", "b.example", {"edus": [1]}),
        ):
            with self.assertRaises(ValueError):
                verify_signature(canonical_json(changed), auth.signature, KEY.verify_key_base64)
