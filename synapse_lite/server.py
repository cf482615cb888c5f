"""One built process of the homeserver: what the composition root made.

:class:`HomeServer` is a record, not a locator: every part is built eagerly,
in order, by ``synapse_lite/app/composition.py`` (the only place that picks
classes for the process's role), and no component receives the record --
each got the few collaborators it uses through its constructor. The entry
point starts and stops :attr:`HomeServer.service`; tests reach into the
record to drive and inspect the parts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attr

if TYPE_CHECKING:
    from synapse_lite.app.listeners import ListenersService
    from synapse_lite.app.services import LoopsService, ProcessService
    from synapse_lite.clock import Clock
    from synapse_lite.config.homeserver import HomeServerConfig
    from synapse_lite.federation.keyring import Keyring
    from synapse_lite.federation.outbox import OutboxConsumer
    from synapse_lite.handlers.presence import PresenceHandlerBase
    from synapse_lite.handlers.typing import TypingHandlerBase
    from synapse_lite.media.repository import MediaRepository
    from synapse_lite.notifier import Notifier
    from synapse_lite.position_log import PositionLog
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.replication.instance_directory import InstanceDirectory
    from synapse_lite.replication.notifier import ReplicationNotifier
    from synapse_lite.replication.streams import Stream
    from synapse_lite.replication.tcp.handler import ReplicationCommandHandler
    from synapse_lite.replication.tcp.receiver import PositionWaiters
    from synapse_lite.replication.tcp.streamer import ReplicationStreamer
    from synapse_lite.replication.transports import ReplicationTransport
    from synapse_lite.rest.client import ClientHandlers
    from synapse_lite.storage.database import DatabasePool
    from synapse_lite.storage.databases.main import GenericWorkerStore
    from synapse_lite.storage.stream_ids import StreamIdGenerators


@attr.s(slots=True, frozen=True, auto_attribs=True, kw_only=True)
class HomeServer:
    """One process: the main process or a worker (see the module docstring)."""

    config: HomeServerConfig
    instance_name: str
    reactor: Any
    clock: Clock
    database_pool: DatabasePool
    id_generators: StreamIdGenerators
    store: GenericWorkerStore
    directory: InstanceDirectory
    notifier: Notifier
    replication_notifier: ReplicationNotifier
    position_log: PositionLog | None
    calls: InternalCalls
    streams: dict[str, Stream]
    waiters: PositionWaiters
    replication: ReplicationCommandHandler
    streamer: ReplicationStreamer
    transport: ReplicationTransport
    handlers: ClientHandlers
    typing: TypingHandlerBase
    presence: PresenceHandlerBase
    #: The federation sender, or the main process's queue feeding a sender worker.
    outbox: OutboxConsumer | None
    keyring: Keyring | None
    #: The media repository, on the media instance.
    media: MediaRepository | None
    #: The background loops (started with the service; tests of in-process
    #: clusters, which start no listeners or transports, start these alone).
    loops: LoopsService
    listeners: ListenersService
    service: ProcessService
