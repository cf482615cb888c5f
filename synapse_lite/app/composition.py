"""The composition root: builds one process for its role, explicitly.

This module and ``roles.py`` are the one place that knows which classes a
role uses (a typing writer or a follower, a presence writer or a follower, a
federation sender, the queue feeding one, or neither; the media repository
or a refusal of media paths: one function each in ``roles.py``) and the
order things are built in. ``Role.of`` decides, once, what the config makes of the process (from
its writers directory, ``config.writers``); then :func:`build_homeserver`
runs the stages, each a function returning a frozen record of what it built,
each given only the records of the stages before it:

1. :class:`Database`: the schema checked (created or upgraded by the main
   process), every stream's ID generator, the store and the instances table
   loaded from one startup connection;
2. :class:`Positions`: where this process is on every stream (an ID
   generator's positions, or the counter of the component keeping a stream
   in memory), and the callers waiting for positions;
3. :class:`Transport`: the internal calls to other processes and the
   replication commands going out;
4. :class:`Streams`: the components keeping streams in memory (typing,
   federation) and this process's view of every stream;
5. :class:`Handlers`: the client API's and the role's handlers, with what
   they serve, take and run (:class:`Hooks`);
6. :class:`Replication`: the receiver, the command handler and the streamer,
   given those hooks, and the transport that carries them;
7. :class:`Lifecycle`: the listeners and the services that start and stop it all.

Each component is given what it uses through its constructor, and no record
is handed out before it is complete. One registration remains after
construction, by design: handlers make each other's writes through the
internal calls, which run a call in process where it is served, so the calls
learn their handlers once the handlers exist (``calls.serve``). Components
that react to this process's writes (the streamer, the federation outbox,
pusher delivery) subscribe, as they are built, to the replication notifier
the ID generators poke. The result is a
:class:`~synapse_lite.server.HomeServer` record whose ``service`` starts and
stops the process (``app/services.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

import attr
from twisted.internet import defer

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.app.listeners import ListenerResources, ListenersService, MediaEndpoints
from synapse_lite.app.role import Role
from synapse_lite.app.roles import (
    Federation,
    Hooks,
    app_services_for_role,
    client_ip_recorder,
    federation_for_role,
    main_duties,
    media_for_role,
    presence_for_role,
    pushers_for_role,
    typing_for_role,
)
from synapse_lite.app.services import CallbackService, LoopsService, ProcessService
from synapse_lite.appservice.api import ApplicationServiceApi
from synapse_lite.appservice.queries import AppServiceQueries
from synapse_lite.clock import Clock
from synapse_lite.config.homeserver import HomeServerConfig
from synapse_lite.federation.crypto import SigningKey, load_or_create_signing_key
from synapse_lite.federation.inbound import FederationInboundHandler, announce_server_up
from synapse_lite.federation.inbound_edus import InboundEdus
from synapse_lite.federation.keyring import Keyring
from synapse_lite.federation.send_queue import FederationRemoteSendQueue
from synapse_lite.federation.sender.federation_sender import FederationSender
from synapse_lite.federation.server import register_federation_servlets, well_known_resource
from synapse_lite.handlers.account import AccountHandler
from synapse_lite.handlers.account_data import AccountDataHandler
from synapse_lite.handlers.admin import AdminHandler
from synapse_lite.handlers.admin_media import AdminMediaHandler
from synapse_lite.handlers.admin_reports import AdminReportsHandler
from synapse_lite.handlers.admin_room_tools import AdminRoomToolsHandler
from synapse_lite.handlers.admin_rooms import AdminRoomsHandler
from synapse_lite.handlers.admin_users import AdminUsersHandler
from synapse_lite.handlers.auth import AuthHandler
from synapse_lite.handlers.client_events import ClientEventFormatter, PduSigner
from synapse_lite.handlers.device import DeviceHandler
from synapse_lite.handlers.devicemessage import DeviceMessageHandler
from synapse_lite.handlers.directory import DirectoryHandler
from synapse_lite.handlers.e2e_keys import E2eKeysHandler
from synapse_lite.handlers.federation_backfill import Backfiller, BackfillWriter
from synapse_lite.handlers.federation_join import FederationJoinHandler, RemoteJoinWriter
from synapse_lite.handlers.federation_rooms import FederationRoomsHandler, ReceivedEventsWriter
from synapse_lite.handlers.filtering import FilteringHandler
from synapse_lite.handlers.identity import IdentityHandler
from synapse_lite.handlers.inbound_pdus import InboundPdus, InboundQueue
from synapse_lite.handlers.legacy_sync import LegacySyncHandler
from synapse_lite.handlers.login import LoginHandler
from synapse_lite.handlers.message import EventCreationHandler
from synapse_lite.handlers.openid import OpenIdHandler
from synapse_lite.handlers.pagination import PaginationHandler
from synapse_lite.handlers.presence import (
    PresenceHandlerBase,
)
from synapse_lite.handlers.profile import ProfileHandler
from synapse_lite.handlers.purge_history import PurgeHistoryHandler
from synapse_lite.handlers.push import PushActionsHandler
from synapse_lite.handlers.push_rules import PushRulesHandler
from synapse_lite.handlers.receipts import ReceiptsHandler
from synapse_lite.handlers.redact_user import RedactUserHandler
from synapse_lite.handlers.register import RegistrationHandler
from synapse_lite.handlers.registration_tokens import RegistrationTokensHandler
from synapse_lite.handlers.relations import RelationsHandler
from synapse_lite.handlers.remote_devices import RemoteDeviceLists
from synapse_lite.handlers.reports import ReportsHandler
from synapse_lite.handlers.revocation import CACHES_APPLIED, RevocationBarrier
from synapse_lite.handlers.room import RoomCreationHandler
from synapse_lite.handlers.room_deletion import RoomDeletionHandler
from synapse_lite.handlers.room_keys import RoomKeysHandler
from synapse_lite.handlers.room_member import RoomMemberHandler
from synapse_lite.handlers.room_upgrade import RoomUpgradeHandler, UpgradedRoomUserState
from synapse_lite.handlers.search import SearchHandler
from synapse_lite.handlers.server_notices import ServerNoticesHandler
from synapse_lite.handlers.sliding_sync.handler import SlidingSyncHandler
from synapse_lite.handlers.space_hierarchy import SpaceHierarchyHandler
from synapse_lite.handlers.state_gaps import StateGapWriter
from synapse_lite.handlers.sync import SyncHandler
from synapse_lite.handlers.sync_sections.builtin import BuiltInSections
from synapse_lite.handlers.sync_sections.stream_parts import stream_part_sections
from synapse_lite.handlers.typing import (
    TypingFollowerHandler,
    TypingHandlerBase,
    TypingWriterHandler,
)
from synapse_lite.handlers.ui_auth import InteractiveAuthHandler
from synapse_lite.http.forwarded import router_proof
from synapse_lite.http.outbound import OutboundHttpClient
from synapse_lite.http.server import JsonResource
from synapse_lite.http.tls import https_policy_trusting
from synapse_lite.media.repository import MediaRepository
from synapse_lite.notifier import Notifier
from synapse_lite.position_log import PositionLog, position_log_path
from synapse_lite.replication.claim_notes import (
    ClaimNoteSigner,
    ClaimNoteVerifier,
)
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
from synapse_lite.replication.http.federation_rooms import (
    PERSIST_BACKFILLED,
    PERSIST_RECEIVED_EVENT,
    PERSIST_REMOTE_JOIN,
    PERSIST_STATE_GAP,
    PROCESS_INBOUND_PDUS,
)
from synapse_lite.replication.http.forward_extremities import DELETE_FORWARD_EXTREMITIES
from synapse_lite.replication.http.remote_devices import WRITE_REMOTE_DEVICE_LIST
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
    SET_PUSHER,
    SET_ROOM_TAG,
)
from synapse_lite.replication.instance_directory import InstanceDirectory
from synapse_lite.replication.notifier import ReplicationNotifier
from synapse_lite.replication.streams import (
    MemoryPositions,
    Stream,
    StreamPositions,
    no_rows,
)
from synapse_lite.replication.tcp.connection import OutgoingCommands
from synapse_lite.replication.tcp.handler import ReplicationCommandHandler
from synapse_lite.replication.tcp.receiver import (
    PositionWaiters,
    ReplicationReceiver,
)
from synapse_lite.replication.tcp.streamer import ReplicationStreamer
from synapse_lite.replication.transports import ReplicationTransport
from synapse_lite.rest.client import ClientHandlers
from synapse_lite.server import HomeServer
from synapse_lite.storage._base import StoreContext
from synapse_lite.storage.database import DatabasePool, make_startup_connection
from synapse_lite.storage.databases.main import DataStore, GenericWorkerStore
from synapse_lite.storage.databases.main.instances import InstancesWorkerStore
from synapse_lite.storage.databases.main.stream_runs import take_next_stream_run_txn
from synapse_lite.storage.engines import create_engine
from synapse_lite.storage.id_generators.stalls import StallDetector
from synapse_lite.storage.prepare_database import prepare_database
from synapse_lite.storage.stream_ids import StreamIdGenerators

logger = logging.getLogger(__name__)


def build_homeserver(config: HomeServerConfig, instance_name: str, reactor: Any) -> HomeServer:
    """Build one process (see the module docstring); nothing runs until its
    ``service`` is started."""
    role = Role.of(config, instance_name)
    clock = Clock(reactor)
    database = _load_database(config, role, reactor, clock)
    positions = _positions(config, role, database, clock)
    transport = _transport(config, role, reactor, clock, database, positions)
    streams = _streams(config, role, reactor, clock, database, positions, transport)
    handlers = _handlers(config, role, reactor, clock, database, positions, transport, streams)
    replication = _replication(
        config, role, reactor, clock, database, positions, transport, streams, handlers
    )
    lifecycle = _lifecycle(
        config, role, reactor, clock, database, transport, streams, handlers, replication
    )
    return HomeServer(
        config=config,
        instance_name=role.name,
        reactor=reactor,
        clock=clock,
        database_pool=database.pool,
        id_generators=database.id_generators,
        store=database.store,
        directory=database.instances,
        notifier=streams.notifier,
        replication_notifier=database.replication_notifier,
        position_log=database.position_log,
        calls=transport.calls,
        streams=streams.streams,
        waiters=positions.waiters,
        replication=replication.handler,
        streamer=replication.streamer,
        transport=replication.transport,
        handlers=handlers.client,
        typing=streams.typing,
        presence=handlers.presence,
        outbox=streams.federation.outbox,
        keyring=streams.federation.keyring,
        media=handlers.media,
        loops=lifecycle.loops,
        listeners=lifecycle.listeners,
        service=lifecycle.process,
    )


# 1. The database and stores


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Database:
    """The database, every stream's ID generator and the store, loaded from
    one startup connection; the instances table's view."""

    pool: DatabasePool
    id_generators: StreamIdGenerators
    store: GenericWorkerStore
    #: The same store, with its main-only parts, on the main process.
    main_store: DataStore | None
    #: Where the other processes are and who writes events now.
    instances: InstanceDirectory
    #: The typing writer's run number, taken at startup (None elsewhere).
    typing_run: int | None
    #: Poked when this process's ids finish (the generators poke it).
    replication_notifier: ReplicationNotifier
    position_log: PositionLog | None
    #: The main process's key for CHECKED notes, over Redis (None elsewhere).
    claim_note_signer: ClaimNoteSigner | None


