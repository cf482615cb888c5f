"""The ``federation`` config section: addresses of other servers, retry."""

from __future__ import annotations

import tempfile
from typing import Any

from twisted.trial import unittest

from synapse_lite.config.homeserver import load_config
from synapse_lite.config.validation import ConfigError
from tests.config.test_homeserver import write_config
from tests.harness.tls import TestCA


class FederationConfigTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp()

    def load(self, federation: object) -> object:
        data = {"server_name": "a.example", "federation": federation}
        return load_config(write_config(self.dir, data))

    def test_defaults_and_addresses(self) -> None:
        config = load_config(write_config(self.dir, {"server_name": "a.example"}))
        federation = config.federation
        self.assertEqual(federation.retry.initial_seconds, 1.0)
        self.assertTrue(federation.verify_certificates)
        self.assertFalse(federation.address_filter.allows_address("127.0.0.1"))
        self.assertTrue(federation.address_filter.allows_address("8.8.8.8"))
        self.assertIsNone(federation.well_known_server)
        mapped = self.load({"destinations": {"b.example": "http://127.0.0.1:8009/"}})
        self.assertEqual(mapped.federation.destinations["b.example"], "http://127.0.0.1:8009")  # type: ignore[attr-defined]

    def test_discovery_settings(self) -> None:
        config: Any = self.load(
            {
                "ip_range_allowlist": ["127.0.0.0/8"],
                "verify_certificates": False,
                "well_known_server": "fed.a.example:443",
                "well_known_client": {"m.homeserver": {"base_url": "https://a.example"}},
            }
        )
        federation = config.federation
        self.assertTrue(federation.address_filter.allows_address("127.0.0.2"))
        self.assertFalse(federation.address_filter.allows_address("10.0.0.1"))
        self.assertFalse(federation.verify_certificates)
        self.assertEqual(federation.well_known_server, "fed.a.example:443")
        self.assertEqual(
            federation.well_known_client, {"m.homeserver": {"base_url": "https://a.example"}}
        )

    def test_key_settings(self) -> None:
        key = "A" * 43
        config: Any = self.load(
            {
                "trusted_key_servers": [
                    {"server_name": "notary.example", "verify_keys": {"ed25519:n": key}},
                    {"server_name": "other.example:8448"},
                ],
                "old_verify_keys": {"ed25519:old": {"key": key, "expired_ts": 5}},
            }
        )
        federation = config.federation
        self.assertEqual(
            [(t.server_name, t.verify_keys) for t in federation.trusted_key_servers],
            [("notary.example", {"ed25519:n": key}), ("other.example:8448", {})],
        )
        self.assertEqual(federation.old_verify_keys, {"ed25519:old": (key, 5)})
        self.assertEqual(self.load({}).federation.trusted_key_servers, ())  # type: ignore[attr-defined]
        with self.assertRaises(ConfigError) as cm:
            self.load(
                {
                    "trusted_key_servers": [
                        {"server_name": "bad name", "verify_keys": {"ed25519:n": "short"}}
                    ],
                    "old_verify_keys": {"rsa:x": {"key": key, "expired_ts": 1}},
                }
            )
        text = str(cm.exception)
        self.assertIn("federation.trusted_key_servers[0].server_name", text)
        self.assertIn("federation.trusted_key_servers[0].verify_keys.ed25519:n", text)
        self.assertIn("federation.old_verify_keys.rsa:x: key ids are", text)

    def test_bad_discovery_settings_name_their_key(self) -> None:
        with self.assertRaises(ConfigError) as cm:
            self.load(
                {
                    "ip_range_denylist": ["not a range"],
                    "well_known_server": "a b:99999",
                    "well_known_client": {"m.homeserver": {}},
                    "verify_certificates": "no",
                }
            )
        text = str(cm.exception)
        self.assertIn("federation.ip_range_denylist[0]", text)
        self.assertIn("federation.well_known_server: must be a server name", text)
        self.assertIn("federation.well_known_client: must be a mapping with m.homeserver", text)
        self.assertIn("federation.verify_certificates: must be true or false", text)

    def test_bad_values_name_their_key(self) -> None:
        with self.assertRaises(ConfigError) as cm:
            self.load(
                {
                    "destinations": {
                        "b.example": "ftp://x",
                        "c.example": "http://h:1/path",
                        "d.example": 5,
                        "e.example": "http://h:99999",
                    },
                    "retry": {"initial_seconds": 10, "max_seconds": 1, "typo": 1},
                    "request_timeout_seconds": "soon",
                }
            )
        text = str(cm.exception)
        for key in (
            "federation.destinations.b.example: must be an http:// or https:// URL",
            "federation.destinations.c.example: must be a base URL",
            "federation.destinations.d.example: must be a string",
            "federation.destinations.e.example: is not a URL",
            "federation.retry.max_seconds: must not be below initial_seconds",
            "federation.retry.typo: is not a known setting here",
            "federation.request_timeout_seconds: must be a number",
        ):
            self.assertIn(key, text)

    def test_extra_ca_paths(self) -> None:
        """CAs trusted for other servers' certificates besides the system's:
        read at load, relative to the config file, a bad one named."""
        self.assertEqual(self.load({}).federation.extra_ca_paths, ())  # type: ignore[attr-defined]
        ca = TestCA(self.dir)
        loaded = self.load({"extra_ca_paths": ["ca.pem"]})
        self.assertEqual(loaded.federation.extra_ca_paths, (ca.ca_path,))  # type: ignore[attr-defined]
        with self.assertRaises(ConfigError) as cm:
            self.load({"extra_ca_paths": "missing.pem"})
        self.assertIn("federation.extra_ca_paths[0]: cannot read", str(cm.exception))
