"""The main process's end of direct TCP replication: listen, authenticate, relay.

Workers connect to the main process's replication listener. Which object is
what (see ``connection.py``):

* :class:`ReplicationServerFactory` is the main process's ReplicationBus: its
  ``send_command`` goes to every authenticated worker connection.
* Each :class:`ServerReplicationProtocol`, one per worker connection, is a
  ReplicationConnection. The receiver gets it in ``new_connection`` once the
  worker has authenticated, in ``on_command`` with each data command from that
  worker, and in ``lost_connection`` when it goes. Its own ``send_command``
  reaches that one worker.
* Relaying: each data command from one worker is sent on, as received, to every
  other authenticated worker (never back to the sender) and then handed to the
  receiver, so the TCP star behaves like a bus. Subscriptions: a worker that
  sent ``SUBSCRIBE <streams>`` (after its NAME) is sent the RDATA and
  POSITION of those streams alone, relayed or the main process's own; the
  other commands reach every worker. What a worker subscribes to is its
  role's reading (``Role.subscription``, ``docs/workers.md``); the positions
  the main process announces the instant a worker authenticates, before its
  SUBSCRIBE is read, may include others' (the worker skips them unparsed).
  An RDATA or POSITION naming a writer other than the connection's NAME is
  neither relayed nor handed on: only a writer speaks for itself (logged,
  counted as ``wrong_sender``).
* Checking before relaying: every RDATA and POSITION is first checked as a
  claim (``claims.py``); one refused is neither relayed nor handed on, so
  workers can take what the main process relays as checked and need not read
  the stream's sequence themselves (``vouches_for_claims`` on their end). A
  check that must read the database holds back every command received after
  it, from any worker, until it is answered: commands are relayed and handed
  on in the order received, which the processes rely on (a new events
  writer's first POSITION reaches everyone before anything that could give it
  a room). A check that fails (the database is unreachable) is retried every
  :data:`CHECK_RETRY_SECONDS`, holding the queue meanwhile: nothing is lost or
  reordered.

One live connection per instance name (a decision, issue 34): a ``NAME``
taken by a live connection, or the listening process's own name, is refused
(``ERROR instance name <n> is taken``, closed, logged at ERROR, counted as
``duplicate_name``), and a connection may not rename itself. The connection
already there keeps the name: refusing the newcomer cannot cut off a working
writer (replacing the old one would let any holder of the secret, or a
worker started twice, keep knocking the real writer off), and a restarted
worker whose old connection is half-open gets in once the keepalive drops
that one (:data:`PING_TIMEOUT_SECONDS`), its client retrying meanwhile.

Handshake: the server sends ``SERVER <server_name>`` at once. With a secret
configured, the worker's first command must be ``AUTH <secret>`` (compared in
constant time); anything else first, a wrong secret, or no AUTH within
AUTH_TIMEOUT_SECONDS gets an ERROR, a warning naming the peer, and a close, and
the connection never reaches the receiver. Until then nothing but SERVER (and
that ERROR) is sent and nothing the worker sends is acted on.
"""

from __future__ import annotations

import hmac
import logging
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import attr
from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import ServerFactory

from synapse_lite.config.homeserver import MAIN_PROCESS
from synapse_lite.metrics import REPLICATION_CLAIMS_REFUSED
from synapse_lite.replication.claims import (
    DUPLICATE_NAME,
    WRONG_SENDER,
    ForeignTraffic,
    RefusalLog,
    shorten,
)
from synapse_lite.replication.tcp.commands import (
    AuthCommand,
    ClearUserSyncCommand,
    Command,
    CommandEncodeError,
    ErrorCommand,
    FederationAckCommand,
    NameCommand,
    PingCommand,
    PositionCommand,
    RdataCommand,
    RemoteServerUpCommand,
    ReplicateCommand,
    ServerCommand,
    SubscribeCommand,
    UserIpCommand,
    UserSyncCommand,
    claim_stream,
    command_line,
)
from synapse_lite.replication.tcp.protocol import PING_TIMEOUT_SECONDS, ReplicationProtocol
from synapse_lite.replication.tcp.reactor_time import ReactorTime, cancel_call

if TYPE_CHECKING:
    from synapse_lite.replication.tcp.connection import ReplicationCommandReceiver

logger = logging.getLogger(__name__)

#: How long a worker has to authenticate before it is disconnected.
AUTH_TIMEOUT_SECONDS = PING_TIMEOUT_SECONDS

#: Delay before checking a claim again after its check failed.
CHECK_RETRY_SECONDS = 1.0

#: Checks a claim from a sender (described) before it is relayed: True or False
#: at once, or a Deferred answer (``PeerClaims.check``).
ClaimCheck = Callable[[Command, str], bool | defer.Deferred[bool]]


