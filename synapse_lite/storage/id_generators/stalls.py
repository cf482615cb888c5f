"""Noticing a stream that has stopped advancing.

A stream stalls when its persisted-up-to position stops moving while rows are
being written above it: /sync hands out persisted-up-to, so clients see
nothing new, silently (the reference homeserver's operators meet this as a
"stuck" /sync). Two ways it shows, checked every few seconds on every process:

* **here**: this process holds ids it allocated and has not finished (a
  transaction that never ends), and persisted-up-to has not moved for
  :data:`STALL_SECONDS`: the ids and their writer (this process) are logged;
* **elsewhere**: persisted-up-to has not moved for :data:`STALL_SECONDS` while
  a writer is known to be past it: the writers at the bottom hold it back
  (frozen, or gone without being retired). An idle writer announces its
  position every second, so this does not happen to a healthy one.

Either way the process logs it (when it starts, every minute while it lasts,
and when it ends), ``synapse_lite_stream_stalled_seconds{stream, writer}``
shows how long, and ``/health`` says ``degraded`` with the reason. Streams
any process writes (caches) are left out of the second check: a process that
has gone for good leaves its last position there, and nothing reads that
stream's persisted-up-to.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import attr
from twisted.internet import task

from synapse_lite.clock import Clock
from synapse_lite.metrics import STREAM_STALLED_SECONDS
from synapse_lite.storage.id_generators.generator import MultiWriterIdGenerator

logger = logging.getLogger(__name__)

#: How long persisted-up-to may stand still with work above it.
STALL_SECONDS = 30.0
#: How often the streams are checked.
CHECK_SECONDS = 5.0
#: How often a stall that lasts is logged again.
REMIND_SECONDS = 60.0


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Stall:
    stream: str
    writer: str
    seconds: float
    reason: str


@attr.s(slots=True, auto_attribs=True)
class _Watch:
    """What the detector remembers of one stream between checks."""

    persisted_upto: int
    moved_at: float
    #: Unfinished ids of this process, and when each was first seen.
    unfinished_since: dict[int, float] = attr.ib(factory=dict)


class StallDetector:
    """Checks the streams of one process (see the module docstring)."""

    def __init__(
        self,
        clock: Clock,
        instance_name: str,
        generators: Iterable[tuple[MultiWriterIdGenerator, bool]],
        threshold: float = STALL_SECONDS,
    ) -> None:
        """``generators``: each stream's generator, and whether the stream
        has configured writers (False: any process writes it)."""
        self._clock = clock
        self._me = instance_name
        self._generators = list(generators)
        self._threshold = threshold
        self._watches: dict[str, _Watch] = {}
        self._stalls: dict[tuple[str, str], Stall] = {}
        self._logged_at: dict[tuple[str, str], float] = {}
        self._loop: task.LoopingCall | None = None

    def start(self) -> None:
        self._loop = self._clock.looping_call(self.check, CHECK_SECONDS)

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def reasons(self) -> list[str]:
        """What is stalled now, for /health."""
        return [stall.reason for stall in self._stalls.values()]

    def check(self) -> list[Stall]:
        """Look at every stream now; the stalls found."""
        now = self._clock.time()
        found: dict[tuple[str, str], Stall] = {}
        for generator, has_writers in self._generators:
            for stall in self._check_stream(generator, has_writers, now):
                found[(stall.stream, stall.writer)] = stall
        for key, stall in found.items():
            if key not in self._stalls:
                logger.warning("Stream stalled: %s", stall.reason)
                self._logged_at[key] = now
            elif now - self._logged_at.get(key, now) >= REMIND_SECONDS:
                logger.warning("Stream still stalled: %s", stall.reason)
                self._logged_at[key] = now
            STREAM_STALLED_SECONDS.labels(*key).set(stall.seconds)
        for key in set(self._stalls) - set(found):
            logger.info("Stream %s moves again (it was held by %s)", *key)
            self._logged_at.pop(key, None)
            STREAM_STALLED_SECONDS.labels(*key).set(0)
        self._stalls = found
        return list(found.values())

    def _check_stream(
        self, generator: MultiWriterIdGenerator, has_writers: bool, now: float
    ) -> list[Stall]:
        name = generator.stream_name
        snapshot = generator.snapshot()
        watch = self._watches.get(name)
        if watch is None or watch.persisted_upto != snapshot.persisted_upto:
            watch = _Watch(snapshot.persisted_upto, now, (watch.unfinished_since if watch else {}))
            self._watches[name] = watch
        watch.unfinished_since = {
            i: watch.unfinished_since.get(i, now) for i in snapshot.unfinished
        }
        still = now - watch.moved_at
        if still < self._threshold:
            return []
        # Shown as the database stores them, where an operator looks.
        shown = snapshot.id_space.stored_id
        shown_upto = shown(snapshot.persisted_upto)
        since = watch.unfinished_since
        old = sorted(i for i, first in since.items() if now - first >= self._threshold)
        if old:
            ids = ", ".join(str(shown(i)) for i in old[:10]) + (" ..." if len(old) > 10 else "")
            return [
                Stall(
                    name,
                    self._me,
                    still,
                    f"stream {name}: {self._me} has ids {ids} unfinished for"
                    f" {now - since[old[0]]:.0f} s; persisted-up-to stuck at"
                    f" {shown_upto} for {still:.0f} s",
                )
            ]
        if not has_writers or not snapshot.positions:
            return []
        newest = max(snapshot.positions.values())
        if newest <= snapshot.persisted_upto:
            return []
        holding = sorted(
            w
            for w, p in snapshot.positions.items()
            if p <= snapshot.persisted_upto and w != self._me
        )
        return [
            Stall(
                name,
                writer,
                still,
                f"stream {name}: persisted-up-to stuck at {shown_upto} for {still:.0f} s, held"
                f" back by {writer} (at {shown(snapshot.positions[writer])}; others are up to"
                f" {shown(newest)}): is it frozen, or gone without being retired?",
            )
            for writer in holding
        ]
