"""To-device messages, written by the to_device writer.

``*`` as a device id means every device of the user, expanded by the writer
when it stores the message. Messages for users on other servers are queued in
the federation outbox in the same transaction, and the federation sender (or
the main process's queue feeding it) is woken. A repeated ``txnId`` of the
same device is answered without sending again (remembered by the writer for
the last :data:`TXN_MEMORY` sends). Messages from other servers arrive through
:meth:`DeviceMessageHandler.receive_remote_messages`, stored once per
``(origin, message_id)``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import check_identifier_text, is_valid_user_id, random_string
from synapse_lite.federation.crypto import CanonicalJsonError, canonical_json
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.message import check_content_size
from synapse_lite.handlers.writer_routing import write_on_stream_writer

if TYPE_CHECKING:
    from synapse_lite.server import HomeServer

SEND_TO_DEVICE_ENDPOINT = "send_to_device"
RECEIVE_REMOTE_TO_DEVICE_ENDPOINT = "receive_remote_to_device"
TXN_MEMORY = 10_000
#: Recipients (user, device) of one request.
MAX_RECIPIENTS = 1_000


def check_messages(messages: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """``{user_id: {device_id or "*": content}}``, or a 400."""
    if not isinstance(messages, dict):
        raise SynapseError(400, "'messages' must be an object", Codes.BAD_JSON)
    count = 0
    for user_id, devices in messages.items():
        if not is_valid_user_id(user_id):
            raise SynapseError(400, "'messages' keys must be user ids", Codes.BAD_JSON)
        if not isinstance(devices, dict):
            raise SynapseError(400, "'messages' values must be objects", Codes.BAD_JSON)
        for device_id, content in devices.items():
            check_identifier_text(device_id, "device_id")
            if not isinstance(content, dict):
                raise SynapseError(400, "each message must be an object", Codes.BAD_JSON)
            check_content_size(content)
            count += 1
    if count > MAX_RECIPIENTS:
        raise SynapseError(400, "Too many recipients", Codes.INVALID_PARAM)
    return messages


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


class DeviceMessageHandler:
    """``PUT /sendToDevice/{eventType}/{txnId}``."""

    def __init__(self, hs: HomeServer) -> None:
        self._hs = hs
        self._store = hs.datastore
        self._recent_txns: OrderedDict[tuple[str, str, str], int] = OrderedDict()

    async def send_to_device(
        self, requester: Requester, event_type: str, txn_id: str, messages: dict[str, Any]
    ) -> None:
        body = {
            "sender": requester.user_id,
            "sender_device": requester.device_id,
            "type": event_type,
            "txn_id": txn_id,
            "messages": check_messages(messages),
        }
        check_remote_messages(body["messages"], self._hs.is_mine_id)
        await write_on_stream_writer(
            self._hs,
            "to_device",
            lambda: self.write_messages(body),
            SEND_TO_DEVICE_ENDPOINT,
            body,
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
        body = {
            "origin": origin,
            "sender": sender,
            "type": event_type,
            "message_id": message_id,
            "messages": messages,
        }
        await write_on_stream_writer(
            self._hs,
            "to_device",
            lambda: self.write_remote_messages(body),
            RECEIVE_REMOTE_TO_DEVICE_ENDPOINT,
            body,
        )

    async def write_remote_messages(self, body: dict[str, Any]) -> int:
        """On the to_device writer: expand ``*``, store once, wake the recipients."""
        sender, event_type = body["sender"], body["type"]
        local: dict[str, dict[str, dict[str, Any]]] = {}
        for user_id, devices in body["messages"].items():
            targets = await self._expand_devices(user_id, devices, sender, event_type)
            if targets:
                local[user_id] = targets
        stream_id = await self._store.add_remote_messages_to_device_inbox(
            body["origin"], body["message_id"], local
        )
        if stream_id is None:
            return self._store.get_to_device_stream_token()
        self._hs.notifier.notify(users=list(local))
        return stream_id

    async def _expand_devices(
        self, user_id: str, devices: dict[str, Any], sender: str, event_type: str
    ) -> dict[str, dict[str, Any]]:
        targets: dict[str, dict[str, Any]] = {}
        for device_id, content in devices.items():
            ids = await self._store.get_device_ids(user_id) if device_id == "*" else [device_id]
            for target in ids:
                targets[target] = {"type": event_type, "sender": sender, "content": content}
        return targets

    async def write_messages(self, body: dict[str, Any]) -> int:
        """On the to_device writer: expand ``*``, store, wake the recipients."""
        txn_key = (body["sender"], body["sender_device"], body["txn_id"])
        done = self._recent_txns.get(txn_key)
        if done is not None:
            return done
        sender, event_type = body["sender"], body["type"]
        local: dict[str, dict[str, dict[str, Any]]] = {}
        remote: dict[str, dict[str, Any]] = {}
        for user_id, devices in body["messages"].items():
            if not self._hs.is_mine_id(user_id):
                server = user_id.split(":", 1)[1]
                edu = remote.setdefault(
                    server,
                    {
                        "sender": sender,
                        "type": event_type,
                        "message_id": random_string(16),
                        "messages": {},
                    },
                )
                edu["messages"][user_id] = devices
                continue
            targets = await self._expand_devices(user_id, devices, sender, event_type)
            if targets:
                local[user_id] = targets
        if not local and not remote:
            return self._store.get_to_device_stream_token()
        stream_id = await self._store.add_messages_to_device_inbox(local, remote)
        self._recent_txns[txn_key] = stream_id
        while len(self._recent_txns) > TXN_MEMORY:
            self._recent_txns.popitem(last=False)
        self._hs.notifier.notify(users=list(local))
        sender_component = self._hs.federation_sender
        if remote and sender_component is not None:
            sender_component.notify_outbox_write(list(remote), stream_id)
        return stream_id
