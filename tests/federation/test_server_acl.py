"""``m.room.server_acl`` matching and room EDU filtering
(synapse_lite/federation/server_acl.py)."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.trial import unittest

from synapse_lite.federation.server_acl import (
    acl_filtered_edu,
    host_of,
    is_ip_literal,
    room_allows_server,
    server_allowed,
)


class ServerAclTestCase(unittest.TestCase):
    def test_host_of(self) -> None:
        self.assertEqual(host_of("a.test:8448"), "a.test")
        self.assertEqual(host_of("a.test"), "a.test")
        self.assertEqual(host_of("[::1]:8448"), "[::1]")
        self.assertTrue(is_ip_literal("1.2.3.4"))
        self.assertTrue(is_ip_literal("[::1]"))
        self.assertFalse(is_ip_literal("a.test"))

    def test_rules_in_order(self) -> None:
        acl = {"allow": ["*"], "deny": ["*.evil.test", "b?d.test"], "allow_ip_literals": False}
        self.assertTrue(server_allowed(acl, "good.test:8448"))
        self.assertFalse(server_allowed(acl, "x.EVIL.test"))
        self.assertFalse(server_allowed(acl, "bad.test:443"))
        self.assertTrue(server_allowed(acl, "baad.test"))
        self.assertFalse(server_allowed(acl, "1.2.3.4:8448"))
        self.assertFalse(server_allowed(acl, "[::1]"))
        self.assertTrue(server_allowed({"allow": ["*"]}, "1.2.3.4"))

    def test_no_allow_denies_everyone_and_bad_entries_are_ignored(self) -> None:
        self.assertFalse(server_allowed({}, "a.test"))
        self.assertFalse(server_allowed({"allow": "*"}, "a.test"))
        self.assertTrue(server_allowed({"allow": [3, "a.test"], "deny": [None]}, "a.test"))
        # Regex characters in a glob are literal.
        self.assertFalse(server_allowed({"allow": ["a.t(e)st"]}, "a.test"))


class _Event:
    def __init__(self, content: dict[str, Any]) -> None:
        self.content = content


class _Store:
    """Current ACLs by room (``!open`` has none)."""

    def __init__(self, acls: dict[str, dict[str, Any]]) -> None:
        self.acls = acls

    async def get_current_state_ids(self, room_id: str) -> dict[tuple[str, str], str]:
        return {("m.room.server_acl", ""): room_id} if room_id in self.acls else {}

    async def get_event(self, event_id: str) -> _Event | None:
        return _Event(self.acls[event_id]) if event_id in self.acls else None


class RoomEduAclTestCase(unittest.TestCase):
    """Room EDUs from a server a room's ACL denies are dropped (``/send``)."""

    store = _Store({"!closed": {"allow": ["*"], "deny": ["a.test"]}})

    def filtered(self, edu: dict[str, Any], origin: str = "a.test") -> Any:
        return self.successResultOf(defer.ensureDeferred(acl_filtered_edu(self.store, origin, edu)))

    def test_typing(self) -> None:
        denied = {"edu_type": "m.typing", "content": {"room_id": "!closed", "typing": True}}
        allowed = {"edu_type": "m.typing", "content": {"room_id": "!open", "typing": True}}
        self.assertIsNone(self.filtered(denied))
        self.assertEqual(self.filtered(denied, "b.test"), denied)
        self.assertEqual(self.filtered(allowed), allowed)
        # No room id: left to the typing handler to refuse.
        malformed = {"edu_type": "m.typing", "content": {"room_id": 5}}
        self.assertEqual(self.filtered(malformed), malformed)

    def test_receipts_of_denied_rooms_are_removed(self) -> None:
        both = {"edu_type": "m.receipt", "content": {"!closed": {"r": 1}, "!open": {"r": 2}}}
        self.assertEqual(
            self.filtered(both), {"edu_type": "m.receipt", "content": {"!open": {"r": 2}}}
        )
        only_denied = {"edu_type": "m.receipt", "content": {"!closed": {}}}
        self.assertIsNone(self.filtered(only_denied))
        self.assertEqual(self.filtered(both, "b.test"), both)

    def test_other_edus_pass(self) -> None:
        edu = {"edu_type": "m.direct_to_device", "content": {"room_id": "!closed"}}
        self.assertEqual(self.filtered(edu), edu)

    def test_room_allows_server(self) -> None:
        for room_id, origin, expected in (
            ("!closed", "a.test", False),
            ("!closed", "b.test", True),
            ("!open", "a.test", True),
        ):
            allowed = self.successResultOf(
                defer.ensureDeferred(room_allows_server(self.store, room_id, origin))
            )
            self.assertEqual(allowed, expected, (room_id, origin))
