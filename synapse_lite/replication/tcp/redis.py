"""Redis pub/sub replication: every process a peer on the deployment's channels.

Each process publishes its commands, as the same ``NAME rest`` lines as TCP:
an RDATA, POSITION or CHECKED (the main process's note of a sequence read,
``claim_notes.py``) on its stream's channel, ``<channel>/<stream>``, every
other command on the deployment's channel. It subscribes to the deployment's
channel and to the channels of the streams it reads (its role's
subscription, ``Role.subscription``; ``docs/workers.md``), so Redis sends it
nothing of the others. Redis delivers one publisher's messages to a
subscriber in the order published, whatever their channels, so the order
the handler relies on holds across streams. :class:`RedisReplicationBus` is
both the process's ReplicationBus and its only ReplicationConnection: the
receiver gets the bus itself in ``new_connection``, ``on_command`` and
``lost_connection``.

Channel: ``<channel_prefix><server_name>`` (no prefix by default); a
stream's is that and ``/<stream>``. Redis pub/sub channels are global to a
Redis server: ``dbid`` selects a keyspace but does not separate channels, so
deployments sharing a Redis must differ in server name or in
``channel_prefix``.

Two connections, because a subscribed connection can run nothing but
(un)subscribe and PING:

* The subscriber, once connected (and authenticated), subscribes and waits for
  Redis to confirm; only then is the bus announced with ``new_connection`` (so
  no reply to what the handler sends next is missed), and REPLICATE is
  published so every process announces its positions. The handler must announce
  its own positions on ``new_connection``: nobody else can tell it resubscribed.
  When the subscriber connection goes, ``lost_connection``.
* The publisher. While it is down, commands are queued in order and flushed
  when it is back. Commands written but not yet acknowledged by Redis when the
  connection drops are queued again in front, so nothing is lost in a blip
  (a command may then arrive twice; the handler tolerates repeats of RDATA,
  POSITION and the rest). If more than MAX_PENDING_COMMANDS pile up (Redis gone
  for long, or not answering), the bus does what a TCP connection that "failed
  to keep up" does: the whole queue is dropped (logged, counted), the bus is
  announced lost, commands sent meanwhile are dropped, and once the publisher
  is back the bus is announced anew. Dropping everything rather than the oldest
  or newest means a peer never sees a gap followed by later rows: after the
  gap, the first thing it hears from us is the re-announced POSITIONs, from
  which it catches up.

Every message names its sender and is signed:
``@<deployment id> <instance name> <MAC> <line>``, the deployment id being
the one stored in the database (``deployment`` table), the MAC
:func:`message_mac`: HMAC-SHA256, keyed by :func:`mac_key` of the
replication secret, over ``@<deployment id> <instance name> <line>``, cut to
16 bytes, in hex. Redis cannot tell who published a message; the MAC makes
only holders of the secret able to speak on the channel at all, as on TCP
(issue 34). A message without that envelope is refused like a bad line; one
whose MAC does not match is refused, counted
(``synapse_lite_replication_claims_refused_total``, ``reason="bad_mac"``) and
logged at most once per 10 s. A message
of another deployment (a second homeserver with the same server name and no
channel prefix on the same Redis) is dropped, logged at most once a minute per
deployment, counted (``synapse_lite_replication_claims_refused_total``,
``reason="foreign_deployment"``) and reported by ``/health`` for
:data:`FOREIGN_MEMORY_SECONDS`. An RDATA or POSITION naming a writer other than
its sender is dropped (only a writer speaks for itself).

Every message on the channel, this process's own included, reaches
``receiver.on_command(bus, cmd)``, except this process's own RDATA,
POSITION and CHECKED: a writer hears back every row it publishes, and parsing them only to
drop them would double its work. (The handler also drops own echoes by instance
name, for any that get through.) A message that is not one data command (bad UTF-8, over
MAX_LINE_LENGTH, unparseable, or a TCP connection command) is logged and
dropped, and the subscription carries on.

Both connections are kept up, with backoff and keepalive PINGs, by
``redis_connections.py``.
"""

