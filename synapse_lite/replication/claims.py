"""Whether to believe what a peer says about a stream's positions.

A POSITION or an RDATA token is a claim: "writer W of stream S has nothing
unsent at or below N". Believing a false one is not harmless: every process
would take N as W's position, hand it out in /sync tokens (skipping W's real
rows below it), and a writer would record it in ``stream_positions``, which
outlives restarts. So before a claim moves anything here it is checked:

* **the stream exists** (a name in this process's catalog);
* **the writer may write it**: a configured writer of the stream (for the
  events writers' streams, also one the ``instances`` table lists, read again
  when an unknown name appears, at most once per name per
  :data:`WRITER_LOOKUP_INTERVAL_SECONDS`); for a stream any process may write,
  a configured process;
* **the position can be put in a token**: ``0 <= N <=``
  :data:`~synapse_lite.tokens.MAX_TOKEN_POSITION`, so a token handed out later
  always parses;
* **somebody really allocated N**: a database stream's ids all come from its
  sequence, so no writer can truthfully claim a position beyond the sequence's
  last value. Claims at or below the largest value already read from the
  sequence cost nothing; a claim beyond it makes this process read the
  sequence (one query, only then) and the claim is refused if it is still
  beyond. Streams kept in a writer's memory (typing, federation) have no
  sequence; only the range applies to them.

Which *connection* a claim may come from is the transport's business (over
TCP the main process accepts claims for W only on W's connection; see
``tcp_server.py``).

Over TCP the sequence is read once for everybody: the main process checks each
claim (:meth:`PeerClaims.check`) before relaying it, in the order received, so
a worker's connection to it *vouches* for the claims it carries and the
worker reads no sequence (issue 18: that read was the largest share of what a
follower paid per event). The other checks still run everywhere: they cost no
I/O. Over Redis every process checks for itself, but the main process
publishes what each of its sequence reads returned as a signed note
(``claim_notes.py``), and the others wait a moment for one before reading
the sequence themselves: one read per new position again, as over TCP.

A refused claim changes nothing: it is logged (at most one line per reason per
:data:`REFUSAL_LOG_INTERVAL_SECONDS`, with the number not logged since) and
counted in ``synapse_lite_replication_claims_refused_total``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import TYPE_CHECKING

from twisted.internet import defer

from synapse_lite.clock import Clock
from synapse_lite.metrics import REPLICATION_CLAIMS_REFUSED
from synapse_lite.replication.streams import Stream
from synapse_lite.replication.tcp.commands import (
    CheckedCommand,
    Command,
    PositionCommand,
    RdataCommand,
)
from synapse_lite.tokens import MAX_TOKEN_POSITION

if TYPE_CHECKING:
    from synapse_lite.replication.claim_notes import ClaimNoteVerifier

logger = logging.getLogger(__name__)

#: At most one log line per refusal reason in this many seconds.
REFUSAL_LOG_INTERVAL_SECONDS = 10.0

#: An unknown writer name makes the events writers be read again at most this
#: often (per name): a new writer is found, a flood of made-up names is cheap.
WRITER_LOOKUP_INTERVAL_SECONDS = 10.0

#: How long a claim waits for the main process's CHECKED note (Redis,
#: ``claim_notes.py``) before this process reads the sequence itself. The
#: main process's read is one database round trip; this bounds what a
#: follower loses when the main process is away.
NOTE_WAIT_SECONDS = 0.2

#: How many recently looked-up writer names are remembered.
MAX_REMEMBERED_LOOKUPS = 1000

#: Refusal reasons (the metric's ``reason`` label).
UNKNOWN_STREAM = "unknown_stream"
UNKNOWN_WRITER = "unknown_writer"
OUT_OF_RANGE = "out_of_range"
NOT_ALLOCATED = "not_allocated"
WRONG_SENDER = "wrong_sender"
WENT_BACKWARDS = "went_backwards"
#: A CHECKED note where none is taken (the main process's own channel:
#: only it signs notes; over TCP a CHECKED is not a command at all).
NOTE_NOT_EXPECTED = "note_not_expected"
#: A replication connection naming an instance that another live connection
#: (or the listening process) has: refused before it can claim anything.
DUPLICATE_NAME = "duplicate_name"

#: Writers of a stream, by name; None: any name (tests without a config).
WritersOf = Callable[[str], Collection[str] | None]
#: Look a writer up again (read the instances table); True if it now is one.
WriterLookup = Callable[[str, str], Awaitable[bool]]


def claim_line(cmd: RdataCommand | PositionCommand) -> str:
    """How a claim is named in log lines (an RDATA's row left out)."""
    if isinstance(cmd, RdataCommand):
        return f"RDATA {cmd.stream_name} {cmd.instance_name} {cmd.token}"
    return f"POSITION {cmd.stream_name} {cmd.instance_name} {cmd.prev_token} {cmd.new_token}"


def shorten(value: str, limit: int = 80) -> str:
    """A peer-supplied name for a log line: never a 300-letter one."""
    return value if len(value) <= limit else value[:limit] + f"...({len(value)} chars)"


class RefusalLog:
    """Logs and counts refused claims, rate-limited per reason."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self._last_logged: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def refuse(self, reason: str, stream: str, sender: str, detail: str) -> None:
        known_stream = stream if reason != UNKNOWN_STREAM else "unknown"
        REPLICATION_CLAIMS_REFUSED.labels(known_stream, reason).inc()
        now = self._now()
        last = self._last_logged.get(reason)
        if last is not None and now - last < REFUSAL_LOG_INTERVAL_SECONDS:
            self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return
        self._last_logged[reason] = now
        suppressed = self._suppressed.pop(reason, 0)
        logger.warning(
            "Refused a replication claim from %s (%s): %s%s",
            shorten(sender),
            reason,
            detail,
            f" ({suppressed} more refused for this reason since the last line)"
            if suppressed
            else "",
        )


class PeerClaims:
    """Checks peers' POSITION and RDATA claims (see the module docstring)."""

    def __init__(
        self,
        clock: Clock,
        streams: Mapping[str, Stream],
        writers_of: WritersOf,
        look_up_writer: WriterLookup | None = None,
        notes: ClaimNoteVerifier | None = None,
        publish_read: Callable[[str, int], None] | None = None,
    ) -> None:
        """``writers_of(stream)``: its writers as configured (and known so
        far); ``look_up_writer(stream, writer)``: for streams whose writers
        can be added at runtime, read them again (None: never). Over Redis:
        ``notes``, on every process but the main one, checks the main
        process's CHECKED notes, and a claim beyond what this process read
        waits up to :data:`NOTE_WAIT_SECONDS` for one before reading the
        sequence itself; ``publish_read(stream, allocated)``, on the main
        process, publishes each sequence read as a note."""
        self._clock = clock
        self._streams = streams
        self._writers_of = writers_of
        self._look_up_writer = look_up_writer
        self.refusals = RefusalLog(clock.time)
        #: Per stream, the largest value read from its sequence (or vouched
        #: for by the main process) so far.
        self._allocated: dict[str, int] = {}
        #: Per stream with a sequence read under way, who waits for it: a
        #: burst of claims arriving meanwhile shares that read.
        self._reading: dict[str, list[defer.Deferred[None]]] = {}
        self._looked_up: dict[tuple[str, str], float] = {}
        self._notes = notes
        self._publish_read = publish_read
        #: Per stream, claims waiting for a note: ``(token, waiter)``.
        self._note_waiters: dict[str, list[tuple[int, defer.Deferred[bool]]]] = {}
        #: Streams whose last wait for a note ran out: read at once until a
        #: note comes again (the main process is away or slow).
        self._notes_quiet: set[str] = set()

    def stream(self, stream_name: str, writer: str, sender: str, line: str) -> Stream | None:
        """The stream a claim is about, or None (refused) if there is none."""
        stream = self._streams.get(stream_name)
        if stream is None:
            self.refusals.refuse(UNKNOWN_STREAM, stream_name, sender, shorten(line, 200))
        return stream

    def stream_in_range(self, stream_name: str, token: int | None) -> Stream | None:
        """The stream of a claim that :meth:`stream` and :meth:`in_range`
        would both accept, found without naming the claim (a follower asks
        for every row); None: ask them, they refuse it and say why."""
        stream = self._streams.get(stream_name)
        if stream is None or (token is not None and not 0 <= token <= MAX_TOKEN_POSITION):
            return None
        return stream

    def in_range(self, stream: str, sender: str, line: str, *tokens: int | None) -> bool:
        """Whether every token can be carried in a /sync token."""
        for token in tokens:
            if token is not None and not 0 <= token <= MAX_TOKEN_POSITION:
                self.refusals.refuse(OUT_OF_RANGE, stream, sender, shorten(line, 200))
                return False
        return True

    def not_backwards(
        self, stream: Stream, writer: str, token: int, sender: str, line: str
    ) -> bool:
        """False (refused, counted) when ``token`` lies below what this process
        received from ``writer`` on a stream where that can only be false
        (``lower_position_is_false``: typing, whose runs begin above each
        other); a lower position of a database stream is merely old."""
        positions = stream.positions
        if positions.lower_position_is_false and token < positions.received_position(writer):
            self.refusals.refuse(
                WENT_BACKWARDS,
                stream.name,
                sender,
                f"{shorten(line, 200)}: below {positions.received_position(writer)}, and"
                f" {stream.name} positions of {shorten(writer)} only grow",
            )
            return False
        return True

    def believed_at_once(
        self, stream: Stream, writer: str, token: int | None, vouched: bool = False
    ) -> bool:
        """True when :meth:`believe` would say yes without reading anything
        (a configured writer, a token at or below what the sequence was read
        at, or vouched for): the common case, which a follower meets for most
        rows. False means only "ask :meth:`believe`"."""
        writers = self._writers_of(stream.name)
        return (writers is None or writer in writers) and (
            vouched or token is None or token <= self._allocated.get(stream.name, 0)
        )

    async def believe(
        self,
        stream: Stream,
        writer: str,
        token: int | None,
        sender: str,
        line: str,
        vouched: bool = False,
    ) -> bool:
        """Whether ``writer`` may write ``stream`` and ``token`` (None: a row
        of a batch, no position yet) was really allocated. ``vouched``: the
        connection's peer has already checked the token against the sequence
        (the main process over TCP); it is taken as read. Refusals are logged
        and counted here. A failed sequence read raises."""
        if not await self._is_writer(stream.name, writer):
            self.refusals.refuse(UNKNOWN_WRITER, stream.name, sender, shorten(line, 200))
            return False
        if token is None or token <= self._allocated.get(stream.name, 0):
            return True
        if vouched:
            self._allocated[stream.name] = token
            return True
        if (
            self._notes is not None
            and stream.positions.has_sequence
            and stream.name not in self._notes_quiet
        ):
            if await self._wait_for_note(stream.name, token):
                return True
        while stream.name in self._reading:
            # Another claim's read is under way: it may cover this one too.
            waiter: defer.Deferred[None] = defer.Deferred()
            self._reading[stream.name].append(waiter)
            await waiter
            if token <= self._allocated.get(stream.name, 0):
                return True
        self._reading[stream.name] = []
        try:
            allocated = await stream.positions.read_max_allocated()
            if allocated is not None:
                self._allocated[stream.name] = max(self._allocated.get(stream.name, 0), allocated)
                if self._publish_read is not None:
                    self._publish_read(stream.name, allocated)
        finally:
            # Woken with what was read known (or, if the read failed, to read
            # again themselves).
            for waiter in self._reading.pop(stream.name):
                waiter.callback(None)
        if allocated is None or token <= allocated:
            return True
        self.refusals.refuse(
            NOT_ALLOCATED,
            stream.name,
            sender,
            f"{shorten(line, 200)}: the sequence of {stream.name} has only handed out up to"
            f" {allocated}",
        )
        return False

    async def _wait_for_note(self, stream_name: str, token: int) -> bool:
        """True once a note covers ``token``; False if none does within the
        wait (the stream is then read for at once until a note comes)."""
        waiter: defer.Deferred[bool] = defer.Deferred()
        self._note_waiters.setdefault(stream_name, []).append((token, waiter))
        timer = self._clock.call_later(NOTE_WAIT_SECONDS, waiter.callback, False)
        if await waiter:
            timer.cancel()
            return True
        waiters = self._note_waiters.get(stream_name, [])
        if (token, waiter) in waiters:
            waiters.remove((token, waiter))
        if stream_name not in self._notes_quiet:
            self._notes_quiet.add(stream_name)
            logger.info(
                "No CHECKED note covered %s %d within %.1f s: reading the sequence here until"
                " one comes (is the main process up?)",
                stream_name,
                token,
                NOTE_WAIT_SECONDS,
            )
        return False

    def on_note(self, cmd: CheckedCommand, sender: str) -> None:
        """A CHECKED note from ``sender``: once verified, what it says was
        handed out is believed, and the claims it covers go on."""
        if self._notes is None:
            self.refusals.refuse(
                NOTE_NOT_EXPECTED,
                cmd.stream_name,
                sender,
                f"CHECKED {shorten(cmd.stream_name)} {cmd.allocated}: this process takes no notes",
            )
            return
        if cmd.stream_name not in self._streams:
            self.refusals.refuse(UNKNOWN_STREAM, cmd.stream_name, sender, "a CHECKED note")
            return
        verified = self._notes.verify(cmd, sender)
        if verified is True:
            self._noted(cmd.stream_name, cmd.allocated)
        elif isinstance(verified, defer.Deferred):
            verified.addCallback(
                lambda ok: self._noted(cmd.stream_name, cmd.allocated) if ok else None
            )

    def _noted(self, stream_name: str, allocated: int) -> None:
        self._notes_quiet.discard(stream_name)
        if allocated > self._allocated.get(stream_name, 0):
            self._allocated[stream_name] = allocated
        waiters = self._note_waiters.get(stream_name)
        if not waiters:
            return
        covered = [w for w in waiters if w[0] <= allocated]
        if not covered:
            return
        self._note_waiters[stream_name] = [w for w in waiters if w[0] > allocated]
        for _, waiter in covered:
            if not waiter.called:
                waiter.callback(True)

    def check(self, cmd: Command, sender: str) -> bool | defer.Deferred[bool]:
        """Every check of an RDATA or POSITION, for the main process to run
        before relaying it: True or False when that needs no I/O, else a
        Deferred with the answer (it fails if the sequence cannot be read).
        Any other command: True."""
        if isinstance(cmd, RdataCommand):
            tokens: tuple[int | None, ...] = (cmd.token,)
            token = cmd.token
        elif isinstance(cmd, PositionCommand):
            tokens = (cmd.prev_token, cmd.new_token)
            token = cmd.new_token
        else:
            return True
        line = claim_line(cmd)
        stream = self.stream(cmd.stream_name, cmd.instance_name, sender, line)
        if stream is None or not self.in_range(cmd.stream_name, sender, line, *tokens):
            return False
        if isinstance(cmd, PositionCommand) and not self.not_backwards(
            stream, cmd.instance_name, cmd.new_token, sender, line
        ):
            return False
        if self.believed_at_once(stream, cmd.instance_name, token):
            return True
        return defer.ensureDeferred(self.believe(stream, cmd.instance_name, token, sender, line))

    async def _is_writer(self, stream: str, writer: str) -> bool:
        writers = self._writers_of(stream)
        if writers is None or writer in writers:
            return True
        if self._look_up_writer is None:
            return False
        key = (stream, writer)
        now = self._clock.time()
        last = self._looked_up.get(key)
        if last is not None and now - last < WRITER_LOOKUP_INTERVAL_SECONDS:
            return False
        if len(self._looked_up) >= MAX_REMEMBERED_LOOKUPS:
            self._looked_up.clear()
        self._looked_up[key] = now
        try:
            return await self._look_up_writer(stream, writer)
        except Exception:
            logger.warning(
                "Looking up writer %s of %s failed", shorten(writer), stream, exc_info=True
            )
            return False


#: How long ``/health`` reports another deployment after last hearing it.
FOREIGN_MEMORY_SECONDS = 300.0


class ForeignTraffic:
    """Processes of another deployment heard on this process's replication
    (a TCP peer whose handshake names another deployment id): logged once a
    minute per deployment, counted, and reported by ``/health``."""

    def __init__(self, now: Callable[[], float], where: str) -> None:
        self._now = now
        self._where = where
        self._heard: dict[str, tuple[str, float]] = {}
        self._logged: dict[str, float] = {}

    def heard(self, deployment: str, process: str) -> None:
        ident, name = shorten(deployment, 40), shorten(process)
        now = self._now()
        if len(self._heard) >= 100 and ident not in self._heard:
            self._heard.pop(next(iter(self._heard)))
        self._heard[ident] = (name, now)
        REPLICATION_CLAIMS_REFUSED.labels("unknown", "foreign_deployment").inc()
        last = self._logged.get(ident)
        if last is None or now - last >= 60.0:
            if len(self._logged) >= 100:
                self._logged.clear()
            self._logged[ident] = now
            logger.error(
                "A process of another deployment (%s, %s) on %s: refused. Check the"
                " replication settings of both deployments.",
                ident,
                name,
                self._where,
            )

    def problems(self) -> list[str]:
        now = self._now()
        return [
            f"foreign replication traffic from deployment {ident} (process {name}) on"
            f" {self._where}, {now - when:.0f} s ago"
            for ident, (name, when) in sorted(self._heard.items())
            if now - when < FOREIGN_MEMORY_SECONDS
        ]
