"""contrib/sytest/: SyTest starts synapse_lite itself through our plugin.

A smoke test on the workplace's SyTest snapshot (``shared/sytest/src``,
copied to a temporary directory: CI's shared folder is read-only): SyTest's
first files (registration, login, creating rooms) and
``tests/46direct/04federation.pl``, whose two tests send to-device messages
from a user of one homeserver to a user of another and back. Those pass only
if the plugin started both homeservers, each with its own ports and
database, serving federation over HTTPS with a certificate of SyTest's CA and
trusting that CA for the other. It needs SyTest's Perl modules (Debian's,
which ``.ci/run`` installs): skipped with the reason where they are missing,
a failure under ``CI=true``. About 20 s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections import Counter
from typing import Any

import yaml
from twisted.trial import unittest

from bench.sytest import (
    find_shared_sytest,
    missing_perl_modules,
    read_tap,
    run_with_plugin,
    summary,
)
from bench.sytest_homeserver import (
    APP_SERVICE_KEY,
    HttpsFront,
    add_https_front,
    apply_sytest_recipe,
    layout_config,
    ports_of,
    write_config,
)
from synapse_lite.config.homeserver import load_config
from synapse_lite.config.validation import ConfigError
from tests.harness.services import ServiceMissing, in_ci
from tests.harness.tls import TestCA

#: Each file's expected (passed, failed, skipped).
SMOKE_FILES = {
    "tests/10apidoc/01register.pl": (26, 0, 0),
    "tests/10apidoc/02login.pl": (6, 0, 0),
    "tests/10apidoc/30room-create.pl": (10, 0, 0),
    "tests/46direct/04federation.pl": (2, 0, 0),
}
#: Longest the smoke run may take (it takes about 20 s on a quiet machine).
TIMEOUT_SECONDS = 300


def _skip_or_fail(reason: str) -> None:
    if in_ci():
        raise ServiceMissing(reason + " (CI=true: this is a failure)")
    raise unittest.SkipTest(reason)


class SyTestPluginSmokeTestCase(unittest.TestCase):
    def setUp(self) -> None:
        shared = find_shared_sytest()
        if shared is None:
            _skip_or_fail("no shared/sytest/src (SyTest's snapshot) beside this checkout")
            return
        missing = missing_perl_modules(shared)
        if missing:
            _skip_or_fail(
                f"SyTest's Perl modules are missing ({', '.join(missing)}): install the Debian"
                " packages .ci/run lists"
            )
        self.directory = tempfile.mkdtemp(prefix="sytest_smoke_")
        self.addCleanup(shutil.rmtree, self.directory, True)
        self.sytest_dir = os.path.join(self.directory, "sytest")
        shutil.copytree(os.path.join(shared, "src"), self.sytest_dir, symlinks=True)
        # CI's copy of the shared folder has no write bits, and the copy
        # keeps them: make it ours to write in and to remove.
        for root, directories, files in os.walk(self.sytest_dir):
            for name in [*directories, *files]:
                path = os.path.join(root, name)
                if not os.path.islink(path):
                    os.chmod(path, os.stat(path).st_mode | 0o200)
        os.chmod(self.sytest_dir, 0o755)

    def test_first_files_and_two_homeservers(self) -> None:
        out = os.path.join(self.directory, "out")
        os.makedirs(out)
        try:
            results = run_with_plugin(
                self.sytest_dir, out, list(SMOKE_FILES), timeout=TIMEOUT_SECONDS
            )
        except subprocess.TimeoutExpired:
            self.fail(f"SyTest did not finish within {TIMEOUT_SECONDS} s: {self._tail(out)}")
        counts: dict[str, Counter[str]] = {name: Counter() for name in SMOKE_FILES}
        for result in results:
            counts.setdefault(result.file, Counter())[result.result] += 1
        found = {name: (c["pass"], c["fail"], c["skip"]) for name, c in counts.items()}
        failed = [f"{r.file}: {r.name} ({r.result})" for r in results if r.result != "pass"]
        self.assertEqual(found, SMOKE_FILES, f"{failed}\n{self._tail(out)}")

        # Two homeservers, each on its own ports and database.
        configs = []
        for index in (0, 1):
            with open(os.path.join(out, "work", f"server-{index}", "homeserver.yaml")) as f:
                configs.append(yaml.safe_load(f))
        names = [config["server_name"] for config in configs]
        self.assertNotEqual(names[0], names[1])
        for index, config in enumerate(configs):
            database = os.path.join(out, "work", f"server-{index}", "data", "homeserver.db")
            self.assertTrue(os.path.exists(database), database)
            tls = [lst for lst in config["listeners"] if "tls_certificate_path" in lst]
            self.assertEqual(
                [(lst["port"], lst["resources"]) for lst in tls],
                [(int(names[index].rsplit(":", 1)[1]), ["client", "federation", "keys"])],
            )

    def _tail(self, out: str) -> str:
        try:
            with open(os.path.join(out, "results.tap"), encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-40:])
        except OSError:
            return "(no results.tap)"


class PluginConfigTestCase(unittest.TestCase):
    """The config the plugin has ``bench/sytest_homeserver.py`` write: the
    layout on SyTest's ports, HTTPS where SyTest connects, SyTest's CA
    trusted, what synapse_lite does not know yet left out."""

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir, True)
        ca = TestCA(self.dir)
        self.certificate, self.key = ca.issue("localhost", ["localhost"])
        # A stand-in for SyTest's checkout: its keys/ holds its CA and the
        # identity server's self-signed certificate.
        self.sytest_dir = os.path.join(self.dir, "sytest")
        os.makedirs(os.path.join(self.sytest_dir, "keys"))
        for name in ("ca.crt", "tls-selfsigned.crt"):
            shutil.copy(ca.ca_path, os.path.join(self.sytest_dir, "keys", name))

    def config(self, layout: str, front: HttpsFront) -> dict[str, Any]:
        config = layout_config(layout, f"localhost:{front.federation_port}", 29001, 12)
        add_https_front(config, front, self.sytest_dir)
        apply_sytest_recipe(config, self.sytest_dir)
        return config

    def front(self, federation_port: int, client_port: int) -> HttpsFront:
        return HttpsFront(self.certificate, self.key, federation_port, client_port)

    def test_monolith_serves_client_and_federation_on_one_https_port(self) -> None:
        config = self.config("monolith", self.front(29000, 29000))
        path, left_out = write_config(self.dir, config)
        self.assertEqual(left_out, [])
        loaded = load_config(path)
        https = [listener for listener in loaded.listeners if listener.tls is not None]
        self.assertEqual(
            [(lst.port, lst.resources) for lst in https],
            [(29000, ("client", "federation", "keys"))],
        )
        ca = os.path.join(self.sytest_dir, "keys", "ca.crt")
        self.assertEqual(loaded.federation.extra_ca_paths, (ca,))
        self.assertEqual(loaded.registration_shared_secret, "reg_secret")
        self.assertFalse(loaded.rate_limits.enabled)
        self.assertIsNone(loaded.router)

    def test_default_layout_clients_through_the_router(self) -> None:
        config = self.config("default", self.front(29000, 28999))
        loaded = load_config(write_config(self.dir, config)[0])
        assert loaded.router is not None
        https = [lst for lst in loaded.router.listeners if lst.tls is not None]
        self.assertEqual([(lst.port, lst.resources) for lst in https], [(28999, ("client",))])
        federation = [lst for lst in loaded.listeners if lst.tls is not None]
        self.assertEqual(
            [(lst.port, lst.resources) for lst in federation], [(29000, ("federation", "keys"))]
        )
        # The layout's own 9 ports (the router's federation port among them)
        # within the 12 SyTest allocates.
        self.assertEqual(ports_of(config) - {28999, 29000}, set(range(29001, 29001 + 9)))

    def test_layouts_it_cannot_serve(self) -> None:
        with self.assertRaisesRegex(ValueError, "client port differs"):
            self.config("default", self.front(29000, 29000))
        with self.assertRaisesRegex(ValueError, "client and federation ports are one"):
            self.config("monolith", self.front(29000, 28999))
        with self.assertRaisesRegex(ValueError, "beyond the 4 from 29001"):
            layout_config("default", "localhost:29000", 29001, 4)
        config = layout_config("default", "localhost:29000", 29001, 12)
        config["workers"]["synchrotron1"]["listeners"][0]["resources"].append("federation")
        with self.assertRaisesRegex(
            ValueError, r"2 processes serve federation \(main, synchrotron1"
        ):
            add_https_front(config, self.front(29000, 28999), self.sytest_dir)

    def test_settings_synapse_lite_does_not_know_are_left_out(self) -> None:
        """Optional settings (SyTest's application-service registrations)
        are passed on where synapse_lite knows them and left out where it
        does not; any other mistake still stops."""
        config = self.config("monolith", self.front(29000, 29000))
        config["a_setting_of_a_later_version"] = ["x"]
        optional = ("a_setting_of_a_later_version", APP_SERVICE_KEY)
        _, left_out = write_config(self.dir, dict(config), optional)
        self.assertEqual(left_out, ["a_setting_of_a_later_version"])
        config["no_such_setting"] = 1
        with self.assertRaisesRegex(ConfigError, "no_such_setting: is not a known setting"):
            write_config(self.dir, config, optional)


class ReadTapTestCase(unittest.TestCase):
    def test_results_and_directories(self) -> None:
        lines = [
            "tests/10apidoc/01register.pl:\n",
            "    Test 1 GET /register yields a set of flows... OK\n",
            "ok 1 GET /register yields a set of flows\n",
            "    Test 2 Can create a user... ok 2 Can create a user # skip lack of X\n",
            "tests/42tags.pl:\n",
            "not ok 3 Can add tag (2 subtests)\n",
            "  ok 1 step one\n",
            "not ok 4 (expected fail) Tag gone # TODO expected fail\n",
            "# not ok 5 a diagnostic line\n",
        ]
        results = read_tap(iter(lines))
        self.assertEqual(
            [(r.file, r.directory, r.name, r.result) for r in results],
            [
                (
                    "tests/10apidoc/01register.pl",
                    "10apidoc",
                    "GET /register yields a set of flows",
                    "pass",
                ),
                ("tests/10apidoc/01register.pl", "10apidoc", "Can create a user", "skip"),
                ("tests/42tags.pl", "42tags", "Can add tag", "fail"),
                ("tests/42tags.pl", "42tags", "Tag gone", "fail"),
            ],
        )
        self.assertEqual(
            summary(results).splitlines()[0], "1 passed, 2 failed, 1 skipped (4 tests)"
        )
