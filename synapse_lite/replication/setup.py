"""Assembling a process's replication: its streams, which of them it writes,
the command handler and the streamer."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from synapse_lite.handlers.presence import PresenceWriterHandler
from synapse_lite.handlers.typing import TypingFollowerHandler
from synapse_lite.replication.http.streams import http_update_function
from synapse_lite.replication.tcp.commands import (
    ClearUserSyncCommand,
    UserIpCommand,
    UserSyncCommand,
)
from synapse_lite.replication.tcp.handler import ReplicationCommandHandler
from synapse_lite.replication.tcp.streamer import ReplicationStreamer
from synapse_lite.replication.tcp.streams import (
    AccountDataStream,
    BackfillStream,
    CachesStream,
    DeviceListsStream,
    EventsStream,
    FederationStream,
    PresenceStream,
    ReceiptsStream,
    Stream,
    ToDeviceStream,
    TypingStream,
)
from synapse_lite.replication.tcp.streams._base import no_update_function

if TYPE_CHECKING:
    from synapse_lite.server import HomeServer

logger = logging.getLogger(__name__)


def build_streams(hs: HomeServer) -> dict[str, Stream]:
    """Every stream, as this process sees it."""
    me = hs.instance_name
    store = hs.datastore
    writers = hs.config.stream_writers
    typing_handler = hs.typing_handler
    if writers.typing == me:
        typing_update = typing_handler.get_all_typing_updates  # type: ignore[attr-defined]
    else:
        typing_update = http_update_function(hs.replication_client, "typing", writers.typing)

    # The federation queue and its stream arrive with the federation sender;
    # until then every process follows an empty stream.
    federation_source = _ZeroToken()
    federation_update = no_update_function("federation")

    streams: list[Stream] = [
        EventsStream(me, store),
        BackfillStream(me, store),
        CachesStream(me, store),
        TypingStream(me, typing_handler, typing_update),
        ReceiptsStream(me, store),
        AccountDataStream(me, store),
        ToDeviceStream(me, store),
        PresenceStream(me, store),
        FederationStream(me, federation_source, federation_update),
        DeviceListsStream(me, store),
    ]
    return {s.NAME: s for s in streams}


class _ZeroToken:
    """The federation stream's token on processes that only follow it: they
    fetch everything a POSITION announces."""

    def get_current_token(self) -> int:
        return 0


def build_replication(hs: HomeServer) -> ReplicationCommandHandler:
    streams = build_streams(hs)
    sourced = hs.config.streams_written_by(hs.instance_name)
    handler = ReplicationCommandHandler(hs, streams, sourced)
    handler.streamer = ReplicationStreamer(hs, handler, [streams[name] for name in sourced])
    hs.instance_directory.attach(handler)
    typing_handler = hs.typing_handler
    if isinstance(typing_handler, TypingFollowerHandler):
        handler.data_handler.add_row_hook("typing", typing_handler.process_replication_rows)
    presence = hs.presence_handler
    if isinstance(presence, PresenceWriterHandler):
        handler.add_command_hook(UserSyncCommand, presence.on_user_sync)
        handler.add_command_hook(ClearUserSyncCommand, presence.on_clear_user_sync)
    if hs.is_main_process:
        handler.add_command_hook(UserIpCommand, lambda cmd: _record_user_ip(hs, cmd))
    logger.info("Replication: writing %s", ", ".join(sourced))
    return handler


def _record_user_ip(hs: HomeServer, cmd: UserIpCommand) -> None:
    """USER_IP reaches the main process, which records it."""
    from twisted.internet import defer

    store = hs.datastore
    d = defer.ensureDeferred(
        store.insert_client_ip(  # type: ignore[attr-defined]
            cmd.user_id, cmd.device_id or "", cmd.ip, cmd.user_agent, cmd.last_seen
        )
    )
    d.addErrback(lambda f: logger.warning("Recording a client IP failed: %s", f.value))