def _load_database(config: HomeServerConfig, role: Role, reactor: Any, clock: Clock) -> Database:
    """Check (main: create or upgrade) the schema, then load every ID generator,
    the store and the instances table from one startup connection; the typing
    writer also takes its run number there."""
    start = time.monotonic()
    me = role.name
    replication_notifier = ReplicationNotifier()
    position_log = (
        PositionLog(position_log_path(config.data_dir, me), me) if config.position_log else None
    )
    db_config = config.database
    engine = create_engine(db_config.engine, db_config.args)
    logger.info("Connecting to %s", engine.describe())
    db_conn = make_startup_connection(engine)
    pool: DatabasePool | None = None
    try:
        prepare_database(db_conn, is_main=role.is_main)
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
        main_store = DataStore(pool, db_conn, context) if role.is_main else None
        store = main_store or GenericWorkerStore(pool, db_conn, context)
        instances = InstanceDirectory(config, me, store)
        claim_note_signer = None
        with db_conn.transaction("instances_at_startup") as txn:
            instances.load_at_startup(txn)
            if role.is_main and config.replication.transport == "redis":
                # Recorded before the transport starts: the first note a
                # follower checks finds this key (replication/claim_notes.py).
                claim_note_signer = ClaimNoteSigner(instances.deployment_id)
                InstancesWorkerStore.record_claim_note_key_txn(
                    txn, me, claim_note_signer.verify_key
                )
        typing_run = None
        if role.writes_typing:
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
    return Database(
        pool=pool,
        id_generators=id_generators,
        store=store,
        main_store=main_store,
        instances=instances,
        typing_run=typing_run,
        replication_notifier=replication_notifier,
        position_log=position_log,
        claim_note_signer=claim_note_signer,
    )