from __future__ import annotations

import hmac
import logging
from collections import deque
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, cast

import txredisapi
from twisted.internet.defer import Deferred, gatherResults, succeed
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.python.failure import Failure

from synapse_lite.metrics import (
    REPLICATION_BAD_LINES,
    REPLICATION_CLAIMS_REFUSED,
    REPLICATION_COMMANDS_DROPPED,
    REPLICATION_COMMANDS_IN,
    REPLICATION_COMMANDS_OUT,
    count_command,
)
from synapse_lite.replication.claims import WRONG_SENDER, RefusalLog, shorten
from synapse_lite.replication.tcp.commands import (
    DATA_COMMANDS,
    MAX_LINE_LENGTH,
    CheckedCommand,
    Command,
    CommandEncodeError,
    CommandParseError,
    PositionCommand,
    RdataCommand,
    ReplicateCommand,
    claim_stream,
    command_line,
    parse_command_from_line,
)
from synapse_lite.replication.tcp.reactor_time import ReactorTime, cancel_call
from synapse_lite.replication.tcp.reconnect import Backoff, reconnecting_service
from synapse_lite.replication.tcp.redis_connections import (
    KEEPALIVE_TIMEOUT_SECONDS,
    ConnectionFactory,
    Keepalive,
    PublisherConnection,
    SubscriberConnection,
    client_name,
    set_client_name,
)
from synapse_lite.streams.catalog import BUILTIN_STREAMS

if TYPE_CHECKING:
    from synapse_lite.config.homeserver import RedisConfig
    from synapse_lite.replication.tcp.connection import ReplicationCommandReceiver

logger = logging.getLogger(__name__)

#: Commands queued (or written and not yet acknowledged) beyond which the bus
#: gives up on them and resyncs, like a TCP connection that failed to keep up.
MAX_PENDING_COMMANDS = 10_000

#: How long ``/health`` reports another deployment's traffic after the last of it.
FOREIGN_MEMORY_SECONDS = 300.0
#: At most one log line per foreign deployment in this many seconds.
FOREIGN_LOG_INTERVAL_SECONDS = 60.0
#: The longest envelope accepted (``@`` id, space, instance name, space, MAC, space).
MAX_ENVELOPE_LENGTH = 440
#: Bytes of the HMAC-SHA256 kept (sent as twice as many hex digits).
MAC_BYTES = 16
#: A refusal reason: a message whose MAC is missing or wrong.
BAD_MAC = "bad_mac"


#: A command waiting for the publisher: ``(command name, channel, message)``.
Outgoing = tuple[str, str, bytes]


def stream_channel(channel: str, stream: str) -> str:
    """The channel of one stream's RDATA and POSITION (a server name has no
    ``/``, so no deployment's main channel looks like another's stream's)."""
    return f"{channel}/{stream}"


def mac_key(secret: str | None) -> bytes:
    """The key Redis messages are signed with: derived from the replication
    secret (so the secret itself never signs anything else's way). Without a
    secret (a lone main process, no workers) the key is public: messages are
    then checked for integrity only."""
    return hmac.digest((secret or "").encode("utf-8"), b"synapse_lite redis replication", "sha256")


def message_mac(key: bytes, sender_and_line: bytes) -> bytes:
    """The MAC of ``@<deployment> <sender> <line>`` (as hex digits)."""
    return hmac.digest(key, sender_and_line, "sha256")[:MAC_BYTES].hex().encode("ascii")


def signed_message(key: bytes, deployment_id: str, sender: str, line: bytes) -> bytes:
    """A message as a process of ``deployment_id`` publishes it."""
    head = f"@{deployment_id} {sender} ".encode()
    return head + message_mac(key, head + line) + b" " + line


