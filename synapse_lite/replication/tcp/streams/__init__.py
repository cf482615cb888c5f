"""The replication streams, by name."""

from __future__ import annotations

from synapse_lite.replication.tcp.streams._base import (
    InvalidRow,
    Stream,
    StreamFromIdGen,
    UpdateFunction,
    Updates,
)
from synapse_lite.replication.tcp.streams.data import (
    AccountDataStream,
    CachesStream,
    DeviceListsStream,
    PresenceStream,
    ReceiptsStream,
    ToDeviceStream,
)
from synapse_lite.replication.tcp.streams.events import BackfillStream, EventsStream
from synapse_lite.replication.tcp.streams.federation import FederationStream
from synapse_lite.replication.tcp.streams.typing import TypingStream

STREAM_CLASSES: dict[str, type[Stream]] = {
    cls.NAME: cls
    for cls in (
        EventsStream,
        BackfillStream,
        CachesStream,
        TypingStream,
        ReceiptsStream,
        AccountDataStream,
        ToDeviceStream,
        PresenceStream,
        FederationStream,
        DeviceListsStream,
    )
}

__all__ = [
    "STREAM_CLASSES",
    "AccountDataStream",
    "BackfillStream",
    "CachesStream",
    "DeviceListsStream",
    "EventsStream",
    "FederationStream",
    "InvalidRow",
    "PresenceStream",
    "ReceiptsStream",
    "Stream",
    "StreamFromIdGen",
    "ToDeviceStream",
    "TypingStream",
    "UpdateFunction",
    "Updates",
]
