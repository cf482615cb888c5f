"""Client writes carried to the writer of their stream: account data, push rules, receipts,
to-device messages (sent by local users, or received from other servers),
typing and presence.

Each request type validates every field as strictly as the client API does.
Stream writes answer the stream id they were written at, so a caller on
another process waits for it (see ``calls.py``).
"""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.api.content import (
    RECEIPT_TYPES,
    check_content_size,
    check_to_device_messages,
)
from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import check_identifier_text, check_room_id, is_valid_user_id
from synapse_lite.http.fields import (
    get_bool,
    get_dict,
    get_int,
    get_optional_int,
    get_optional_str,
    get_str,
)
from synapse_lite.push.pushers import PusherSet
from synapse_lite.replication.http.calls import EmptyBody, InternalCall
from synapse_lite.streams.writers import writer_of


def is_local_user(user_id: object, server_name: str) -> bool:
    return is_valid_user_id(user_id) and str(user_id).endswith(":" + server_name)


def local_user(body: dict[str, Any], name: str, server_name: str) -> str:
    user_id = get_str(body, name)
    if not is_local_user(user_id, server_name):
        raise SynapseError(400, f"'{name}' must be a local user id", Codes.BAD_JSON)
    return user_id


@attr.s(slots=True, frozen=True, auto_attribs=True)
class StreamWritten:
    """The answer to a stream write: where it was written."""

    stream_id: int

    def to_json(self) -> dict[str, Any]:
        return {"stream_id": self.stream_id}

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> StreamWritten:
        return cls(get_int(body, "stream_id"))


def written_on(stream_name: str) -> Any:
    def answer_position(answer: StreamWritten) -> tuple[str, int]:
        return stream_name, answer.stream_id

    return answer_position


@attr.s(slots=True, frozen=True, auto_attribs=True)
class AccountDataWrite:
    """Global (``room_id`` None) or per-room account data of a local user."""

    user_id: str
    room_id: str | None
    data_type: str
    content: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id,
            "room_id": self.room_id,
            "type": self.data_type,
            "content": self.content,
        }

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> AccountDataWrite:
        room_id = get_optional_str(body, "room_id")
        if room_id is not None:
            check_room_id(room_id)
        content = get_dict(body, "content")
        check_content_size(content)
        return cls(
            user_id=local_user(body, "user_id", server_name),
            room_id=room_id,
            data_type=check_identifier_text(body.get("type"), "type"),
            content=content,
        )


ADD_ACCOUNT_DATA = InternalCall(
    "add_account_data",
    AccountDataWrite,
    StreamWritten,
    served_by=writer_of("account_data"),
    answer_position=written_on("account_data"),
)


#: The edits of a user's push rules (``PushRuleEdit.op``).
PUSH_RULE_OPS = ("put", "delete", "enabled", "actions")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PushRuleEdit:
    """One edit of a local user's push rules: ``put`` (``body`` is the rule,
    placed ``before``/``after`` another), ``delete``, or setting ``enabled``
    or ``actions`` (``body["value"]``). The rule's content is checked by the
    writer, which refuses it without storing anything."""

    user_id: str
    op: str
    kind: str
    rule_id: str
    body: dict[str, Any]
    before: str | None = None
    after: str | None = None

    def to_json(self) -> dict[str, Any]:
        return attr.asdict(self)

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> PushRuleEdit:
        op = get_str(body, "op")
        if op not in PUSH_RULE_OPS:
            raise SynapseError(400, f"Unknown push rule edit {op!r}", Codes.BAD_JSON)
        return cls(
            user_id=local_user(body, "user_id", server_name),
            op=op,
            kind=get_str(body, "kind"),
            rule_id=get_str(body, "rule_id"),
            body=get_dict(body, "body"),
            before=get_optional_str(body, "before"),
            after=get_optional_str(body, "after"),
        )


EDIT_PUSH_RULES = InternalCall(
    "edit_push_rules",
    PushRuleEdit,
    StreamWritten,
    served_by=writer_of("push_rules"),
    answer_position=written_on("push_rules"),
)


SET_PUSHER = InternalCall(
    "set_pusher",
    PusherSet,
    StreamWritten,
    served_by=writer_of("pushers"),
    answer_position=written_on("pushers"),
)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class TagWrite:
    """One room tag of a local user set (``content``) or removed (None)."""

    user_id: str
    room_id: str
    tag: str
    content: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id,
            "room_id": self.room_id,
            "tag": self.tag,
            "content": self.content,
        }

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> TagWrite:
        content = body.get("content")
        if content is not None:
            content = get_dict(body, "content")
            check_tag_content(content)
        return cls(
            user_id=local_user(body, "user_id", server_name),
            room_id=check_room_id(get_str(body, "room_id")),
            tag=check_tag_name(body.get("tag")),
            content=content,
        )


#: The longest tag name accepted (a tag is a key of the ``m.tag`` content).
MAX_TAG_LENGTH = 255


def check_tag_name(tag: object) -> str:
    """A room tag name, or a 400."""
    return check_identifier_text(tag, "tag", max_length=MAX_TAG_LENGTH)


def check_tag_content(content: dict[str, Any]) -> None:
    """A tag's content: a JSON object whose ``order``, when given, is a number
    in [0, 1] (the spec's ordering key); a 400 otherwise."""
    check_content_size(content)
    order = content.get("order")
    if "order" in content and (
        isinstance(order, bool) or not isinstance(order, int | float) or not 0 <= order <= 1
    ):
        raise SynapseError(400, "'order' must be a number between 0 and 1", Codes.BAD_JSON)