@attr.s(slots=True, auto_attribs=True)
class _HeldCommand:
    """A received data command waiting for its turn to be relayed."""

    sender: ServerReplicationProtocol
    cmd: Command
    line: bytes
    #: None while its check is under way.
    believed: bool | None


class ServerReplicationProtocol(ReplicationProtocol):
    """The main process's end of one worker's connection."""

    VALID_INBOUND = frozenset(
        {
            AuthCommand,
            NameCommand,
            ReplicateCommand,
            PingCommand,
            ErrorCommand,
            RdataCommand,
            PositionCommand,
            UserSyncCommand,
            ClearUserSyncCommand,
            FederationAckCommand,
            UserIpCommand,
            RemoteServerUpCommand,
            SubscribeCommand,
        }
    )

    def __init__(self, factory: ReplicationServerFactory) -> None:
        super().__init__(factory.receiver, factory.clock)
        self.factory = factory
        #: The streams whose RDATA and POSITION this worker is sent (its
        #: SUBSCRIBE; None until it sends one: every stream).
        self.subscribed: frozenset[bytes] | None = None
        self._authenticated = False
        self._auth_call: IDelayedCall | None = None

    def connectionMade(self) -> None:
        super().connectionMade()
        self.factory.open_protocols.add(self)
        logger.info("replication connection from %s", self.describe())
        self._write_now(ServerCommand(self.factory.server_name, self.factory.deployment_id))
        if self.factory.secret is None:
            self._authenticated = True
            self._establish()
        else:
            self._auth_call = self._clock.callLater(AUTH_TIMEOUT_SECONDS, self._auth_timed_out)

    def _auth_timed_out(self) -> None:
        logger.warning("%s did not authenticate in %.0fs", self.describe(), AUTH_TIMEOUT_SECONDS)
        self.send_error_and_close("authentication timeout")

    def _handle_command(self, cmd: Command, line: bytes) -> None:
        if self._authenticated:
            super()._handle_command(cmd, line)
        else:
            self._authenticate(cmd)

    def _authenticate(self, cmd: Command) -> None:
        secret = self.factory.secret
        assert secret is not None
        cancel_call(self._auth_call)
        if not isinstance(cmd, AuthCommand):
            logger.warning("%s sent %s before AUTH: refusing", self.describe(), cmd.NAME)
            self.send_error_and_close("authentication required")
            return
        if not hmac.compare_digest(cmd.secret.encode("utf-8"), secret.encode("utf-8")):
            logger.warning("%s sent a wrong replication secret: refusing", self.describe())
            self.send_error_and_close("bad secret")
            return
        self._authenticated = True
        self._establish()

    def _handle_handshake_command(self, cmd: Command) -> None:
        if isinstance(cmd, NameCommand):
            logger.info("replication connection %s is %s", self.describe(), cmd.client_name)
            if self.peer_name is not None:
                if cmd.client_name != self.peer_name:
                    # Renamed, it would speak for another writer with the
                    # first one's bookkeeping. (The same NAME again: harmless.)
                    self.factory.refuse_name(
                        self, cmd.client_name, f"the connection is named {self.peer_name}"
                    )
                return
            ours = self.factory.deployment_id
            if cmd.deployment is not None and ours is not None and cmd.deployment != ours:
                self.peer_name = cmd.client_name
                self.factory.foreign.heard(cmd.deployment, self.describe())
                self.send_error_and_close("another deployment")
                return
            if not self.factory.claim_name(self, cmd.client_name):
                return
            self.peer_name = cmd.client_name
        elif isinstance(cmd, SubscribeCommand):
            logger.info(
                "replication connection %s reads %s",
                self.describe(),
                ", ".join(cmd.streams) or "no stream",
            )
            self.subscribed = frozenset(name.encode("utf-8") for name in cmd.streams)
        elif isinstance(cmd, AuthCommand):
            # A worker configured with a secret the listener does not need, or
            # a repeated AUTH: nothing to check, nothing to refuse.
            logger.info("%s sent an AUTH that is not needed; ignoring it", self.describe())

    def _handle_data_command(self, cmd: Command, line: bytes) -> None:
        if isinstance(cmd, (RdataCommand, PositionCommand)) and cmd.instance_name != self.peer_name:
            # Only a writer speaks for itself: a claim about writer W from a
            # connection that is not W's is neither believed nor relayed.
            self.factory.refusals.refuse(
                WRONG_SENDER,
                cmd.stream_name,
                self.describe(),
                f"{cmd.NAME} for writer {shorten(cmd.instance_name)} of {shorten(cmd.stream_name)}"
                f" on the connection of {self.peer_name or 'a process that sent no NAME'}",
            )
            return
        self.factory.check_and_relay(self, cmd, line)

    def _read_lines(self, data: bytes) -> None:
        # What the read's commands relay leaves before the read is done,
        # and with it the rows applied here (issue 35).
        with self.factory.relaying():
            super()._read_lines(data)

    def is_sent(self, stream: bytes | None) -> bool:
        """Whether a line about ``stream`` goes to this worker (``stream``:
        :func:`claim_stream` of the line; None for other commands)."""
        return stream is None or self.subscribed is None or stream in self.subscribed

    def deliver(self, cmd: Command) -> None:
        """Hand a command received on this connection to the receiver."""
        self._deliver(cmd)

    def _on_established(self) -> None:
        self.factory.add_connection(self)

    def _on_lost(self) -> None:
        cancel_call(self._auth_call)
        self.factory.open_protocols.discard(self)
        self.factory.remove_connection(self)
        self.factory.release_name(self)


