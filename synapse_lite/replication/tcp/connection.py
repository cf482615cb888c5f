"""The contract between the replication transports and the command handler.

Transports (direct TCP, Redis) frame, authenticate, ping and parse; they hand
every *data* command (RDATA, POSITION, REPLICATE, USER_SYNC, CLEAR_USER_SYNC,
FEDERATION_ACK, USER_IP, REMOTE_SERVER_UP) to a :class:`ReplicationCommandReceiver`
and keep connection-level commands (AUTH, NAME, SERVER, PING, ERROR) to
themselves. The handler sends through :class:`ReplicationConnection`.

Both transports behave like a bus: a command sent by any process reaches every
other process. Over Redis a process also receives its own commands back (the
bus drops its own RDATA and POSITION unparsed; the handler drops any other own
echo by instance name); over TCP the main process relays
each data command from one worker to all the others, and never back to the
sender.

Two kinds of object, one for sending and one for receiving:

* One :class:`ReplicationBus` per process, the handler's way out: its
  ``send_command`` reaches every other process. On the main process over TCP it
  is the ``ReplicationServerFactory`` (a broadcast to every authenticated
  worker); on a TCP worker the ``ReplicationClientFactory`` (the current
  connection to the main process, which relays); over Redis the
  ``RedisReplicationBus`` (a publish).
* :class:`ReplicationConnection` objects, what the receiver is given in
  ``new_connection`` / ``on_command`` / ``lost_connection``: the identity to key
  per-connection state on (such as "streams whose POSITION this connection has
  delivered"). On the main process over TCP there is one per worker connection;
  on a TCP worker, one per connection to the main process (a new object after
  each reconnect); over Redis, the bus itself, announced again after each
  resubscription. ``send_command`` on one of them reaches only the processes
  behind it, so on the main process it is *not* a way to reach every worker.

Sending to every connection announced so far reaches the same processes as the
bus, on every transport; a handler should do one or the other, not both.
On ``new_connection`` the handler must announce its own positions (POSITION for
every stream it writes): the peers cannot tell that it (re)connected, and over
Redis nobody answers for it otherwise.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from synapse_lite.replication.tcp.commands import Command

logger = logging.getLogger(__name__)


class ReplicationConnection(Protocol):
    """One connection to other processes: a TCP connection or the Redis bus.

    ``send_command`` reaches the processes behind this connection only.
    """

    #: Whether the peer has checked every RDATA and POSITION it sends against
    #: the stream's sequence (a TCP worker's connection to the main process,
    #: which relays only claims it believes): the receiver need not read it.
    vouches_for_claims: bool

    def send_command(self, cmd: Command) -> None:
        """Queue a command for sending; never blocks, never raises for a closed
        connection (the command is dropped and logged)."""

    def describe(self) -> str:
        """A short name for logs (peer instance name and address)."""


class ReplicationBus(Protocol):
    """The way out to every other process, whatever the transport (see above).

    Commands go out in the order they are sent. While the transport is down
    they are queued (up to a bound) or dropped, and logged; the handler hears of
    it through :meth:`ReplicationCommandReceiver.lost_connection` and resyncs on
    the next :meth:`ReplicationCommandReceiver.new_connection`.
    """

    def send_command(self, cmd: Command) -> None:
        """Send ``cmd`` to every other process; never blocks or raises."""

    def describe(self) -> str:
        """A short name for logs."""


class ReplicationCommandReceiver(Protocol):
    """What a transport calls as connections come and go and commands arrive."""

    def new_connection(self, connection: ReplicationConnection) -> None:
        """A connection is ready for data commands (authenticated, and for
        Redis, subscribed)."""

    def lost_connection(self, connection: ReplicationConnection) -> None:
        """A connection that was announced with :meth:`new_connection` is gone."""

    def on_command(self, connection: ReplicationConnection, cmd: Command) -> None:
        """A data command arrived on ``connection``. Must not raise."""

    def read_started(self) -> None:
        """The commands of one read of a socket follow (``on_command`` for
        each, possibly none) until :meth:`read_done`; reads may nest. What
        they change may be held back until then. Must not raise."""

    def read_done(self) -> None:
        """The commands of the read begun by :meth:`read_started` have all
        been handed over: apply whatever was held back. Must not raise."""


class OutgoingCommands:
    """This process's commands to every other process: what its components
    (presence, the federation sender, the client-IP recorder, ...) send
    through. Built before them, and before the command handler, which tells
    it which connections are up; the transport gives it the bus when it
    starts. Sent through the bus when there is one, else on each connection
    (the in-memory links of tests); dropped, with a debug log, while no
    connection is up (positions are announced again on reconnection)."""

    def __init__(self) -> None:
        self._bus: ReplicationBus | None = None
        self._connections: list[ReplicationConnection] = []

    def set_bus(self, bus: ReplicationBus | None) -> None:
        """The transport's way out, when it starts (None: each connection)."""
        self._bus = bus

    @property
    def connected(self) -> bool:
        return bool(self._connections)

    def connection_up(self, connection: ReplicationConnection) -> None:
        self._connections.append(connection)

    def connection_down(self, connection: ReplicationConnection) -> None:
        if connection in self._connections:
            self._connections.remove(connection)

    def send_command(self, cmd: Command) -> None:
        """Send to every other process (see the class docstring)."""
        if not self._connections:
            logger.debug("Not connected: dropping %s", type(cmd).__name__)
            return
        if self._bus is not None:
            self._bus.send_command(cmd)
            return
        for connection in list(self._connections):
            connection.send_command(cmd)
