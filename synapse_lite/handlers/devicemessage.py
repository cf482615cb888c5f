"""To-device messages, written by the to_device writer.

``*`` as a device id means every device of the user, expanded by the writer
when it stores the message. Messages for users on other servers are queued in
the federation outbox in the same transaction, and the federation sender (or
the main process's queue feeding it) is woken. A repeated ``txnId`` of the
same device is answered without sending again: the writer records it in
``client_transactions`` in the transaction that stores the messages, so this
holds across restarts of every process. Messages from other servers arrive through
:meth:`DeviceMessageHandler.receive_remote_messages`, stored once per
``(origin, message_id)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from synapse_lite.api.content import check_to_device_messages
from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import is_mine_id, random_string
from synapse_lite.federation.crypto import CanonicalJsonError, canonical_json
from synapse_lite.handlers.auth import Requester
from synapse_lite.replication.http.writes import (
    RECEIVE_REMOTE_TO_DEVICE,
    SEND_TO_DEVICE,
    RemoteToDeviceReceive,
    StreamWritten,
    ToDeviceSend,
)

if TYPE_CHECKING:
    from synapse_lite.federation.outbox import OutboxConsumer
    from synapse_lite.notifier import Notifier
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.storage.databases.main.client_transactions import TxnKey


def check_remote_messages(messages: Any, is_mine: Any) -> None:
    """Messages for other servers travel signed, so their content must be
    canonical JSON (no floats, integers within 2**53): a 400 now rather than a
    message that can never be sent."""
    for user_id, devices in messages.items():
        if is_mine(user_id):
            continue
        try:
            canonical_json(devices)
        except CanonicalJsonError as e:
            raise SynapseError(
                400, f"Messages for {user_id} cannot be sent to their server: {e}", Codes.BAD_JSON
            ) from None


class DeviceMessageStore(Protocol):
    """The store reads of :class:`DeviceMessageHandler`."""

    async def add_messages_to_device_inbox(
        self,
        local_messages: dict[str, dict[str, dict[str, Any]]],
        remote_messages: dict[str, dict[str, Any]],
        txn_key: TxnKey | None = None,
    ) -> tuple[int, bool]: ...

    async def add_remote_messages_to_device_inbox(
        self,
        origin: str,
        message_id: str,
        local_messages: dict[str, dict[str, dict[str, Any]]],
    ) -> int | None: ...

    async def get_device_ids(self, user_id: str) -> list[str]: ...

    def get_to_device_stream_token(self) -> int: ...


class DeviceMessageHandler:
    """``PUT /sendToDevice/{eventType}/{txnId}``."""

    def __init__(
        self,
        *,
        store: DeviceMessageStore,
        server_name: str,
        notifier: Notifier,
        calls: InternalCalls,
        outbox: OutboxConsumer | None,
    ) -> None:
        """``outbox``: what hears of messages queued for other servers here
        (the federation sender, or the queue feeding it), if anything."""
        self._store = store
        self._server_name = server_name
        self._notifier = notifier
        self._calls = calls
        self._outbox = outbox

    def _is_mine(self, user_id: str) -> bool:
        return is_mine_id(user_id, self._server_name)

    async def send_to_device(
        self, requester: Requester, event_type: str, txn_id: str, messages: dict[str, Any]
    ) -> None:
        checked = check_to_device_messages(messages)
        check_remote_messages(checked, self._is_mine)
        await self._calls.call(
            SEND_TO_DEVICE,
            ToDeviceSend(requester.user_id, requester.device_id, event_type, txn_id, checked),
        )

    async def receive_remote_messages(
        self,
        origin: str,
        sender: str,
        event_type: str,
        message_id: str,
        messages: dict[str, dict[str, Any]],
    ) -> None:
        """A to-device EDU from ``origin`` for local users: stored on the
        to_device writer, at most once per ``(origin, message_id)``."""
        await self._calls.call(
            RECEIVE_REMOTE_TO_DEVICE,
            RemoteToDeviceReceive(origin, sender, event_type, message_id, messages),
        )

    async def write_remote_messages(self, received: RemoteToDeviceReceive) -> StreamWritten:
        """Serves :data:`RECEIVE_REMOTE_TO_DEVICE`: expand ``*``, store once,
        wake the recipients."""
        local: dict[str, dict[str, dict[str, Any]]] = {}
        for user_id, devices in received.messages.items():
            targets = await self._expand_devices(
                user_id, devices, received.sender, received.event_type
            )
            if targets:
                local[user_id] = targets
        stream_id = await self._store.add_remote_messages_to_device_inbox(
            received.origin, received.message_id, local
        )
        if stream_id is None:
            return StreamWritten(self._store.get_to_device_stream_token())
        self._notifier.notify(users=list(local))
        return StreamWritten(stream_id)

    async def _expand_devices(
        self, user_id: str, devices: dict[str, Any], sender: str, event_type: str
    ) -> dict[str, dict[str, Any]]:
        targets: dict[str, dict[str, Any]] = {}
        for device_id, content in devices.items():
            ids = await self._store.get_device_ids(user_id) if device_id == "*" else [device_id]
            for target in ids:
                targets[target] = {"type": event_type, "sender": sender, "content": content}
        return targets

    async def write_messages(self, send: ToDeviceSend) -> StreamWritten:
        """Serves :data:`SEND_TO_DEVICE`: expand ``*``, store (once per
        ``txnId`` of the sending device), wake the recipients."""
        txn_key = (send.sender, send.sender_device, send.txn_id)
        local: dict[str, dict[str, dict[str, Any]]] = {}
        remote: dict[str, dict[str, Any]] = {}
        for user_id, devices in send.messages.items():
            if not self._is_mine(user_id):
                server = user_id.split(":", 1)[1]
                edu = remote.setdefault(
                    server,
                    {
                        "sender": send.sender,
                        "type": send.event_type,
                        "message_id": random_string(16),
                        "messages": {},
                    },
                )
                edu["messages"][user_id] = devices
                continue
            targets = await self._expand_devices(user_id, devices, send.sender, send.event_type)
            if targets:
                local[user_id] = targets
        if not local and not remote:
            return StreamWritten(self._store.get_to_device_stream_token())
        # A repeat (``new`` False: sent before, maybe before a restart) wrote
        # nothing and answers with the first stream id. It still wakes the
        # recipients: if the first attempt's COMMIT went through unheard (the
        # database layer ran it again), nobody was woken for it.
        stream_id, _new = await self._store.add_messages_to_device_inbox(local, remote, txn_key)
        self._notifier.notify(users=list(local))
        if remote and self._outbox is not None:
            self._outbox.notify_outbox_write(list(remote), stream_id)
        return StreamWritten(stream_id)
