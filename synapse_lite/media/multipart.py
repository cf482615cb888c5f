"""The ``multipart/mixed`` answers of the federation media endpoints.

``GET /_matrix/federation/v1/media/download/{mediaId}`` (and ``thumbnail``)
answer with two parts (RFC 2046, lines ended by CRLF)::

    --<boundary>
    Content-Type: application/json

    {}                                    the metadata (an object; empty today)
    --<boundary>
    Content-Type: image/png               the content, with its type and
    Content-Disposition: inline; ...      disposition, or a Location header
                                          (and no body) to fetch it from
    <bytes>
    --<boundary>--

Writing and reading live side by side here so they cannot drift apart. The
reader works on any buffer with ``find`` and slicing (``bytes`` or an
``mmap`` of the received file), so a large answer is never read into memory:
it gives offsets of the content, which the caller copies.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Protocol

import attr

#: The federation media endpoints (``/download/{mediaId}``, ``/thumbnail/{mediaId}``).
FEDERATION_MEDIA_PREFIX = "/_matrix/federation/v1/media"
#: The first part's type.
METADATA_TYPE = "application/json"
#: Longest header block of one part we read (a real one is a few hundred bytes).
MAX_PART_HEADER_BYTES = 16 * 1024
#: Longest metadata part we read.
MAX_METADATA_BYTES = 64 * 1024
#: Parts one answer may have (two are expected; a few more are ignored).
MAX_PARTS = 8
#: What a multipart answer may add to the content it carries: boundaries,
#: headers, metadata.
MAX_OVERHEAD_BYTES = MAX_METADATA_BYTES + 4 * MAX_PART_HEADER_BYTES
_CRLF = b"\r\n"


class MultipartError(ValueError):
    """An answer that is not the two-part ``multipart/mixed`` the spec
    describes; the message says what is wrong, for the user's error."""


class Buffer(Protocol):
    """``bytes`` or an ``mmap``: what the reader needs of either."""

    def find(self, sub: bytes, start: int = ..., end: int = ...) -> int: ...

    def __getitem__(self, index: slice) -> bytes: ...

    def __len__(self) -> int: ...


def new_boundary() -> str:
    """A random boundary (RFC 2046 allows 1-70 characters)."""
    return secrets.token_hex(16)


def content_type_header(boundary: str) -> bytes:
    return f"multipart/mixed; boundary={boundary}".encode("ascii")


def boundary_of(content_type: str | None) -> bytes:
    """The boundary of a ``multipart/mixed`` ``Content-Type`` header value."""
    if not content_type:
        raise MultipartError("the answer has no Content-Type (multipart/mixed expected)")
    essence, _, params = content_type.partition(";")
    if essence.strip().lower() != "multipart/mixed":
        raise MultipartError(f"the answer is {essence.strip()!r}, not multipart/mixed")
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "boundary":
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            if not 1 <= len(value) <= 70 or not value.isascii() or not value.isprintable():
                raise MultipartError(
                    "the multipart boundary is not 1-70 printable ASCII characters"
                )
            return value.encode("ascii")
    raise MultipartError("the multipart/mixed answer names no boundary")


# Writing


def answer_head(boundary: str, metadata: dict[str, Any], part_headers: dict[str, bytes]) -> bytes:
    """Everything before the content: the metadata part and the content
    part's headers (``Content-Type`` and ``Content-Disposition``, or
    ``Location``)."""
    lines = [
        b"--" + boundary.encode("ascii"),
        b"Content-Type: " + METADATA_TYPE.encode("ascii"),
        b"",
        json.dumps(metadata, separators=(",", ":")).encode("utf-8"),
        b"--" + boundary.encode("ascii"),
    ]
    lines += [name.encode("ascii") + b": " + value for name, value in part_headers.items()]
    return _CRLF.join(lines) + _CRLF + _CRLF


def answer_tail(boundary: str) -> bytes:
    """What follows the content: the closing delimiter."""
    return _CRLF + b"--" + boundary.encode("ascii") + b"--" + _CRLF


