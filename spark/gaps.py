"""Gaps (ids the sequence handed out that no row carries), from block totals.

Spark reduces the rows to one record per block of 32,768 consecutive ids
(:func:`spark.checks.block_totals`): the smallest and largest id at most the
sequence's last value and how many distinct ids there are; and, for the
blocks whose ids fall short of that span, the 64-bit words of their bitmap
(:func:`spark.checks.block_words`). That is all a gap needs:

* between blocks: from the largest id of one block holding ids to the
  smallest of the next;
* inside a block: the zero bits of its bitmap between its smallest and
  largest id;
* after the largest id: up to the sequence's last value.

The driver walks these records with bounded memory: a few numbers per block
(1/32,768 of the id space), one block's bitmap at a time and, per stream, the
first :data:`SAMPLES` ranges.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import attr

#: Ids per word: the bits of a long.
WORD_IDS = 64
#: Ids per block: 512 words, a 4 KB bitmap.
BLOCK_IDS = 32768
#: Ranges listed per stream (the count covers all of them).
SAMPLES = 10


@attr.s(slots=True, auto_attribs=True)
class StreamGaps:
    """One stream's gaps: how many ranges, how many ids, the first ranges."""

    ranges: int = 0
    missing: int = 0
    first: list[tuple[int, int]] = attr.Factory(list)

    def add(self, first: int, last: int) -> None:
        """Count the range of missing ids ``first`` to ``last`` and keep it
        while it may be among the first listed."""
        self.ranges += 1
        self.missing += last - first + 1
        self.first.append((first, last))
        if len(self.first) > 4 * SAMPLES:  # keep only what can still be listed
            self.first = sorted(self.first)[:SAMPLES]


def _zero_runs(present: int, first: int, last: int, base: int) -> tuple[int, list[tuple[int, int]]]:
    """The runs of ids from ``first`` to ``last`` whose bit is clear in
    ``present`` (bit ``p`` is id ``base + p``): how many, and the first
    :data:`SAMPLES` as (first, last) ids."""
    low, high = first - base, last - base
    missing = ~present & (((1 << (high - low + 1)) - 1) << low)
    # A run starts where a missing id follows a present one.
    runs = (missing & ~(missing << 1)).bit_count()
    samples: list[tuple[int, int]] = []
    while missing and len(samples) < SAMPLES:
        start = (missing & -missing).bit_length() - 1
        above = missing >> start
        length = (~above & (above + 1)).bit_length() - 1  # the run of set bits
        samples.append((base + start, base + start + length - 1))
        missing &= ~(((1 << length) - 1) << start)
    return runs, samples


def _block_bitmaps(words: Iterable[Any]) -> Iterator[tuple[str, int, int]]:
    """(stream, block, bitmap) from words ordered by stream, block and word;
    bit ``p`` of a bitmap is id ``block * BLOCK_IDS + p``."""
    current: tuple[str, int] | None = None
    bitmap = 0
    for row in words:
        key = (row["stream"], int(row["block"]))
        if key != current:
            if current is not None:
                yield (*current, bitmap)
            current, bitmap = key, 0
        offset = (int(row["word"]) * WORD_IDS) - key[1] * BLOCK_IDS
        bitmap |= (int(row["kept"]) & ((1 << WORD_IDS) - 1)) << offset
    if current is not None:
        yield (*current, bitmap)


def stream_gaps(
    spans: list[tuple[str, int, int, int]],
    words: Iterable[Any],
    last_values: dict[str, int],
) -> dict[str, StreamGaps]:
    """Every stream with a gap, from the blocks holding ids (stream, block,
    low, top) and the words of the short ones, in order (see
    :func:`_block_bitmaps`)."""
    found: dict[str, StreamGaps] = {}
    extent = {(stream, block): (low, top) for stream, block, low, top in spans}
    for stream, block, bitmap in _block_bitmaps(words):
        low, top = extent[(stream, block)]
        runs, samples = _zero_runs(bitmap, low, top, block * BLOCK_IDS)
        gaps = found.setdefault(stream, StreamGaps())
        for first, last in samples:
            gaps.add(first, last)
        # The runs beyond the samples are counted, not listed: their ids are
        # the span's missing ones less those listed.
        missing = (top - low + 1) - bitmap.bit_count()
        gaps.ranges += runs - len(samples)
        gaps.missing += missing - sum(b - a + 1 for a, b in samples)
    by_stream: dict[str, list[tuple[int, int, int]]] = {}
    for stream, block, low, top in spans:
        by_stream.setdefault(stream, []).append((block, low, top))
    for stream, last_value in last_values.items():
        before = 0
        for _, low, top in sorted(by_stream.get(stream, [])):
            if low > before + 1:
                found.setdefault(stream, StreamGaps()).add(before + 1, low - 1)
            before = top
        if before < last_value:
            found.setdefault(stream, StreamGaps()).add(before + 1, last_value)
    for gaps in found.values():
        gaps.first = sorted(gaps.first)[:SAMPLES]
    return found
