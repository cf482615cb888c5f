"""Client writes carried to the writer of their stream: account data, push rules, receipts,
to-device messages (sent by local users, or received from other servers),
typing and presence.

Each request type's fields declare their kinds, which check them as strictly
as the client API does (``synapse_lite/codec/``). Stream writes answer the
stream id they were written at, so a caller on another process waits for it
(see ``calls.py``).
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
from synapse_lite.api.identifiers import check_identifier_text, is_valid_user_id
from synapse_lite.codec.kinds import (
    Bool,
    Checked,
    Custom,
    DecodeContext,
    Identifier,
    Int,
    JsonObject,
    LocalUserId,
    Nullable,
    RoomId,
    Str,
    UserId,
    is_local_user,
    wire,
)
from synapse_lite.http.fields import int_value
from synapse_lite.push.pushers import PusherSet
from synapse_lite.replication.http.calls import EmptyBody, InternalCall
from synapse_lite.streams.writers import writer_of


@attr.s(slots=True, frozen=True, auto_attribs=True)
class StreamWritten:
    """The answer to a stream write: where it was written."""

    stream_id: int = attr.ib(metadata=wire(Int()))


def written_on(stream_name: str) -> Any:
    def answer_position(answer: StreamWritten) -> tuple[str, int]:
        return stream_name, answer.stream_id

    return answer_position


@attr.s(slots=True, frozen=True, auto_attribs=True)
class AccountDataWrite:
    """Global (``room_id`` None) or per-room account data of a local user."""

    user_id: str = attr.ib(metadata=wire(LocalUserId()))
    room_id: str | None = attr.ib(metadata=wire(Nullable(RoomId())))
    data_type: str = attr.ib(metadata=wire(Identifier(), key="type"))
    content: dict[str, Any] = attr.ib(
        metadata=wire(JsonObject(lambda content, _: check_content_size(content)))
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


def _check_push_rule_op(op: str, context: DecodeContext) -> None:
    if op not in PUSH_RULE_OPS:
        raise SynapseError(400, f"Unknown push rule edit {op!r}", Codes.BAD_JSON)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PushRuleEdit:
    """One edit of a local user's push rules: ``put`` (``body`` is the rule,
    placed ``before``/``after`` another), ``delete``, or setting ``enabled``
    or ``actions`` (``body["value"]``). The rule's content is checked by the
    writer, which refuses it without storing anything."""

    user_id: str = attr.ib(metadata=wire(LocalUserId()))
    op: str = attr.ib(metadata=wire(Checked(Str(), _check_push_rule_op, example="put")))
    kind: str = attr.ib(metadata=wire(Str()))
    rule_id: str = attr.ib(metadata=wire(Str()))
    body: dict[str, Any] = attr.ib(metadata=wire(JsonObject()))
    before: str | None = attr.ib(default=None, metadata=wire(Nullable(Str())))
    after: str | None = attr.ib(default=None, metadata=wire(Nullable(Str())))


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


@attr.s(slots=True, frozen=True, auto_attribs=True)
class TagWrite:
    """One room tag of a local user set (``content``) or removed (None)."""

    user_id: str = attr.ib(metadata=wire(LocalUserId()))
    room_id: str = attr.ib(metadata=wire(RoomId()))
    tag: str = attr.ib(metadata=wire(Identifier(max_length=MAX_TAG_LENGTH)))
    content: dict[str, Any] | None = attr.ib(
        metadata=wire(Nullable(JsonObject(lambda content, _: check_tag_content(content))))
    )


SET_ROOM_TAG = InternalCall(
    "set_room_tag",
    TagWrite,
    StreamWritten,
    served_by=writer_of("account_data"),
    answer_position=written_on("account_data"),
)


def _check_receipt_type(receipt_type: str, context: DecodeContext) -> None:
    if receipt_type not in RECEIPT_TYPES:
        raise SynapseError(400, "Unsupported receipt type", Codes.INVALID_PARAM)


def _check_receipt_data(data: dict[str, Any]) -> None:
    int_value(data.get("ts"), "ts")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ReceiptWrite:
    """A receipt already checked by the sender (membership is read anywhere);
    of a remote user when another server sent it (``federation/inbound_edus.py``)."""

    room_id: str = attr.ib(metadata=wire(RoomId()))
    receipt_type: str = attr.ib(
        metadata=wire(Checked(Str(), _check_receipt_type, example="m.read"))
    )
    user_id: str = attr.ib(metadata=wire(UserId()))
    event_id: str = attr.ib(metadata=wire(Identifier()))
    thread_id: str | None = attr.ib(metadata=wire(Nullable(Str(max_length=255))))
    data: dict[str, Any] = attr.ib(
        metadata=wire(JsonObject(lambda data, _: _check_receipt_data(data), example={"ts": 1}))
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

    sender: str = attr.ib(metadata=wire(LocalUserId()))
    sender_device: str = attr.ib(metadata=wire(Identifier()))
    event_type: str = attr.ib(metadata=wire(Identifier(), key="type"))
    txn_id: str = attr.ib(metadata=wire(Identifier()))
    messages: dict[str, dict[str, dict[str, Any]]] = attr.ib(
        metadata=wire(
            Custom(
                lambda messages, _: check_to_device_messages(messages),
                example=lambda context: {f"@bob:{context.server_name}": {"DEV": {"body": "hi"}}},
            )
        )
    )


SEND_TO_DEVICE = InternalCall(
    "send_to_device",
    ToDeviceSend,
    StreamWritten,
    served_by=writer_of("to_device"),
    answer_position=written_on("to_device"),
)


def _check_remote_user(user_id: str, context: DecodeContext) -> None:
    if not is_valid_user_id(user_id) or is_local_user(user_id, context.local_server()):
        raise SynapseError(400, "'sender' must be a remote user id", Codes.BAD_JSON)


def _check_remote_to_device_messages(messages: dict[str, Any], context: DecodeContext) -> None:
    """``{local user: {device: content}}``."""
    for user_id, devices in messages.items():
        if not is_local_user(user_id, context.local_server()):
            raise SynapseError(400, "recipients must be local users", Codes.BAD_JSON)
        if not isinstance(devices, dict) or not all(isinstance(c, dict) for c in devices.values()):
            raise SynapseError(400, "each message must be an object", Codes.BAD_JSON)
        for device_id in devices:
            check_identifier_text(device_id, "device_id")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RemoteToDeviceReceive:
    """A to-device EDU from ``origin`` for local users, stored at most once
    per ``(origin, message_id)``."""

    origin: str = attr.ib(metadata=wire(Identifier()))
    sender: str = attr.ib(
        metadata=wire(Checked(Str(), _check_remote_user, example="@bob:elsewhere.example"))
    )
    event_type: str = attr.ib(metadata=wire(Identifier(), key="type"))
    message_id: str = attr.ib(metadata=wire(Identifier()))
    messages: dict[str, dict[str, dict[str, Any]]] = attr.ib(
        metadata=wire(JsonObject(_check_remote_to_device_messages))
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
    """``requester`` says ``user_id`` is (or stopped) typing in a room (both
    a remote user when their server sent it: ``federation/inbound_edus.py``)."""

    requester: str = attr.ib(metadata=wire(UserId()))
    user_id: str = attr.ib(metadata=wire(UserId()))
    room_id: str = attr.ib(metadata=wire(RoomId()))
    typing: bool = attr.ib(metadata=wire(Bool(False)))
    timeout_ms: int | None = attr.ib(metadata=wire(Nullable(Int()), key="timeout"))


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

    user_id: str = attr.ib(metadata=wire(LocalUserId()))
    presence: str = attr.ib(metadata=wire(Str(max_length=64)))
    status_msg: str | None = attr.ib(metadata=wire(Nullable(Str())))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RemotePresence:
    """Another server's user's presence, as their server sent it (checked
    by ``federation/inbound_edus.py``)."""

    user_id: str = attr.ib(metadata=wire(UserId()))
    presence: str = attr.ib(metadata=wire(Str(max_length=64)))
    status_msg: str | None = attr.ib(metadata=wire(Nullable(Str())))
    last_active_ts: int = attr.ib(metadata=wire(Int()))
    currently_active: bool = attr.ib(metadata=wire(Bool(False)))


SET_REMOTE_PRESENCE = InternalCall(
    "set_remote_presence",
    RemotePresence,
    EmptyBody,
    served_by=writer_of("presence"),
    idempotent=True,
)


SET_PRESENCE = InternalCall(
    "set_presence",
    PresenceChange,
    EmptyBody,
    served_by=writer_of("presence"),
    idempotent=True,
)
