"""To-device messages, written by the to_device writer.

``*`` as a device id means every device of the user, expanded by the writer
when it stores the message. Messages for users on other servers are queued in
the federation outbox in the same transaction. A repeated ``txnId`` of the
same device is answered without sending again (remembered by the writer for
the last :data:`TXN_MEMORY` sends).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import check_identifier_text, is_valid_user_id, random_string
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.message import check_content_size
from synapse_lite.handlers.writer_routing import write_on_stream_writer

if TYPE_CHECKING:
    from synapse_lite.server import HomeServer

SEND_TO_DEVICE_ENDPOINT = "send_to_device"
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
        await write_on_stream_writer(
            self._hs,
            "to_device",
            self._hs.config.stream_writers.to_device,
            lambda: self.write_messages(body),
            SEND_TO_DEVICE_ENDPOINT,
            body,
        )

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
            targets: dict[str, dict[str, Any]] = {}
            for device_id, content in devices.items():
                ids = await self._store.get_device_ids(user_id) if device_id == "*" else [device_id]
                for target in ids:
                    targets[target] = {"type": event_type, "sender": sender, "content": content}
            if targets:
                local[user_id] = targets
        if not local and not remote:
            return self._store.get_to_device_stream_token()
        stream_id = await self._store.add_messages_to_device_inbox(local, remote)
        self._recent_txns[txn_key] = stream_id
        while len(self._recent_txns) > TXN_MEMORY:
            self._recent_txns.popitem(last=False)
        self._hs.notifier.notify(users=list(local))
        return stream_id
