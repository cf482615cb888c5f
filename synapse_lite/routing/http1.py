"""Just enough HTTP/1.1 to relay requests: heads parsed, bodies framed.

The router forwards bytes as they come and parses only what it must: the
request line and headers (to route, and to add ``X-Forwarded-For``), the
response's status line and headers, and where each body ends (to keep
connections alive). Bodies are never decoded: a chunked body is relayed as
chunks, a long-poll's response as it is written.

Requests are held to the strict reading of RFC 9112, since the processes
behind may read them differently otherwise: a request with both
``Content-Length`` and ``Transfer-Encoding``, a transfer coding other than
``chunked``, conflicting lengths, folded headers, a malformed line, or a bare
CR or LF or a NUL anywhere in the head is refused with 400 (or 501 for an
unknown coding).
"""

from __future__ import annotations

import re

import attr

#: Longest request or response head accepted (request line and headers).
MAX_HEAD_BYTES = 64 * 1024
#: Longest chunk-size line (with extensions) or trailer line.
MAX_CHUNK_LINE_BYTES = 4096

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: Bytes a request target may not contain (controls, space, DEL, non-ASCII).
_BAD_TARGET_BYTE = re.compile(rb"[\x00-\x20\x7f-\xff]")
_DIGITS = re.compile(rb"[0-9]{1,15}")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")

#: Headers that describe one connection, not the message (RFC 9110 7.6.1).
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"upgrade"}
)


