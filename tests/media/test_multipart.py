"""The federation media answers' ``multipart/mixed``: what we write is what
we read, from bytes and from a mapped file; every malformed answer is a
:class:`MultipartError` saying what is wrong; file names from
``Content-Disposition``."""

from __future__ import annotations

import mmap
import tempfile

from twisted.trial import unittest

from synapse_lite.media.multipart import (
    MAX_PARTS,
    MultipartError,
    answer_head,
    answer_tail,
    boundary_of,
    content_type_header,
    new_boundary,
    parse_media_answer,
    parse_parts,
)
from synapse_lite.media.remote import file_name_of

CONTENT = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4 + b"\r\n--not-the-boundary\r\n"


def written(content: bytes, boundary: str, headers: dict[str, bytes] | None = None) -> bytes:
    part_headers = headers or {
        "Content-Type": b"image/png",
        "Content-Disposition": b'inline; filename="a.png"',
    }
    return answer_head(boundary, {}, part_headers) + content + answer_tail(boundary)


class RoundTripTestCase(unittest.TestCase):
    def test_written_then_read(self) -> None:
        boundary = new_boundary()
        data = written(CONTENT, boundary)
        header = content_type_header(boundary).decode("ascii")
        answer = parse_media_answer(data, boundary_of(header))
        self.assertEqual(answer.metadata, {})
        self.assertEqual(answer.media_type, "image/png")
        self.assertEqual(answer.disposition, 'inline; filename="a.png"')
        self.assertIsNone(answer.location)
        self.assertEqual(data[answer.start : answer.end], CONTENT)

    def test_read_from_a_mapped_file(self) -> None:
        boundary = new_boundary()
        with tempfile.TemporaryFile() as f:
            f.write(written(CONTENT * 100, boundary))
            f.flush()
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                answer = parse_media_answer(data, boundary.encode())
                self.assertEqual(data[answer.start : answer.end], CONTENT * 100)

    def test_empty_content(self) -> None:
        answer = parse_media_answer(written(b"", "b1"), b"b1")
        self.assertEqual(answer.start, answer.end)

    def test_location_instead_of_content(self) -> None:
        data = written(b"", "b1", {"Location": b"https://cdn.example/x"})
        answer = parse_media_answer(data, b"b1")
        self.assertEqual(answer.location, "https://cdn.example/x")
        self.assertIsNone(answer.media_type)

    def test_preamble_epilogue_padding_and_a_quoted_boundary(self) -> None:
        data = (
            b'preamble\r\n--b1  \r\nContent-Type: application/json\r\n\r\n{"k": 1}\r\n'
            b"--b1\r\n\r\nraw\r\n--b1--\r\nepilogue"
        )
        answer = parse_media_answer(data, boundary_of('multipart/mixed; boundary="b1"'))
        self.assertEqual(answer.metadata, {"k": 1})
        self.assertIsNone(answer.media_type)  # no headers: the caller's default
        self.assertEqual(data[answer.start : answer.end], b"raw")


class BadInputTestCase(unittest.TestCase):
    def refused(self, data: bytes, expected: str, boundary: bytes = b"b1") -> None:
        with self.assertRaises(MultipartError) as caught:
            parse_media_answer(data, boundary)
        self.assertIn(expected, str(caught.exception))

    def test_content_type_headers(self) -> None:
        for value, expected in (
            (None, "no Content-Type"),
            ("", "no Content-Type"),
            ("application/json", "not multipart/mixed"),
            ("multipart/form-data; boundary=x", "not multipart/mixed"),
            ("multipart/mixed", "names no boundary"),
            ("multipart/mixed; boundary=", "1-70"),
            ("multipart/mixed; boundary=" + "x" * 71, "1-70"),
            ("multipart/mixed; boundary=\x01", "1-70"),
        ):
            with self.assertRaises(MultipartError) as caught:
                boundary_of(value)
            self.assertIn(expected, str(caught.exception), value)
        self.assertEqual(boundary_of("Multipart/Mixed ; charset=x; Boundary=abc"), b"abc")

    def test_no_boundary_in_the_body(self) -> None:
        self.refused(b'{"errcode": "M_UNKNOWN"}', "does not contain its multipart boundary")

    def test_truncated(self) -> None:
        whole = written(CONTENT, "b1")
        self.refused(whole[: len(whole) - 10], "ends before its closing")
        self.refused(whole[:30], "headers do not end")

    def test_one_part(self) -> None:
        data = b"--b1\r\nContent-Type: application/json\r\n\r\n{}\r\n--b1--\r\n"
        self.refused(data, "1 part(s)")

    def test_metadata(self) -> None:
        for metadata, expected in (
            (b"not json", "not JSON"),
            (b"[]", "not a JSON object"),
        ):
            data = b"--b1\r\n\r\n" + metadata + b"\r\n--b1\r\n\r\nx\r\n--b1--"
            self.refused(data, expected)
        data = b"--b1\r\nContent-Type: text/plain\r\n\r\n{}\r\n--b1\r\n\r\nx\r\n--b1--"
        self.refused(data, "not application/json")

    def test_malformed_headers(self) -> None:
        for headers, expected in (
            (b"no colon here", "malformed header"),
            (b" Folded: x", "malformed header"),
            (b"X-Name: caf\xc3\xa9", "not ASCII"),
            (b"X: " + b"y" * 20_000, "do not end (or are too long)"),
        ):
            data = b"--b1\r\n" + headers + b"\r\n\r\n{}\r\n--b1\r\n\r\nx\r\n--b1--"
            self.refused(data, expected)

    def test_bad_boundary_line_and_empty_location(self) -> None:
        self.refused(b"--b1junk\r\n\r\n{}\r\n--b1--", "boundary line is malformed")
        data = b"--b1\r\n\r\n{}\r\n--b1\r\nLocation:\r\n\r\n\r\n--b1--"
        self.refused(data, "empty Location")

    def test_too_many_parts(self) -> None:
        data = b"--b1\r\n\r\n{}\r\n" + b"--b1\r\n\r\nx\r\n" * MAX_PARTS + b"--b1--"
        with self.assertRaises(MultipartError):
            parse_parts(data, b"b1")


class FileNameTestCase(unittest.TestCase):
    def test_names(self) -> None:
        for header, expected in (
            (None, None),
            ("inline", None),
            ('inline; filename="cat.png"', "cat.png"),
            ("attachment; filename=plain.txt", "plain.txt"),
            ("inline; filename*=utf-8''caf%C3%A9.png", "café.png"),
            ("inline; filename=\"a.png\"; filename*=UTF-8''b%20c.png", "b c.png"),
            ('inline; filename="../../etc/passwd"', None),
            ('inline; filename="bad\x07name"', None),
            ('inline; filename="' + "n" * 300 + '"', None),
            ("inline; filename*=latin-1''x.png", None),
            ("inline; filename*=utf-8''%FF%FE", None),
        ):
            self.assertEqual(file_name_of(header), expected, header)
