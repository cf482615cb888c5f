"""``m.room.server_acl`` matching (synapse_lite/federation/server_acl.py)."""

from __future__ import annotations

from twisted.trial import unittest

from synapse_lite.federation.server_acl import host_of, is_ip_literal, server_allowed


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
