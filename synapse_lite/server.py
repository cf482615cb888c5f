"""The HomeServer object: one process's config, database and components.

Components are built on first use; the database and every stream's ID generator
are loaded by :meth:`HomeServer.setup`, synchronously, before anything serves.
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from synapse_lite.clock import Clock
from synapse_lite.config.homeserver import MAIN_PROCESS, HomeServerConfig
from synapse_lite.position_log import PositionLog, position_log_path
from synapse_lite.replication.notifier import ReplicationNotifier
from synapse_lite.storage.database import DatabasePool, make_startup_connection
from synapse_lite.storage.engines import create_engine
from synapse_lite.storage.prepare_database import prepare_database

if TYPE_CHECKING:
    from synapse_lite.federation.client import FederationClient
    from synapse_lite.federation.crypto import SigningKey
    from synapse_lite.federation.inbound import FederationInboundHandler
    from synapse_lite.federation.keyring import Keyring
    from synapse_lite.federation.outbox import OutboxConsumer
    from synapse_lite.handlers.account_data import AccountDataHandler
    from synapse_lite.handlers.auth import AuthHandler
    from synapse_lite.handlers.device import DeviceHandler
    from synapse_lite.handlers.devicemessage import DeviceMessageHandler
    from synapse_lite.handlers.filtering import FilteringHandler
    from synapse_lite.handlers.login import LoginHandler
    from synapse_lite.handlers.message import EventCreationHandler
    from synapse_lite.handlers.pagination import PaginationHandler
    from synapse_lite.handlers.receipts import ReceiptsHandler
    from synapse_lite.handlers.register import RegistrationHandler
    from synapse_lite.handlers.room import RoomCreationHandler
    from synapse_lite.handlers.room_member import RoomMemberHandler
    from synapse_lite.handlers.sync import SyncHandler
    from synapse_lite.handlers.typing import TypingHandlerBase
    from synapse_lite.notifier import Notifier
    from synapse_lite.replication.http._base import ReplicationClient
    from synapse_lite.replication.instance_directory import InstanceDirectory
    from synapse_lite.replication.tcp.handler import ReplicationCommandHandler
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)


class HomeServer:
    """One process of the homeserver: the main process or a worker."""

    def __init__(self, config: HomeServerConfig, instance_name: str, reactor: Any) -> None:
        self.config = config
        self.instance_name = instance_name
        self.hostname = config.server_name
        self.reactor = reactor
        self.clock = Clock(reactor)
        #: Differs on every run: names this run in USER_SYNC commands.
        self.instance_id = secrets.token_hex(8)
        self.is_main_process = instance_name == MAIN_PROCESS
        self.replication_notifier = ReplicationNotifier()
        self.position_log: PositionLog | None = None
        if config.position_log:
            self.position_log = PositionLog(
                position_log_path(config.data_dir, instance_name), instance_name
            )
        self._datastore: GenericWorkerStore | None = None
        self.database_pool: DatabasePool | None = None

    def is_mine_id(self, user_id: str) -> bool:
        """Whether a user id belongs to this server."""
        return user_id.startswith("@") and user_id.endswith(":" + self.hostname)

    def setup(self) -> None:
        """Check (main: create or upgrade) the schema and load every store and
        ID generator from one startup connection."""
        from synapse_lite.storage.databases.main import DataStore, GenericWorkerStore

        start = time.monotonic()
        db_config = self.config.database
        engine = create_engine(db_config.engine, db_config.args)
        logger.info("Connecting to %s", engine.describe())
        db_conn = make_startup_connection(engine)
        try:
            prepare_database(db_conn, is_main=self.is_main_process)
            self.database_pool = DatabasePool(
                self.reactor,
                engine,
                min_connections=db_config.min_connections,
                max_connections=db_config.max_connections,
            )
            store_class = DataStore if self.is_main_process else GenericWorkerStore
            self._datastore = store_class(self.database_pool, db_conn, self)
            with db_conn.transaction("instances_at_startup") as txn:
                self.instance_directory.load_at_startup(txn)
        finally:
            db_conn.close()
        logger.info("Loaded the database in %.3f s", time.monotonic() - start)

    @property
    def datastore(self) -> GenericWorkerStore:
        if self._datastore is None:
            raise RuntimeError("HomeServer.setup() has not been called")
        return self._datastore

    # Components, built on first use

    @functools.cached_property
    def notifier(self) -> Notifier:
        from synapse_lite.notifier import Notifier

        return Notifier(self)

    @functools.cached_property
    def replication(self) -> ReplicationCommandHandler:
        from synapse_lite.replication.setup import build_replication

        return build_replication(self)

    @functools.cached_property
    def instance_directory(self) -> InstanceDirectory:
        from synapse_lite.replication.instance_directory import InstanceDirectory

        return InstanceDirectory(self)

    @functools.cached_property
    def replication_client(self) -> ReplicationClient:
        from synapse_lite.replication.http._base import ReplicationClient

        return ReplicationClient(self)

    @functools.cached_property
    def typing_handler(self) -> TypingHandlerBase:
        from synapse_lite.handlers.typing import TypingFollowerHandler, TypingWriterHandler

        if self.config.stream_writers.typing == self.instance_name:
            return TypingWriterHandler(self)
        return TypingFollowerHandler(self)

    @functools.cached_property
    def presence_handler(self) -> Any:
        from synapse_lite.handlers.presence import build_presence_handler

        return build_presence_handler(self)

    # Federation (synapse_lite/federation/)

    @functools.cached_property
    def signing_key(self) -> SigningKey:
        """This server's ed25519 key, from ``data_dir`` (the main process
        creates it on its first start)."""
        from synapse_lite.federation.crypto import load_or_create_signing_key

        return load_or_create_signing_key(self.config.data_dir, create=self.is_main_process)

    @functools.cached_property
    def keyring(self) -> Keyring:
        from synapse_lite.federation.keyring import Keyring

        return Keyring(self)

    @functools.cached_property
    def federation_client(self) -> FederationClient:
        from synapse_lite.federation.client import FederationClient

        return FederationClient(self)

    @functools.cached_property
    def federation_handler(self) -> FederationInboundHandler:
        from synapse_lite.federation.inbound import FederationInboundHandler

        return FederationInboundHandler(self)

    @functools.cached_property
    def federation_sender(self) -> OutboxConsumer | None:
        """What hears of queued EDUs here: the ``FederationSender`` on the
        configured sender, the federation stream's queue on the main process
        when a worker sends, nothing elsewhere."""
        from synapse_lite.federation.send_queue import FederationRemoteSendQueue
        from synapse_lite.federation.sender.federation_sender import FederationSender

        if self.config.federation_sender == self.instance_name:
            return FederationSender(self)
        if self.is_main_process:
            return FederationRemoteSendQueue(self)
        return None

    # Client API handlers (synapse_lite/handlers/), one per concept

    @functools.cached_property
    def auth_handler(self) -> AuthHandler:
        from synapse_lite.handlers.auth import AuthHandler

        return AuthHandler(self)

    @functools.cached_property
    def registration_handler(self) -> RegistrationHandler:
        from synapse_lite.handlers.register import RegistrationHandler

        return RegistrationHandler(self)

    @functools.cached_property
    def login_handler(self) -> LoginHandler:
        from synapse_lite.handlers.login import LoginHandler

        return LoginHandler(self)

    @functools.cached_property
    def device_handler(self) -> DeviceHandler:
        from synapse_lite.handlers.device import DeviceHandler

        return DeviceHandler(self)

    @functools.cached_property
    def event_creation_handler(self) -> EventCreationHandler:
        from synapse_lite.handlers.message import EventCreationHandler

        return EventCreationHandler(self)

    @functools.cached_property
    def room_creation_handler(self) -> RoomCreationHandler:
        from synapse_lite.handlers.room import RoomCreationHandler

        return RoomCreationHandler(self)

    @functools.cached_property
    def room_member_handler(self) -> RoomMemberHandler:
        from synapse_lite.handlers.room_member import RoomMemberHandler

        return RoomMemberHandler(self)

    @functools.cached_property
    def sync_handler(self) -> SyncHandler:
        from synapse_lite.handlers.sync import SyncHandler

        return SyncHandler(self)

    @functools.cached_property
    def pagination_handler(self) -> PaginationHandler:
        from synapse_lite.handlers.pagination import PaginationHandler

        return PaginationHandler(self)

    @functools.cached_property
    def filtering_handler(self) -> FilteringHandler:
        from synapse_lite.handlers.filtering import FilteringHandler

        return FilteringHandler(self)

    @functools.cached_property
    def receipts_handler(self) -> ReceiptsHandler:
        from synapse_lite.handlers.receipts import ReceiptsHandler

        return ReceiptsHandler(self)

    @functools.cached_property
    def account_data_handler(self) -> AccountDataHandler:
        from synapse_lite.handlers.account_data import AccountDataHandler

        return AccountDataHandler(self)

    @functools.cached_property
    def device_message_handler(self) -> DeviceMessageHandler:
        from synapse_lite.handlers.devicemessage import DeviceMessageHandler

        return DeviceMessageHandler(self)

    def stop_background_tasks(self) -> None:
        """Stop the looping calls of the components built so far."""
        built = self.__dict__
        if "replication" in built:
            built["replication"].stop()
            if built["replication"].streamer is not None:
                built["replication"].streamer.stop()
        for name in ("typing_handler", "presence_handler", "federation_sender"):
            component = built.get(name)
            stop = getattr(component, "stop_loops", None)
            if stop is not None:
                stop()

    def shutdown(self) -> None:
        """Stop background work; release the database pool and the position log."""
        self.stop_background_tasks()
        if self.database_pool is not None:
            self.database_pool.close()
        if "federation_client" in self.__dict__:
            self.federation_client.close()
        if self.position_log is not None:
            self.position_log.close()
