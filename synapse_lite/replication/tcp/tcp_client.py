"""A worker's end of direct TCP replication: connect, and reconnect, to the main process.

Which object is what (see ``connection.py``):

* :class:`ReplicationClientFactory` is the worker's ReplicationBus: its
  ``send_command`` goes over the current connection to the main process, which
  relays it to every other worker. With no connection up, the command is
  dropped (logged at debug): the receiver has already been told with
  ``lost_connection`` and resyncs on the next ``new_connection``.
* Each :class:`ClientReplicationProtocol` is a ReplicationConnection: the
  receiver gets a new one in ``new_connection`` after each (re)connect, with
  every data command in ``on_command``, and in ``lost_connection`` when it goes.

Handshake, in order: ``AUTH <secret>`` (if a secret is configured), ``NAME
<client_name>``, ``SUBSCRIBE <streams>`` (when the worker reads only some
streams), the first PING, ``receiver.new_connection``, then
``REPLICATE``. The main process's first command must be ``SERVER <name>``
with the expected name, or the worker answers ``ERROR Wrong remote`` and closes
before acting on anything else it sent.

:meth:`ReplicationClientFactory.connect` keeps the connection up through a
``ClientService`` (``reconnect.py``, the policy the Redis transport uses):
reconnecting backs off exponentially from ``initial_delay`` to ``max_delay``
(jittered); the backoff resets once the main process has accepted the
connection, which it shows by its first PING (it pings only after AUTH).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from twisted.application.internet import ClientService
from twisted.internet import defer
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.protocol import Factory
from twisted.python.failure import Failure
from zope.interface import implementer

from synapse_lite.replication.claims import ForeignTraffic
from synapse_lite.replication.tcp.commands import (
    AuthCommand,
    ClearUserSyncCommand,
    Command,
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
    command_line,
)
from synapse_lite.replication.tcp.protocol import ReplicationProtocol
from synapse_lite.replication.tcp.reactor_time import ReactorTime
from synapse_lite.replication.tcp.reconnect import Backoff, reconnecting_service

if TYPE_CHECKING:
    from synapse_lite.replication.tcp.connection import ReplicationCommandReceiver

logger = logging.getLogger(__name__)


class ClientReplicationProtocol(ReplicationProtocol):
    """A worker's end of its connection to the main process."""

    # Workers accept every data command: the main process relays what other
    # workers (which may be stream writers) send.
    VALID_INBOUND = frozenset(
        {
            ServerCommand,
            RdataCommand,
            PositionCommand,
            ErrorCommand,
            PingCommand,
            RemoteServerUpCommand,
            ReplicateCommand,
            UserSyncCommand,
            ClearUserSyncCommand,
            FederationAckCommand,
            UserIpCommand,
        }
    )

    #: The main process relays only claims it has checked (``tcp_server.py``).
    vouches_for_claims = True

    def __init__(self, factory: ReplicationClientFactory) -> None:
        super().__init__(factory.receiver, factory.timer)
        self.factory = factory
        self.peer_name = factory.server_name
        self.followed_streams = factory.followed_streams
        self._server_verified = False
        self._accepted = False

    def connectionMade(self) -> None:
        super().connectionMade()
        logger.info("connected to replication server %s", self.describe())
        if self.factory.secret is not None:
            self._write_now(AuthCommand(self.factory.secret))
        self._write_now(NameCommand(self.factory.client_name, self.factory.deployment_id))
        if self.factory.subscription is not None:
            # Before REPLICATE: the positions it asks for are only those of
            # the streams we read.
            self._write_now(self.factory.subscription)
        self._establish()
        self.send_command(ReplicateCommand())

    def _handle_command(self, cmd: Command, line: bytes) -> None:
        if not self._server_verified and not isinstance(cmd, ServerCommand | ErrorCommand):
            logger.warning("%s sent %s before SERVER: closing", self.describe(), cmd.NAME)
            self.send_error_and_close("expected SERVER first")
            return
        if isinstance(cmd, PingCommand) and not self._accepted:
            # The server pings only once it has accepted us: a good connection.
            self._accepted = True
            self.factory.connection_accepted()
        super()._handle_command(cmd, line)

    def _handle_handshake_command(self, cmd: Command) -> None:
        if not isinstance(cmd, ServerCommand):
            return
        if cmd.server_name != self.factory.server_name:
            logger.warning(
                "%s says it is %r, not %r: closing",
                self.describe(),
                cmd.server_name,
                self.factory.server_name,
            )
            self.send_error_and_close("Wrong remote")
            return
        ours = self.factory.deployment_id
        if cmd.deployment is not None and ours is not None and cmd.deployment != ours:
            self.factory.foreign.heard(cmd.deployment, self.describe())
            self.send_error_and_close("another deployment")
            return
        self._server_verified = True

    def _on_established(self) -> None:
        self.factory.current_connection = self

    def _on_lost(self) -> None:
        if self.factory.current_connection is self:
            self.factory.current_connection = None
        if not self.factory.stopping:
            logger.info("lost replication server %s; reconnecting", self.factory.server_name)