class RedisReplicationBus:
    """The Redis transport: this process's ReplicationBus and its one connection.

    Call :meth:`start` once; :meth:`stop` (returns a Deferred) at shutdown.
    """

    #: Anyone able to publish on the channel reaches us unchecked.
    vouches_for_claims = False

    def __init__(
        self,
        *,
        server_name: str,
        instance_name: str,
        receiver: ReplicationCommandReceiver,
        endpoint: IStreamClientEndpoint,
        clock: ReactorTime,
        password: str | None = None,
        dbid: int = 0,
        channel_prefix: str = "",
        initial_delay: float = 0.2,
        max_delay: float = 10.0,
        deployment_id: str = "none",
        followed_streams: Collection[str] | None = None,
        secret: str | None = None,
    ) -> None:
        """``deployment_id``: the database's (one word); processes with
        another one on the channel are refused. ``secret``: the replication
        secret, which signs every message (see the module docstring).
        ``followed_streams``: the only streams whose RDATA and POSITION reach
        ``receiver``: the bus subscribes to their channels alone (any others
        that still come, on the main channel, are skipped unparsed); None:
        every stream of the built-in catalog."""
        self.channel = channel_prefix + server_name
        self.instance_name = instance_name
        self._own_name = instance_name.encode("utf-8")
        self.deployment_id = deployment_id
        self._envelope = f"@{deployment_id} {instance_name} ".encode()
        self._mac_key = mac_key(secret)
        self._deployment = deployment_id.encode("utf-8")
        self._followed = (
            None
            if followed_streams is None
            else frozenset(name.encode("utf-8") for name in followed_streams)
        )
        #: The channels subscribed to: ours, and those of the streams read.
        self.channels = [self.channel] + [
            stream_channel(self.channel, name)
            for name in (BUILTIN_STREAMS.names() if followed_streams is None else followed_streams)
        ]
        self._stream_channels: dict[str, str] = {}
        #: Other deployments heard: id -> (a sender's name, when last heard).
        self._foreign: dict[str, tuple[str, float]] = {}
        self._foreign_logged: dict[str, float] = {}
        self._refusals = RefusalLog(clock.seconds)
        #: The sender of the message being handed to the receiver, if any.
        self._sender: str | None = None
        self.password = password
        # SELECT only when asked for something other than the default.
        self.dbid = dbid or None
        self._receiver = receiver
        self._clock = clock

        self._subscriber: SubscriberConnection | None = None
        self._subscriber_keepalive: Keepalive | None = None
        self._subscribed = False
        self._publisher: PublisherConnection | None = None
        self._publisher_keepalive: Keepalive | None = None
        # Encoded lines waiting for the publisher, with their command names.
        self._pending: deque[Outgoing] = deque()
        self._overflowed = False
        self._announced = False
        self._stopped = False
        self._stop_waiters: list[Deferred[None]] | None = None
        self._stop_complete = False

        subscribers = ConnectionFactory(
            self, "subscriber", SubscriberConnection, Backoff(initial_delay, max_delay)
        )
        self._subscriber_service = reconnecting_service(
            endpoint, subscribers, clock, subscribers.backoff
        )
        publishers = ConnectionFactory(
            self, "publisher", PublisherConnection, Backoff(initial_delay, max_delay)
        )
        self._publisher_service = reconnecting_service(
            endpoint, publishers, clock, publishers.backoff
        )

    @classmethod
    def from_config(
        cls,
        config: RedisConfig,
        *,
        server_name: str,
        instance_name: str,
        receiver: ReplicationCommandReceiver,
        reactor: Any,
        **kwargs: Any,
    ) -> RedisReplicationBus:
        """A bus for the Redis of ``config``, over TCP from ``reactor``."""
        return cls(
            server_name=server_name,
            instance_name=instance_name,
            receiver=receiver,
            endpoint=cast(
                IStreamClientEndpoint, HostnameEndpoint(reactor, config.host, config.port)
            ),
            clock=reactor,
            password=config.password,
            dbid=config.dbid,
            channel_prefix=config.channel_prefix,
            **kwargs,
        )

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Connect both connections (and keep them connected)."""
        logger.info("Redis replication on channel %r starting", self.channel)
        self._subscriber_service.startService()
        self._publisher_service.startService()

    def stop(self) -> Deferred[None]:
        """Disconnect for good; fires once both connections are closed.

        Idempotent: a second call just waits for the first. (ClientService
        fires its stop from inside its state machine, so a caller resumed by
        it may not call stopService again.)
        """
        if self._stop_waiters is None:
            self._stopped = True
            self._stop_waiters = []
            if self._pending:
                logger.warning(
                    "Redis replication stopping with %d commands unsent", len(self._pending)
                )
                self._pending.clear()
            gatherResults(
                [self._subscriber_service.stopService(), self._publisher_service.stopService()]
            ).addBoth(self._fully_stopped)
        if self._stop_complete:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._stop_waiters.append(waiter)
        return waiter

    def _fully_stopped(self, result: object) -> None:
        if isinstance(result, Failure):
            logger.error("Redis replication did not stop cleanly: %s", result.getErrorMessage())
        self._stop_complete = True
        waiters, self._stop_waiters = self._stop_waiters or [], []
        for waiter in waiters:
            waiter.callback(None)

    @property
    def publisher_connected(self) -> bool:
        """Whether Redis is taking our commands right now."""
        return self._publisher is not None

    @property
    def announced(self) -> bool:
        """Whether the receiver has the bus as a live connection now."""
        return self._announced

    @property
    def pending_count(self) -> int:
        """Commands waiting for the publisher (for tests and metrics)."""
        return len(self._pending)

    # -- ReplicationBus / ReplicationConnection ----------------------------------------

    def describe(self) -> str:
        """While a message is handed to the receiver: its sender on the
        channel; otherwise the bus itself."""
        if self._sender is not None:
            return f"{self._sender} on Redis channel {self.channel}"
        return f"Redis channel {self.channel} ({self.instance_name})"

    def send_command(self, cmd: Command) -> None:
        """Publish ``cmd`` to every process (this one included), or queue it."""
        if self._stopped or self._overflowed:
            reason = "stopped" if self._stopped else "overflow"
            logger.debug("Redis replication %s: dropping %s", reason, cmd.NAME)
            REPLICATION_COMMANDS_DROPPED.labels("redis", reason).inc()
            return
        try:
            body = command_line(cmd).encode("utf-8")
            mac = message_mac(self._mac_key, self._envelope + body)
            line = self._envelope + mac + b" " + body
        except CommandEncodeError as e:
            logger.error("not publishing %s: %s", cmd.NAME, e)
            REPLICATION_COMMANDS_DROPPED.labels("redis", "unencodable").inc()
            return
        if isinstance(cmd, (RdataCommand, PositionCommand, CheckedCommand)):
            channel = self._stream_channels.get(cmd.stream_name)
            if channel is None:  # our own streams': a few names
                channel = stream_channel(self.channel, cmd.stream_name)
                self._stream_channels[cmd.stream_name] = channel
        else:
            channel = self.channel
        outgoing = (cmd.NAME, channel, line)
        if self._publisher is not None:
            self._publish(self._publisher, outgoing)
        else:
            self._pending.append(outgoing)
        self._check_backlog()

    # -- publisher (publisher_ready and publisher_lost: called by the connection) ------

    def _publish(self, proto: PublisherConnection, outgoing: Outgoing) -> None:
        name, channel, line = outgoing
        try:
            d: Deferred[Any] = proto.publish(channel, line)
        except txredisapi.ConnectionError:
            # Lost in this very turn; connectionLost is on its way.
            self._pending.append(outgoing)
            return
        proto.unacked.append(outgoing)
        d.addCallbacks(
            lambda _: self._acknowledged(proto, name),
            lambda failure: self._publish_failed(failure, proto),
        )

    def _acknowledged(self, proto: PublisherConnection, name: str) -> None:
        if proto.unacked:
            proto.unacked.popleft()
        count_command(REPLICATION_COMMANDS_OUT, name)

    def _publish_failed(self, failure: Failure, proto: PublisherConnection) -> None:
        if failure.check(txredisapi.ConnectionError):
            return  # still in proto.unacked: queued again by _publisher_lost
        # Redis answered, with an error: this one is not coming back.
        if proto.unacked:
            name, _, _ = proto.unacked.popleft()
            REPLICATION_COMMANDS_DROPPED.labels("redis", "refused").inc()
            logger.error("Redis refused to publish %s: %s", name, failure.getErrorMessage())

    def publisher_ready(self, proto: PublisherConnection) -> None:
        if self._stopped:
            return
        logger.info("Redis replication publisher connected")
        # Written before the flush below, so it costs the queue nothing.
        Deferred.fromCoroutine(
            set_client_name(proto, client_name(self.channel, self.instance_name, "pub"))
        )
        self._publisher = proto
        self._publisher_keepalive = Keepalive(proto, self._clock)
        self._publisher_keepalive.start()
        pending, self._pending = self._pending, deque()
        for outgoing in pending:
            self._publish(proto, outgoing)
        self._maybe_announce()

    def publisher_lost(self, proto: PublisherConnection) -> None:
        if self._publisher is not proto:
            return
        self._publisher = None
        if self._publisher_keepalive is not None:
            self._publisher_keepalive.stop()
        if self._stopped or self._overflowed:
            proto.unacked.clear()
            return
        if proto.unacked:
            logger.info(
                "Redis replication publisher lost; re-queueing %d unacknowledged commands",
                len(proto.unacked),
            )
            # They were sent before anything still pending: they go first.
            self._pending.extendleft(reversed(proto.unacked))
            proto.unacked.clear()
        else:
            logger.info("Redis replication publisher lost; queueing until it is back")
        self._check_backlog()

    def _check_backlog(self) -> None:
        unacked = len(self._publisher.unacked) if self._publisher is not None else 0
        backlog = len(self._pending) + unacked
        if backlog <= MAX_PENDING_COMMANDS:
            return
        logger.error(
            "Redis replication: %d commands unsent or unacknowledged; dropping them all and"
            " resyncing once Redis is back",
            backlog,
        )
        REPLICATION_COMMANDS_DROPPED.labels("redis", "overflow").inc(backlog)
        self._pending.clear()
        self._overflowed = True
        self._announce_lost()
        if self._publisher is not None:
            # Redis is not keeping up: start over on a new connection.
            self._publisher.unacked.clear()
            self._publisher.transport.abortConnection()

    # -- subscriber (the public methods: called by the connection) ---------------------

    def subscriber_ready(self, proto: SubscriberConnection) -> Deferred[None]:
        self._subscriber = proto
        return Deferred.fromCoroutine(self._subscribe(proto))

    async def _subscribe(self, proto: SubscriberConnection) -> None:
        # A Redis that accepts the connection but never answers would leave us
        # waiting for ever (the keepalive only starts once subscribed).
        timeout = self._clock.callLater(KEEPALIVE_TIMEOUT_SECONDS, self._subscribe_timed_out, proto)
        try:
            await set_client_name(proto, client_name(self.channel, self.instance_name, "sub"))
            if self._subscriber is not proto:
                return  # lost meanwhile, and already reported
            reply = await proto.subscribe(self.channels)
        except txredisapi.ConnectionError:
            return  # lost meanwhile, and already reported
        except Exception as e:
            logger.warning("could not subscribe to Redis channel %r: %s", self.channel, e)
            proto.transport.abortConnection()
            return
        finally:
            cancel_call(timeout)
        if self._subscriber is not proto or self._stopped:
            return
        if not (isinstance(reply, list) and reply[:1] == [b"subscribe"]):
            logger.warning("unexpected reply to SUBSCRIBE %r: %r", self.channel, reply)
            proto.transport.abortConnection()
            return
        logger.info(
            "Redis replication subscribed to channel %r and %d of its streams",
            self.channel,
            len(self.channels) - 1,
        )
        self._subscribed = True
        self._subscriber_keepalive = Keepalive(proto, self._clock)
        self._subscriber_keepalive.start()
        self._maybe_announce()

    def _subscribe_timed_out(self, proto: SubscriberConnection) -> None:
        logger.warning(
            "Redis did not confirm SUBSCRIBE %r in %.0fs: reconnecting",
            self.channel,
            KEEPALIVE_TIMEOUT_SECONDS,
        )
        proto.transport.abortConnection()

    def subscriber_lost(self, proto: SubscriberConnection) -> None:
        if self._subscriber is not proto:
            return
        self._subscriber = None
        self._subscribed = False
        if self._subscriber_keepalive is not None:
            self._subscriber_keepalive.stop()
        if not self._stopped:
            logger.info("Redis replication subscriber lost; reconnecting")
        self._announce_lost()

    def read_started(self) -> None:
        self._receiver.read_started()

    def read_done(self) -> None:
        self._receiver.read_done()

    def message_received(self, proto: SubscriberConnection, message: object) -> None:
        if proto is not self._subscriber or not self._announced:
            logger.debug("Redis replication not announced: dropping a message")
            return
        data = message.encode("utf-8") if isinstance(message, str) else message
        if not isinstance(data, bytes):
            self._refuse(repr(message).encode(), "not a bulk string")
            return
        if len(data) > MAX_LINE_LENGTH + MAX_ENVELOPE_LENGTH:
            self._refuse(data, f"over {MAX_LINE_LENGTH} bytes")
            return
        opened = self._open_envelope(data)
        if opened is None:
            return
        sender, mac, head, data = opened
        if len(data) > MAX_LINE_LENGTH:
            self._refuse(data, f"over {MAX_LINE_LENGTH} bytes")
            return
        # Skipped unchecked, as they would be checked: neither does anything.
        if sender == self._own_name and self._is_own_echo(data):
            return
        if self._followed is not None:
            stream = claim_stream(data)
            if stream is not None and stream not in self._followed:
                count_command(
                    REPLICATION_COMMANDS_IN, "RDATA" if data[0] == ord("R") else "POSITION"
                )
                return
        if not hmac.compare_digest(mac, message_mac(self._mac_key, head + data)):
            name = shorten(sender.decode("utf-8", "replace"))
            self._refusals.refuse(
                BAD_MAC,
                "unknown",
                f"{name} on {self.channel}",
                f"a message whose MAC does not match (signed without the replication secret?):"
                f" {shorten(data.decode('utf-8', 'replace'), 120)}",
            )
            return
        try:
            cmd = parse_command_from_line(data.decode("utf-8"))
        except UnicodeDecodeError:
            self._refuse(data, "invalid UTF-8")
            return
        except CommandParseError as e:
            self._refuse(data, str(e))
            return
        count_command(REPLICATION_COMMANDS_IN, cmd.NAME)
        if type(cmd) not in DATA_COMMANDS:
            self._refuse(data, f"{cmd.NAME} is not used over Redis")
            return
        if isinstance(cmd, (RdataCommand, PositionCommand)) and (
            cmd.instance_name.encode("utf-8") != sender
        ):
            name = sender.decode("utf-8", "replace")
            self._refusals.refuse(
                WRONG_SENDER,
                cmd.stream_name,
                f"{shorten(name)} on {self.channel}",
                f"{cmd.NAME} for writer {shorten(cmd.instance_name)} of {shorten(cmd.stream_name)}",
            )
            return
        self._sender = shorten(sender.decode("utf-8", "replace"))
        try:
            self._receiver.on_command(self, cmd)
        except Exception:
            logger.exception("replication receiver failed on %s from Redis", cmd.NAME)
        finally:
            self._sender = None

    def _is_own_echo(self, data: bytes) -> bool:
        """Our own RDATA, POSITION or CHECKED coming back: the receiver would
        drop it, so skip parsing its JSON (a writer hears every row it
        publishes, the main process every note)."""
        return (
            data.startswith(b"RDATA ")
            or data.startswith(b"POSITION ")
            or data.startswith(b"CHECKED ")
        )

    def _open_envelope(self, data: bytes) -> tuple[bytes, bytes, bytes, bytes] | None:
        """``(sender, MAC, signed head, line)`` of a message of this
        deployment (the MAC not yet checked); None (refused, or another
        deployment's, noted) otherwise."""
        fields = data.split(b" ", 3)
        if len(fields) != 4 or not fields[0].startswith(b"@") or not fields[1]:
            self._refuse(data, "no sender (@<deployment> <instance> <MAC> before the command)")
            return None
        deployment, sender, mac, line = fields[0][1:], fields[1], fields[2], fields[3]
        if deployment != self._deployment:
            self._foreign_message(deployment, sender)
            return None
        return sender, mac, fields[0] + b" " + sender + b" ", line

    def _foreign_message(self, deployment: bytes, sender: bytes) -> None:
        ident = shorten(deployment.decode("utf-8", "replace"), 40)
        name = shorten(sender.decode("utf-8", "replace"), 80)
        now = self._clock.seconds()
        if len(self._foreign) >= 100 and ident not in self._foreign:
            # A flood of made-up ids must not grow this without bound.
            self._foreign.pop(next(iter(self._foreign)))
        self._foreign[ident] = (name, now)
        REPLICATION_CLAIMS_REFUSED.labels("unknown", "foreign_deployment").inc()
        last = self._foreign_logged.get(ident)
        if last is None or now - last >= FOREIGN_LOG_INTERVAL_SECONDS:
            if len(self._foreign_logged) >= 100:
                self._foreign_logged.clear()
            self._foreign_logged[ident] = now
            logger.error(
                "Another deployment (%s, process %s) publishes on Redis channel %r: its"
                " commands are refused. Give each deployment its own server name or"
                " replication.redis.channel_prefix.",
                ident,
                name,
                self.channel,
            )

    def problems(self) -> list[str]:
        """What ``/health`` reports: other deployments heard lately."""
        now = self._clock.seconds()
        return [
            f"foreign replication traffic from deployment {ident} (process {name}) on Redis"
            f" channel {self.channel}, {now - when:.0f} s ago"
            for ident, (name, when) in sorted(self._foreign.items())
            if now - when < FOREIGN_MEMORY_SECONDS
        ]

    def _refuse(self, data: bytes, reason: str) -> None:
        REPLICATION_BAD_LINES.labels("redis").inc()
        logger.warning(
            "dropping a message on Redis channel %r: %s: %s",
            self.channel,
            reason,
            repr(data[:200]) + ("..." if len(data) > 200 else ""),
        )

    # -- announcing to the receiver ----------------------------------------------------

    def _maybe_announce(self) -> None:
        if self._announced or not self._subscribed or self._stopped:
            return
        if self._overflowed:
            # Commands stay dropped until the re-announcement, which needs
            # Redis to take commands again: then the first thing peers hear
            # from us after the gap is the handler's POSITIONs.
            if self._publisher is None:
                return
            self._overflowed = False
        self._announced = True
        _call_receiver(self._receiver.new_connection, self)
        # Subscribed first, so the answers to this are not missed.
        self.send_command(ReplicateCommand())

    def _announce_lost(self) -> None:
        if not self._announced:
            return
        self._announced = False
        _call_receiver(self._receiver.lost_connection, self)


def _call_receiver(method: Callable[[RedisReplicationBus], None], bus: RedisReplicationBus) -> None:
    try:
        method(bus)
    except Exception:
        logger.exception("replication receiver failed in %s", method.__name__)
