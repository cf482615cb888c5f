"""Hashes, event ids and signatures of events, with the spec's test vectors
(appendices, "Cryptographic Test Vectors")."""

from __future__ import annotations

import copy
from typing import Any

from twisted.trial import unittest

from synapse_lite.api.room_versions import SPEC_ROOM_VERSIONS, EventIdFormat
from synapse_lite.event_graph.hashing import (
    content_hash,
    content_hash_matches,
    event_id_of,
    servers_that_must_sign,
    sign_event,
    verify_event_signature,
)
from synapse_lite.event_graph.pdu import Pdu, PduFormatError
from synapse_lite.events import pruned_event
from synapse_lite.federation.crypto import SignatureError, SigningKey, decode_base64

V = SPEC_ROOM_VERSIONS
#: The spec's test key: server "domain", key id "ed25519:1".
SPEC_KEY = SigningKey("1", decode_base64("YJDBA9Xnr2sVqXD9Vj7XVUnmFZcZrlw8Md7kMW+3XA1"))

MINIMAL_EVENT: dict[str, Any] = {
    "room_id": "!x:domain",
    "sender": "@a:domain",
    "origin": "domain",
    "origin_server_ts": 1000000,
    "signatures": {},
    "hashes": {},
    "type": "X",
    "content": {},
    "prev_events": [],
    "auth_events": [],
    "depth": 3,
    "unsigned": {"age_ts": 1000000},
}

REDACTABLE_EVENT: dict[str, Any] = {
    "content": {"body": "Here is the message content"},
    "event_id": "$0:domain",
    "origin": "domain",
    "origin_server_ts": 1000000,
    "type": "m.room.message",
    "room_id": "!r:domain",
    "sender": "@u:domain",
    "signatures": {},
    "unsigned": {"age_ts": 1000000},
}


class SpecTestVectors(unittest.TestCase):
    def test_minimal_event(self) -> None:
        signed = sign_event(V["1"], MINIMAL_EVENT, "domain", SPEC_KEY)
        self.assertEqual(
            signed["hashes"], {"sha256": "5jM4wQpv6lnBo7CLIghJuHdW+s2CMBJPUOGOC89ncos"}
        )
        self.assertEqual(
            signed["signatures"]["domain"]["ed25519:1"],
            "KxwGjPSDEtvnFgU00fwFz+l6d2pJM6XBIaMEn81SXPTRl16AqLAYqfIReFGZlHi5KLjAWbOoMszkwsQma+lYAg",
        )
        self.assertEqual(signed["unsigned"], {"age_ts": 1000000})

    def test_redactable_event(self) -> None:
        signed = sign_event(V["1"], REDACTABLE_EVENT, "domain", SPEC_KEY)
        self.assertEqual(
            signed["hashes"], {"sha256": "onLKD1bGljeBWQhWZ1kaP9SorVmRQNdN5aM2JYU2n/g"}
        )
        self.assertEqual(
            signed["signatures"]["domain"]["ed25519:1"],
            "Wm+VzmOUOz08Ds+0NTWb1d4CZrVsJSikkeRxh6aCcUwu6pNC78FunoD7KNWzqFn241eYHYMGCA5McEiVPdhzBA",
        )


class Signatures(unittest.TestCase):
    def test_verifies_and_survives_redaction(self) -> None:
        signed = sign_event(V["1"], REDACTABLE_EVENT, "domain", SPEC_KEY)
        key = SPEC_KEY.verify_key_base64
        verify_event_signature(V["1"], signed, "domain", "ed25519:1", key)
        # The signature covers the redacted event: a redaction keeps it valid...
        redacted = {**signed, "content": {}}
        verify_event_signature(V["1"], redacted, "domain", "ed25519:1", key)
        # ...but not a change to what redaction keeps, and the content hash
        # then no longer matches.
        self.assertFalse(content_hash_matches(V["1"], redacted))
        moved = {**signed, "origin_server_ts": 1000001}
        self.assertRaises(
            SignatureError, verify_event_signature, V["1"], moved, "domain", "ed25519:1", key
        )
        self.assertRaises(
            SignatureError, verify_event_signature, V["1"], signed, "other", "ed25519:1", key
        )

    def test_content_hash(self) -> None:
        signed = sign_event(V["10"], MINIMAL_EVENT, "domain", SPEC_KEY)
        self.assertTrue(content_hash_matches(V["10"], signed))
        tampered = {**signed, "content": {"body": "x"}}
        self.assertFalse(content_hash_matches(V["10"], tampered))
        self.assertFalse(content_hash_matches(V["10"], {**signed, "hashes": {"sha256": "!"}}))
        # unsigned, signatures and hashes are outside the hash
        self.assertEqual(
            content_hash(V["10"], {**MINIMAL_EVENT, "unsigned": {"x": 1}, "signatures": {"a": 1}}),
            content_hash(V["10"], MINIMAL_EVENT),
        )

    def test_servers_that_must_sign(self) -> None:
        join = {
            "event_id": "$1:origin",
            "sender": "@u:sender",
            "type": "m.room.member",
            "content": {"membership": "join", "join_authorised_via_users_server": "@v:resident"},
        }
        self.assertEqual(servers_that_must_sign(V["1"], join), {"sender", "origin"})
        self.assertEqual(servers_that_must_sign(V["7"], join), {"sender"})
        self.assertEqual(servers_that_must_sign(V["8"], join), {"sender", "resident"})