# 2. Positions


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Positions:
    """Where this process is on every stream, and the callers waiting to get
    somewhere: built before anything that waits or moves a position."""

    #: Stream name -> its positions (an ID generator's, or the counter of the
    #: component keeping the stream in memory).
    of: dict[str, StreamPositions]
    #: The counters of the streams kept in memory, for their owners.
    memory: dict[str, MemoryPositions]
    waiters: PositionWaiters


def _positions(config: HomeServerConfig, role: Role, database: Database, clock: Clock) -> Positions:
    memory = {
        "typing": (
            TypingWriterHandler.positions(database.typing_run)
            if database.typing_run is not None
            else TypingFollowerHandler.positions()
        ),
        # The main process's queue counts its own; elsewhere a copy (a
        # sender worker's) or a constant 0.
        "federation": (
            FederationRemoteSendQueue.positions(clock)
            if role.is_main and not role.sends_federation
            else MemoryPositions()
        ),
    }
    of: dict[str, StreamPositions] = {}
    for definition in config.streams:
        if definition.ids is not None:
            of[definition.name] = database.id_generators.of(definition)
        else:
            of[definition.name] = memory[definition.name]
    waiters = PositionWaiters(clock, role.name, of, reads=role.subscription(config.streams))
    return Positions(of=of, memory=memory, waiters=waiters)


# 3. Transport: how this process reaches the others


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Transport:
    """Internal calls to the other processes, and replication commands out."""

    calls: InternalCalls
    outgoing: OutgoingCommands


