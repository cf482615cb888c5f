"""Hashes and signatures of events (server-server spec, "Signing events"
and "Calculating the reference hash"), over events in their
server-server JSON form.

The redaction algorithm itself is :func:`synapse_lite.events.pruned_event`
(one place for it); canonical JSON and ed25519 are
``synapse_lite/federation/crypto.py``.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from synapse_lite.api.identifiers import server_of
from synapse_lite.api.room_versions import EventIdFormat, RoomVersion
from synapse_lite.events import event_canonical_json, pruned_event
from synapse_lite.federation.crypto import (
    SignatureError,
    SigningKey,
    decode_base64,
    encode_base64,
    verify_signature,
)

#: Keys never covered by the content hash.
_UNHASHED_KEYS = ("unsigned", "signatures", "hashes")


def content_hash(room_version: RoomVersion, pdu: dict[str, Any]) -> str:
    """The unpadded base64 SHA-256 of ``pdu`` without ``unsigned``,
    ``signatures`` and ``hashes`` (what ``hashes.sha256`` must be)."""
    unhashed = {k: v for k, v in pdu.items() if k not in _UNHASHED_KEYS}
    strict = room_version.strict_canonical_json
    return encode_base64(hashlib.sha256(event_canonical_json(unhashed, strict)).digest())


def content_hash_matches(room_version: RoomVersion, pdu: dict[str, Any]) -> bool:
    """Whether ``pdu``'s ``hashes.sha256`` is its content hash (when it is
    not, a receiving server keeps only the redacted event)."""
    hashes = pdu.get("hashes")
    if not isinstance(hashes, dict) or not isinstance(hashes.get("sha256"), str):
        return False
    try:
        claimed = decode_base64(hashes["sha256"])
    except ValueError:
        return False
    return encode_base64(claimed) == content_hash(room_version, pdu)


def reference_hash(room_version: RoomVersion, pdu: dict[str, Any]) -> bytes:
    """SHA-256 of the canonical JSON of the redacted event without
    ``signatures``, ``unsigned`` and (versions 1 and 2) ``age_ts``."""
    redacted = pruned_event(room_version, pdu)
    for key in ("signatures", "unsigned", "age_ts"):
        redacted.pop(key, None)
    return hashlib.sha256(
        event_canonical_json(redacted, room_version.strict_canonical_json)
    ).digest()


def event_id_of(room_version: RoomVersion, pdu: dict[str, Any]) -> str:
    """The id of an event: its ``event_id`` in versions 1 and 2 (KeyError
    when it has none), ``$`` and its reference hash from version 3 (in
    URL-safe unpadded base64 from version 4)."""
    if room_version.event_ids is EventIdFormat.SERVER_SUFFIXED:
        event_id = pdu["event_id"]
        if not isinstance(event_id, str):
            raise KeyError("event_id")
        return event_id
    digest = reference_hash(room_version, pdu)
    if room_version.event_ids is EventIdFormat.REFERENCE_HASH_BASE64:
        return "$" + encode_base64(digest)
    return "$" + base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def _signed_bytes(room_version: RoomVersion, pdu: dict[str, Any]) -> bytes:
    """What an event's signatures sign: the redacted event without
    ``signatures`` and ``unsigned``."""
    redacted = pruned_event(room_version, pdu)
    redacted.pop("signatures", None)
    redacted.pop("unsigned", None)
    return event_canonical_json(redacted, room_version.strict_canonical_json)


def sign_event(
    room_version: RoomVersion, pdu: dict[str, Any], server_name: str, key: SigningKey
) -> dict[str, Any]:
    """A copy of ``pdu`` with its content hash set under ``hashes`` and
    ``server_name``'s signature added (over the redacted event, so a
    redaction keeps the signature valid)."""
    hashed = {**pdu, "hashes": {"sha256": content_hash(room_version, pdu)}}
    signature = key.sign(_signed_bytes(room_version, hashed))
    signatures = {k: dict(v) for k, v in pdu.get("signatures", {}).items()}
    signatures.setdefault(server_name, {})[key.key_id] = signature
    hashed["signatures"] = signatures
    return hashed


def add_event_signature(
    room_version: RoomVersion, pdu: dict[str, Any], server_name: str, key: SigningKey
) -> dict[str, Any]:
    """A copy of ``pdu`` with ``server_name``'s signature added and nothing
    else changed (its ``hashes`` are another server's and in its id): how a
    resident server countersigns a join it accepts."""
    signature = key.sign(_signed_bytes(room_version, pdu))
    signatures = {k: dict(v) for k, v in pdu.get("signatures", {}).items()}
    signatures.setdefault(server_name, {})[key.key_id] = signature
    return {**pdu, "signatures": signatures}


def verify_event_signature(
    room_version: RoomVersion,
    pdu: dict[str, Any],
    server_name: str,
    key_id: str,
    verify_key_base64: str,
) -> None:
    """:class:`SignatureError` unless ``server_name`` signed ``pdu`` with
    ``key_id`` (whose public key is ``verify_key_base64``)."""
    signatures = pdu.get("signatures")
    by_server = signatures.get(server_name) if isinstance(signatures, dict) else None
    signature = by_server.get(key_id) if isinstance(by_server, dict) else None
    if not isinstance(signature, str):
        raise SignatureError(f"no signature of {server_name} with {key_id}")
    verify_signature(_signed_bytes(room_version, pdu), signature, verify_key_base64)


def servers_that_must_sign(room_version: RoomVersion, pdu: dict[str, Any]) -> set[str]:
    """The servers whose signatures an event needs: its sender's; the
    server of its ``event_id`` in versions 1 and 2; for a restricted join
    (version 8 on), the server of ``join_authorised_via_users_server``."""
    servers = {server_of(pdu["sender"])}
    if room_version.event_ids is EventIdFormat.SERVER_SUFFIXED and "event_id" in pdu:
        servers.add(server_of(pdu["event_id"]))
    content = pdu.get("content", {})
    authoriser = content.get("join_authorised_via_users_server")
    if (
        room_version.restricted_joins
        and pdu.get("type") == "m.room.member"
        and content.get("membership") == "join"
        and isinstance(authoriser, str)
    ):
        servers.add(server_of(authoriser))
    return servers
