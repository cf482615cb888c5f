"""The composition root: builds one process for its role, explicitly.

This is the one place that knows which classes a role uses (a typing writer
or a follower, a presence writer or a follower, a federation sender, the
queue feeding one, or neither; the media repository or a refusal of media
paths) and the order things are built in. Each
component is given the few collaborators it uses through its constructor;
nothing is looked up later. The result is a :class:`~synapse_lite.server.HomeServer`
record whose ``service`` starts and stops the process (``app/services.py``).

Build order:

1. the database: schema checked (created or upgraded by the main process),
   every stream's ID generator and the store loaded from one startup connection;
2. the instance directory, the notifier, internal calls;
3. handlers, by role;
4. this process's view of every stream, the receiver, the command handler and
   the streamer;
5. internal calls served, replication hooks;
6. listeners and the lifecycle services.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import attr
from twisted.internet import defer

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.app.listeners import ListenerResources, ListenersService, MediaEndpoints
from synapse_lite.app.services import CallbackService, Loop, LoopsService, ProcessService
from synapse_lite.clock import Clock
from synapse_lite.config.homeserver import MAIN_PROCESS, HomeServerConfig
from synapse_lite.federation.client import FederationClient
from synapse_lite.federation.crypto import SigningKey, load_or_create_signing_key
from synapse_lite.federation.inbound import FederationInboundHandler
from synapse_lite.federation.keyring import Keyring
from synapse_lite.federation.outbox import OutboxConsumer
from synapse_lite.federation.send_queue import FederationRemoteSendQueue
from synapse_lite.federation.sender.federation_sender import FederationSender
from synapse_lite.federation.server import register_federation_servlets
from synapse_lite.handlers.account import AccountHandler
from synapse_lite.handlers.account_data import AccountDataHandler
from synapse_lite.handlers.admin import AdminHandler
from synapse_lite.handlers.auth import AuthHandler
from synapse_lite.handlers.client_events import ClientEventFormatter, PduSigner
from synapse_lite.handlers.client_ips import ClientIpRecorder
from synapse_lite.handlers.client_transactions import ClientTransactionExpiry
from synapse_lite.handlers.device import DeviceHandler
from synapse_lite.handlers.devicemessage import DeviceMessageHandler
from synapse_lite.handlers.directory import DirectoryHandler
from synapse_lite.handlers.e2e_keys import E2eKeysHandler
from synapse_lite.handlers.event_expiry import EventExpiry
from synapse_lite.handlers.events_writers import EventsWriterRetirement
from synapse_lite.handlers.filtering import FilteringHandler
from synapse_lite.handlers.identity import IdentityHandler
from synapse_lite.handlers.legacy_sync import LegacySyncHandler
from synapse_lite.handlers.login import LoginHandler
from synapse_lite.handlers.message import EventCreationHandler
from synapse_lite.handlers.openid import OpenIdHandler
from synapse_lite.handlers.pagination import PaginationHandler
from synapse_lite.handlers.presence import (
    PresenceFollowerHandler,
    PresenceHandlerBase,
    PresenceWriterHandler,
)
from synapse_lite.handlers.profile import ProfileHandler
from synapse_lite.handlers.push import PushActionsHandler
from synapse_lite.handlers.push_rules import PushRulesHandler
from synapse_lite.handlers.pusher_delivery import PusherDelivery
from synapse_lite.handlers.receipts import ReceiptsHandler
from synapse_lite.handlers.register import RegistrationHandler
from synapse_lite.handlers.relations import RelationsHandler
from synapse_lite.handlers.reports import ReportsHandler
from synapse_lite.handlers.room import RoomCreationHandler
from synapse_lite.handlers.room_keys import RoomKeysHandler
from synapse_lite.handlers.room_member import RoomMemberHandler
from synapse_lite.handlers.room_upgrade import RoomUpgradeHandler, UpgradedRoomUserState
from synapse_lite.handlers.search import SearchHandler
from synapse_lite.handlers.sync import SyncHandler
from synapse_lite.handlers.typing import (
    TypingFollowerHandler,
    TypingHandlerBase,
    TypingWriterHandler,
    starts_typing_run,
)
from synapse_lite.handlers.ui_auth import InteractiveAuthHandler
from synapse_lite.http.forwarded import router_proof
from synapse_lite.http.outbound import OutboundHttpClient
from synapse_lite.http.server import JsonResource
from synapse_lite.http.tls import https_policy_trusting
from synapse_lite.media.paths import MediaFilePaths
from synapse_lite.media.repository import MediaRepository
from synapse_lite.media.servlets import MediaElsewhere, MediaServlets
from synapse_lite.media.storage import MediaStorage, make_storage_provider
from synapse_lite.media.url_preview import UrlPreviewer
from synapse_lite.notifier import Notifier
from synapse_lite.position_log import PositionLog, position_log_path
from synapse_lite.replication.claims import PeerClaims
from synapse_lite.replication.http.calls import InternalCall, InternalCalls
from synapse_lite.replication.http.devices import (
    DELETE_DEVICES,
    REGISTER_DEVICE,
    REMOVE_DEVICE_PUSHERS,
    RENAME_DEVICE,
)
from synapse_lite.replication.http.e2e_keys import (
    UPLOAD_CROSS_SIGNING_KEYS,
    UPLOAD_DEVICE_KEYS,
    UPLOAD_SIGNATURES,
)
from synapse_lite.replication.http.instances import RETIRE_EVENTS_WRITER
from synapse_lite.replication.http.send_events import SEND_EVENTS
from synapse_lite.replication.http.stream_updates import (
    GET_STREAM_UPDATES,
    StreamUpdates,
    StreamUpdatesWanted,
)
from synapse_lite.replication.http.writes import (
    ADD_ACCOUNT_DATA,
    EDIT_PUSH_RULES,
    RECEIVE_REMOTE_TO_DEVICE,
    SEND_RECEIPT,
    SEND_TO_DEVICE,
    SET_PRESENCE,
    SET_PUSHER,
    SET_ROOM_TAG,
    SET_TYPING,
)
from synapse_lite.replication.instance_directory import InstanceDirectory
from synapse_lite.replication.notifier import ReplicationNotifier
from synapse_lite.replication.streams import (
    IdGeneratorPositions,
    MemoryPositions,
    Stream,
    StreamPositions,
    no_rows,
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
from synapse_lite.replication.tcp.handler import ReplicationCommandHandler
from synapse_lite.replication.tcp.receiver import (
    PositionWaiters,
    ReplicationReceiver,
    RowHook,
)
from synapse_lite.replication.tcp.streamer import ReplicationStreamer
from synapse_lite.replication.transports import ReplicationTransport
from synapse_lite.rest.client import ClientHandlers
from synapse_lite.server import HomeServer
from synapse_lite.storage._base import StoreContext
from synapse_lite.storage.database import DatabasePool, make_startup_connection
from synapse_lite.storage.databases.main import DataStore, GenericWorkerStore
from synapse_lite.storage.databases.main.stream_runs import take_next_stream_run_txn
from synapse_lite.storage.engines import create_engine
from synapse_lite.storage.id_generators.stalls import StallDetector
from synapse_lite.storage.prepare_database import prepare_database
from synapse_lite.storage.stream_ids import StreamIdGenerators
from synapse_lite.streams.definition import UpdateFunction

logger = logging.getLogger(__name__)


@attr.s(slots=True, auto_attribs=True)
class _Wiring:
    """What the role-specific choices hand to the steps every process shares:
    each role's branch says here what its components serve, hook and run, so
    nothing later asks which class a component is."""

    #: Internal calls this process serves.
    served: list[tuple[InternalCall[Any, Any], Any]] = attr.ib(factory=list)
    #: ``(stream name, hook)``: role handlers taking a stream's rows.
    row_hooks: list[tuple[str, RowHook]] = attr.ib(factory=list)
    #: ``(command class, hook)``: role handlers taking a command.
    command_hooks: list[tuple[type[Command], Callable[[Any], object]]] = attr.ib(factory=list)
    loops: list[Loop] = attr.ib(factory=list)
    #: Positions and rows of the streams kept in a writer's memory, by name.
    memory_streams: dict[str, tuple[StreamPositions, UpdateFunction]] = attr.ib(factory=dict)


def _peer_claims(
    config: HomeServerConfig,
    clock: Clock,
    streams: dict[str, Stream],
    directory: InstanceDirectory,
) -> PeerClaims:
    """Who may claim positions of which stream: its configured writers; the
    events writers as the instances table has them now; for a stream any
    process writes, any process the config or the table knows."""
    writers = config.writers

    def writers_of(stream_name: str) -> Collection[str] | None:
        definition = config.streams.get(stream_name)
        if definition is None:
            return ()
        if definition.writers.follows_instances:
            return (*writers.writers(stream_name), *directory.event_writers())
        return writers.writers(stream_name) or config.instance_names()

    async def look_up_writer(stream_name: str, writer: str) -> bool:
        definition = config.streams.get(stream_name)
        if definition is None:
            return False
        if definition.writers.follows_instances:
            await directory.refresh()
            return writer in directory.event_writers()
        if definition.writers.any_process:
            await directory.refresh()
            return directory.is_known(writer)
        return False

    return PeerClaims(clock, streams, writers_of, look_up_writer)


def build_homeserver(config: HomeServerConfig, instance_name: str, reactor: Any) -> HomeServer:
    """Build one process (see the module docstring); nothing runs until its
    ``service`` is started."""
    me = instance_name
    is_main = me == MAIN_PROCESS
    clock = Clock(reactor)
    replication_notifier = ReplicationNotifier()
    position_log = (
        PositionLog(position_log_path(config.data_dir, me), me) if config.position_log else None
    )
    wiring = _Wiring()

    # 1. The database.
    pool, id_generators, store, main_store, directory, typing_run = _load_database(
        config, me, reactor, clock, replication_notifier, position_log
    )

    # 2. Who is where, wake-ups, internal calls.
    notifier = Notifier(clock)
    streams: dict[str, Stream] = {}  # filled in step 4; the waiters read it lazily
    waiters = PositionWaiters(clock, me, streams)
    calls = InternalCalls(
        config=config,
        instance_name=me,
        clock=clock,
        reactor=reactor,
        locations=directory,
        waiter=waiters,
    )
    receiver = ReplicationReceiver(store, streams, notifier, waiters)
    replication = ReplicationCommandHandler(
        instance_name=me,
        clock=clock,
        streams=streams,
        receiver=receiver,
        claims=_peer_claims(config, clock, streams, directory),
    )

    # 3. Handlers, by role.
    server_name = config.server_name
    event_writers = directory.event_writers
    typing = _typing_for_role(
        config, me, typing_run, store, clock, notifier, replication_notifier, calls, wiring
    )
    presence = _presence_for_role(config, me, store, clock, notifier, calls, replication, wiring)
    federation = _federation_for_role(
        config, me, reactor, clock, store, replication, replication_notifier, calls, wiring
    )
    auth = AuthHandler(
        store, _client_ip_recorder(clock, main_store, replication), config.allow_guest_access
    )
    # Requests to servers users name (identity servers, pages to preview).
    outbound = OutboundHttpClient(
        reactor,
        config.outbound_requests,
        https_policy_trusting(config.outbound_requests.extra_ca_paths),
    )
    media, media_endpoints = _media_for_role(
        config, me, store, clock, reactor, auth, outbound, wiring
    )
    devices = DeviceHandler(store, calls, config, notifier)
    writes_events = config.writers.writes(me, "events")
    push = PushActionsHandler(store, config.server_name) if writes_events else None
    events = EventCreationHandler(
        push=push,
        store=store,
        clock=clock,
        config=config,
        instance_name=me,
        notifier=notifier,
        calls=calls,
        event_writers=event_writers,
    )
    device_messages = DeviceMessageHandler(
        store=store,
        server_name=server_name,
        notifier=notifier,
        calls=calls,
        outbox=federation.outbox,
    )
    e2e_keys = E2eKeysHandler(store, calls, config, notifier)
    ui_auth = InteractiveAuthHandler(store, clock, config)
    account_data = AccountDataHandler(store, notifier, calls)
    push_rules = PushRulesHandler(store, notifier, calls)
    upgraded_rooms = UpgradedRoomUserState(store, account_data, push_rules)
    members = RoomMemberHandler(store, clock, server_name, events, upgraded_rooms)
    room_creation = RoomCreationHandler(
        store=store,
        clock=clock,
        server_name=server_name,
        events=events,
        writers=config.writers,
        event_writers=event_writers,
    )

    def signing_key() -> SigningKey:
        return load_or_create_signing_key(config.data_dir, create=False)

    # One formatter for /sync, /messages and /context: the filters'
    # ``event_format: federation`` signs with the server's key.
    formatter = ClientEventFormatter(store, PduSigner(server_name, signing_key))
    pagination = PaginationHandler(store, clock, formatter)
    relations = RelationsHandler(store, clock, pagination)
    identity = IdentityHandler(store, outbound, signing_key, server_name)
    sync = SyncHandler(
        store=store,
        clock=clock,
        config=config,
        notifier=notifier,
        typing=typing,
        presence=presence,
        streams=streams,
        waiters=waiters,
        event_writers=event_writers,
        position_log=position_log,
        sections={d.name: d.sync_section(store) for d in config.streams if d.sync_section},
        formatter=formatter,
        relations=relations,
    )
    handlers = ClientHandlers(
        clock=clock,
        store=store,
        auth=auth,
        registration=RegistrationHandler(store, clock, config, devices, ui_auth),
        login=LoginHandler(store, clock, config, devices),
        devices=devices,
        filtering=FilteringHandler(store),
        sync=sync,
        legacy_sync=LegacySyncHandler(
            store=store,
            clock=clock,
            limits=config.limits,
            sync=sync,
            pagination=pagination,
            notifier=notifier,
            typing=typing,
            presence=presence,
        ),
        events=events,
        room_creation=room_creation,
        room_upgrade=RoomUpgradeHandler(
            store=store,
            clock=clock,
            server_name=server_name,
            events=events,
            room_creation=room_creation,
            user_state=upgraded_rooms,
        ),
        members=members,
        pagination=pagination,
        receipts=ReceiptsHandler(store, clock, notifier, calls),
        account_data=account_data,
        device_messages=device_messages,
        e2e_keys=e2e_keys,
        room_keys=RoomKeysHandler(store),
        ui_auth=ui_auth,
        typing=typing,
        presence=presence,
        account=AccountHandler(store, ui_auth, devices, members, identity),
        reports=ReportsHandler(store, server_name),
        admin=AdminHandler(store),
        openid=OpenIdHandler(store, clock, server_name),
        push_rules=push_rules,
        turn=config.turn,
        profiles=ProfileHandler(store, clock, server_name, events),
        directory=DirectoryHandler(store, server_name, clock, events),
        relations=relations,
        search=SearchHandler(store, clock, pagination),
        identity=identity,
        server_name=server_name,
    )
    if config.writers.writes(me, "events"):
        wiring.served.append((SEND_EVENTS, events.persist_events))
    wiring.served += [
        (ADD_ACCOUNT_DATA, handlers.account_data.write_account_data),
        (EDIT_PUSH_RULES, handlers.push_rules.write_edit),
        (SET_PUSHER, handlers.push_rules.write_pusher),
        (REMOVE_DEVICE_PUSHERS, handlers.push_rules.remove_device_pushers),
        (SET_ROOM_TAG, handlers.account_data.write_tag),
        (SEND_RECEIPT, handlers.receipts.write_receipt),
        (SEND_TO_DEVICE, device_messages.write_messages),
        (RECEIVE_REMOTE_TO_DEVICE, device_messages.write_remote_messages),
    ]
    if config.writers.writes(me, "device_lists"):
        wiring.served += [
            (REGISTER_DEVICE, devices.store_device_and_token),
            (DELETE_DEVICES, devices.logout_devices),
            (RENAME_DEVICE, devices.rename_device_here),
            (UPLOAD_DEVICE_KEYS, e2e_keys.store_device_keys),
            (UPLOAD_CROSS_SIGNING_KEYS, e2e_keys.store_cross_signing_keys),
            (UPLOAD_SIGNATURES, e2e_keys.store_signatures),
        ]
    if main_store is not None:
        recorder = main_store
        wiring.command_hooks.append((UserIpCommand, lambda cmd: _record_user_ip(recorder, cmd)))
        wiring.served.append(
            (RETIRE_EVENTS_WRITER, EventsWriterRetirement(store, directory, reactor).retire)
        )

    if me in config.pusher_instances:
        delivery = PusherDelivery(
            store=store,
            clock=clock,
            calls=calls,
            instance_name=me,
            instances=config.pusher_instances,
            reactor=reactor,
            tls_policy=https_policy_trusting(config.outbound_requests.extra_ca_paths),
        )
        wiring.loops.append(delivery)
        # Woken by events (new notifications) and read receipts (badge
        # updates) written elsewhere (replication rows) and here (a writer's
        # own ids finishing poke the replication notifier).
        wiring.row_hooks.append(("events", delivery.on_rows))
        wiring.row_hooks.append(("receipts", delivery.on_rows))
        if config.writers.writes(me, "events") or config.writers.writes(me, "receipts"):
            replication_notifier.add_replication_callback(delivery.wake)

    if is_main and config.experimental.msc2228_self_destructing_events:
        wiring.loops.append(EventExpiry(store, clock))
    if is_main:
        wiring.loops.append(ClientTransactionExpiry(store, clock))

    stalls = StallDetector(
        clock,
        me,
        [(id_generators.of(d), not d.writers.any_process) for d in config.streams.with_ids()],
    )
    wiring.loops.append(stalls)

    # 4. This process's view of every stream, and replication.
    for definition in config.streams:
        if definition.ids is not None:
            assert definition.rows_from_store is not None, definition.name
            positions: StreamPositions = IdGeneratorPositions(
                id_generators.of(definition), definition.ids.positive, me
            )
            update_function = definition.rows_from_store(store)
        else:
            positions, update_function = wiring.memory_streams[definition.name]
        streams[definition.name] = Stream(definition, positions, update_function, me)
    streamer = ReplicationStreamer(
        instance_name=me,
        clock=clock,
        handler=replication,
        streams=[streams[name] for name in config.writers.streams_written_by(me)],
        position_log=position_log,
    )
    replication_notifier.add_replication_callback(streamer.on_notifier_poke)
    replication.add_connection_greeting(presence.get_user_sync_commands)
    directory.attach(replication)

    # 5. Internal calls served here, replication hooks.
    for call, handler in wiring.served:
        if call.served_by is None or calls.server_of(call) == me:
            calls.serve(call, handler)
    calls.serve(GET_STREAM_UPDATES, _stream_updates_server(me, streams))
    for stream_name, hook in wiring.row_hooks:
        receiver.add_row_hook(stream_name, hook)
    for command_type, command_hook in wiring.command_hooks:
        replication.add_command_hook(command_type, command_hook)
    inbound = None
    if federation.keyring is not None:
        inbound = FederationInboundHandler(
            store=store,
            server_name=server_name,
            device_messages=device_messages,
            send_command=replication.send_command,
            outbox=federation.outbox,
        )

    # 6. Listeners and lifecycle.
    federation_servlets = None
    if federation.keyring is not None and inbound is not None:
        keyring, inbound_handler = federation.keyring, inbound

        def federation_servlets(resource: JsonResource, resources: tuple[str, ...]) -> None:
            register_federation_servlets(
                resource,
                resources,
                keyring=keyring,
                inbound=inbound_handler,
                server_name=server_name,
                openid=handlers.openid,
            )

    listeners = ListenersService(
        reactor=reactor,
        clock=clock,
        listeners=config.listeners_of(me),
        resources=ListenerResources(
            instance_name=me,
            client=handlers,
            replication=calls.resource,
            federation=federation_servlets,
            media=media_endpoints,
            problems=lambda: [*stalls.reasons(), *transport.problems()],
        ),
        max_body_bytes=config.limits.max_request_body_bytes,
        router_proof=(
            router_proof(config.worker_replication_secret)
            if config.worker_replication_secret
            else None
        ),
    )
    transport = ReplicationTransport(
        config, me, replication, reactor, deployment_id=directory.deployment_id
    )

    async def close_clients() -> None:
        await calls.close()
        if federation.client is not None:
            await federation.client.close()

    async def flush_positions() -> None:
        await id_generators.flush_positions()
        await clock.timeout(defer.ensureDeferred(streamer.send_pending()), 2.0)

    loops_service = LoopsService([streamer, *wiring.loops])
    service = ProcessService(clock, me)
    # Stopped in the reverse order (see app/services.py).
    for child in (
        CallbackService("database", stop=pool.close),
        CallbackService(
            "position log", stop=position_log.close if position_log is not None else None
        ),
        CallbackService("http clients", stop=close_clients),
        CallbackService("media jobs", stop=media.finish_jobs if media is not None else None),
        CallbackService("replication", start=transport.start, stop=transport.stop),
        CallbackService("user syncs", stop=presence.end_of_syncs),
        CallbackService("stream positions", stop=flush_positions),
        loops_service,
        CallbackService(
            "rooms of removed writers",
            start=(lambda: _reassign_rooms(store, directory)) if is_main else None,
        ),
        listeners,
    ):
        child.setServiceParent(service)

    return HomeServer(
        config=config,
        instance_name=me,
        reactor=reactor,
        clock=clock,
        database_pool=pool,
        id_generators=id_generators,
        store=store,
        directory=directory,
        notifier=notifier,
        replication_notifier=replication_notifier,
        position_log=position_log,
        calls=calls,
        streams=streams,
        waiters=waiters,
        replication=replication,
        streamer=streamer,
        transport=transport,
        handlers=handlers,
        typing=typing,
        presence=presence,
        outbox=federation.outbox,
        keyring=federation.keyring,
        media=media,
        loops=loops_service,
        listeners=listeners,
        service=service,
    )


def _typing_for_role(
    config: HomeServerConfig,
    me: str,
    run: int | None,
    store: GenericWorkerStore,
    clock: Clock,
    notifier: Notifier,
    replication_notifier: ReplicationNotifier,
    calls: InternalCalls,
    wiring: _Wiring,
) -> TypingHandlerBase:
    """The typing writer keeps the stream in memory and serves changes; any
    other process mirrors its rows and forwards changes to it. ``run``: the
    writer's run number, taken at startup (None elsewhere)."""
    writer = config.writers.single("typing")
    if writer == me:
        assert run is not None
        handler = TypingWriterHandler(
            run=run,
            store=store,
            clock=clock,
            notifier=notifier,
            replication_notifier=replication_notifier,
            calls=calls,
        )
        wiring.served.append((SET_TYPING, handler.apply_typing))
        wiring.loops.append(handler)
        wiring.memory_streams["typing"] = (
            MemoryPositions(handler.get_current_token, starts_typing_run),
            handler.get_all_typing_updates,
        )
        return handler
    follower = TypingFollowerHandler(calls)
    wiring.row_hooks.append(("typing", follower.on_rows))
    wiring.memory_streams["typing"] = (
        MemoryPositions(follower.get_current_token, starts_typing_run),
        rows_from_writer(calls, config.streams["typing"], writer),
    )
    return follower


