"""Parsing request and response heads and framing bodies, byte by byte."""

from __future__ import annotations

from twisted.trial import unittest

from synapse_lite.routing.http1 import (
    BadMessage,
    Chunked,
    FixedLength,
    NoBody,
    UntilClose,
    parse_request_head,
    parse_response_head,
    request_framing,
    response_framing,
    without_hop_by_hop,
)


def head(text: bytes):
    return parse_request_head(text)


class RequestHeadTestCase(unittest.TestCase):
    def test_parses_line_and_headers(self) -> None:
        h = head(
            b"GET /_matrix/client/v3/sync?since=s1&timeout=30000 HTTP/1.1\r\nHost: x\r\n"
            b"Authorization:  Bearer syl_abc.def "
        )
        self.assertEqual(h.method, b"GET")
        self.assertEqual(h.path, "/_matrix/client/v3/sync")
        self.assertEqual(h.query, b"since=s1&timeout=30000")
        self.assertEqual(h.header(b"authorization"), b"Bearer syl_abc.def")
        self.assertTrue(h.keep_alive)

    def test_keep_alive(self) -> None:
        self.assertFalse(head(b"GET / HTTP/1.1\r\nConnection: close").keep_alive)
        self.assertFalse(head(b"GET / HTTP/1.0").keep_alive)

    def test_refused_heads(self) -> None:
        for text, status in [
            (b"GET /x", 400),
            (b"GET  /x HTTP/1.1", 400),
            (b"GET /x HTTP/2.0", 505),
            (b"G@T /x HTTP/1.1", 400),
            (b"GET http://evil/x HTTP/1.1", 400),
            (b"GET /a\x7fb HTTP/1.1", 400),
            (b"GET /x HTTP/1.1\r\nHost: a\r\n folded", 400),
            (b"GET /x HTTP/1.1\r\nNo colon here", 400),
            (b"GET /x HTTP/1.1\r\nBad Name: v", 400),
            # A bare LF, CR or a NUL in a value: a process reading lines
            # differently could see another header there (X-Forwarded-For).
            (b"GET /x HTTP/1.1\r\nA: v\nX-Forwarded-For: 1.2.3.4", 400),
            (b"GET /x HTTP/1.1\r\nA: v\rX-Forwarded-For: 1.2.3.4", 400),
            (b"GET /x HTTP/1.1\r\nA: v\x00w", 400),
        ]:
            with self.subTest(text=text):
                with self.assertRaises(BadMessage) as raised:
                    head(text)
                self.assertEqual(raised.exception.status, status)

    def test_body_framing(self) -> None:
        self.assertIsInstance(request_framing(head(b"GET / HTTP/1.1")), NoBody)
        fixed = request_framing(head(b"PUT / HTTP/1.1\r\nContent-Length: 12"))
        self.assertIsInstance(fixed, FixedLength)
        self.assertIsInstance(
            request_framing(head(b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked")), Chunked
        )
        # The same length repeated is one length.
        self.assertIsInstance(
            request_framing(head(b"PUT / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3")),
            FixedLength,
        )

    def test_ambiguous_bodies_are_refused(self) -> None:
        for text, status in [
            (b"PUT / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked", 400),
            (b"PUT / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4", 400),
            (b"PUT / HTTP/1.1\r\nContent-Length: -1", 400),
            (b"PUT / HTTP/1.1\r\nContent-Length: 0x10", 400),
            (b"PUT / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked", 501),
            (b"PUT / HTTP/1.0\r\nTransfer-Encoding: chunked", 400),
        ]:
            with self.subTest(text=text):
                with self.assertRaises(BadMessage) as raised:
                    request_framing(head(text))
                self.assertEqual(raised.exception.status, status)

    def test_hop_by_hop_headers_go(self) -> None:
        headers = [
            (b"Connection", b"keep-alive, X-Private"),
            (b"X-Private", b"1"),
            (b"Keep-Alive", b"timeout=5"),
            (b"Content-Length", b"3"),
            (b"X-Forwarded-For", b"1.2.3.4"),
        ]
        kept = without_hop_by_hop(headers, frozenset({b"x-forwarded-for"}))
        self.assertEqual(kept, [(b"Content-Length", b"3")])


class ChunkedTestCase(unittest.TestCase):
    BODY = b"4\r\nWiki\r\n5;ext=1\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nX-Trailer: 1\r\n\r\n"

    def test_whole_body_and_what_follows(self) -> None:
        framing = Chunked()
        taken = framing.feed(self.BODY + b"GET /next")
        self.assertEqual(taken, len(self.BODY))
        self.assertTrue(framing.complete)

    def test_one_byte_at_a_time(self) -> None:
        framing = Chunked()
        total = 0
        for i in range(len(self.BODY)):
            self.assertFalse(framing.complete, i)
            total += framing.feed(self.BODY[i : i + 1])
        self.assertTrue(framing.complete)
        self.assertEqual(total, len(self.BODY))

    def test_malformed(self) -> None:
        for body in [b"zz\r\n", b"4\r\nWikiXX\r\n", b"4\nWiki", b"1" * 5000]:
            with self.subTest(body=body[:20]):
                with self.assertRaises(BadMessage):
                    Chunked().feed(body)


class ResponseTestCase(unittest.TestCase):
    def test_framing(self) -> None:
        def response(text: bytes):
            return parse_response_head(text)

        ok = response(b"HTTP/1.1 200 OK\r\nContent-Length: 5")
        self.assertEqual(ok.status, 200)
        self.assertIsInstance(response_framing(b"GET", ok), FixedLength)
        self.assertIsInstance(response_framing(b"HEAD", ok), NoBody)
        chunked = response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked")
        self.assertIsInstance(response_framing(b"GET", chunked), Chunked)
        self.assertIsInstance(response_framing(b"GET", response(b"HTTP/1.0 200 OK")), UntilClose)
        self.assertIsInstance(response_framing(b"GET", response(b"HTTP/1.1 304 NM")), NoBody)
        self.assertIsInstance(response_framing(b"GET", response(b"HTTP/1.1 100 C")), NoBody)

    def test_malformed_is_a_bad_gateway(self) -> None:
        for text in [b"HTTP/1.1 2000 OK", b"SPDY 200 OK", b"HTTP/1.1 200 OK\r\nbad line"]:
            with self.assertRaises(BadMessage) as raised:
                parse_response_head(text)
            self.assertEqual(raised.exception.status, 502)
