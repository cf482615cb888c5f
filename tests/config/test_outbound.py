"""``outbound_requests``: extra CA files read at load (relative to the config
file, a missing one or one without a certificate refused with its key path),
and the IP ranges user-named destinations may not be reached at."""

from __future__ import annotations

import tempfile
from typing import Any

from twisted.trial import unittest

from synapse_lite.config.homeserver import load_config
from synapse_lite.config.outbound import OutboundRequestsConfig
from synapse_lite.config.validation import ConfigError
from tests.config.test_homeserver import sharded_config, write_config
from tests.harness.tls import TestCA


class OutboundRequestsConfigTestCase(unittest.TestCase):
    def load(self, directory: str, **section: Any) -> Any:
        data = sharded_config()
        data["outbound_requests"] = section
        return load_config(write_config(directory, data)).outbound_requests

    def refused(self, directory: str, **section: Any) -> str:
        with self.assertRaises(ConfigError) as raised:
            self.load(directory, **section)
        return str(raised.exception)

    def test_extra_ca_paths(self) -> None:
        directory = tempfile.mkdtemp()
        self.assertEqual(self.load(directory).extra_ca_paths, ())
        ca = TestCA(directory)
        self.assertEqual(
            self.load(directory, extra_ca_paths=["ca.pem"]).extra_ca_paths, (ca.ca_path,)
        )
        # One file may be given as a string.
        self.assertEqual(
            self.load(directory, extra_ca_paths="ca.pem").extra_ca_paths, (ca.ca_path,)
        )
        with open(f"{directory}/notes.txt", "w") as f:
            f.write("not a certificate\n")
        for value, reason in [
            (["missing.pem"], "outbound_requests.extra_ca_paths[0]: cannot read"),
            (
                ["notes.txt"],
                f"outbound_requests.extra_ca_paths[0]: {directory}/notes.txt holds no PEM",
            ),
            ([5], "outbound_requests.extra_ca_paths[0]: must be a string"),
            ({"a": 1}, "outbound_requests.extra_ca_paths: must be a list of strings"),
        ]:
            self.assertIn(reason, self.refused(directory, extra_ca_paths=value))
        self.assertIn(
            "outbound_requests.ca_paths: is not a known setting here",
            self.refused(directory, ca_paths=["ca.pem"]),
        )

    def test_ip_ranges(self) -> None:
        default = OutboundRequestsConfig()
        private = ["127.0.0.1", "10.1.2.3", "192.168.0.1", "169.254.169.254", "::1", "fe80::1",
                   "fd00::1", "::ffff:127.0.0.1", "0.0.0.0", "100.64.0.1"]  # fmt: skip
        for address in private:
            self.assertFalse(default.allows_address(address), address)
        for address in ("93.184.216.34", "2606:2800:220:1::1", "8.8.8.8"):
            self.assertTrue(default.allows_address(address), address)
        directory = tempfile.mkdtemp()
        allowing = self.load(directory, ip_range_allowlist=["127.0.0.1"])
        self.assertTrue(allowing.allows_address("127.0.0.1"))
        self.assertFalse(allowing.allows_address("127.0.0.2"))
        replaced = self.load(directory, ip_range_denylist=["8.8.8.0/24"])
        self.assertTrue(replaced.allows_address("127.0.0.1"))
        self.assertFalse(replaced.allows_address("8.8.8.8"))
        self.assertIn(
            "outbound_requests.ip_range_allowlist[1]: 'nonsense' is not an IP address or range",
            self.refused(directory, ip_range_allowlist=["127.0.0.1", "nonsense"]),
        )
