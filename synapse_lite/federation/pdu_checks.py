"""Checks of a PDU another server sent, made before anything of it is
stored (server-server spec, "Checks performed on receipt of a PDU", 1-3):
it is an event of its room's version within the spec's limits, its content
hash matches (else only its redacted form is kept, as the spec says) and
the servers that must sign it did.

The format and hash checks are pure (:func:`check_pdu_format`); the
signature check asks the keyring (:func:`check_pdu_signatures`). Each
raises :class:`PduRefused` with the reason a transaction's answer gives.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.api.identifiers import is_valid_user_id
from synapse_lite.api.room_versions import EventIdFormat, RoomVersion
from synapse_lite.event_graph.hashing import (
    content_hash_matches,
    event_id_of,
    servers_that_must_sign,
    verify_event_signature,
)
from synapse_lite.event_graph.pdu import Pdu, PduFormatError
from synapse_lite.events import event_canonical_json, pruned_event
from synapse_lite.federation.crypto import CanonicalJsonError
from synapse_lite.federation.keyring import KeyLookupError

if TYPE_CHECKING:
    from synapse_lite.federation.keyring import Keyring

logger = logging.getLogger(__name__)

#: The spec's limits for PDUs: 65,536 bytes of canonical JSON, at most 20
#: ``prev_events`` and 10 ``auth_events``.
MAX_PDU_BYTES = 65_536
MAX_PREV_EVENTS = 20
MAX_AUTH_EVENTS = 10


class PduRefused(Exception):
    """A received PDU is not stored: ``str(e)`` says why."""


@attr.s(slots=True, frozen=True, auto_attribs=True)
class CheckedPdu:
    """A received PDU that passed the format and hash checks."""

    event_id: str
    #: The graph's view of it (of ``pdu``: redacted when ``redacted``).
    event: Pdu
    #: What is stored and served of it: as received, or its redacted form
    #: when its content hash did not match (same id and signatures).
    pdu: dict[str, Any] = attr.ib(hash=False)
    redacted: bool = False


def received_form(room_version: RoomVersion, pdu: dict[str, Any]) -> dict[str, Any]:
    """``pdu`` without what no server signs: ``unsigned``, and from version
    3 a stray ``event_id`` (ids are hashes there; receivers ignore it)."""
    dropped = (
        ("unsigned",)
        if room_version.event_ids is EventIdFormat.SERVER_SUFFIXED
        else (
            "unsigned",
            "event_id",
        )
    )
    return {k: v for k, v in pdu.items() if k not in dropped}


def check_pdu_format(room_version: RoomVersion, pdu: Any) -> CheckedPdu:
    """The checks of a received ``pdu`` of ``room_version`` that need no
    keys: a JSON object whose canonical JSON the version allows, at most
    :data:`MAX_PDU_BYTES`, of the version's shape with 1 to 20
    ``prev_events`` (none for a create event) and at most 10 ``auth_events``,
    a user as its sender. A content hash that does not match gives its
    redacted form (``redacted``). :class:`PduRefused` otherwise."""
    if not isinstance(pdu, dict):
        raise PduRefused("a PDU must be a JSON object")
    pdu = received_form(room_version, pdu)
    try:
        encoded = event_canonical_json(pdu, room_version.strict_canonical_json)
    except (CanonicalJsonError, TypeError, ValueError) as e:
        version = room_version.identifier
        raise PduRefused(f"not valid JSON for room version {version}: {e}") from None
    if len(encoded) > MAX_PDU_BYTES:
        raise PduRefused(f"larger than {MAX_PDU_BYTES} bytes ({len(encoded)})")
    try:
        event_id = event_id_of(room_version, pdu)
        event = Pdu.from_json(room_version, pdu, event_id)
    except (KeyError, TypeError, ValueError, CanonicalJsonError, PduFormatError) as e:
        raise PduRefused(f"malformed for room version {room_version.identifier}: {e}") from None
    is_create = event.type == "m.room.create" and event.state_key == ""
    if not is_create and not 0 < len(event.prev_event_ids) <= MAX_PREV_EVENTS:
        raise PduRefused(f"an event names 1 to {MAX_PREV_EVENTS} prev_events")
    if len(event.auth_event_ids) > MAX_AUTH_EVENTS:
        raise PduRefused(f"an event names at most {MAX_AUTH_EVENTS} auth_events")
    if not is_valid_user_id(event.sender):
        raise PduRefused(f"its sender {event.sender!r} is not a user id")
    if content_hash_matches(room_version, pdu):
        return CheckedPdu(event_id, event, pdu)
    logger.info("%s: its content hash does not match: keeping its redacted form", event_id)
    redacted = pruned_event(room_version, pdu)
    return CheckedPdu(event_id, Pdu.from_json(room_version, redacted, event_id), redacted, True)


async def check_pdu_signatures(
    keyring: Keyring, room_version: RoomVersion, pdu: dict[str, Any]
) -> None:
    """:class:`PduRefused` unless every server that must sign ``pdu``
    (``servers_that_must_sign``, us included: an event claiming one of our
    users must carry our signature) signed it with a key valid when it says
    it was made (its ``origin_server_ts``: old keys verify old events)."""
    ts = pdu.get("origin_server_ts")
    valid_at = ts if isinstance(ts, int) and not isinstance(ts, bool) else None
    for server in sorted(servers_that_must_sign(room_version, pdu)):
        await check_signed_by(keyring, room_version, pdu, server, valid_at)


async def check_signed_by(
    keyring: Keyring,
    room_version: RoomVersion,
    pdu: dict[str, Any],
    server: str,
    valid_at_ms: int | None,
) -> None:
    """:class:`PduRefused` unless one of ``server``'s ed25519 keys, valid
    at ``valid_at_ms`` (None: now), signed ``pdu``; the refusal names each
    key tried and why it failed."""
    signatures = pdu.get("signatures")
    by_server = signatures.get(server) if isinstance(signatures, dict) else None
    problems = []
    for key_id in sorted(by_server) if isinstance(by_server, dict) else []:
        if not key_id.startswith("ed25519:"):
            continue
        try:
            key = await keyring.get_verify_key(server, key_id, valid_at_ms=valid_at_ms)
            verify_event_signature(room_version, pdu, server, key_id, key)
            return
        except (KeyLookupError, ValueError) as e:
            problems.append(f"{key_id}: {e}")
    detail = "; ".join(problems) or "no signature"
    raise PduRefused(f"not signed by {server} ({detail})")


async def check_room_pdu(
    keyring: Keyring, room_version: RoomVersion, room_id: str, pdu: Any
) -> CheckedPdu:
    """A PDU another server gave for ``room_id`` (fetched history, an event
    of a gap): :func:`check_pdu_format`, of that room, and
    :func:`check_pdu_signatures`. :class:`PduRefused` otherwise."""
    checked = check_pdu_format(room_version, pdu)
    if checked.event.room_id != room_id:
        raise PduRefused(f"{checked.event_id} is of another room ({checked.event.room_id})")
    await check_pdu_signatures(keyring, room_version, checked.pdu)
    return checked
