"""Sending this process's streams: RDATA for new rows, POSITION for the rest.

On each poke (an id finished somewhere in this process), and once a second in
any case, for every stream this process writes:

* what a poke finds is sent at the end of the reactor turn, so the rows of
  every transaction committed within one turn go out together;
* new rows go out as RDATA, one batch per stream: every row but the last
  carries the ``batch`` token, the last the batch's token (its highest), so
  a follower applies them at once (one cache pass, one /sync wake-up, one
  position advance; ``docs/scaling.md``, "Batches"). Streams that can reset (kept in
  a writer's memory: typing) keep one batch per token;
* if the rows end below the stream's current position, a trailing
  ``POSITION last_row current`` follows;
* a position that moved with no rows of ours (an idle writer catching up with
  the ids it has seen) goes out as ``POSITION last current``, so the minimum
  position across writers never stalls behind an idle writer (except on the
  caches stream, where only our own invalidations matter to anyone);
* after REPLICATE and on every new connection, ``POSITION s me p p`` for every
  stream, so newcomers learn where we are without being sent old rows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from twisted.internet import defer, task
from twisted.internet.interfaces import IDelayedCall

from synapse_lite.clock import Clock
from synapse_lite.replication.streams import Stream
from synapse_lite.replication.tcp.commands import PositionCommand, RdataCommand

if TYPE_CHECKING:
    from synapse_lite.position_log import PositionLog
    from synapse_lite.replication.notifier import ReplicationNotifier
    from synapse_lite.replication.tcp.handler import ReplicationCommandHandler

logger = logging.getLogger(__name__)

#: Seconds between announcements of idle writers' positions.
ANNOUNCE_INTERVAL_SECONDS = 1.0


class ReplicationStreamer:
    """Turns stream advances of this process into replication commands."""

    def __init__(
        self,
        *,
        instance_name: str,
        clock: Clock,
        handler: ReplicationCommandHandler,
        streams: Sequence[Stream],
        position_log: PositionLog | None,
        local_writes: ReplicationNotifier | None = None,
        vouch: Callable[[str, int], None] | None = None,
    ) -> None:
        """``local_writes``: poked when this process's ids finish (each poke
        sends what is new); announcements follow every new connection.
        ``vouch(stream, position)``: the main process over Redis, which
        vouches for its own claims with a signed note
        (``replication/claim_notes.py``): called after each pass of the send
        loop with the highest position claimed of each stream with a
        sequence."""
        self._me = instance_name
        self._vouch = vouch
        #: This pass's highest claimed position per stream (for ``vouch``).
        self._claimed: dict[str, int] = {}
        self._clock = clock
        self._handler = handler
        self._streams = list(streams)
        self._position_log = position_log
        self._pending_updates = False
        self._is_looping = False
        #: The end-of-turn start of the send loop, while one is pending.
        self._scheduled: IDelayedCall | None = None
        self._should_announce_positions = True
        self._loop: task.LoopingCall | None = None
        handler.on_new_connection(self.announce)
        if local_writes is not None:
            local_writes.add_replication_callback(self.on_notifier_poke)

    @property
    def sourced_stream_names(self) -> list[str]:
        return [s.name for s in self._streams]

    # The announcement loop (a background loop of the process)

    def start(self) -> None:
        if self._streams:
            self._loop = self._clock.looping_call(self.on_notifier_poke, ANNOUNCE_INTERVAL_SECONDS)

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self._scheduled is not None and self._scheduled.active():
            self._scheduled.cancel()
        self._scheduled = None

    async def send_pending(self) -> None:
        """Send what is waiting now and return once it has gone (a stopping
        process's last rows; the caller bounds the wait)."""
        self.on_notifier_poke()
        while self._is_looping or self._scheduled is not None:
            await self._clock.sleep(0.01)

    def announce(self) -> None:
        """Send every stream's position at the next opportunity."""
        self._should_announce_positions = True
        self.on_notifier_poke()

    def on_notifier_poke(self) -> None:
        if not self._streams:
            return
        if not self._handler.connected:
            # Nobody to tell: what happened meanwhile is read from the database
            # by whoever connects, after our POSITION.
            for stream in self._streams:
                stream.skip_unsent()
            return
        if not self._should_announce_positions and all(
            s.last_sent_position == s.positions.writer_position(self._me) for s in self._streams
        ):
            return
        self._pending_updates = True
        if self._is_looping or self._scheduled is not None:
            return
        # At the end of this reactor turn: the other transactions whose
        # commits this turn delivers go in the same batches.
        self._scheduled = self._clock.call_later(0, self._start_loop)

    def _start_loop(self) -> None:
        self._scheduled = None
        if not self._is_looping:
            defer.ensureDeferred(self._run_loop())

    async def _run_loop(self) -> None:
        self._is_looping = True
        try:
            while self._pending_updates and self._handler.connected:
                self._pending_updates = False
                if self._should_announce_positions:
                    self._should_announce_positions = False
                    for stream in self._streams:
                        last = stream.last_sent_position
                        self._send_position(stream, last, last)
                for stream in self._streams:
                    await self._send_stream(stream)
                self._vouch_for_claims()
        except Exception:
            logger.exception("Sending replication updates failed; will retry on the next poke")
            self._pending_updates = True
        finally:
            self._is_looping = False

    async def _send_stream(self, stream: Stream) -> None:
        if stream.last_sent_position == stream.positions.writer_position(self._me):
            return
        last = stream.last_sent_position
        updates, current, limited = await stream.new_local_rows()
        if limited:
            self._pending_updates = True
        if not updates:
            if (
                stream.definition.writers.any_process
                and stream.positions.newest_local_write() <= last
            ):
                # Only other writers moved: echoing it would only add traffic.
                return
            self._send_position(stream, last, current)
            return
        encode = stream.definition.encode_row
        one_batch = not stream.positions.can_reset
        for i, (token, row) in enumerate(updates):
            shares_next = i + 1 < len(updates) and (one_batch or updates[i + 1][0] == token)
            self._handler.send_command(
                RdataCommand(stream.name, self._me, None if shares_next else token, encode(row))
            )
            if not shares_next:
                self._log_position(stream.name, token)
                self._note_claim(stream, token)
        last_row_token = updates[-1][0]
        if last_row_token < current:
            self._send_position(stream, last_row_token, current)

    def _send_position(self, stream: Stream, prev: int, new: int) -> None:
        self._handler.send_command(PositionCommand(stream.name, self._me, prev, new))
        self._log_position(stream.name, new)
        self._note_claim(stream, new)

    def _note_claim(self, stream: Stream, position: int) -> None:
        if self._vouch is not None and stream.positions.has_sequence and position > 0:
            self._claimed[stream.name] = max(position, self._claimed.get(stream.name, 0))

    def _vouch_for_claims(self) -> None:
        """One note per stream for what this pass claimed: every position
        this process claims it allocated itself or believed after a check,
        so the sequence had handed it out."""
        if self._vouch is None or not self._claimed:
            return
        claimed, self._claimed = self._claimed, {}
        for stream_name, position in claimed.items():
            self._vouch(stream_name, position)

    def _log_position(self, stream_name: str, position: int) -> None:
        if self._position_log is not None:
            self._position_log.position(stream_name, self._me, position, "announce")