def _presence_for_role(
    config: HomeServerConfig,
    me: str,
    store: GenericWorkerStore,
    clock: Clock,
    notifier: Notifier,
    calls: InternalCalls,
    replication: ReplicationCommandHandler,
    wiring: _Wiring,
) -> PresenceHandlerBase:
    """The presence writer decides online and offline from who is syncing
    (USER_SYNC); any other process tells it."""
    if config.writers.single("presence") == me:
        writer = PresenceWriterHandler(store=store, clock=clock, calls=calls, notifier=notifier)
        wiring.served.append((SET_PRESENCE, writer.apply_state))
        wiring.command_hooks.append((UserSyncCommand, writer.on_user_sync))
        wiring.command_hooks.append((ClearUserSyncCommand, writer.on_clear_user_sync))
        wiring.loops.append(writer)
        return writer
    follower = PresenceFollowerHandler(
        store=store,
        clock=clock,
        calls=calls,
        send_command=replication.send_command,
        instance_id=secrets.token_hex(8),
    )
    wiring.loops.append(follower)
    return follower


def _media_for_role(
    config: HomeServerConfig,
    me: str,
    store: GenericWorkerStore,
    clock: Clock,
    reactor: Any,
    auth: AuthHandler,
    outbound: OutboundHttpClient,
    wiring: _Wiring,
) -> tuple[MediaRepository | None, MediaEndpoints]:
    """The media instance serves the media repository; every other process
    answers media paths with an error naming it."""
    if config.media_instance != me:
        media_url = None
        for listener in config.listeners_of(config.media_instance):
            if "client" in listener.resources:
                media_url = f"http://{listener.bind_address}:{listener.port}"
                break
        return None, MediaElsewhere(me, config.media_instance, media_url)
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
    wiring.loops.append(repository)
    previewer = UrlPreviewer(repository, outbound) if media_config.url_previews else None
    return repository, MediaServlets(repository, auth, previewer)