class ReplicationClientFactory(Factory):
    """Keeps a worker connected to the main process; the worker's ReplicationBus.

    Start it with :meth:`connect` (an endpoint to the main process's
    replication listener); stop it with :meth:`stop`.
    """

    # We log connection attempts ourselves, at INFO.
    noisy = False

    def __init__(
        self,
        server_name: str,
        client_name: str,
        secret: str | None,
        receiver: ReplicationCommandReceiver,
        clock: ReactorTime,
        *,
        initial_delay: float = 0.2,
        max_delay: int = 10,
        deployment_id: str | None = None,
        followed_streams: Collection[str] | None = None,
    ) -> None:
        """Raises CommandEncodeError for a name or secret that cannot be sent.
        ``deployment_id``: the database's, sent in NAME; a main process naming
        another in SERVER is refused and reported (None: not checked).
        ``followed_streams``: the only streams whose RDATA and POSITION reach
        ``receiver``: sent to the main process as ``SUBSCRIBE`` after NAME,
        so it relays no others (any that still come are skipped unparsed);
        None: all."""
        # Refuse at startup what could never go on the wire (a name with a
        # space, a secret with a newline) rather than on every connection.
        command_line(ServerCommand(server_name))
        command_line(NameCommand(client_name))
        if secret is not None:
            command_line(AuthCommand(secret))
        self.server_name = server_name
        self.client_name = client_name
        self.secret = secret
        self.deployment_id = deployment_id
        self.followed_streams = (
            None
            if followed_streams is None
            else frozenset(name.encode("utf-8") for name in followed_streams)
        )
        #: Sent after NAME: the main process relays us only these streams.
        self.subscription = (
            None if followed_streams is None else SubscribeCommand(tuple(followed_streams))
        )
        if self.subscription is not None:
            command_line(self.subscription)
        self.foreign = ForeignTraffic(clock.seconds, f"the replication connection to {server_name}")
        self.receiver = receiver
        self.timer = clock
        #: Reset when the main process accepts a connection (its first PING).
        self.backoff = Backoff(initial_delay, max_delay)
        #: Connections made so far (each tried by the handshake).
        self.connections_made = 0
        self._service: ClientService | None = None
        self.stopping = False
        #: The established connection, if any.
        self.current_connection: ClientReplicationProtocol | None = None

    def connect(self, endpoint: IStreamClientEndpoint) -> None:
        """Connect to the main process through ``endpoint``, and reconnect
        whenever the connection is lost or cannot be made, until :meth:`stop`."""
        self._service = reconnecting_service(
            _ReportedFailures(endpoint, self.server_name), self, self.timer, self.backoff
        )
        self._service.startService()

    def buildProtocol(self, addr: object) -> ClientReplicationProtocol:
        self.connections_made += 1
        return ClientReplicationProtocol(self)

    def problems(self) -> list[str]:
        """What ``/health`` reports: a main process of another deployment."""
        return self.foreign.problems()

    def connection_accepted(self) -> None:
        """The main process accepted a connection: back off from scratch next time."""
        self.backoff.accepted()

    def stop(self) -> defer.Deferred[None]:
        """Stop reconnecting and close the current connection, if any."""
        self.stopping = True
        if self.current_connection is not None:
            self.current_connection.close()
        service, self._service = self._service, None
        if service is None or not service.running:
            return defer.succeed(None)
        stopped: defer.Deferred[None] = service.stopService()
        return stopped

    # -- ReplicationBus ----------------------------------------------------------------

    def send_command(self, cmd: Command) -> None:
        """Send ``cmd`` to the main process (which relays it to the other workers)."""
        if self.current_connection is None:
            logger.debug("not connected to %s: dropping %s", self.server_name, cmd.NAME)
            return
        self.current_connection.send_command(cmd)

    def describe(self) -> str:
        state = "connected" if self.current_connection is not None else "disconnected"
        return f"replication client {self.client_name} -> {self.server_name} ({state})"


@implementer(IStreamClientEndpoint)
class _ReportedFailures:
    """An endpoint whose failed connection attempts are logged with their
    reason (``ClientService`` logs only that it will retry)."""

    def __init__(self, endpoint: IStreamClientEndpoint, server_name: str) -> None:
        self._endpoint = endpoint
        self._server_name = server_name

    def connect(self, factory: Any) -> defer.Deferred[Any]:
        def report(failure: Failure) -> Failure:
            logger.info(
                "could not connect to replication server %s: %s; retrying",
                self._server_name,
                failure.getErrorMessage(),
            )
            return failure

        connecting: defer.Deferred[Any] = self._endpoint.connect(factory)
        return connecting.addErrback(report)
