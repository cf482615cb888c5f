"""What each role of a process gets.

:class:`Role` (``role.py``) is what the config makes of one process (from
its writers directory, ``config.writers``, and its settings), decided once. The parts
that differ between roles are each decided by one function here, which picks
the classes for the role and says, in a :class:`Hooks`, what they serve
(internal calls), take (a stream's rows, a command) and run (background
loops): typing (the writer, or a follower), presence (the writer, or a
follower), federation (the sender, the main process's queue feeding a sender
worker, the keyring), media (the repository, or a refusal naming where it
is), the main process's own duties, and push delivery. The composition root
(``composition.py``) calls them in its stages and hands the hooks on to the
receiver, the command handler and the internal calls.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any

import attr
from twisted.internet import defer

from synapse_lite.app.listeners import MediaEndpoints
from synapse_lite.app.role import Role
from synapse_lite.app.services import Loop
from synapse_lite.appservice.api import ApplicationServiceApi
from synapse_lite.appservice.sender import ApplicationServiceSender, sender_of
from synapse_lite.clock import Clock
from synapse_lite.config.homeserver import MAIN_PROCESS, HomeServerConfig
from synapse_lite.federation.client import FederationClient
from synapse_lite.federation.crypto import load_or_create_signing_key
from synapse_lite.federation.keyring import Keyring
from synapse_lite.federation.outbox import OutboxConsumer
from synapse_lite.federation.queries import FederationQueries
from synapse_lite.federation.send_queue import FederationRemoteSendQueue
from synapse_lite.federation.sender.edus import (
    DeviceListsFeed,
    PresenceFeed,
    ReceiptsFeed,
    SendEdus,
    TypingFeed,
)
from synapse_lite.federation.sender.federation_sender import FederationSender
from synapse_lite.federation.sender.pdu_queue import FeedProgress
from synapse_lite.federation.sender.room_events import PduRenderer, RoomEventsFeed
from synapse_lite.federation.senders import sender_of as federation_sender_of
from synapse_lite.handlers.auth import AuthHandler
from synapse_lite.handlers.client_events import ClientEventFormatter, PduSigner
from synapse_lite.handlers.client_ips import ClientIpRecorder
from synapse_lite.handlers.client_transactions import ClientTransactionExpiry
from synapse_lite.handlers.event_expiry import EventExpiry
from synapse_lite.handlers.events_writers import EventsWriterRetirement
from synapse_lite.handlers.presence import (
    PresenceFollowerHandler,
    PresenceHandlerBase,
    PresenceWriterHandler,
)
from synapse_lite.handlers.pusher_delivery import PusherDelivery
from synapse_lite.handlers.typing import (
    TypingFollowerHandler,
    TypingHandlerBase,
    TypingWriterHandler,
)
from synapse_lite.http.outbound import OutboundHttpClient
from synapse_lite.http.tls import https_policy_trusting
from synapse_lite.media.paths import MediaFilePaths
from synapse_lite.media.remote import RemoteMediaCache
from synapse_lite.media.repository import MediaRepository
from synapse_lite.media.servlets import MediaElsewhere, MediaServlets
from synapse_lite.media.storage import MediaStorage, make_storage_provider
from synapse_lite.media.url_preview import UrlPreviewer
from synapse_lite.notifier import Notifier
from synapse_lite.replication.http.calls import InternalCall, InternalCalls
from synapse_lite.replication.http.instances import RETIRE_EVENTS_WRITER
from synapse_lite.replication.http.media import DELETE_MEDIA, PURGE_MEDIA_CACHE
from synapse_lite.replication.http.writes import (
    SET_PRESENCE,
    SET_REMOTE_PRESENCE,
    SET_TYPING,
)
from synapse_lite.replication.instance_directory import InstanceDirectory
from synapse_lite.replication.notifier import ReplicationNotifier
from synapse_lite.replication.streams import (
    MemoryPositions,
    rows_from_writer,
)
from synapse_lite.replication.tcp.commands import (
    ClearUserSyncCommand,
    Command,
    FederationAckCommand,
    RemoteServerUpCommand,
    UserIpCommand,
    UserSyncCommand,
)
from synapse_lite.replication.tcp.connection import OutgoingCommands
from synapse_lite.replication.tcp.receiver import (
    RowHook,
)
from synapse_lite.storage.databases.main import DataStore, GenericWorkerStore
from synapse_lite.streams.definition import UpdateFunction

logger = logging.getLogger(__name__)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Hooks:
    """What a role's components serve, take and run, handed by the stage
    that builds them to the ones that need it (in the order built)."""

    #: Internal calls this process serves.
    served: tuple[tuple[InternalCall[Any, Any], Any], ...] = ()
    #: ``(stream name, hook)``: handlers taking a stream's rows.
    row_hooks: tuple[tuple[str, RowHook], ...] = ()
    #: ``(command class, hook)``: handlers taking a command.
    command_hooks: tuple[tuple[type[Command], Callable[[Any], object]], ...] = ()
    loops: tuple[Loop, ...] = ()

    def __add__(self, other: Hooks) -> Hooks:
        return Hooks(
            served=self.served + other.served,
            row_hooks=self.row_hooks + other.row_hooks,
            command_hooks=self.command_hooks + other.command_hooks,
            loops=self.loops + other.loops,
        )


NO_HOOKS = Hooks()


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Federation:
    """The federation parts of a process (each None where the role has none):
    what :func:`federation_for_role` gives it."""

    client: FederationClient | None = None
    keyring: Keyring | None = None
    #: The sender, or the main process's queue feeding a sender worker.
    outbox: OutboxConsumer | None = None
    #: The federation stream's rows as this process reads them (None: none).
    rows: UpdateFunction | None = None
    hooks: Hooks = NO_HOOKS
    #: Profile and alias lookups on other servers, for our clients.
    queries: FederationQueries | None = None
    #: Closes what ``queries`` opened itself (a client worker's own client).
    close_queries: Callable[[], Any] | None = None


def typing_for_role(
    role: Role,
    config: HomeServerConfig,
    clock: Clock,
    store: GenericWorkerStore,
    positions: MemoryPositions,
    notifier: Notifier,
    local_writes: ReplicationNotifier,
    calls: InternalCalls,
) -> tuple[TypingHandlerBase, UpdateFunction, Hooks]:
    """The typing writer keeps the stream in memory and serves changes; any
    other process mirrors its rows and forwards changes to it."""
    if role.writes_typing:
        writer = TypingWriterHandler(
            positions=positions,
            store=store,
            clock=clock,
            notifier=notifier,
            replication_notifier=local_writes,
        )
        hooks = Hooks(served=((SET_TYPING, writer.apply_typing),), loops=(writer,))
        return writer, writer.get_all_typing_updates, hooks
    follower = TypingFollowerHandler(positions, calls)
    rows = rows_from_writer(calls, config.streams["typing"], config.writers.single("typing"))
    return follower, rows, Hooks(row_hooks=(("typing", follower.on_rows),))


def federation_for_role(
    role: Role,
    config: HomeServerConfig,
    reactor: Any,
    clock: Clock,
    store: GenericWorkerStore,
    positions: MemoryPositions,
    local_writes: ReplicationNotifier,
    calls: InternalCalls,
    outgoing: OutgoingCommands,
    typing: TypingHandlerBase | None = None,
) -> Federation:
    """The sender on the configured sender; the queue feeding a sender worker
    on the main process; the key and keyring where federation is served. The
    main process creates the signing key on its first start; the others read
    it (a missing key fails here, clearly)."""
    if not role.takes_part_in_federation:
        # A client worker asks other servers with a client of its own, made
        # at the first question (the main process has made the key by then).
        queries, close_queries = FederationQueries.on_demand(
            config.federation, config.data_dir, reactor, config.server_name
        )
        return Federation(queries=queries, close_queries=close_queries)
    signing_key = load_or_create_signing_key(config.data_dir, create=role.is_main)
    logger.info("Signing key %s", signing_key.key_id)
    client = FederationClient(config.federation, reactor, signing_key, config.server_name)
    keyring = None
    if role.serves_federation:
        keyring = Keyring(
            store=store,
            clock=clock,
            config=config.federation,
            client=client,
            signing_key=signing_key,
            server_name=config.server_name,
        )
    outbox: OutboxConsumer | None = None
    rows: UpdateFunction | None = None
    hooks = NO_HOOKS
    if role.sends_federation:
        key = signing_key
        renderer = PduRenderer(
            store, ClientEventFormatter(store, PduSigner(config.server_name, lambda: key)), clock
        )
        senders = config.federation_sender_instances

        def owns(destination: str) -> bool:
            # Each destination is sent to by one sender (federation/senders.py).
            return federation_sender_of(destination, senders) == role.name

        progress = FeedProgress()
        sender = FederationSender(
            store=store,
            clock=clock,
            server_name=config.server_name,
            instance_name=role.name,
            client=client,
            config=config.federation,
            send_command=None if role.is_main else outgoing.send_command,
            positions=positions,
            replication_notifier=local_writes,
            render_pdus=renderer.transaction_pdus,
            owns=owns,
            feed=progress,
        )
        # Room events for other servers: from every events writer's rows,
        # and this process's own sends.
        feed = RoomEventsFeed(
            store=store,
            clock=clock,
            server_name=config.server_name,
            queue_pdus=sender.send_pdus,
            local_writes=local_writes,
            progress=progress,
            owns=owns,
            catch_up=sender.catch_up,
            filled=sender.feed_filled,
        )
        edu_feeds = edu_feeds_for_sender(
            store, clock, config.server_name, sender.send_edus, local_writes, typing
        )
        hooks = edu_feeds + Hooks(
            loops=(sender, feed),
            row_hooks=(("events", feed.on_rows),),
            command_hooks=(
                (RemoteServerUpCommand, lambda cmd: sender.on_remote_server_up(cmd.server_name)),
            ),
        )
        if not role.is_main:
            # The main process's queue owns the stream; it tells this worker.
            hooks += Hooks(row_hooks=(("federation", sender.process_federation_rows),))
            rows = rows_from_writer(calls, config.streams["federation"], MAIN_PROCESS)
        outbox = sender
    elif role.is_main:
        queue = FederationRemoteSendQueue(
            store=store,
            clock=clock,
            positions=positions,
            replication_notifier=local_writes,
        )
        hooks = Hooks(loops=(queue,), command_hooks=((FederationAckCommand, queue.federation_ack),))
        rows = queue.get_replication_rows
        outbox = queue
    if outbox is not None and role.is_main and config.writers.single("to_device") != MAIN_PROCESS:
        # Messages another process queued for other servers.
        hooks += Hooks(row_hooks=(("to_device", outbox.on_to_device_rows),))
    return Federation(
        client=client,
        keyring=keyring,
        outbox=outbox,
        rows=rows,
        hooks=hooks,
        queries=FederationQueries(lambda: client),
    )


def edu_feeds_for_sender(
    store: GenericWorkerStore,
    clock: Clock,
    server_name: str,
    send_edus: SendEdus,
    local_writes: ReplicationNotifier,
    typing: TypingHandlerBase | None,
) -> Hooks:
    """The feeds of ephemeral EDUs for other servers (typing, receipts,
    device lists, presence), each following its stream on the sender
    (``federation/sender/edus.py``)."""
    common: dict[str, Any] = {
        "store": store,
        "clock": clock,
        "server_name": server_name,
        "send_edus": send_edus,
        "local_writes": local_writes,
    }
    feeds: list[tuple[str, Any]] = [
        ("receipts", ReceiptsFeed(**common)),
        ("device_lists", DeviceListsFeed(**common)),
        ("presence", PresenceFeed(**common)),
    ]
    if typing is not None:
        feeds.append(("typing", TypingFeed(typing=typing, **common)))
    hooks = Hooks(
        loops=tuple(feed for _, feed in feeds),
        row_hooks=tuple((stream, feed.on_rows) for stream, feed in feeds),
    )
    return hooks


def presence_for_role(
    role: Role,
    store: GenericWorkerStore,
    clock: Clock,
    notifier: Notifier,
    calls: InternalCalls,
    outgoing: OutgoingCommands,
) -> tuple[PresenceHandlerBase, Hooks]:
    """The presence writer decides online and offline from who is syncing
    (USER_SYNC); any other process tells it."""
    if role.writes_presence:
        writer = PresenceWriterHandler(store=store, clock=clock, calls=calls, notifier=notifier)
        return writer, Hooks(
            served=(
                (SET_PRESENCE, writer.apply_state),
                (SET_REMOTE_PRESENCE, writer.apply_remote_state),
            ),
            command_hooks=(
                (UserSyncCommand, writer.on_user_sync),
                (ClearUserSyncCommand, writer.on_clear_user_sync),
            ),
            loops=(writer,),
        )
    follower = PresenceFollowerHandler(
        store=store,
        clock=clock,
        calls=calls,
        send_command=outgoing.send_command,
        instance_id=secrets.token_hex(8),
    )
    return follower, Hooks(loops=(follower,))


def media_for_role(
    role: Role,
    config: HomeServerConfig,
    store: GenericWorkerStore,
    clock: Clock,
    reactor: Any,
    auth: AuthHandler,
    outbound: OutboundHttpClient,
    federation_client: Callable[[], FederationClient] | None,
    keyring: Callable[[], Keyring] | None,
) -> tuple[MediaRepository | None, MediaEndpoints, Hooks]:
    """The media instance serves the media repository (and, with a way to
    ask other servers, the federation media endpoints and other servers'
    media, cached); every other process answers media paths with an error
    naming it."""
    if not role.serves_media:
        media_url = None
        for listener in config.listeners_of(config.media_instance):
            if "client" in listener.resources:
                media_url = f"http://{listener.bind_address}:{listener.port}"
                break
        return None, MediaElsewhere(role.name, config.media_instance, media_url), NO_HOOKS
    media_config = config.media
    storage = MediaStorage(
        MediaFilePaths(media_config.store_path),
        [make_storage_provider(p) for p in media_config.storage_providers],
        reactor,
    )
    repository = MediaRepository(
        store=store,
        storage=storage,
        clock=clock,
        reactor=reactor,
        config=media_config,
        server_name=config.server_name,
        rate_limits_enabled=config.rate_limits.enabled,
    )
    previewer = UrlPreviewer(repository, outbound) if media_config.url_previews else None
    hooks = Hooks(loops=(repository,), served=((DELETE_MEDIA, repository.delete_media),))
    remote = None
    if federation_client is not None:
        remote = RemoteMediaCache(
            repository=repository,
            store=store,
            client=federation_client,
            outbound=outbound,
            clock=clock,
            reactor=reactor,
        )
        hooks += Hooks(served=((PURGE_MEDIA_CACHE, remote.purge),))
    servlets = MediaServlets(repository, auth, previewer, remote=remote, keyring=keyring)
    return repository, servlets, hooks


def main_duties(
    role: Role,
    config: HomeServerConfig,
    clock: Clock,
    main_store: DataStore | None,
    instances: InstanceDirectory,
    reactor: Any,
) -> Hooks:
    """What the main process alone does: record client addresses (USER_IP),
    retire events writers, expire events and transaction ids. ``main_store``:
    the store with its main-only parts (None elsewhere)."""
    if not role.is_main or main_store is None:
        return NO_HOOKS
    store = main_store
    loops: tuple[Loop, ...] = ()
    if config.experimental.msc2228_self_destructing_events:
        loops += (EventExpiry(store, clock),)
    loops += (ClientTransactionExpiry(store, clock),)
    retirement = EventsWriterRetirement(store, instances, reactor)
    return Hooks(
        served=((RETIRE_EVENTS_WRITER, retirement.retire),),
        command_hooks=((UserIpCommand, lambda cmd: record_user_ip(main_store, cmd)),),
        loops=loops,
    )


def pushers_for_role(
    role: Role,
    config: HomeServerConfig,
    clock: Clock,
    store: GenericWorkerStore,
    calls: InternalCalls,
    local_writes: ReplicationNotifier,
    reactor: Any,
) -> Hooks:
    """A pusher instance delivers its pushers' notifications, woken by events
    (new notifications) and read receipts (badge updates) written elsewhere
    (replication rows) and here (this process's ids finishing)."""
    if not role.delivers_pushes:
        return NO_HOOKS
    delivery = PusherDelivery(
        store=store,
        clock=clock,
        calls=calls,
        instance_name=role.name,
        instances=config.pusher_instances,
        reactor=reactor,
        tls_policy=https_policy_trusting(config.outbound_requests.extra_ca_paths),
        local_writes=(local_writes if role.writes_events or role.writes_receipts else None),
    )
    return Hooks(
        row_hooks=(("events", delivery.on_rows), ("receipts", delivery.on_rows)),
        loops=(delivery,),
    )


def client_ip_recorder(
    clock: Clock, main_store: DataStore | None, outgoing: OutgoingCommands
) -> ClientIpRecorder:
    """Requests' addresses: recorded here on the main process, sent to it
    (USER_IP) from the others."""
    if main_store is not None:
        recorder = main_store
        return ClientIpRecorder(clock, lambda cmd: record_user_ip(recorder, cmd))
    return ClientIpRecorder(clock, outgoing.send_command)


def record_user_ip(store: DataStore, cmd: UserIpCommand) -> None:
    """USER_IP reaches the main process, which records it."""
    d = defer.ensureDeferred(
        store.insert_client_ip(
            cmd.user_id, cmd.device_id or "", cmd.ip, cmd.user_agent, cmd.last_seen
        )
    )
    d.addErrback(lambda f: logger.warning("Recording a client IP failed: %s", f.value))


def app_services_for_role(
    role: Role,
    config: HomeServerConfig,
    clock: Clock,
    store: GenericWorkerStore,
    api: ApplicationServiceApi,
    local_writes: ReplicationNotifier,
    reactor: Any,
    typing: TypingHandlerBase,
) -> tuple[ApplicationServiceSender | None, Hooks]:
    """Each of ``appservice_instances`` sends their transactions to the
    services it owns (docs/appservices.md#which-process-sends),
    woken by events persisted elsewhere (replication rows) and here (ids
    finishing)."""
    owned = [
        service
        for service in config.app_services
        if sender_of(service.id, config.appservice_instances) == role.name
    ]
    if not role.sends_to_app_services or not owned:
        return None, NO_HOOKS
    sender = ApplicationServiceSender(
        store=store,
        clock=clock,
        reactor=reactor,
        api=api,
        services=owned,
        server_name=config.server_name,
        local_writes=(
            local_writes
            if role.writes_events
            or role.writes_receipts
            or role.writes_typing
            or role.writes_presence
            or role.writes_device_lists
            or config.writers.single("to_device") == role.name
            else None
        ),
        typing=typing,
    )
    row_hooks = tuple(
        (stream, sender.on_rows)
        for stream in (
            "events",
            "receipts",
            "typing",
            "presence",
            "to_device",
            "device_lists",
        )
    )
    return sender, Hooks(row_hooks=row_hooks, loops=(sender,))