# Reading


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Part:
    """One part: its headers (names in lower case) and where its body is."""

    headers: dict[str, str]
    start: int
    end: int


@attr.s(slots=True, frozen=True, auto_attribs=True)
class MediaAnswer:
    """A federation media answer: its metadata and either the content's
    place in the buffer (``start``, ``end``) or a ``location`` to fetch it from."""

    metadata: dict[str, Any]
    media_type: str | None
    disposition: str | None
    location: str | None
    start: int
    end: int


def _parse_headers(block: bytes) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in block.split(_CRLF):
        if not line:
            continue
        name, colon, value = line.partition(b":")
        if not colon or not name.strip() or name != name.strip():
            raise MultipartError(f"a part has a malformed header line {line[:40]!r}")
        try:
            text = value.strip().decode("ascii")
        except UnicodeDecodeError:
            raise MultipartError("a part's header is not ASCII") from None
        headers[name.decode("ascii", "replace").lower()] = text
    return headers


def parse_parts(data: Buffer, boundary: bytes) -> list[Part]:
    """The parts of a multipart body (preamble and epilogue ignored);
    :class:`MultipartError` if it is not well formed or not terminated."""
    dash_boundary = b"--" + boundary
    delimiter = _CRLF + dash_boundary
    if data[0 : len(dash_boundary)] == dash_boundary:
        position = 0
    else:
        found = data.find(delimiter)
        if found < 0:
            raise MultipartError("the answer does not contain its multipart boundary")
        position = found + 2
    parts: list[Part] = []
    while True:
        after = position + len(dash_boundary)
        if data[after : after + 2] == b"--":
            return parts
        if len(parts) >= MAX_PARTS:
            raise MultipartError(f"the answer has more than {MAX_PARTS} parts")
        line_end = data.find(_CRLF, after, after + 256)
        if line_end < 0 or data[after:line_end].strip(b" \t"):
            raise MultipartError("a multipart boundary line is malformed")
        headers_start = line_end + 2
        if data[headers_start : headers_start + 2] == _CRLF:
            headers, body_start = {}, headers_start + 2
        else:
            headers_end = data.find(
                _CRLF + _CRLF, headers_start, headers_start + MAX_PART_HEADER_BYTES
            )
            if headers_end < 0:
                raise MultipartError("a part's headers do not end (or are too long)")
            headers = _parse_headers(data[headers_start:headers_end])
            body_start = headers_end + 4
        body_end = data.find(delimiter, body_start)
        if body_end < 0:
            raise MultipartError("the answer ends before its closing multipart boundary")
        parts.append(Part(headers, body_start, body_end))
        position = body_end + 2


def parse_media_answer(data: Buffer, boundary: bytes) -> MediaAnswer:
    """Read a federation media answer (see the module docstring)."""
    parts = parse_parts(data, boundary)
    if len(parts) < 2:
        raise MultipartError(f"the answer has {len(parts)} part(s), not the metadata and content")
    first, second = parts[0], parts[1]
    first_type = first.headers.get("content-type", METADATA_TYPE).split(";", 1)[0].strip()
    if first_type.lower() != METADATA_TYPE:
        raise MultipartError(f"the first part is {first_type!r}, not {METADATA_TYPE}")
    if first.end - first.start > MAX_METADATA_BYTES:
        raise MultipartError("the metadata part is too large")
    try:
        metadata = json.loads(data[first.start : first.end])
    except ValueError:
        raise MultipartError("the metadata part is not JSON") from None
    if not isinstance(metadata, dict):
        raise MultipartError("the metadata part is not a JSON object")
    location = second.headers.get("location")
    if location is not None and not location:
        raise MultipartError("the content part has an empty Location")
    return MediaAnswer(
        metadata=metadata,
        media_type=second.headers.get("content-type"),
        disposition=second.headers.get("content-disposition"),
        location=location,
        start=second.start,
        end=second.end,
    )