def _transport(
    config: HomeServerConfig,
    role: Role,
    reactor: Any,
    clock: Clock,
    database: Database,
    positions: Positions,
) -> Transport:
    calls = InternalCalls(
        config=config,
        instance_name=role.name,
        clock=clock,
        reactor=reactor,
        locations=database.instances,
        waiter=positions.waiters,
    )
    return Transport(calls=calls, outgoing=OutgoingCommands())


# 4. Streams: the components keeping streams in memory, and every stream


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Streams:
    """This process's view of every stream, the components owning the streams
    kept in memory (typing, federation), and the /sync notifier they wake."""

    streams: dict[str, Stream]
    typing: TypingHandlerBase
    typing_hooks: Hooks
    federation: Federation
    notifier: Notifier


def _streams(
    config: HomeServerConfig,
    role: Role,
    reactor: Any,
    clock: Clock,
    database: Database,
    positions: Positions,
    transport: Transport,
) -> Streams:
    notifier = Notifier(clock)
    store, local_writes = database.store, database.replication_notifier
    typing, typing_rows, typing_hooks = typing_for_role(
        role,
        config,
        clock,
        store,
        positions.memory["typing"],
        notifier,
        local_writes,
        transport.calls,
    )
    federation = federation_for_role(
        role,
        config,
        reactor,
        clock,
        store,
        positions.memory["federation"],
        local_writes,
        transport.calls,
        transport.outgoing,
        typing,
    )
    memory_rows = {"typing": typing_rows, "federation": federation.rows}
    streams: dict[str, Stream] = {}
    for definition in config.streams:
        if definition.rows_from_store is not None:
            update_function = definition.rows_from_store(database.store)
        else:
            update_function = memory_rows[definition.name] or no_rows(definition.name)
        streams[definition.name] = Stream(
            definition, positions.of[definition.name], update_function, role.name
        )
    return Streams(
        streams=streams,
        typing=typing,
        typing_hooks=typing_hooks,
        federation=federation,
        notifier=notifier,
    )


# 5. Handlers


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Handlers:
    """The handlers of the client API and of the role, and what they serve,
    take and run."""

    client: ClientHandlers
    presence: PresenceHandlerBase
    media: MediaRepository | None
    media_endpoints: MediaEndpoints
    #: Handles federation requests, where they are served.
    inbound: FederationInboundHandler | None
    #: Serves our rooms to other servers, where federation is served.
    rooms: FederationRoomsHandler | None
    #: Our users' memberships in other servers' rooms; serves their invites.
    remote_members: FederationJoinHandler | None
    #: Other servers' users' device lists; ours served to other servers.
    device_lists: RemoteDeviceLists
    stalls: StallDetector
    hooks: Hooks


