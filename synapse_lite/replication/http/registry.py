"""Every internal endpoint a process serves on its ``replication`` listener."""

from __future__ import annotations

from typing import TYPE_CHECKING

from synapse_lite.replication.http._base import ReplicationEndpoint, ReplicationRestResource
from synapse_lite.replication.http.client_writes import (
    AddAccountDataEndpoint,
    DeleteDevicesEndpoint,
    RegisterDeviceEndpoint,
    SendReceiptEndpoint,
    SendToDeviceEndpoint,
)
from synapse_lite.replication.http.federation import ReceiveRemoteToDeviceEndpoint
from synapse_lite.replication.http.handlers import SetPresenceEndpoint, SetTypingEndpoint
from synapse_lite.replication.http.instances import RetireEventsWriterEndpoint
from synapse_lite.replication.http.send_events import SendEventsEndpoint
from synapse_lite.replication.http.streams import GetStreamUpdates

if TYPE_CHECKING:
    from synapse_lite.server import HomeServer

ENDPOINT_CLASSES: list[type[ReplicationEndpoint]] = [
    GetStreamUpdates,
    SetTypingEndpoint,
    SetPresenceEndpoint,
    RetireEventsWriterEndpoint,
    SendEventsEndpoint,
    AddAccountDataEndpoint,
    SendReceiptEndpoint,
    SendToDeviceEndpoint,
    RegisterDeviceEndpoint,
    DeleteDevicesEndpoint,
    ReceiveRemoteToDeviceEndpoint,
]


def replication_resource(hs: HomeServer) -> ReplicationRestResource:
    return ReplicationRestResource(hs, [cls(hs) for cls in ENDPOINT_CLASSES])
