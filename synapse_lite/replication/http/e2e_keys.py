"""Key writes that announce a change on the device_lists stream, so run on the
user's device_lists writer (``config.writers.writer_for("device_lists",
user_id)``, see ``devices.py``): a device's identity keys."""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import check_identifier_text
from synapse_lite.http.fields import get_optional_int
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
    """The device_lists stream id the change was written at (None: nothing
    changed): a caller on another process waits until it has seen the writer
    reach it, so the client's next read there shows the change."""

    stream_id: int | None

    @property
    def changed(self) -> bool:
        return self.stream_id is not None

    def to_json(self) -> dict[str, Any]:
        return {"stream_id": self.stream_id}

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> KeysChanged:
        return cls(get_optional_int(body, "stream_id"))


def device_lists_position(answer: KeysChanged) -> tuple[str, int] | None:
    """``answer_position`` of the calls that change device lists."""
    return None if answer.stream_id is None else ("device_lists", answer.stream_id)


UPLOAD_DEVICE_KEYS = InternalCall(
    "upload_device_keys",
    DeviceKeysUpload,
    KeysChanged,
    # Storing the same keys twice changes nothing the second time.
    idempotent=True,
    answer_position=device_lists_position,
)


_KEY_TYPES = ("master", "self_signing", "user_signing")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class CrossSigningUpload:
    """Replace some of a user's cross-signing keys (by type; already checked)."""

    user_id: str
    keys: dict[str, dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"user_id": self.user_id, "keys": self.keys}

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> CrossSigningUpload:
        keys = body.get("keys")
        if (
            not isinstance(keys, dict)
            or not keys
            or not all(k in _KEY_TYPES and isinstance(v, dict) for k, v in keys.items())
        ):
            raise SynapseError(400, "'keys' must map key types to keys", Codes.BAD_JSON)
        return cls(local_user(body, "user_id", server_name), keys)


UPLOAD_CROSS_SIGNING_KEYS = InternalCall(
    "upload_cross_signing_keys",
    CrossSigningUpload,
    KeysChanged,
    idempotent=True,
    answer_position=device_lists_position,
)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class SignaturesUpload:
    """Signatures by ``user_id``: ``[target user, target device or public
    key, signing key id, signature]`` each (already checked)."""

    user_id: str
    signatures: list[list[str]]

    def to_json(self) -> dict[str, Any]:
        return {"user_id": self.user_id, "signatures": self.signatures}

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> SignaturesUpload:
        signatures = body.get("signatures")
        if not isinstance(signatures, list) or not all(
            isinstance(s, list) and len(s) == 4 and all(isinstance(p, str) for p in s)
            for s in signatures
        ):
            raise SynapseError(400, "'signatures' must be a list of 4 strings each", Codes.BAD_JSON)
        return cls(local_user(body, "user_id", server_name), signatures)


UPLOAD_SIGNATURES = InternalCall(
    "upload_signatures",
    SignaturesUpload,
    KeysChanged,
    idempotent=True,
    answer_position=device_lists_position,
)
