"""One HTTP request from a plain thread (no reactor), bodies streamed both
ways: for benchmarks and for tests that drive large transfers from a thread."""

from __future__ import annotations

import http.client
import urllib.parse
from typing import Any

BLOCK = 64 * 1024


def http_request(
    url: str,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    sink: Any = None,
) -> tuple[int, bytes]:
    """One HTTP request; the body streamed from a file object, the answer
    streamed into ``sink`` (if given; then the returned bytes are empty)."""
    parsed = urllib.parse.urlsplit(url)
    host = parsed.hostname or "127.0.0.1"
    conn = http.client.HTTPConnection(host, parsed.port, timeout=300, blocksize=BLOCK)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        if sink is None:
            return response.status, response.read()
        while chunk := response.read(BLOCK):
            sink.write(chunk)
        return response.status, b""
    finally:
        conn.close()