def _load_database(
    config: HomeServerConfig,
    me: str,
    reactor: Any,
    clock: Clock,
    replication_notifier: ReplicationNotifier,
    position_log: PositionLog | None,
) -> tuple[
    DatabasePool,
    StreamIdGenerators,
    GenericWorkerStore,
    DataStore | None,
    InstanceDirectory,
    int | None,
]:
    """Check (main: create or upgrade) the schema, then load every ID generator,
    the store (the main process's, with its main-only parts, is also returned
    as such) and the instance directory from one startup connection; the
    typing writer also takes its run number there (None on other processes)."""
    start = time.monotonic()
    db_config = config.database
    engine = create_engine(db_config.engine, db_config.args)
    logger.info("Connecting to %s", engine.describe())
    db_conn = make_startup_connection(engine)
    pool: DatabasePool | None = None
    try:
        prepare_database(db_conn, is_main=me == MAIN_PROCESS)
        pool = DatabasePool(
            reactor,
            engine,
            min_connections=db_config.min_connections,
            max_connections=db_config.max_connections,
        )
        id_generators = StreamIdGenerators.load(
            db_conn=db_conn,
            pool=pool,
            config=config,
            instance_name=me,
            notifier=replication_notifier,
            position_log=position_log,
        )
        context = StoreContext(config, clock, me, id_generators)
        main_store = DataStore(pool, db_conn, context) if me == MAIN_PROCESS else None
        store = main_store or GenericWorkerStore(pool, db_conn, context)
        directory = InstanceDirectory(config, me, store)
        with db_conn.transaction("instances_at_startup") as txn:
            directory.load_at_startup(txn)
        typing_run = None
        if config.writers.single("typing") == me:
            with db_conn.transaction("typing_run") as txn:
                typing_run = take_next_stream_run_txn(txn, "typing")
            logger.info("Typing stream: run %d", typing_run)
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    finally:
        db_conn.close()
    logger.info("Loaded the database in %.3f s", time.monotonic() - start)
    return pool, id_generators, store, main_store, directory, typing_run


