"""Events as each room version shapes them: the redaction algorithm, event
ids, and the redacted event as clients are served it."""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any

from twisted.trial import unittest

from synapse_lite.api.errors import SynapseError
from synapse_lite.api.room_versions import (
    DEFAULT_ROOM_VERSION,
    KNOWN_ROOM_VERSIONS,
    room_version_of_request,
)
from synapse_lite.events import Event, EventSpec, pruned_content
from synapse_lite.federation.crypto import canonical_json

V = KNOWN_ROOM_VERSIONS


def event(event_type: str, content: dict[str, Any], **kw: Any) -> Event:
    return Event(
        event_id="$e",
        room_id="!r:hs",
        type=event_type,
        state_key=kw.pop("state_key", ""),
        sender="@a:hs",
        content=content,
        origin_server_ts=1,
        stream_ordering=1,
        depth=1,
        instance_name="main",
        **kw,
    )


class RoomVersionsTestCase(unittest.TestCase):
    def test_the_versions_served(self) -> None:
        self.assertEqual(list(KNOWN_ROOM_VERSIONS), [str(n) for n in range(1, 13)])
        self.assertEqual(DEFAULT_ROOM_VERSION.identifier, "10")
        self.assertEqual(V["6"].join_rules, ("public", "invite"))
        self.assertEqual(
            V["10"].join_rules, ("public", "invite", "knock", "restricted", "knock_restricted")
        )
        self.assertNotIn("knock", V["6"].memberships)

    def test_requested_versions(self) -> None:
        self.assertIs(room_version_of_request("7", "room_version"), V["7"])
        for value, errcode in ((7, "M_BAD_JSON"), (None, "M_BAD_JSON"), ("13", None), ("x", None)):
            with self.assertRaises(SynapseError) as e:
                room_version_of_request(value, "room_version")
            self.assertEqual(e.exception.code, 400)
            self.assertEqual(e.exception.errcode, errcode or "M_UNSUPPORTED_ROOM_VERSION")


class RedactionAlgorithmTestCase(unittest.TestCase):
    def test_what_each_version_keeps(self) -> None:
        member = {
            "membership": "join",
            "displayname": "A",
            "join_authorised_via_users_server": "@b:hs",
            "third_party_invite": {"display_name": "x", "signed": {"token": "t"}},
        }
        self.assertEqual(pruned_content("m.room.member", member, V["8"]), {"membership": "join"})
        self.assertEqual(
            pruned_content("m.room.member", member, V["9"]),
            {"membership": "join", "join_authorised_via_users_server": "@b:hs"},
        )
        self.assertEqual(
            pruned_content("m.room.member", member, V["11"]),
            {
                "membership": "join",
                "join_authorised_via_users_server": "@b:hs",
                "third_party_invite": {"signed": {"token": "t"}},
            },
        )
        create = {"creator": "@a:hs", "room_version": "10", "m.federate": False}
        self.assertEqual(pruned_content("m.room.create", create, V["10"]), {"creator": "@a:hs"})
        self.assertEqual(pruned_content("m.room.create", create, V["11"]), create)
        rules = {"join_rule": "restricted", "allow": [], "other": 1}
        self.assertEqual(
            pruned_content("m.room.join_rules", rules, V["7"]), {"join_rule": "restricted"}
        )
        self.assertEqual(
            pruned_content("m.room.join_rules", rules, V["8"]),
            {"join_rule": "restricted", "allow": []},
        )
        levels = {"ban": 50, "invite": 0, "notifications": {"room": 50}}
        self.assertEqual(pruned_content("m.room.power_levels", levels, V["10"]), {"ban": 50})
        self.assertEqual(
            pruned_content("m.room.power_levels", levels, V["11"]), {"ban": 50, "invite": 0}
        )
        aliases = {"aliases": ["#a:hs"]}
        self.assertEqual(pruned_content("m.room.aliases", aliases, V["5"]), aliases)
        self.assertEqual(pruned_content("m.room.aliases", aliases, V["6"]), {})
        redaction = {"redacts": "$x", "reason": "r"}
        self.assertEqual(pruned_content("m.room.redaction", redaction, V["10"]), {})
        self.assertEqual(pruned_content("m.room.redaction", redaction, V["11"]), {"redacts": "$x"})
        message = {"body": "secret", "msgtype": "m.text"}
        for version in V.values():
            self.assertEqual(pruned_content("m.room.message", message, version), {})

    def test_served_redaction_events(self) -> None:
        """A redaction names its target at the top level and in its content
        in every version; redacted, it keeps the name only from version 11."""
        cause = event("m.room.redaction", {"reason": "r"}, state_key=None, redacts="$t")
        served = cause.to_client_dict()
        self.assertEqual((served["redacts"], served["content"]["redacts"]), ("$t", "$t"))
        for version, kept in (("10", False), ("11", True)):
            content = {"reason": "r", "redacts": "$t"} if version == "11" else {"reason": "r"}
            target = event("m.room.redaction", content, state_key=None, redacts="$t")
            redacted = target.redacted(cause, V[version]).to_client_dict()
            self.assertEqual("redacts" in redacted, kept)
            self.assertEqual(redacted["content"], {"redacts": "$t"} if kept else {})
            self.assertEqual(redacted["unsigned"]["redacted_because"]["redacts"], "$t")


