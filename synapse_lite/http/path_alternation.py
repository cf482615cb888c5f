"""Many path patterns as one regex, matched once per request instead of
pattern after pattern: what the client resource (``JsonResource``) and the
router's table (``routing/table.py``) both route by.

``(?P<_0>...)|(?P<_1>...)|...``: each alternative is one pattern (whole,
with ``\\Z``, or as a prefix of the path), its named groups renamed apart
(``r0_room_id``; references to them, ``(?P=name)``, too). Alternatives are
tried in order, so the first pattern that matches wins, as trying them one
by one in order finds; the wrapping group closes last, so ``lastindex``
names the pattern."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import attr

#: A named group, or a reference to one, in a pattern.
_NAMED_GROUP = re.compile(r"\(\?P([<=])([A-Za-z_][A-Za-z0-9_]*)")


def group_prefix(position: int) -> str:
    """What the named groups of the pattern at ``position`` are renamed with."""
    return f"r{position}_"


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PathAlternation:
    regex: re.Pattern[str]
    #: Group index of each alternative's wrapper -> the pattern's position.
    positions: Mapping[int, int]

    @classmethod
    def of(cls, patterns: Sequence[tuple[str, bool]]) -> PathAlternation:
        """``patterns``: ``(pattern, whole)`` in the order they are tried;
        ``whole``: it must match the whole path, not only a prefix."""
        alternatives = []
        for i, (pattern, whole) in enumerate(patterns):
            renamed = _NAMED_GROUP.sub(rf"(?P\1{group_prefix(i)}\2", pattern)
            end = r"\Z" if whole else ""
            alternatives.append(f"(?P<_{i}>(?:{renamed}){end})")
        regex = re.compile("|".join(alternatives) or r"(?!)")
        return cls(regex, {regex.groupindex[f"_{i}"]: i for i in range(len(patterns))})

    def match(self, path: str) -> tuple[int, re.Match[str]] | None:
        """The position of the first pattern matching ``path`` and the match
        (its groups named with :func:`group_prefix`); None if none does."""
        found = self.regex.match(path)
        if found is None or found.lastindex is None:
            return None
        return self.positions[found.lastindex], found
