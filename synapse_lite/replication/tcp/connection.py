"""The contract between the replication transports and the command handler.

Transports (direct TCP, Redis) frame, authenticate, ping and parse; they hand
every *data* command (RDATA, POSITION, REPLICATE, USER_SYNC, CLEAR_USER_SYNC,
FEDERATION_ACK, USER_IP, REMOTE_SERVER_UP) to a :class:`ReplicationCommandReceiver`
and keep connection-level commands (AUTH, NAME, SERVER, PING, ERROR) to
themselves. The handler sends through :class:`ReplicationConnection`.

Both transports behave like a bus: a command sent by any process reaches every
other process. Over Redis a process also receives its own commands back (the
handler drops its own echoes by instance name); over TCP the main process relays
each data command from one worker to all the others, and never back to the
sender.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from synapse_lite.replication.tcp.commands import Command


class ReplicationConnection(Protocol):
    """One way out to the other processes: a TCP connection or the Redis bus."""

    def send_command(self, cmd: Command) -> None:
        """Queue a command for sending; never blocks, never raises for a closed
        connection (the command is dropped and logged)."""

    def describe(self) -> str:
        """A short name for logs (peer instance name and address)."""


class ReplicationCommandReceiver(Protocol):
    """What a transport calls as connections come and go and commands arrive."""

    def new_connection(self, connection: ReplicationConnection) -> None:
        """A connection is ready for data commands (authenticated, and for
        Redis, subscribed)."""

    def lost_connection(self, connection: ReplicationConnection) -> None:
        """A connection that was announced with :meth:`new_connection` is gone."""

    def on_command(self, connection: ReplicationConnection, cmd: Command) -> None:
        """A data command arrived on ``connection``. Must not raise."""