class _Federation:
    """The federation parts of a process (each None where the role has none)."""

    def __init__(
        self,
        client: FederationClient | None,
        keyring: Keyring | None,
        outbox: OutboxConsumer | None,
    ) -> None:
        self.client = client
        self.keyring = keyring
        self.outbox = outbox


def _federation_for_role(
    config: HomeServerConfig,
    me: str,
    reactor: Any,
    clock: Clock,
    store: GenericWorkerStore,
    replication: ReplicationCommandHandler,
    replication_notifier: ReplicationNotifier,
    calls: InternalCalls,
    wiring: _Wiring,
) -> _Federation:
    """The sender on the configured sender; the queue feeding a sender worker
    on the main process; the key and keyring where federation is served. The
    main process creates the signing key on its first start; the others read
    it (a missing key fails here, clearly)."""
    is_main = me == MAIN_PROCESS
    is_sender = config.federation_sender == me
    serves_federation = any(
        {"federation", "keys"} & set(listener.resources) for listener in config.listeners_of(me)
    )
    stream = config.streams["federation"]
    nothing = (MemoryPositions(lambda: 0), no_rows(stream.name))
    if not (is_main or is_sender or serves_federation):
        wiring.memory_streams[stream.name] = nothing
        return _Federation(None, None, None)
    signing_key = load_or_create_signing_key(config.data_dir, create=is_main)
    logger.info("Signing key %s", signing_key.key_id)
    client = FederationClient(config.federation, reactor, signing_key, config.server_name)
    keyring = None
    if serves_federation:
        keyring = Keyring(
            store=store,
            clock=clock,
            config=config.federation,
            client=client,
            signing_key=signing_key,
            server_name=config.server_name,
        )
    outbox: OutboxConsumer | None = None
    wiring.memory_streams[stream.name] = nothing
    if is_sender:
        sender = FederationSender(
            store=store,
            clock=clock,
            server_name=config.server_name,
            instance_name=me,
            client=client,
            config=config.federation,
            send_command=None if is_main else replication.send_command,
        )
        wiring.loops.append(sender)
        wiring.command_hooks.append(
            (RemoteServerUpCommand, lambda cmd: sender.on_remote_server_up(cmd.server_name))
        )
        if not is_main:
            # The main process's queue owns the stream; it tells this worker.
            wiring.row_hooks.append((stream.name, sender.process_federation_rows))
            wiring.memory_streams[stream.name] = (
                MemoryPositions(sender.get_current_token),
                rows_from_writer(calls, stream, MAIN_PROCESS),
            )
        outbox = sender
    elif is_main:
        queue = FederationRemoteSendQueue(
            store=store, clock=clock, replication_notifier=replication_notifier
        )
        wiring.loops.append(queue)
        wiring.command_hooks.append((FederationAckCommand, queue.federation_ack))
        wiring.memory_streams[stream.name] = (
            MemoryPositions(queue.get_current_token),
            queue.get_replication_rows,
        )
        outbox = queue
    if outbox is not None:
        replication_notifier.add_replication_callback(outbox.release_held)
        if is_main and config.writers.single("to_device") != MAIN_PROCESS:
            # Messages another process queued for other servers.
            wiring.row_hooks.append(("to_device", outbox.on_to_device_rows))
    return _Federation(client, keyring, outbox)