def _handlers(
    config: HomeServerConfig,
    role: Role,
    reactor: Any,
    clock: Clock,
    database: Database,
    positions: Positions,
    transport: Transport,
    streams: Streams,
) -> Handlers:
    me = role.name
    store = database.store
    calls = transport.calls
    notifier = streams.notifier
    typing = streams.typing
    federation = streams.federation
    server_name = config.server_name
    event_writers = database.instances.event_writers
    presence, presence_hooks = presence_for_role(
        role, store, clock, notifier, calls, transport.outgoing
    )
    auth = AuthHandler(
        store,
        client_ip_recorder(clock, database.main_store, transport.outgoing),
        config.allow_guest_access,
        config.app_services,
    )
    # Requests to application services (transactions, queries, pings).
    app_service_api = ApplicationServiceApi(
        reactor, https_policy_trusting(config.outbound_requests.extra_ca_paths)
    )
    app_service_sender, app_service_hooks = app_services_for_role(
        role,
        config,
        clock,
        store,
        app_service_api,
        database.replication_notifier,
        reactor,
        typing,
    )
    app_service_queries = AppServiceQueries(
        config.app_services,
        app_service_api,
        store,
        app_service_sender.retry_now if app_service_sender is not None else None,
    )
    # Requests to servers users name (identity servers, pages to preview).
    outbound = OutboundHttpClient(
        reactor,
        config.outbound_requests,
        https_policy_trusting(config.outbound_requests.extra_ca_paths),
    )
    # One keyring per process, shared by media, joins and backfill.
    keyring = _keyring_on_demand(config, clock, store, federation)
    media, media_endpoints, media_hooks = media_for_role(
        role,
        config,
        store,
        clock,
        reactor,
        auth,
        outbound,
        federation.queries.client if federation.queries is not None else None,
        # Other servers' keys, for signed federation media requests.
        keyring,
    )
    # Every process answers a revoking writer once it has forgotten the tokens.
    revocations = RevocationBarrier(
        me=me,
        clock=clock,
        calls=calls,
        waiters=positions.waiters,
        caches=positions.of["caches"],
        processes=config.instance_names,
    )
    devices = DeviceHandler(store, calls, config, notifier, revocations)
    push = PushActionsHandler(store, server_name) if role.writes_events else None
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
    # Other servers' users' device lists (and ours served to them).
    device_lists = RemoteDeviceLists(
        store=store,
        calls=calls,
        writers=config.writers,
        server_name=server_name,
        notifier=notifier,
        get_client=federation.queries.client if federation.queries is not None else None,
    )
    e2e_keys = E2eKeysHandler(store, calls, config, notifier, remote=device_lists)
    ui_auth = InteractiveAuthHandler(store, clock, config)
    registration_tokens = RegistrationTokensHandler(store, clock)
    account_data = AccountDataHandler(store, notifier, calls)
    push_rules = PushRulesHandler(store, notifier, calls)
    upgraded_rooms = UpgradedRoomUserState(store, account_data, push_rules)
    remote = _remote_membership(
        config, keyring, clock, store, federation, calls, event_writers, device_lists
    )
    remote_members, backfiller = remote if remote is not None else (None, None)
    members = RoomMemberHandler(
        store, clock, server_name, events, upgraded_rooms, app_service_queries, remote_members
    )
    room_creation = RoomCreationHandler(
        app_service_queries=app_service_queries,
        store=store,
        clock=clock,
        server_name=server_name,
        events=events,
        writers=config.writers,
        event_writers=event_writers,
        remote_invites=remote_members,
    )

    def signing_key() -> SigningKey:
        return load_or_create_signing_key(config.data_dir, create=False)

    # One formatter for /sync, /messages and /context: the filters'
    # ``event_format: federation`` signs with the server's key.
    formatter = ClientEventFormatter(store, PduSigner(server_name, signing_key))
    pagination = PaginationHandler(store, clock, formatter, lambda: backfiller)
    relations = RelationsHandler(store, clock, pagination)
    identity = IdentityHandler(store, outbound, signing_key, server_name)
    sync = SyncHandler(
        store=store,
        clock=clock,
        config=config,
        notifier=notifier,
        presence=presence,
        streams=streams.streams,
        waiters=positions.waiters,
        event_writers=event_writers,
        position_log=database.position_log,
        sections=BuiltInSections.build(store, typing, formatter, relations),
        stream_sections=stream_part_sections(config.streams, store),
    )
    sliding_sync = SlidingSyncHandler(
        store=store,
        clock=clock,
        config=config,
        sync=sync,
        notifier=notifier,
        presence=presence,
        typing=typing,
        formatter=formatter,
        relations=relations,
    )
    account = AccountHandler(store, ui_auth, devices, members, identity)
    room_deletion = RoomDeletionHandler(store, members, server_name)
    purge_history = PurgeHistoryHandler(store, server_name)
    redact_user = RedactUserHandler(store, server_name, events)
    admin_rooms = AdminRoomsHandler(store, clock, server_name, formatter)
    profiles = ProfileHandler(
        store, clock, server_name, events, app_service_queries, federation.queries
    )
    admin_users = AdminUsersHandler(store, server_name, devices, account, profiles, members)
    directory = DirectoryHandler(
        store, server_name, clock, events, app_service_queries, federation.queries
    )
    client = ClientHandlers(
        clock=clock,
        auth=auth,
        registration=RegistrationHandler(
            store, clock, config, devices, ui_auth, registration_tokens
        ),
        registration_tokens=registration_tokens,
        login=LoginHandler(store, clock, config, devices),
        devices=devices,
        filtering=FilteringHandler(store),
        sync=sync,
        sliding_sync=sliding_sync,
        legacy_sync=LegacySyncHandler(
            store=store,
            clock=clock,
            limits=config.limits,
            sync=sync,
            pagination=pagination,
            notifier=notifier,
            typing=typing,
            presence=presence,
            formatter=formatter,
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
        account=account,
        reports=ReportsHandler(store, server_name),
        admin=AdminHandler(
            store,
            auth,
            lambda name: announce_server_up(
                transport.outgoing.send_command, federation.outbox, name
            ),
        ),
        admin_users=admin_users,
        admin_media=AdminMediaHandler(
            store, server_name, admin_users, calls, config.media_instance
        ),
        server_notices=ServerNoticesHandler(
            store,
            server_name,
            config.server_notices,
            room_creation,
            events,
            account_data,
            profiles,
        ),
        admin_rooms=admin_rooms,
        admin_room_tools=AdminRoomToolsHandler(store, server_name, events, members),
        admin_reports=AdminReportsHandler(store, clock, admin_rooms, formatter),
        room_deletion=room_deletion,
        purge_history=purge_history,
        redact_user=redact_user,
        openid=OpenIdHandler(store, clock, server_name),
        push_rules=push_rules,
        turn=config.turn,
        profiles=profiles,
        directory=directory,
        spaces=SpaceHierarchyHandler(store, server_name, clock, directory, federation.queries),
        relations=relations,
        search=SearchHandler(store, clock, pagination),
        identity=identity,
        server_name=server_name,
        app_service_queries=app_service_queries,
    )
    # The streams it reads or writes: another's view stands still by design.
    reads = role.subscription(config.streams)
    stalls = StallDetector(
        clock,
        me,
        [
            (database.id_generators.of(d), not d.writers.any_process)
            for d in config.streams.with_ids()
            if reads is None or d.name in reads or config.writers.writes(me, d.name)
        ],
    )
    # Other servers' events (remote joins) are persisted by the room's writer.
    received_writer = ReceivedEventsWriter(store, events)
    # Queued PDUs of received transactions too (handlers/inbound_pdus.py).
    inbound_queue = InboundQueue(
        store=store, clock=clock, events=events, instance_name=me, event_writers=event_writers
    )
    remote_join_writer = RemoteJoinWriter(store, events)
    received_hooks = (
        Hooks(
            served=(
                (PERSIST_RECEIVED_EVENT, received_writer.persist_received),
                (PROCESS_INBOUND_PDUS, inbound_queue.process),
                (PERSIST_REMOTE_JOIN, remote_join_writer.persist),
                (PERSIST_BACKFILLED, BackfillWriter(store, me, event_writers).persist),
                (PERSIST_STATE_GAP, StateGapWriter(store, events).persist),
            ),
            loops=(inbound_queue,),
        )
        if role.writes_events
        else Hooks()
    )
    hooks = (
        streams.typing_hooks
        + received_hooks
        + presence_hooks
        + federation.hooks
        + media_hooks
        + _writes_served(role, client, streams.streams)
        + main_duties(role, config, clock, database.main_store, database.instances, reactor)
        + pushers_for_role(
            role, config, clock, store, calls, database.replication_notifier, reactor
        )
        + app_service_hooks
        + Hooks(loops=(stalls,), served=((CACHES_APPLIED, revocations.apply_here),))
        + (
            Hooks(served=((WRITE_REMOTE_DEVICE_LIST, device_lists.write),))
            if role.writes_device_lists
            else Hooks()
        )
        # The main process resumes the admin jobs a restart interrupted.
        + (Hooks(loops=(room_deletion, purge_history, redact_user)) if role.is_main else Hooks())
    )
    inbound = None
    rooms = None
    if federation.keyring is not None:
        rooms = FederationRoomsHandler(
            store=store,
            clock=clock,
            server_name=server_name,
            keyring=federation.keyring,
            formatter=formatter,
            signing_key=signing_key,
            calls=calls,
            event_writers=event_writers,
        )
        inbound = FederationInboundHandler(
            store=store,
            server_name=server_name,
            device_messages=device_messages,
            send_command=transport.outgoing.send_command,
            outbox=federation.outbox,
            pdus=InboundPdus(
                store=store,
                clock=clock,
                server_name=server_name,
                keyring=federation.keyring,
                client=federation.client,
                calls=calls,
                event_writers=event_writers,
            )
            if federation.client is not None
            else None,
            edus=InboundEdus(
                store=store,
                typing=typing,
                calls=calls,
                device_lists=device_lists.on_edu,
                clock=clock,
            ),
        )
    # The one registration after construction: handlers make each other's
    # writes through ``calls``, which runs a call here when this process
    # serves it, so the calls learn their handlers once these are built.
    for call, handler in hooks.served:
        if call.served_by is None or calls.server_of(call) == me:
            calls.serve(call, handler)
    return Handlers(
        client=client,
        presence=presence,
        media=media,
        media_endpoints=media_endpoints,
        inbound=inbound,
        rooms=rooms,
        remote_members=remote_members,
        device_lists=device_lists,
        stalls=stalls,
        hooks=hooks,
    )


def _keyring_on_demand(
    config: HomeServerConfig, clock: Clock, store: GenericWorkerStore, federation: Federation
) -> Callable[[], Keyring] | None:
    """This process's keyring or, where it has none, one made on first use
    (with its federation client, made on first use too); None where the
    process has no way to ask other servers."""
    queries = federation.queries
    if queries is None:
        return None
    made: list[Keyring] = []

    def keyring() -> Keyring:
        if federation.keyring is not None:
            return federation.keyring
        if not made:
            made.append(
                Keyring(
                    store=store,
                    clock=clock,
                    config=config.federation,
                    client=queries.client(),
                    signing_key=load_or_create_signing_key(config.data_dir, create=False),
                    server_name=config.server_name,
                )
            )
        return made[0]

    return keyring


def _remote_membership(
    config: HomeServerConfig,
    keyring: Callable[[], Keyring] | None,
    clock: Clock,
    store: GenericWorkerStore,
    federation: Federation,
    calls: InternalCalls,
    event_writers: Callable[[], Sequence[str]],
    device_lists: RemoteDeviceLists,
) -> tuple[FederationJoinHandler, Backfiller] | None:
    """Joins and leaves of our users in other servers' rooms, and backfill
    of their history, through this process's federation client (a client
    worker's own, made on first use) and ``keyring`` (see
    :func:`_keyring_on_demand`)."""
    queries = federation.queries
    if queries is None or keyring is None:
        return None

    def signing_key() -> SigningKey:
        return load_or_create_signing_key(config.data_dir, create=False)

    return FederationJoinHandler(
        store=store,
        clock=clock,
        server_name=config.server_name,
        client=queries.client,
        keyring=keyring,
        signing_key=signing_key,
        calls=calls,
        writers=config.writers,
        event_writers=event_writers,
        device_lists=device_lists,
    ), Backfiller(
        store=store,
        clock=clock,
        server_name=config.server_name,
        client=queries.client,
        keyring=keyring,
        calls=calls,
        event_writers=event_writers,
    )


def _writes_served(role: Role, client: ClientHandlers, streams: dict[str, Stream]) -> Hooks:
    """The internal calls the client handlers serve: a stream's writes where
    this process writes it (``calls.serve`` keeps those this process serves),
    and every stream's rows written here."""
    writes: list[tuple[InternalCall[Any, Any], Any]] = []
    if role.writes_events:
        writes.append((SEND_EVENTS, client.events.persist_events))
        writes.append((DELETE_FORWARD_EXTREMITIES, client.events.delete_extremities_as_writer))
    writes += [
        (ADD_ACCOUNT_DATA, client.account_data.write_account_data),
        (EDIT_PUSH_RULES, client.push_rules.write_edit),
        (SET_PUSHER, client.push_rules.write_pusher),
        (REMOVE_DEVICE_PUSHERS, client.push_rules.remove_device_pushers),
        (SET_ROOM_TAG, client.account_data.write_tag),
        (SEND_RECEIPT, client.receipts.write_receipt),
        (SEND_TO_DEVICE, client.device_messages.write_messages),
        (RECEIVE_REMOTE_TO_DEVICE, client.device_messages.write_remote_messages),
    ]
    if role.writes_device_lists:
        writes += [
            (REGISTER_DEVICE, client.devices.store_device_and_token),
            (DELETE_DEVICES, client.devices.logout_devices),
            (RENAME_DEVICE, client.devices.rename_device_here),
            (UPLOAD_DEVICE_KEYS, client.e2e_keys.store_device_keys),
            (UPLOAD_CROSS_SIGNING_KEYS, client.e2e_keys.store_cross_signing_keys),
            (UPLOAD_SIGNATURES, client.e2e_keys.store_signatures),
        ]
    writes.append((GET_STREAM_UPDATES, _stream_updates_server(role.name, streams)))
    return Hooks(served=tuple(writes))


# 6. Replication


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Replication:
    """Receiving other processes' rows and commands, sending this one's, and
    the transport carrying them."""

    handler: ReplicationCommandHandler
    streamer: ReplicationStreamer
    transport: ReplicationTransport


def _replication(
    config: HomeServerConfig,
    role: Role,
    reactor: Any,
    clock: Clock,
    database: Database,
    positions: Positions,
    transport: Transport,
    streams: Streams,
    handlers: Handlers,
) -> Replication:
    me = role.name
    instances = database.instances
    receiver = ReplicationReceiver(
        database.store,
        streams.streams,
        streams.notifier,
        positions.waiters,
        row_hooks=(
            ("events", instances.on_events_rows),
            ("caches", instances.on_caches_rows),
            *handlers.hooks.row_hooks,
        ),
    )
    handler = ReplicationCommandHandler(
        instance_name=me,
        clock=clock,
        streams=streams.streams,
        receiver=receiver,
        claims=_peer_claims(config, clock, streams.streams, database, transport.outgoing),
        outgoing=transport.outgoing,
        greetings=(handlers.presence.get_user_sync_commands,),
        command_hooks=handlers.hooks.command_hooks,
        retired_writers=instances,
        followed_streams=role.subscription(config.streams),
    )
    streamer = ReplicationStreamer(
        instance_name=me,
        clock=clock,
        handler=handler,
        streams=[streams.streams[name] for name in config.writers.streams_written_by(me)],
        position_log=database.position_log,
        local_writes=database.replication_notifier,
        vouch=_claim_notes_out(database.claim_note_signer, transport.outgoing),
    )
    return Replication(
        handler=handler,
        streamer=streamer,
        transport=ReplicationTransport(
            config,
            me,
            handler,
            reactor,
            deployment_id=instances.deployment_id,
            followed_streams=role.subscription(config.streams),
        ),
    )


def _claim_notes_out(
    signer: ClaimNoteSigner | None, outgoing: OutgoingCommands
) -> Callable[[str, int], None] | None:
    """How the main process over Redis publishes a CHECKED note (of each of
    its sequence reads, and of its own claims, so that nobody else reads a
    sequence for them); None elsewhere."""
    if signer is None:
        return None
    return lambda stream, position: outgoing.send_command(signer.note(stream, position))


def _peer_claims(
    config: HomeServerConfig,
    clock: Clock,
    streams: dict[str, Stream],
    database: Database,
    outgoing: OutgoingCommands,
) -> PeerClaims:
    """Who may claim positions of which stream: its configured writers; for a
    stream whose writers follow the instances table, those it has now too;
    for a stream any process writes, any process the config or the table
    knows. Over Redis the main process publishes its sequence reads as
    signed notes and the others take them (``replication/claim_notes.py``)."""
    writers = config.writers
    instances = database.instances

    def writers_of(stream_name: str) -> Collection[str] | None:
        definition = config.streams.get(stream_name)
        if definition is None:
            return ()
        if definition.writers.follows_instances:
            return (*writers.writers(stream_name), *instances.event_writers())
        return writers.writers(stream_name) or config.instance_names()

    async def look_up_writer(stream_name: str, writer: str) -> bool:
        definition = config.streams.get(stream_name)
        if definition is None:
            return False
        if definition.writers.follows_instances:
            await instances.refresh()
            return writer in instances.event_writers()
        if definition.writers.any_process:
            await instances.refresh()
            return instances.is_known(writer)
        return False

    signer = database.claim_note_signer
    notes = None
    if config.replication.transport == "redis" and signer is None:
        notes = ClaimNoteVerifier(instances.deployment_id, database.store.get_claim_note_key, clock)
    return PeerClaims(
        clock,
        streams,
        writers_of,
        look_up_writer,
        notes=notes,
        publish_read=_claim_notes_out(signer, outgoing),
    )


# 7. Listeners and the lifecycle


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Lifecycle:
    """What starts and stops the process."""

    loops: LoopsService
    listeners: ListenersService
    process: ProcessService


def _lifecycle(
    config: HomeServerConfig,
    role: Role,
    reactor: Any,
    clock: Clock,
    database: Database,
    transport: Transport,
    streams: Streams,
    handlers: Handlers,
    replication: Replication,
) -> Lifecycle:
    me = role.name
    federation = streams.federation
    federation_servlets = None
    if federation.keyring is not None and handlers.inbound is not None:
        keyring, inbound, openid = federation.keyring, handlers.inbound, handlers.client.openid
        rooms = handlers.rooms
        profiles, directory = handlers.client.profiles, handlers.client.directory
        spaces = handlers.client.spaces
        invites = handlers.remote_members
        user_keys = (handlers.device_lists, handlers.client.e2e_keys)

        def federation_servlets(resource: JsonResource, resources: tuple[str, ...]) -> None:
            register_federation_servlets(
                resource,
                resources,
                keyring=keyring,
                inbound=inbound,
                server_name=config.server_name,
                openid=openid,
                rooms=rooms,
                profiles=profiles,
                directory=directory,
                invites=invites,
                user_keys=user_keys,
                spaces=spaces,
            )

    stalls, replication_transport = handlers.stalls, replication.transport
    sender = federation.outbox

    def problems() -> list[str]:
        return [*stalls.reasons(), *replication_transport.problems()]

    listeners = ListenersService(
        reactor=reactor,
        clock=clock,
        listeners=config.listeners_of(me),
        resources=ListenerResources(
            instance_name=me,
            client=handlers.client,
            replication=transport.calls.resource,
            federation=federation_servlets,
            media=handlers.media_endpoints,
            problems=problems,
            health_details=sender.health if isinstance(sender, FederationSender) else None,
            well_known=well_known_resource(config.federation),
        ),
        max_body_bytes=config.limits.max_request_body_bytes,
        router_proof=(
            router_proof(config.worker_replication_secret)
            if config.worker_replication_secret
            else None
        ),
    )

    async def close_clients() -> None:
        await transport.calls.close()
        if federation.client is not None:
            await federation.client.close()
        if federation.close_queries is not None:
            await federation.close_queries()

    async def flush_positions() -> None:
        await database.id_generators.flush_stream_positions()
        await clock.timeout(defer.ensureDeferred(replication.streamer.send_pending()), 2.0)

    media = handlers.media
    loops = LoopsService([replication.streamer, *handlers.hooks.loops])
    process = ProcessService(clock, me)
    # Stopped in the reverse order (see app/services.py).
    for child in (
        CallbackService("database", stop=database.pool.close),
        CallbackService(
            "position log",
            stop=database.position_log.close if database.position_log is not None else None,
        ),
        CallbackService("http clients", stop=close_clients),
        CallbackService("media jobs", stop=media.finish_jobs if media is not None else None),
        CallbackService(
            "replication", start=replication.transport.start, stop=replication.transport.stop
        ),
        CallbackService("user syncs", stop=handlers.presence.end_of_syncs),
        CallbackService("stream positions", stop=flush_positions),
        loops,
        CallbackService(
            "rooms of removed writers",
            start=(lambda: _reassign_rooms(database.store, database.instances))
            if role.is_main
            else None,
        ),
        listeners,
    ):
        child.setServiceParent(process)
    return Lifecycle(loops=loops, listeners=listeners, process=process)


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


def _reassign_rooms(store: GenericWorkerStore, instances: InstanceDirectory) -> None:
    """Main process, at startup: rooms whose events writer is no longer
    configured get a new one (sends to them fail with a retryable 503 until
    then; see ``RoomWorkerStore.reassign_rooms_of_removed_writers``)."""

    async def reassign() -> None:
        moved = await store.reassign_rooms_of_removed_writers(instances.event_writers())
        if moved:
            logger.info("Moved %d room(s) to configured events writers", moved)

    defer.ensureDeferred(reassign()).addErrback(
        lambda f: logger.error("Reassigning rooms failed: %s", f.getTraceback())
    )