SET_ROOM_TAG = InternalCall(
    "set_room_tag",
    TagWrite,
    StreamWritten,
    served_by=writer_of("account_data"),
    answer_position=written_on("account_data"),
)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ReceiptWrite:
    """A receipt already checked by the sender (membership is read anywhere)."""

    room_id: str
    receipt_type: str
    user_id: str
    event_id: str
    thread_id: str | None
    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return attr.asdict(self)

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> ReceiptWrite:
        data = get_dict(body, "data")
        get_int(data, "ts")
        receipt_type = get_str(body, "receipt_type")
        if receipt_type not in RECEIPT_TYPES:
            raise SynapseError(400, "Unsupported receipt type", Codes.INVALID_PARAM)
        return cls(
            room_id=check_room_id(get_str(body, "room_id")),
            receipt_type=receipt_type,
            user_id=local_user(body, "user_id", server_name),
            event_id=check_identifier_text(body.get("event_id"), "event_id"),
            thread_id=get_optional_str(body, "thread_id", max_length=255),
            data=data,
        )


SEND_RECEIPT = InternalCall(
    "send_receipt",
    ReceiptWrite,
    StreamWritten,
    served_by=writer_of("receipts"),
    answer_position=written_on("receipts"),
)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ToDeviceSend:
    """A local device's to-device send, idempotent per (sender, device, txn_id)."""

    sender: str
    sender_device: str
    event_type: str
    txn_id: str
    messages: dict[str, dict[str, dict[str, Any]]]

    def to_json(self) -> dict[str, Any]:
        return {
            "sender": self.sender,
            "sender_device": self.sender_device,
            "type": self.event_type,
            "txn_id": self.txn_id,
            "messages": self.messages,
        }

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> ToDeviceSend:
        return cls(
            sender=local_user(body, "sender", server_name),
            sender_device=check_identifier_text(body.get("sender_device"), "sender_device"),
            event_type=check_identifier_text(body.get("type"), "type"),
            txn_id=check_identifier_text(body.get("txn_id"), "txn_id"),
            messages=check_to_device_messages(body.get("messages")),
        )


SEND_TO_DEVICE = InternalCall(
    "send_to_device",
    ToDeviceSend,
    StreamWritten,
    served_by=writer_of("to_device"),
    answer_position=written_on("to_device"),
)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RemoteToDeviceReceive:
    """A to-device EDU from ``origin`` for local users, stored at most once
    per ``(origin, message_id)``."""

    origin: str
    sender: str
    event_type: str
    message_id: str
    messages: dict[str, dict[str, dict[str, Any]]]

    def to_json(self) -> dict[str, Any]:
        return {
            "origin": self.origin,
            "sender": self.sender,
            "type": self.event_type,
            "message_id": self.message_id,
            "messages": self.messages,
        }

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> RemoteToDeviceReceive:
        sender = get_str(body, "sender")
        if not is_valid_user_id(sender) or is_local_user(sender, server_name):
            raise SynapseError(400, "'sender' must be a remote user id", Codes.BAD_JSON)
        messages = get_dict(body, "messages")
        for user_id, devices in messages.items():
            if not is_local_user(user_id, server_name):
                raise SynapseError(400, "recipients must be local users", Codes.BAD_JSON)
            if not isinstance(devices, dict) or not all(
                isinstance(c, dict) for c in devices.values()
            ):
                raise SynapseError(400, "each message must be an object", Codes.BAD_JSON)
            for device_id in devices:
                check_identifier_text(device_id, "device_id")
        return cls(
            origin=check_identifier_text(body.get("origin"), "origin"),
            sender=sender,
            event_type=check_identifier_text(body.get("type"), "type"),
            message_id=check_identifier_text(body.get("message_id"), "message_id"),
            messages=messages,
        )


RECEIVE_REMOTE_TO_DEVICE = InternalCall(
    "receive_remote_to_device",
    RemoteToDeviceReceive,
    StreamWritten,
    served_by=writer_of("to_device"),
    answer_position=written_on("to_device"),
)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class TypingChange:
    """``requester`` says ``user_id`` is (or stopped) typing in a room."""

    requester: str
    user_id: str
    room_id: str
    typing: bool
    timeout_ms: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "requester": self.requester,
            "user_id": self.user_id,
            "room_id": self.room_id,
            "typing": self.typing,
            "timeout": self.timeout_ms,
        }

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> TypingChange:
        return cls(
            requester=local_user(body, "requester", server_name),
            user_id=local_user(body, "user_id", server_name),
            room_id=check_room_id(get_str(body, "room_id")),
            typing=get_bool(body, "typing", False),
            timeout_ms=get_optional_int(body, "timeout"),
        )


SET_TYPING = InternalCall(
    "set_typing",
    TypingChange,
    EmptyBody,
    served_by=writer_of("typing"),
    # Setting the same state twice changes nothing (only the timeout moves).
    idempotent=True,
)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PresenceChange:
    """A user sets their presence (checked by the presence writer)."""

    user_id: str
    presence: str
    status_msg: str | None

    def to_json(self) -> dict[str, Any]:
        return {"user_id": self.user_id, "presence": self.presence, "status_msg": self.status_msg}

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> PresenceChange:
        return cls(
            user_id=local_user(body, "user_id", server_name),
            presence=get_str(body, "presence", max_length=64),
            status_msg=get_optional_str(body, "status_msg"),
        )


SET_PRESENCE = InternalCall(
    "set_presence",
    PresenceChange,
    EmptyBody,
    served_by=writer_of("presence"),
    idempotent=True,
)
