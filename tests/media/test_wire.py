"""Uploads that go wrong on the wire: a body cut short, a Content-Length that
lies. Nothing partial is stored, nothing is left in ``tmp/``, and the answer
is never a 500."""

from __future__ import annotations

import os
import socket
import urllib.parse

from twisted.internet import threads

from synapse_lite.clock import Clock
from tests.media.test_endpoints import MediaTestCase


def _exchange(url: str, request: bytes, close_after_send: bool) -> bytes:
    """Send raw bytes to the server; what it answers (until it closes, or
    nothing when we close first)."""
    parsed = urllib.parse.urlsplit(url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=10) as s:
        s.sendall(request)
        if close_after_send:
            return b""
        s.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := s.recv(65536):
            received += chunk
        return received


def _read_a_little(url: str, request: bytes) -> None:
    parsed = urllib.parse.urlsplit(url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=10) as s:
        s.sendall(request)
        s.recv(1000)


def _upload_head(token: str, content_length: str) -> bytes:
    return (
        b"POST /_matrix/media/v3/upload HTTP/1.1\r\nHost: x\r\n"
        + f"Authorization: Bearer {token}\r\nContent-Type: text/plain\r\n".encode()
        + f"Content-Length: {content_length}\r\n\r\n".encode()
    )


class WireTestCase(MediaTestCase):
    async def rows(self) -> int:
        rows = await self.hs.database_pool.select("count", "SELECT COUNT(*) FROM local_media")
        return int(rows[0][0])

    async def settle(self) -> None:
        # Let the server notice the closed connection.
        await Clock(self.hs.reactor).sleep(0.3)

    async def test_truncated_upload_stores_nothing(self) -> None:
        assert self.alice.token is not None
        request = _upload_head(self.alice.token, "100000") + b"x" * 50_000
        await threads.deferToThread(_exchange, self.alice.base_url, request, True)
        await self.settle()
        self.assertEqual(await self.rows(), 0)
        self.assertEqual(self.store_files(), [])

    async def test_content_length_shorter_than_the_body(self) -> None:
        # The server reads the declared 10 bytes as the body; what follows is
        # not a request, and Twisted drops the connection for it. Whatever was
        # stored is exactly what the client declared, never more.
        assert self.alice.token is not None
        request = _upload_head(self.alice.token, "10") + b"0123456789" + b"garbage!!\r\n\r\n"
        answer = await threads.deferToThread(_exchange, self.alice.base_url, request, False)
        self.assertNotIn(b" 500 ", answer)
        await self.settle()
        rows = await self.hs.database_pool.select("len", "SELECT media_length FROM local_media")
        self.assertIn([r[0] for r in rows], ([], [10]))
        self.assertEqual([f for f in self.store_files() if f.startswith("tmp")], [])

    async def test_client_leaving_mid_download(self) -> None:
        # The file is closed and the producer stopped; the next download works.
        uri = await self.alice.upload(b"z" * 1_500_000, "application/octet-stream")
        assert self.alice.token is not None
        request = (
            "GET /_matrix/client/v1/media/download/"
            + uri.removeprefix("mxc://")
            + f" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {self.alice.token}\r\n\r\n"
        ).encode()
        open_before = len(os.listdir("/proc/self/fd"))
        for _ in range(3):
            await threads.deferToThread(_read_a_little, self.alice.base_url, request)
        await self.settle()
        # Three leaked files would show; one more descriptor (a database
        # connection opened meanwhile) would not be a leak.
        self.assertLessEqual(len(os.listdir("/proc/self/fd")), open_before + 1)
        got = await self.alice.download(uri)
        self.assertEqual((got.code, len(got.body)), (200, 1_500_000))

    async def test_content_length_not_a_number(self) -> None:
        assert self.alice.token is not None
        request = _upload_head(self.alice.token, "ten") + b"0123456789"
        answer = await threads.deferToThread(_exchange, self.alice.base_url, request, False)
        self.assertTrue(answer.startswith(b"HTTP/1.1 400"), answer[:200])
        await self.settle()
        self.assertEqual(await self.rows(), 0)
        self.assertEqual(self.store_files(), [])
