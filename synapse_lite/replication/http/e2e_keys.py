"""Key writes that announce a change on the device_lists stream, so run on the
user's device_lists writer (``instance=device_lists_writer_for(...)``, see
``devices.py``): a device's identity keys."""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import check_identifier_text
from synapse_lite.replication.http.calls import InternalCall
from synapse_lite.replication.http.writes import local_user


@attr.s(slots=True, frozen=True, auto_attribs=True)
class DeviceKeysUpload:
    """Store a device's identity keys (already checked by the caller)."""

    user_id: str
    device_id: str
    keys: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"user_id": self.user_id, "device_id": self.device_id, "keys": self.keys}

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> DeviceKeysUpload:
        keys = body.get("keys")
        if not isinstance(keys, dict):
            raise SynapseError(400, "'keys' must be an object", Codes.BAD_JSON)
        return cls(
            user_id=local_user(body, "user_id", server_name),
            device_id=check_identifier_text(body.get("device_id"), "device_id"),
            keys=keys,
        )


@attr.s(slots=True, frozen=True, auto_attribs=True)
class KeysChanged:
    """Whether the keys changed (and so a device_lists row was written)."""

    changed: bool

    def to_json(self) -> dict[str, Any]:
        return {"changed": self.changed}

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> KeysChanged:
        return cls(bool(body.get("changed")))


UPLOAD_DEVICE_KEYS = InternalCall(
    "upload_device_keys",
    DeviceKeysUpload,
    KeysChanged,
    # Storing the same keys twice changes nothing the second time.
    idempotent=True,
)