def _stream_updates_server(
    me: str, streams: dict[str, Stream]
) -> Callable[[StreamUpdatesWanted], Awaitable[StreamUpdates]]:
    """Serves :data:`GET_STREAM_UPDATES`: this process's rows of a stream."""

    async def stream_updates(wanted: StreamUpdatesWanted) -> StreamUpdates:
        stream = streams.get(wanted.stream)
        if stream is None:
            raise SynapseError(400, f"Unknown stream {wanted.stream!r}", Codes.INVALID_PARAM)
        updates, upto, limited = await stream.rows_since(
            me, wanted.from_token, wanted.upto_token, wanted.limit
        )
        encode = stream.definition.encode_row
        return StreamUpdates([(t, encode(r)) for t, r in updates], upto, limited)

    return stream_updates


def _client_ip_recorder(
    clock: Clock, main_store: DataStore | None, replication: ReplicationCommandHandler
) -> ClientIpRecorder:
    """Requests' addresses: recorded here on the main process, sent to it
    (USER_IP) from the others."""
    if main_store is not None:
        recorder = main_store
        return ClientIpRecorder(clock, lambda cmd: _record_user_ip(recorder, cmd))
    return ClientIpRecorder(clock, replication.send_command)


def _record_user_ip(store: DataStore, cmd: UserIpCommand) -> None:
    """USER_IP reaches the main process, which records it."""
    d = defer.ensureDeferred(
        store.insert_client_ip(
            cmd.user_id, cmd.device_id or "", cmd.ip, cmd.user_agent, cmd.last_seen
        )
    )
    d.addErrback(lambda f: logger.warning("Recording a client IP failed: %s", f.value))


def _reassign_rooms(store: GenericWorkerStore, directory: InstanceDirectory) -> None:
    """Main process, at startup: rooms whose events writer is no longer
    configured get a new one (sends to them fail with a retryable 503 until
    then; see ``RoomWorkerStore.reassign_rooms_of_removed_writers``)."""

    async def reassign() -> None:
        moved = await store.reassign_rooms_of_removed_writers(directory.event_writers())
        if moved:
            logger.info("Moved %d room(s) to configured events writers", moved)

    defer.ensureDeferred(reassign()).addErrback(
        lambda f: logger.error("Reassigning rooms failed: %s", f.getTraceback())
    )
