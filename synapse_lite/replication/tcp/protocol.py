"""Direct TCP replication: line framing and the life of one connection.

:class:`ReplicationProtocol` is what the two ends share. It frames ``"\\n"``
-terminated UTF-8 lines, parses them into commands, refuses bad input, keeps the
connection alive with PINGs, queues what is sent while the transport is paused,
and tells the :class:`ReplicationCommandReceiver` when the connection comes and
goes. What differs between the ends (the handshake, who may send what, the main
process relaying) lives in ``tcp_server.py`` and ``tcp_client.py``.

Lifecycle: CONNECTING (TCP is up, the handshake is not done) -> ESTABLISHED <->
PAUSED (the transport's write buffer is full) -> CLOSED.

* Anything the peer sends that is not one valid command for this direction (bad
  UTF-8, a line over MAX_LINE_LENGTH, a parse failure, a command the other end
  may not send) is answered with ``ERROR <reason>`` and the connection closes.
* Commands sent while CONNECTING or PAUSED are queued and flushed in order; if
  more than MAX_QUEUED_COMMANDS pile up the peer is not keeping up: ``ERROR
  Failed to keep up`` goes out past the queue and the connection closes.
* A PING goes out on establishment and whenever nothing was sent for
  PING_INTERVAL_SECONDS. Once the peer has sent a PING (so it is known to ping)
  and nothing has arrived for PING_TIMEOUT_SECONDS: ``ERROR ping timeout`` and
  close. A connection still not closed CLOSE_TIMEOUT_SECONDS after we closed it
  is aborted.
* ``receiver.lost_connection`` is called exactly once for every connection
  given to ``receiver.new_connection``, however it ends.

All timing goes through the injected clock.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from typing import TYPE_CHECKING, ClassVar, Protocol, cast

from twisted.internet.interfaces import IDelayedCall, IPushProducer
from twisted.internet.protocol import connectionDone
from twisted.protocols.basic import LineOnlyReceiver
from twisted.python.failure import Failure
from zope.interface import implementer  # type: ignore[import-untyped, unused-ignore]

from synapse_lite.metrics import (
    REPLICATION_BAD_LINES,
    REPLICATION_COMMANDS_IN,
    REPLICATION_COMMANDS_OUT,
    count_command,
)
from synapse_lite.replication.http.calls import set_tcp_nodelay
from synapse_lite.replication.tcp.commands import (
    DATA_COMMANDS,
    MAX_LINE_LENGTH,
    Command,
    CommandEncodeError,
    CommandParseError,
    ErrorCommand,
    PingCommand,
    claim_stream,
    command_line,
    parse_command_from_line,
)
from synapse_lite.replication.tcp.reactor_time import ReactorTime, cancel_call
from synapse_lite.sockets import write_now

if TYPE_CHECKING:
    from synapse_lite.replication.tcp.connection import ReplicationCommandReceiver

logger = logging.getLogger(__name__)

PING_INTERVAL_SECONDS = 5.0
PING_TIMEOUT_SECONDS = 5 * PING_INTERVAL_SECONDS
CLOSE_TIMEOUT_SECONDS = PING_TIMEOUT_SECONDS
#: Commands queued while paused beyond which the peer is given up on.
MAX_QUEUED_COMMANDS = 10_000


class ConnectionState(enum.Enum):
    CONNECTING = "connecting"
    ESTABLISHED = "established"
    PAUSED = "paused"
    CLOSED = "closed"


class _Transport(Protocol):
    """The part of a TCP transport we use (zope interfaces defeat mypy)."""

    def write(self, data: bytes) -> None: ...
    def loseConnection(self) -> None: ...
    def abortConnection(self) -> None: ...
    def registerProducer(self, producer: object, streaming: bool) -> None: ...
    def unregisterProducer(self) -> None: ...
    def getPeer(self) -> object: ...


def _redacted(line: bytes) -> str:
    """The start of a refused line, safe to log: escaped, cut short, and
    without the secret of anything that looks like an AUTH."""
    if line.startswith(b"AUTH"):
        return "'AUTH <redacted>'"
    text = repr(line[:200])
    return text + "..." if len(line) > 200 else text


@implementer(IPushProducer)
class ReplicationProtocol(LineOnlyReceiver):
    """One end of a replication connection; also its ReplicationConnection.

    Subclasses set VALID_INBOUND, perform the handshake and call
    :meth:`_establish` when the connection may carry data commands.
    """

    delimiter = b"\n"
    MAX_LENGTH = MAX_LINE_LENGTH

    #: Commands the peer may send to this end.
    VALID_INBOUND: ClassVar[frozenset[type[Command]]]

    #: See ``ReplicationConnection``: only the main process's end vouches.
    vouches_for_claims = False

    #: The streams whose RDATA and POSITION this end acts on; the others'
    #: are skipped unparsed (None: every stream).
    followed_streams: frozenset[bytes] | None = None

    def __init__(self, receiver: ReplicationCommandReceiver, clock: ReactorTime) -> None:
        self._receiver = receiver
        self._clock = clock
        self._state = ConnectionState.CONNECTING
        self._paused = False
        # Encoded lines waiting for the transport, with their command names.
        self._queue: deque[tuple[str, bytes]] = deque()
        #: The peer's name: its NAME (server side) or SERVER (client side).
        self.peer_name: str | None = None
        self._peer_address = "?"
        now = clock.seconds()
        self._last_sent = now
        self._last_received = now
        self._received_ping = False
        self._ping_call: IDelayedCall | None = None
        self._abort_call: IDelayedCall | None = None
        self._producer_registered = False
        self._announced = False
        #: Lines written while output is held (:meth:`hold_output`).
        self._held_output: list[bytes] | None = None
        #: Commands received in the read under way, by name: counted in the
        #: metrics once per read (a counter's increment per line was a
        #: measurable share of a follower's CPU, issue 35).
        self._received_counts: dict[str, int] = {}

    # -- ReplicationConnection ---------------------------------------------------------

    def describe(self) -> str:
        return f"{self.peer_name or '?'} ({self._peer_address})"

    def send_command(self, cmd: Command) -> None:
        """Send ``cmd`` to the peer, or queue it while paused. Dropped (and
        logged) if the connection is closed or the command cannot be encoded."""
        if self._state is ConnectionState.CLOSED:
            logger.debug("dropping %s for closed connection %s", cmd.NAME, self.describe())
            return
        try:
            line = command_line(cmd).encode("utf-8")
        except CommandEncodeError as e:
            logger.error("not sending %s to %s: %s", cmd.NAME, self.describe(), e)
            return
        self.send_encoded(cmd.NAME, line)

    @property
    def state(self) -> ConnectionState:
        if self._state is ConnectionState.ESTABLISHED and self._paused:
            return ConnectionState.PAUSED
        return self._state

    # -- sending -----------------------------------------------------------------------

    def send_encoded(self, name: str, line: bytes) -> None:
        """Send an already-encoded command line (no ``"\\n"``); lets the main
        process encode a broadcast once for every connection."""
        if self._state is ConnectionState.CLOSED:
            logger.debug("dropping %s for closed connection %s", name, self.describe())
            return
        if self._state is ConnectionState.CONNECTING or self._paused:
            self._queue.append((name, line))
            if len(self._queue) > MAX_QUEUED_COMMANDS:
                logger.warning(
                    "%s: over %d commands queued, closing", self.describe(), MAX_QUEUED_COMMANDS
                )
                self.send_error_and_close("Failed to keep up")
            return
        self._write(name, line)

    def _write(self, name: str, line: bytes) -> None:
        if self._held_output is not None:
            self._held_output.append(line + b"\n")
        else:
            self._transport.write(line + b"\n")
        self._last_sent = self._clock.seconds()
        count_command(REPLICATION_COMMANDS_OUT, name)

    def hold_output(self) -> None:
        """Keep what is written from now on until :meth:`release_output`."""
        if self._held_output is None:
            self._held_output = []

    def release_output(self) -> None:
        """Send what was held as one write, on the spot where the socket
        takes it (``sockets.write_now``), rather than when the reactor's
        turn ends: the main process relays a claim this way before it
        applies the rows itself (issue 35: the wake-up's path)."""
        held, self._held_output = self._held_output, None
        if held and self._state is not ConnectionState.CLOSED:
            write_now(self._transport, b"".join(held))

    def _write_now(self, cmd: Command) -> None:
        """Write a connection-level command past the queue and the state."""
        self._write(cmd.NAME, command_line(cmd).encode("utf-8"))

    def _flush(self) -> None:
        # A write may pause us (the transport calls pauseProducing at once).
        while self._queue and not self._paused and self._state is ConnectionState.ESTABLISHED:
            name, line = self._queue.popleft()
            self._write(name, line)

    def send_error_and_close(self, message: str) -> None:
        """Tell the peer why (past the queue) and close."""
        if self._state is not ConnectionState.CLOSED:
            try:
                self._write_now(ErrorCommand(message))
            except CommandEncodeError:
                self._write_now(ErrorCommand("closing"))
        self.close()

    def close(self) -> None:
        """Close the connection (idempotent); abort it if it lingers."""
        if self._state is ConnectionState.CLOSED:
            return
        # What was written before (an ERROR saying why) still goes first.
        self.release_output()
        self._state = ConnectionState.CLOSED
        self._queue.clear()
        cancel_call(self._ping_call)
        if self._producer_registered:
            self._producer_registered = False
            self._transport.unregisterProducer()
        self._transport.loseConnection()
        self._abort_call = self._clock.callLater(CLOSE_TIMEOUT_SECONDS, self._abort)

    def _abort(self) -> None:
        logger.warning(
            "%s did not close in %.0fs, aborting", self.describe(), CLOSE_TIMEOUT_SECONDS
        )
        self._transport.abortConnection()

    # -- IPushProducer: the transport tells us when its buffer is full ---------------

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        self._flush()

    def stopProducing(self) -> None:
        # The transport is going away; connectionLost follows and cleans up.
        self._paused = True

    # -- connection events -------------------------------------------------------------

    @property
    def _transport(self) -> _Transport:
        return cast(_Transport, self.transport)

    def connectionMade(self) -> None:
        peer = self._transport.getPeer()
        host, port = getattr(peer, "host", None), getattr(peer, "port", None)
        self._peer_address = f"{host}:{port}" if host is not None else str(peer)
        self._transport.registerProducer(self, True)
        self._producer_registered = True
        # Each turn's lines go at once: with Nagle's algorithm a line written
        # in a later reactor turn than another still unacknowledged (a
        # trailing POSITION, a relayed line behind main's own) would wait
        # for the peer's delayed ACK.
        set_tcp_nodelay(self.transport)
        now = self._clock.seconds()
        self._last_sent = now
        self._last_received = now

    def _establish(self) -> None:
        """The handshake is done: start pinging, flush, announce to the receiver."""
        if self._state is not ConnectionState.CONNECTING:
            return
        self._state = ConnectionState.ESTABLISHED
        logger.info("replication connection established with %s", self.describe())
        self._flush()
        # Ping at once so the peer knows it may time us out.
        self.send_command(PingCommand(self._now_ms()))
        self._schedule_ping()
        self._on_established()
        self._announced = True
        try:
            self._receiver.new_connection(self)
        except Exception:
            logger.exception("replication receiver failed on new connection %s", self.describe())

    def _on_established(self) -> None:
        """Hook for subclasses, called just before the receiver hears of us."""

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._state = ConnectionState.CLOSED
        self._producer_registered = False
        self._queue.clear()
        cancel_call(self._ping_call)
        cancel_call(self._abort_call)
        logger.info(
            "replication connection to %s closed: %s", self.describe(), reason.getErrorMessage()
        )
        self._on_lost()
        if self._announced:
            self._announced = False
            try:
                self._receiver.lost_connection(self)
            except Exception:
                logger.exception(
                    "replication receiver failed on lost connection %s", self.describe()
                )

    def _on_lost(self) -> None:
        """Hook for subclasses, called before the receiver hears of the loss."""

    # -- receiving ---------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        """One read of the socket: its commands reach the receiver between
        ``read_started`` and ``read_done``, so that it can apply their rows
        together (one cache pass and one wake-up per read, not per line)."""
        self._receiver.read_started()
        try:
            self._read_lines(data)
        finally:
            counts = self._received_counts
            if counts:
                for name, amount in counts.items():
                    count_command(REPLICATION_COMMANDS_IN, name, amount)
                counts.clear()
            self._receiver.read_done()

    def _read_lines(self, data: bytes) -> None:
        """Each line of one read, in order (subclasses wrap it)."""
        super().dataReceived(data)

    def lineReceived(self, line: bytes) -> None:
        if self._state is ConnectionState.CLOSED:
            return
        if not line.strip():
            return
        if self.followed_streams is not None and self._skip_unfollowed(line):
            return
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            self._refuse_line(line, "invalid UTF-8")
            return
        try:
            cmd = parse_command_from_line(text)
        except CommandParseError as e:
            self._refuse_line(line, f"failed to parse line: {e}")
            return
        counts = self._received_counts
        counts[cmd.NAME] = counts.get(cmd.NAME, 0) + 1
        self._last_received = self._clock.seconds()
        if type(cmd) not in self.VALID_INBOUND:
            logger.warning("%s sent %s, which it may not send: closing", self.describe(), cmd.NAME)
            self.send_error_and_close(f"invalid command: {cmd.NAME}")
            return
        self._handle_command(cmd, line)

    def _skip_unfollowed(self, line: bytes) -> bool:
        stream = claim_stream(line)
        if stream is None or stream in cast(frozenset[bytes], self.followed_streams):
            return False
        name = "RDATA" if line[0] == ord("R") else "POSITION"
        counts = self._received_counts
        counts[name] = counts.get(name, 0) + 1
        self._last_received = self._clock.seconds()
        return True

    def lineLengthExceeded(self, line: bytes) -> None:
        if self._state is not ConnectionState.CLOSED:
            self._refuse_line(line, f"line too long (over {MAX_LINE_LENGTH} bytes)")

    def _refuse_line(self, line: bytes, reason: str) -> None:
        REPLICATION_BAD_LINES.labels("tcp").inc()
        logger.warning(
            "closing replication connection %s: %s: %s", self.describe(), reason, _redacted(line)
        )
        self.send_error_and_close(reason)

    def _handle_command(self, cmd: Command, line: bytes) -> None:
        """Act on a valid command; ``line`` is how it came on the wire."""
        if isinstance(cmd, PingCommand):
            self._received_ping = True
        elif isinstance(cmd, ErrorCommand):
            logger.warning("%s sent ERROR %r", self.describe(), cmd.message[:200])
        elif type(cmd) in DATA_COMMANDS:
            self._handle_data_command(cmd, line)
        else:
            self._handle_handshake_command(cmd)

    def _handle_data_command(self, cmd: Command, line: bytes) -> None:
        self._deliver(cmd)

    def _handle_handshake_command(self, cmd: Command) -> None:
        """SERVER, NAME, AUTH: subclasses know which they expect."""

    def _deliver(self, cmd: Command) -> None:
        try:
            self._receiver.on_command(self, cmd)
        except Exception:
            logger.exception("replication receiver failed on %s from %s", cmd.NAME, self.describe())

    # -- keepalive ---------------------------------------------------------------------

    def _now_ms(self) -> str:
        return str(int(self._clock.seconds() * 1000))

    def _schedule_ping(self) -> None:
        self._ping_call = self._clock.callLater(PING_INTERVAL_SECONDS, self._on_ping_timer)

    def _on_ping_timer(self) -> None:
        if self._state is ConnectionState.CLOSED:
            return
        now = self._clock.seconds()
        if self._received_ping and now - self._last_received >= PING_TIMEOUT_SECONDS:
            logger.warning(
                "nothing from %s for %.0fs: closing", self.describe(), now - self._last_received
            )
            self.send_error_and_close("ping timeout")
            return
        # While paused the transport is still busy sending: no need to ping.
        if not self._paused and now - self._last_sent >= PING_INTERVAL_SECONDS:
            self.send_command(PingCommand(self._now_ms()))
        self._schedule_ping()
