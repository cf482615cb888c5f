"""A process believes the client address the router forwards only with the
router's proof; anyone else's X-Forwarded-For is ignored."""

from __future__ import annotations

from twisted.internet.address import IPv4Address
from twisted.trial import unittest
from twisted.web.resource import Resource
from twisted.web.test.requesthelper import DummyChannel

from synapse_lite.api.access_tokens import generate_access_token, localpart_of_token
from synapse_lite.http.forwarded import forwarded_address, router_proof
from synapse_lite.http.server import make_site

SECRET = "s3cret"


class ForwardedTestCase(unittest.TestCase):
    def request(self, headers: dict[bytes, bytes]) -> object:
        site = make_site(Resource(), 1024 * 1024, router_proof=router_proof(SECRET))
        channel = DummyChannel()
        channel.site = site
        request = site.requestFactory(channel)
        for name, value in headers.items():
            request.requestHeaders.setRawHeaders(name, [value])
        return request.getClientAddress()

    def test_believed_only_with_the_proof(self) -> None:
        proof = router_proof(SECRET).encode()
        forwarded = self.request(
            {b"X-Forwarded-For": b"203.0.113.7", b"X-Synapse-Lite-Router": proof}
        )
        self.assertEqual(forwarded, IPv4Address("TCP", "203.0.113.7", 0))
        for headers in [
            {b"X-Forwarded-For": b"203.0.113.7"},
            {b"X-Forwarded-For": b"203.0.113.7", b"X-Synapse-Lite-Router": b"guess"},
            {
                b"X-Forwarded-For": b"203.0.113.7",
                b"X-Synapse-Lite-Router": router_proof("other").encode(),
            },
            {b"X-Forwarded-For": b"not an address", b"X-Synapse-Lite-Router": proof},
        ]:
            with self.subTest(headers=headers):
                self.assertNotEqual(self.request(headers), forwarded)

    def test_last_entry_of_a_list(self) -> None:
        proof = router_proof(SECRET).encode()
        address = forwarded_address(proof, b"10.0.0.1, 2001:db8::1", proof)
        self.assertEqual(address.host if address else None, "2001:db8::1")
        self.assertIsNone(forwarded_address(proof, b"10.0.0.1", None))

    def test_proof_is_not_the_secret(self) -> None:
        self.assertNotIn(SECRET, router_proof(SECRET))
        self.assertNotEqual(router_proof(SECRET), router_proof(SECRET + "x"))


class AccessTokenTestCase(unittest.TestCase):
    def test_tokens_name_their_user(self) -> None:
        for user in ["@alice:hs", "@bob_the-builder.x=y/z:hs:8448", "@ünïcode:hs"]:
            token = generate_access_token(user)
            self.assertTrue(token.startswith("syl_"))
            self.assertEqual(localpart_of_token(token), user[1:].split(":")[0])
        self.assertNotEqual(generate_access_token("@a:hs"), generate_access_token("@a:hs"))

    def test_older_and_foreign_tokens_name_nobody(self) -> None:
        for token in ["syl_" + "A" * 43, "abcdef", "syl_!!.x", "syl_/w==.x", ""]:
            self.assertIsNone(localpart_of_token(token), token)
