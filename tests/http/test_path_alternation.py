"""``PathAlternation`` (http/path_alternation.py): many patterns as one
regex, the first that matches winning, against trying them one by one."""

from __future__ import annotations

import random
import re

from twisted.trial import unittest

from synapse_lite.http.path_alternation import PathAlternation, group_prefix

PATTERNS = [
    (r"^/rooms/(?P<room_id>[^/]*)/special$", True),
    (r"^/rooms/(?P<room_id>[^/]*)/(?P<what>[^/]*)$", True),
    (r"^/same/(?P<x>[a-z]+)/(?P=x)$", True),
    (r"/media/", False),
    (r"/media/v3/upload", True),
    (r"^/a(?:b|bc)$", True),
]


def one_by_one(path: str) -> tuple[int, dict[str, str]] | None:
    for position, (pattern, whole) in enumerate(PATTERNS):
        found = (re.fullmatch if whole else re.match)(pattern, path)
        if found is not None:
            return position, found.groupdict()
    return None


class PathAlternationTestCase(unittest.TestCase):
    def test_the_first_pattern_that_matches_wins(self) -> None:
        alternation = PathAlternation.of(PATTERNS)
        paths = [
            "/rooms/!r/special", "/rooms/!r/other", "/rooms/!r/a/b", "/same/ab/ab",
            "/same/ab/cd", "/media/v3/upload", "/media/anything/else", "/abc", "/ab",
            "/a", "", "/rooms//", "/same/ab/ab\n",
        ]  # fmt: skip
        rng = random.Random(3)
        # Paths of the patterns' own words, so that many match something.
        words = ["rooms", "same", "media", "v3", "upload", "ab", "abc", "a", "!r", "special", ""]
        paths += ["/" + "/".join(rng.choice(words) for _ in range(rng.randint(1, 4)))
                  for _ in range(3000)]  # fmt: skip
        matched = 0
        for path in paths:
            want = one_by_one(path)
            found = alternation.match(path)
            if want is None:
                self.assertIsNone(found, path)
                continue
            matched += 1
            assert found is not None, path
            position, match = found
            prefix = group_prefix(position)
            got = {
                k[len(prefix) :]: v for k, v in match.groupdict().items() if k.startswith(prefix)
            }
            self.assertEqual((position, got), want, path)
        self.assertGreater(matched, 300)

    def test_no_pattern_matches_nothing(self) -> None:
        self.assertIsNone(PathAlternation.of([]).match("/anything"))
