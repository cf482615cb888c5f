"""The stores of the main database, composed for the main process and for workers.

Each mixin owns the tables (and stream) its name says. Worker-readable mixins
(``...WorkerStore``) are shared by every process; stream writes inside them are
refused by the stream's ID generator on processes that are not its writer.
``EventsStore`` (persisting events) is used by whichever processes are events
writers; ``ClientIpStore`` only by the main process.
"""

from __future__ import annotations

from synapse_lite.storage.databases.main.account_data import AccountDataWorkerStore
from synapse_lite.storage.databases.main.admin import AdminDestinationsWorkerStore, AdminWorkerStore
from synapse_lite.storage.databases.main.admin_tasks import AdminTasksWorkerStore
from synapse_lite.storage.databases.main.appservice import ApplicationServiceWorkerStore
from synapse_lite.storage.databases.main.client_ips import ClientIpStore, ClientIpWorkerStore
from synapse_lite.storage.databases.main.content_reports import ContentReportsWorkerStore
from synapse_lite.storage.databases.main.destination_rooms import DestinationRoomsWorkerStore
from synapse_lite.storage.databases.main.deviceinbox import DeviceInboxWorkerStore
from synapse_lite.storage.databases.main.end_to_end_keys import EndToEndKeyWorkerStore
from synapse_lite.storage.databases.main.events import EventsStore
from synapse_lite.storage.databases.main.federation import FederationWorkerStore
from synapse_lite.storage.databases.main.filtering import FilteringWorkerStore
from synapse_lite.storage.databases.main.inbound_pdu_queue import InboundPduQueueWorkerStore
from synapse_lite.storage.databases.main.instances import InstancesWorkerStore
from synapse_lite.storage.databases.main.media import MediaRepositoryStore
from synapse_lite.storage.databases.main.media_quarantine import MediaQuarantineWorkerStore
from synapse_lite.storage.databases.main.presence import PresenceWorkerStore
from synapse_lite.storage.databases.main.profile import ProfileWorkerStore
from synapse_lite.storage.databases.main.push_rules import PushRulesWorkerStore
from synapse_lite.storage.databases.main.pushers import PushersWorkerStore
from synapse_lite.storage.databases.main.receipts import ReceiptsWorkerStore
from synapse_lite.storage.databases.main.received_pdus import ReceivedPdusWorkerStore
from synapse_lite.storage.databases.main.registration import RegistrationWorkerStore
from synapse_lite.storage.databases.main.registration_tokens import (
    RegistrationTokensWorkerStore,
)
from synapse_lite.storage.databases.main.relations import RelationsWorkerStore
from synapse_lite.storage.databases.main.remote_devices import RemoteDevicesWorkerStore
from synapse_lite.storage.databases.main.remote_media import RemoteMediaCacheStore
from synapse_lite.storage.databases.main.room import RoomWorkerStore
from synapse_lite.storage.databases.main.room_keys import RoomKeysStore
from synapse_lite.storage.databases.main.search import SearchWorkerStore
from synapse_lite.storage.databases.main.server_notices import ServerNoticesWorkerStore
from synapse_lite.storage.databases.main.sliding_sync import SlidingSyncWorkerStore
from synapse_lite.storage.databases.main.threepid_bindings import ThreepidBindingsWorkerStore
from synapse_lite.storage.databases.main.user_restrictions import UserRestrictionsWorkerStore


class GenericWorkerStore(
    EventsStore,
    RoomWorkerStore,
    RegistrationWorkerStore,
    EndToEndKeyWorkerStore,
    AccountDataWorkerStore,
    ReceiptsWorkerStore,
    DeviceInboxWorkerStore,
    FederationWorkerStore,
    DestinationRoomsWorkerStore,
    ReceivedPdusWorkerStore,
    InboundPduQueueWorkerStore,
    PresenceWorkerStore,
    FilteringWorkerStore,
    InstancesWorkerStore,
    MediaRepositoryStore,
    RemoteMediaCacheStore,
    RoomKeysStore,
    ClientIpWorkerStore,
    ContentReportsWorkerStore,
    PushRulesWorkerStore,
    PushersWorkerStore,
    ProfileWorkerStore,
    RelationsWorkerStore,
    RemoteDevicesWorkerStore,
    SearchWorkerStore,
    SlidingSyncWorkerStore,
    ThreepidBindingsWorkerStore,
    ApplicationServiceWorkerStore,
    AdminWorkerStore,
    AdminTasksWorkerStore,
    RegistrationTokensWorkerStore,
    UserRestrictionsWorkerStore,
    MediaQuarantineWorkerStore,
    ServerNoticesWorkerStore,
    AdminDestinationsWorkerStore,
):
    """The store of a worker process."""


class DataStore(ClientIpStore, GenericWorkerStore):
    """The store of the main process."""


__all__ = ["DataStore", "GenericWorkerStore"]