class EventIds(unittest.TestCase):
    def _event(self, **kw: Any) -> dict[str, Any]:
        return {**copy.deepcopy(MINIMAL_EVENT), **kw}

    def test_formats_per_version(self) -> None:
        self.assertEqual(event_id_of(V["2"], self._event(event_id="$a:domain")), "$a:domain")
        for version in V.values():
            if version.event_ids is EventIdFormat.SERVER_SUFFIXED:
                continue
            event_id = event_id_of(version, sign_event(version, self._event(), "domain", SPEC_KEY))
            self.assertEqual(len(event_id), 44, version.identifier)
            if version.event_ids is EventIdFormat.REFERENCE_HASH_URL_SAFE:
                self.assertNotRegex(event_id[1:], r"[+/=]")

    def test_reference_hash_ignores_signatures_and_unredacted_content(self) -> None:
        v4 = V["4"]
        event = sign_event(v4, self._event(content={"body": "a"}), "domain", SPEC_KEY)
        base = event_id_of(v4, event)
        self.assertEqual(event_id_of(v4, {**event, "signatures": {}, "unsigned": {"b": 2}}), base)
        # Content is covered through the content hash in ``hashes``.
        rehashed = sign_event(v4, {**event, "content": {"body": "b"}}, "domain", SPEC_KEY)
        self.assertNotEqual(event_id_of(v4, rehashed), base)
        self.assertNotEqual(event_id_of(v4, {**event, "depth": 4}), base)

    def test_v12_create_event_names_the_room(self) -> None:
        v12 = V["12"]
        create = self._event(type="m.room.create", state_key="", content={"room_version": "12"})
        del create["room_id"]
        event_id = event_id_of(v12, create)
        pdu = Pdu.from_json(v12, create, event_id)
        self.assertEqual(pdu.room_id, "!" + event_id[1:])
        self.assertRaises(
            PduFormatError, Pdu.from_json, v12, {**create, "room_id": "!x:domain"}, event_id
        )

    def test_pdu_reads_references_per_version(self) -> None:
        v1 = Pdu.from_json(V["1"], self._event(prev_events=[["$p:d", {}]]), "$e:d")
        self.assertEqual(v1.prev_event_ids, ("$p:d",))
        self.assertRaises(
            PduFormatError, Pdu.from_json, V["3"], self._event(prev_events=[["$p:d", {}]]), "$e"
        )
        self.assertRaises(PduFormatError, Pdu.from_json, V["3"], self._event(depth="3"), "$e")
        v11 = Pdu.from_json(
            V["11"], self._event(type="m.room.redaction", content={"redacts": "$x"}), "$e"
        )
        self.assertEqual(v11.redacts, "$x")


class Redaction(unittest.TestCase):
    """The redaction algorithm per version (``events.pruned_event``), as
    hashes and signatures see it, version 12 included."""

    def test_per_version(self) -> None:
        create = {**MINIMAL_EVENT, "type": "m.room.create", "state_key": "",
                  "content": {"creator": "@a:domain", "other": 1}}  # fmt: skip
        levels = {**MINIMAL_EVENT, "type": "m.room.power_levels", "state_key": "",
                  "content": {"invite": 50, "ban": 50, "other": 1}}  # fmt: skip
        for version, create_kept, levels_kept, origin_kept in [
            ("1", {"creator"}, {"ban"}, True),
            ("10", {"creator"}, {"ban"}, True),
            ("11", {"creator", "other"}, {"ban", "invite"}, False),
            ("12", {"creator", "other"}, {"ban", "invite"}, False),
        ]:
            v = V[version]
            self.assertEqual(set(pruned_event(v, create)["content"]), create_kept, version)
            self.assertEqual(set(pruned_event(v, levels)["content"]), levels_kept, version)
            self.assertEqual("origin" in pruned_event(v, create), origin_kept, version)
            # What redaction drops is outside the signature.
            signed = sign_event(v, levels, "domain", SPEC_KEY)
            stripped = {**signed, "content": {"ban": 50, "invite": 50}}
            verify_event_signature(v, stripped, "domain", "ed25519:1", SPEC_KEY.verify_key_base64)
