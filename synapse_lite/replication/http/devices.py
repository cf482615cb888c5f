"""Devices and access tokens, written by a writer of the device_lists stream.

``stream_writers.device_lists`` may name several writers; each user's device
changes are always written by the same one (the stream's per-user rule,
``config.writers.writer_for("device_lists", user_id)``), so one user's
changes keep their order. The calls here are sent to that
writer by the caller (``instance=``)."""

from __future__ import annotations

import re
from typing import Any

import attr

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import check_identifier_text
from synapse_lite.http.fields import get_optional_str, get_str
from synapse_lite.replication.http.calls import EmptyBody, InternalCall
from synapse_lite.replication.http.writes import StreamWritten, local_user, written_on
from synapse_lite.streams.writers import writer_of

_TOKEN_HASH = re.compile(r"[0-9a-f]{64}")
#: Devices one logout may name.
MAX_DEVICES_PER_DELETE = 1_000


@attr.s(slots=True, frozen=True, auto_attribs=True)
class DeviceLogin:
    """Log ``device_id`` in with a new token (only its hash travels)."""

    user_id: str
    device_id: str
    display_name: str | None
    token_hash: str

    def to_json(self) -> dict[str, Any]:
        return attr.asdict(self)

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> DeviceLogin:
        token_hash = get_str(body, "token_hash")
        if not _TOKEN_HASH.fullmatch(token_hash):
            raise SynapseError(400, "'token_hash' must be a SHA-256 hex digest", Codes.BAD_JSON)
        return cls(
            user_id=local_user(body, "user_id", server_name),
            device_id=check_identifier_text(body.get("device_id"), "device_id"),
            display_name=get_optional_str(body, "display_name", max_length=512),
            token_hash=token_hash,
        )


#: Served by the user's device_lists writer, named by the caller.
REGISTER_DEVICE = InternalCall("register_device", DeviceLogin, EmptyBody)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class DevicesLogout:
    """Log devices out (every device of the user when ``device_ids`` is None)."""

    user_id: str
    device_ids: list[str] | None

    def to_json(self) -> dict[str, Any]:
        return {"user_id": self.user_id, "device_ids": self.device_ids}

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> DevicesLogout:
        device_ids = body.get("device_ids")
        if device_ids is not None:
            if not isinstance(device_ids, list) or len(device_ids) > MAX_DEVICES_PER_DELETE:
                raise SynapseError(400, "'device_ids' must be a list or null", Codes.BAD_JSON)
            for device_id in device_ids:
                check_identifier_text(device_id, "device_ids")
        return cls(local_user(body, "user_id", server_name), device_ids)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class TokensRevoked:
    """The hashes of the tokens a logout revoked, so the caller forgets them at once."""

    token_hashes: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"token_hashes": self.token_hashes}

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> TokensRevoked:
        hashes = body.get("token_hashes")
        if not isinstance(hashes, list) or not all(isinstance(h, str) for h in hashes):
            raise SynapseError(400, "'token_hashes' must be a list of strings", Codes.BAD_JSON)
        return cls(hashes)


#: Served by the user's device_lists writer.
DELETE_DEVICES = InternalCall("delete_devices", DevicesLogout, TokensRevoked)

#: The pushers set with the tokens of devices being logged out, removed on
#: the pushers writer (before the devices go: a retry still finds them).
REMOVE_DEVICE_PUSHERS = InternalCall(
    "remove_device_pushers",
    DevicesLogout,
    StreamWritten,
    served_by=writer_of("pushers"),
    answer_position=written_on("pushers"),
    idempotent=True,
)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class DeviceRename:
    """Set a device's display name."""

    user_id: str
    device_id: str
    display_name: str | None

    def to_json(self) -> dict[str, Any]:
        return attr.asdict(self)

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> DeviceRename:
        return cls(
            user_id=local_user(body, "user_id", server_name),
            device_id=check_identifier_text(body.get("device_id"), "device_id"),
            display_name=get_optional_str(body, "display_name", max_length=512),
        )


#: Served by the user's device_lists writer; a 404 for an unknown device.
#: Answers where the rename was written, so a forwarding process waits for it.
RENAME_DEVICE = InternalCall(
    "rename_device",
    DeviceRename,
    StreamWritten,
    idempotent=True,
    answer_position=written_on("device_lists"),
)