class EventIdsTestCase(unittest.TestCase):
    def spec(self, body: str = "hi", redacts: str | None = None) -> EventSpec:
        return EventSpec("m.room.message", None, "@a:hs", {"body": body}, 1000, redacts=redacts)

    def test_formats(self) -> None:
        for version in ("1", "2"):
            content = self.spec().to_persist("!r:hs", V[version], "hs", (), 1)
            self.assertRegex(content.event_id, r"^\$[A-Za-z0-9_-]+:hs$")
        for version, alphabet in (
            ("3", "A-Za-z0-9+/"),
            ("4", "A-Za-z0-9_-"),
            ("11", "A-Za-z0-9_-"),
        ):
            content = self.spec().to_persist("!r:hs", V[version], "hs", ["$prev"], 2)
            self.assertRegex(content.event_id, rf"^\$[{alphabet}]{{43}}$")

    def test_the_reference_hash(self) -> None:
        """The id is the SHA-256 of the redacted event's canonical JSON, with
        the content hash: recomputed here from the spec's definition."""
        content = self.spec("secret").to_persist("!r:hs", V["10"], "hs", ["$prev"], 7)
        pdu: dict[str, Any] = {
            "room_id": "!r:hs",
            "type": "m.room.message",
            "sender": "@a:hs",
            "content": {"body": "secret"},
            "origin_server_ts": 1000,
            "depth": 7,
            "prev_events": ["$prev"],
            "auth_events": [],
        }
        content_hash = hashlib.sha256(canonical_json(pdu)).digest()
        redacted = {
            **pdu,
            "content": {},
            "hashes": {"sha256": base64.b64encode(content_hash).decode().rstrip("=")},
        }
        reference = hashlib.sha256(canonical_json(redacted)).digest()
        self.assertEqual(
            content.event_id, "$" + base64.urlsafe_b64encode(reference).decode().rstrip("=")
        )

    def test_ids_differ_with_content_and_position(self) -> None:
        version = V["10"]
        ids = {
            self.spec("a").to_persist("!r:hs", version, "hs", ["$p"], 2).event_id,
            self.spec("b").to_persist("!r:hs", version, "hs", ["$p"], 2).event_id,
            self.spec("a").to_persist("!r:hs", version, "hs", ["$q"], 2).event_id,
            self.spec("a").to_persist("!s:hs", version, "hs", ["$p"], 2).event_id,
        }
        self.assertEqual(len(ids), 4)
        # Versions before 6 hash what they accepted (floats) as JSON has it.
        old = EventSpec("m.room.message", None, "@a:hs", {"n": 1.5}, 1)
        self.assertTrue(re.match(r"^\$", old.to_persist("!r:hs", V["5"], "hs", (), 1).event_id))

    def test_redactions_of_version_11_carry_redacts_in_content(self) -> None:
        for version, in_content in (("10", False), ("11", True)):
            persisted = self.spec(redacts="$t").to_persist("!r:hs", V[version], "hs", (), 1)
            self.assertEqual(persisted.redacts, "$t")
            self.assertEqual("redacts" in persisted.content, in_content)
