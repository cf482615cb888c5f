"""The ``federation`` config section: addresses of other servers, retry."""

from __future__ import annotations

import tempfile

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
        self.assertEqual(federation.base_url("b.example"), "https://b.example:8448")
        self.assertEqual(federation.base_url("b.example:443"), "https://b.example:443")
        self.assertEqual(federation.base_url("[::1]"), "https://[::1]:8448")
        self.assertEqual(federation.base_url("[::1]:8000"), "https://[::1]:8000")
        mapped = self.load({"destinations": {"b.example": "http://127.0.0.1:8009/"}})
        self.assertEqual(mapped.federation.base_url("b.example"), "http://127.0.0.1:8009")  # type: ignore[attr-defined]

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