class ReplicationServerFactory(ServerFactory):
    """The main process's replication listener, and its ReplicationBus.

    ``secret`` None means workers need not authenticate.
    """

    # We log connections ourselves; Twisted's "Starting factory" adds nothing.
    noisy = False

    def __init__(
        self,
        server_name: str,
        secret: str | None,
        receiver: ReplicationCommandReceiver,
        clock: ReactorTime,
        deployment_id: str | None = None,
        check_claim: ClaimCheck | None = None,
        instance_name: str = MAIN_PROCESS,
    ) -> None:
        """``deployment_id``: the database's, sent in SERVER; a worker naming
        another in its NAME is refused and reported (None: not checked).
        ``check_claim``: how RDATA and POSITION are checked before they are
        relayed (None: relayed unchecked, for tests of the transport alone;
        workers take relayed claims as checked, so a real main process always
        passes one). ``instance_name``: the listening process's own, which
        no connection may take."""
        if secret == "":
            raise ValueError("the replication secret must be non-empty, or None for none")
        command_line(ServerCommand(server_name))  # a name that can go on the wire
        self.server_name = server_name
        self.secret = secret
        self.receiver = receiver
        self.clock = clock
        self.refusals = RefusalLog(clock.seconds)
        self.deployment_id = deployment_id
        self.foreign = ForeignTraffic(clock.seconds, f"the replication listener of {server_name}")
        # Authenticated connections, in the order they were established.
        self._connections: list[ServerReplicationProtocol] = []
        #: Every connection not yet lost, authenticated or not.
        self.open_protocols: set[ServerReplicationProtocol] = set()
        self._check_claim = check_claim
        #: Received commands behind a check under way, in the order received.
        self._held: deque[_HeldCommand] = deque()
        self._retry_call: IDelayedCall | None = None
        self.instance_name = instance_name
        #: Instance name -> the one live connection that carries it.
        self._named: dict[str, ServerReplicationProtocol] = {}
        #: Open :meth:`relaying` blocks, and the connections holding output
        #: until the outermost ends.
        self._relay_depth = 0
        self._holding: list[ServerReplicationProtocol] = []

    def buildProtocol(self, addr: object) -> ServerReplicationProtocol:
        return ServerReplicationProtocol(self)

    @property
    def connections(self) -> tuple[ServerReplicationProtocol, ...]:
        """The authenticated worker connections."""
        return tuple(self._connections)

    def add_connection(self, conn: ServerReplicationProtocol) -> None:
        self._connections.append(conn)

    def remove_connection(self, conn: ServerReplicationProtocol) -> None:
        if conn in self._connections:
            self._connections.remove(conn)

    # -- one live connection per instance name ----------------------------------------

    def claim_name(self, conn: ServerReplicationProtocol, name: str) -> bool:
        """Give ``name`` to ``conn``, unless this process has it or another
        live connection does: then ``conn`` is refused (ERROR, closed, logged,
        counted) and False returned. The first connection keeps the name
        until it is lost (see the module docstring: refused, not replaced)."""
        if name == self.instance_name:
            self.refuse_name(conn, name, "the name of the process it connects to")
            return False
        holder = self._named.get(name)
        if holder is not None and holder is not conn:
            self.refuse_name(conn, name, f"already connected from {holder.describe()}")
            return False
        self._named[name] = conn
        return True

    def refuse_name(self, conn: ServerReplicationProtocol, name: str, why: str) -> None:
        REPLICATION_CLAIMS_REFUSED.labels("unknown", DUPLICATE_NAME).inc()
        logger.error(
            "Refusing replication connection %s naming itself %s: %s. Is a worker started"
            " twice, or a worker's old connection not yet closed (it is dropped after %.0f s"
            " of silence)?",
            conn.describe(),
            shorten(name),
            why,
            PING_TIMEOUT_SECONDS,
        )
        conn.send_error_and_close(f"instance name {shorten(name)} is taken")

    def release_name(self, conn: ServerReplicationProtocol) -> None:
        """``conn`` is lost: its name is free again."""
        if conn.peer_name is not None and self._named.get(conn.peer_name) is conn:
            del self._named[conn.peer_name]

    # -- ReplicationBus ----------------------------------------------------------------

    def send_command(self, cmd: Command) -> None:
        """Send ``cmd`` to every authenticated worker (encoded once); an
        RDATA or POSITION only to those subscribed to its stream."""
        if not self._connections:
            logger.debug("no replication connections: dropping %s", cmd.NAME)
            return
        try:
            line = command_line(cmd).encode("utf-8")
        except CommandEncodeError as e:
            logger.error("not sending %s to workers: %s", cmd.NAME, e)
            return
        stream = claim_stream(line)
        for conn in list(self._connections):
            if conn.is_sent(stream):
                conn.send_encoded(cmd.NAME, line)

    def describe(self) -> str:
        return f"replication listener of {self.server_name} ({len(self._connections)} workers)"

    def problems(self) -> list[str]:
        """What ``/health`` reports: workers of another deployment lately."""
        return self.foreign.problems()

    # -- relaying ----------------------------------------------------------------------

    def check_and_relay(self, sender: ServerReplicationProtocol, cmd: Command, line: bytes) -> None:
        """Check a data command from ``sender``, then relay it and hand it to
        the receiver, after every command received before it (see the
        module docstring)."""
        believed = self._check(sender, cmd)
        if not self._held and believed is True:
            self._pass_on(sender, cmd, line)
            return
        if believed is False:
            return
        if isinstance(believed, defer.Deferred):
            held = _HeldCommand(sender, cmd, line, None)
            self._held.append(held)
            self._await_check(held, believed)
        else:
            self._held.append(_HeldCommand(sender, cmd, line, True))

    def _check(
        self, sender: ServerReplicationProtocol, cmd: Command
    ) -> bool | defer.Deferred[bool]:
        if self._check_claim is None:
            return True
        try:
            return self._check_claim(cmd, sender.describe())
        except Exception as e:
            return defer.fail(e)

    def _await_check(self, held: _HeldCommand, answer: defer.Deferred[bool]) -> None:
        def answered(believed: bool) -> None:
            held.believed = believed
            self._release()

        def failed(failure: object) -> None:
            logger.warning(
                "Checking %s from %s failed (%s); holding it and every command received"
                " after it, checking again in %.0f s",
                held.cmd.NAME,
                held.sender.describe(),
                getattr(failure, "value", failure),
                CHECK_RETRY_SECONDS,
            )
            self._retry_call = self.clock.callLater(CHECK_RETRY_SECONDS, retry)

        def retry() -> None:
            self._retry_call = None
            again = self._check(held.sender, held.cmd)
            if isinstance(again, defer.Deferred):
                self._await_check(held, again)
            else:
                answered(again)

        answer.addCallbacks(answered, failed)

    def _release(self) -> None:
        """Pass on the held commands whose turn has come: relayed first,
        all of them, and sent (:meth:`relaying`), then delivered here."""
        passed = []
        with self.relaying():
            while self._held and self._held[0].believed is not None:
                held = self._held.popleft()
                if held.believed:
                    self.relay(held.sender, held.cmd.NAME, held.line)
                    passed.append(held)
        for held in passed:
            held.sender.deliver(held.cmd)

    def _pass_on(self, sender: ServerReplicationProtocol, cmd: Command, line: bytes) -> None:
        self.relay(sender, cmd.NAME, line)
        sender.deliver(cmd)

    @contextmanager
    def relaying(self) -> Iterator[None]:
        """What is relayed inside leaves as one write per connection when
        the outermost block ends, at once: not after the rest of the
        reactor's turn, which on the main process applies the same rows
        here (issue 35: the wake-up waited for that)."""
        self._relay_depth += 1
        try:
            yield
        finally:
            self._relay_depth -= 1
            if not self._relay_depth:
                holding, self._holding = self._holding, []
                for conn in holding:
                    conn.release_output()

    def relay(self, sender: ServerReplicationProtocol, name: str, line: bytes) -> None:
        """Pass a data command from ``sender`` on to every other worker (an
        RDATA or POSITION only to those subscribed to its stream).

        The line is forwarded as received: it has just been parsed, so it is
        valid, and re-encoding it could only cost time (or, for odd but valid
        JSON such as ``1e15``, make it longer).
        """
        stream = claim_stream(line)
        for conn in list(self._connections):
            if conn is not sender and conn.is_sent(stream):
                if self._relay_depth and conn not in self._holding:
                    conn.hold_output()
                    self._holding.append(conn)
                conn.send_encoded(name, line)

    def close_all(self) -> None:
        """Close every connection, authenticated or not yet, and drop what
        waits to be relayed (for shutdown)."""
        cancel_call(self._retry_call)
        self._retry_call = None
        self._held.clear()
        for conn in list(self.open_protocols):
            conn.close()
