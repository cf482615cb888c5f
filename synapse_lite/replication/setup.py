"""Assembling a process's replication: its streams, which of them it writes,
the command handler and the streamer."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from synapse_lite.config.homeserver import MAIN_PROCESS
from synapse_lite.handlers.presence import PresenceWriterHandler
from synapse_lite.handlers.typing import TypingFollowerHandler
from synapse_lite.replication.http.streams import http_update_function
from synapse_lite.replication.tcp.commands import (
    ClearUserSyncCommand,
    FederationAckCommand,
    RemoteServerUpCommand,
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
from synapse_lite.replication.tcp.streams._base import UpdateFunction, no_update_function
from synapse_lite.replication.tcp.streams.federation import FederationTokenSource

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

    federation_source, federation_update = _federation_stream_parts(hs)

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
    """The federation stream's token on processes with no part in it."""

    def get_current_token(self) -> int:
        return 0


def _federation_stream_parts(hs: HomeServer) -> tuple[FederationTokenSource, UpdateFunction]:
    """Who owns the federation stream's token here, and how its rows are read:
    the main process's queue (when a worker sends), the sender worker (which
    reads the queue over internal HTTP), or nobody."""
    from synapse_lite.federation.send_queue import FederationRemoteSendQueue
    from synapse_lite.federation.sender.federation_sender import FederationSender

    component = hs.federation_sender
    if isinstance(component, FederationRemoteSendQueue):
        return component, component.get_replication_rows
    if isinstance(component, FederationSender) and not hs.is_main_process:
        return component, http_update_function(hs.replication_client, "federation", MAIN_PROCESS)
    return _ZeroToken(), no_update_function("federation")


def _wire_federation(hs: HomeServer, handler: ReplicationCommandHandler) -> None:
    """Feed the federation sender (or the queue in front of it) and route
    FEDERATION_ACK / REMOTE_SERVER_UP to whoever handles them here."""
    from synapse_lite.federation.send_queue import FederationRemoteSendQueue
    from synapse_lite.federation.sender.federation_sender import FederationSender

    component = hs.federation_sender
    if component is None:
        return
    if hs.is_main_process and hs.config.stream_writers.to_device != MAIN_PROCESS:
        handler.data_handler.add_row_hook("to_device", component.on_to_device_rows)
    if isinstance(component, FederationRemoteSendQueue):
        handler.add_command_hook(FederationAckCommand, component.federation_ack)
    if isinstance(component, FederationSender):
        handler.add_command_hook(
            RemoteServerUpCommand, lambda cmd: component.on_remote_server_up(cmd.server_name)
        )
        if not hs.is_main_process:
            handler.data_handler.add_row_hook("federation", component.process_federation_rows)


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
    _wire_federation(hs, handler)
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