class BadMessage(Exception):
    """A request the router refuses: ``status`` and why (sent to the client)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


Headers = list[tuple[bytes, bytes]]


def header_values(headers: Headers, name: bytes) -> list[bytes]:
    """Every value of header ``name`` (lower case), in order."""
    return [v for k, v in headers if k.lower() == name]


def connection_tokens(headers: Headers) -> set[bytes]:
    """The options listed in ``Connection`` headers, lower case."""
    return {
        token.strip().lower()
        for value in header_values(headers, b"connection")
        for token in value.split(b",")
        if token.strip()
    }


def _parse_headers(lines: list[bytes]) -> Headers:
    headers: Headers = []
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            raise BadMessage(400, "folded header lines are not accepted")
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise BadMessage(400, "malformed header line")
        headers.append((name, value.strip(b" \t")))
    return headers


@attr.s(slots=True, auto_attribs=True)
class RequestHead:
    method: bytes
    target: bytes
    version: bytes
    headers: Headers

    @property
    def path(self) -> str:
        """The path, still percent-encoded (as the servlets' patterns expect)."""
        return self.target.split(b"?", 1)[0].decode("ascii", "replace")

    @property
    def query(self) -> bytes:
        return self.target.partition(b"?")[2]

    def header(self, name: bytes) -> bytes | None:
        values = header_values(self.headers, name)
        return values[-1] if values else None

    @property
    def keep_alive(self) -> bool:
        """Whether the client will send another request on this connection."""
        options = connection_tokens(self.headers)
        if self.version == b"HTTP/1.1":
            return b"close" not in options
        return False  # HTTP/1.0: one request per connection, simply


def parse_request_head(block: bytes) -> RequestHead:
    """A request head (without its final blank line), or :class:`BadMessage`."""
    # Lines end with CRLF only, and no value holds a NUL (RFC 9110 5.5): a
    # bare LF passed on inside a value would be a line of its own to a
    # process that reads lines more loosely than this does.
    crlf = block.count(b"\r\n")
    if block.count(b"\n") != crlf or block.count(b"\r") != crlf or b"\x00" in block:
        raise BadMessage(400, "bare CR or LF, or NUL, in the request head")
    lines = block.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        raise BadMessage(400, "malformed request line")
    method, target, version = parts
    if not _TOKEN.fullmatch(method):
        raise BadMessage(400, "malformed method")
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise BadMessage(505, "only HTTP/1.1 and HTTP/1.0 are served")
    if not target.startswith(b"/") or _BAD_TARGET_BYTE.search(target):
        raise BadMessage(400, "malformed request target")
    return RequestHead(method, target, version, _parse_headers(lines[1:]))


@attr.s(slots=True, auto_attribs=True)
class ResponseHead:
    version: bytes
    status: int
    reason: bytes
    headers: Headers


def parse_response_head(block: bytes) -> ResponseHead:
    lines = block.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if not version.startswith(b"HTTP/1.") or not _DIGITS.fullmatch(code) or len(code) != 3:
        raise BadMessage(502, "the process sent a malformed status line")
    try:
        headers = _parse_headers(lines[1:])
    except BadMessage:
        raise BadMessage(502, "the process sent a malformed header") from None
    return ResponseHead(version, int(code), reason, headers)


# Bodies


class Framing:
    """Where a body ends. :meth:`feed` takes bytes and says how many of them
    belong to the body, and whether it is complete."""

    complete = False

    def feed(self, data: bytes | bytearray) -> int:
        raise NotImplementedError


class NoBody(Framing):
    complete = True

    def feed(self, data: bytes | bytearray) -> int:
        return 0


class FixedLength(Framing):
    def __init__(self, length: int) -> None:
        self.remaining = length
        self.complete = length == 0

    def feed(self, data: bytes | bytearray) -> int:
        taken = min(len(data), self.remaining)
        self.remaining -= taken
        self.complete = self.remaining == 0
        return taken


class UntilClose(Framing):
    """A response that ends when the process closes the connection."""

    def feed(self, data: bytes | bytearray) -> int:
        return len(data)


class Chunked(Framing):
    """A chunked body: chunks, a zero-size chunk, trailers, a blank line."""

    _SIZE, _DATA, _DATA_END, _TRAILER = range(4)

    def __init__(self, error_status: int = 400) -> None:
        self._state = self._SIZE
        self._remaining = 0
        self._line = bytearray()
        self._error_status = error_status

    def _fail(self, reason: str) -> BadMessage:
        return BadMessage(self._error_status, f"malformed chunked body: {reason}")

    def feed(self, data: bytes | bytearray) -> int:
        position = 0
        end = len(data)
        while position < end and not self.complete:
            if self._state == self._DATA:
                taken = min(end - position, self._remaining)
                position += taken
                self._remaining -= taken
                if self._remaining == 0:
                    self._state = self._DATA_END
                continue
            # A line: a chunk size, the CRLF after data, or a trailer.
            newline = data.find(b"\n", position)
            if newline < 0:
                self._line += data[position:]
                position = end
                if len(self._line) > MAX_CHUNK_LINE_BYTES:
                    raise self._fail("line too long")
                break
            self._line += data[position : newline + 1]
            position = newline + 1
            line = bytes(self._line)
            self._line.clear()
            if not line.endswith(b"\r\n"):
                raise self._fail("lines must end with CRLF")
            line = line[:-2]
            if self._state == self._SIZE:
                size = line.split(b";", 1)[0].strip(b" \t")
                if not _HEX.fullmatch(size):
                    raise self._fail("bad chunk size")
                self._remaining = int(size, 16)
                self._state = self._DATA if self._remaining else self._TRAILER
            elif self._state == self._DATA_END:
                if line:
                    raise self._fail("chunk longer than its size")
                self._state = self._SIZE
            elif not line:  # the blank line after the trailers
                self.complete = True
        return position


def request_framing(head: RequestHead) -> Framing:
    """How the request's body is delimited (:class:`BadMessage` if it is
    ambiguous or unsupported)."""
    codings = header_values(head.headers, b"transfer-encoding")
    lengths = header_values(head.headers, b"content-length")
    if codings:
        if lengths:
            raise BadMessage(400, "Content-Length and Transfer-Encoding together")
        if [c.strip().lower() for c in b",".join(codings).split(b",")] != [b"chunked"]:
            raise BadMessage(501, "only the chunked transfer coding is supported")
        if head.version != b"HTTP/1.1":
            raise BadMessage(400, "chunked bodies need HTTP/1.1")
        return Chunked()
    if lengths:
        values = {v.strip() for value in lengths for v in value.split(b",")}
        if len(values) != 1 or not _DIGITS.fullmatch(next(iter(values))):
            raise BadMessage(400, "bad Content-Length")
        return FixedLength(int(next(iter(values))))
    return NoBody()


def response_framing(request_method: bytes, head: ResponseHead) -> Framing:
    """How the response's body is delimited (RFC 9112 6.3)."""
    if request_method == b"HEAD" or head.status < 200 or head.status in (204, 304):
        return NoBody()
    codings = header_values(head.headers, b"transfer-encoding")
    if codings:
        if b",".join(codings).split(b",")[-1].strip().lower() == b"chunked":
            return Chunked(error_status=502)
        return UntilClose()
    lengths = header_values(head.headers, b"content-length")
    if lengths:
        values = {v.strip() for value in lengths for v in value.split(b",")}
        if len(values) != 1 or not _DIGITS.fullmatch(next(iter(values))):
            raise BadMessage(502, "the process sent a bad Content-Length")
        return FixedLength(int(next(iter(values))))
    return UntilClose()


def serialize_head(first_line: bytes, headers: Headers) -> bytes:
    return b"\r\n".join([first_line, *(k + b": " + v for k, v in headers), b"", b""])


def without_hop_by_hop(headers: Headers, drop: frozenset[bytes] = frozenset()) -> Headers:
    """``headers`` minus those about the connection (and those in ``drop``)."""
    named = connection_tokens(headers)
    return [
        (k, v)
        for k, v in headers
        if (low := k.lower()) not in HOP_BY_HOP and low not in named and low not in drop
    ]
