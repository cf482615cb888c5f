"""Client writes forwarded to the writer of their stream: account data,
receipts and to-device messages (to their stream writers), devices and access
tokens (to the main process, which writes device_lists).

Each endpoint validates every field as strictly as the client API does: a
caller holding the replication secret is still not trusted with bad data.
Stream writes answer ``{"stream_id"}`` so the caller can wait for it.
"""

from __future__ import annotations

import re
from typing import Any

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import check_identifier_text, check_room_id, is_valid_user_id
from synapse_lite.handlers.account_data import ADD_ACCOUNT_DATA_ENDPOINT
from synapse_lite.handlers.device import DELETE_DEVICES_ENDPOINT, REGISTER_DEVICE_ENDPOINT
from synapse_lite.handlers.devicemessage import SEND_TO_DEVICE_ENDPOINT, check_messages
from synapse_lite.handlers.message import check_content_size
from synapse_lite.handlers.receipts import RECEIPT_TYPES, SEND_RECEIPT_ENDPOINT
from synapse_lite.http.fields import get_dict, get_int, get_optional_str, get_str
from synapse_lite.replication.http._base import ReplicationEndpoint

_TOKEN_HASH = re.compile(r"[0-9a-f]{64}")


def _local_user(endpoint: ReplicationEndpoint, body: dict[str, Any], name: str) -> str:
    user_id = get_str(body, name)
    if not is_valid_user_id(user_id) or not endpoint.hs.is_mine_id(user_id):
        raise SynapseError(400, f"'{name}' must be a local user id", Codes.BAD_JSON)
    return user_id


class AddAccountDataEndpoint(ReplicationEndpoint):
    """``{user_id, room_id|null, type, content}`` on the account_data writer."""

    NAME = ADD_ACCOUNT_DATA_ENDPOINT

    async def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        user_id = _local_user(self, body, "user_id")
        room_id = get_optional_str(body, "room_id")
        if room_id is not None:
            check_room_id(room_id)
        data_type = check_identifier_text(body.get("type"), "type")
        content = get_dict(body, "content")
        check_content_size(content)
        stream_id = await self.hs.account_data_handler.write_account_data(
            user_id, room_id, data_type, content
        )
        return {"stream_id": stream_id}


class SendReceiptEndpoint(ReplicationEndpoint):
    """``{room_id, receipt_type, user_id, event_id, thread_id, data}`` on the
    receipts writer (checked by the sender: membership is read anywhere)."""

    NAME = SEND_RECEIPT_ENDPOINT

    async def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        data = get_dict(body, "data")
        get_int(data, "ts")
        receipt = {
            "room_id": check_room_id(get_str(body, "room_id")),
            "receipt_type": get_str(body, "receipt_type"),
            "user_id": _local_user(self, body, "user_id"),
            "event_id": check_identifier_text(body.get("event_id"), "event_id"),
            "thread_id": get_optional_str(body, "thread_id", max_length=255),
            "data": data,
        }
        if receipt["receipt_type"] not in RECEIPT_TYPES:
            raise SynapseError(400, "Unsupported receipt type", Codes.INVALID_PARAM)
        stream_id = await self.hs.receipts_handler.write_receipt(receipt)
        return {"stream_id": stream_id}


class SendToDeviceEndpoint(ReplicationEndpoint):
    """``{sender, sender_device, type, txn_id, messages}`` on the to_device writer."""

    NAME = SEND_TO_DEVICE_ENDPOINT

    async def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        message = {
            "sender": _local_user(self, body, "sender"),
            "sender_device": check_identifier_text(body.get("sender_device"), "sender_device"),
            "type": check_identifier_text(body.get("type"), "type"),
            "txn_id": check_identifier_text(body.get("txn_id"), "txn_id"),
            "messages": check_messages(body.get("messages")),
        }
        stream_id = await self.hs.device_message_handler.write_messages(message)
        return {"stream_id": stream_id}


class RegisterDeviceEndpoint(ReplicationEndpoint):
    """``{user_id, device_id, display_name, token_hash}`` on the main process."""

    NAME = REGISTER_DEVICE_ENDPOINT

    async def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        user_id = _local_user(self, body, "user_id")
        device_id = check_identifier_text(body.get("device_id"), "device_id")
        display_name = get_optional_str(body, "display_name", max_length=512)
        token_hash = get_str(body, "token_hash")
        if not _TOKEN_HASH.fullmatch(token_hash):
            raise SynapseError(400, "'token_hash' must be a SHA-256 hex digest", Codes.BAD_JSON)
        if await self.hs.datastore.get_user(user_id) is None:
            raise SynapseError(404, "Unknown user", Codes.NOT_FOUND)
        await self.hs.device_handler.store_device_and_token(
            user_id, device_id, display_name, token_hash
        )
        return {}


class DeleteDevicesEndpoint(ReplicationEndpoint):
    """``{user_id, device_ids: [...] | null}`` on the main process ->
    ``{token_hashes}`` (so the caller forgets them at once)."""

    NAME = DELETE_DEVICES_ENDPOINT

    async def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        user_id = _local_user(self, body, "user_id")
        device_ids = body.get("device_ids")
        if device_ids is not None:
            if not isinstance(device_ids, list) or len(device_ids) > 1000:
                raise SynapseError(400, "'device_ids' must be a list or null", Codes.BAD_JSON)
            for device_id in device_ids:
                check_identifier_text(device_id, "device_ids")
        hashes = await self.hs.device_handler.delete_devices(user_id, device_ids)
        return {"token_hashes": hashes}
