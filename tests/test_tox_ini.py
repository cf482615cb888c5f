"""The top-level tox.ini runs what the README and .ci/run run: the trial
suite on SQLite and on PostgreSQL, and the linters."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess

from twisted.trial import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


class ToxIniTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.tox = configparser.ConfigParser(interpolation=None)
        self.tox.read_string(read("tox.ini"))

    def test_environments(self) -> None:
        self.assertEqual(
            [e.strip() for e in self.tox["tox"]["envlist"].split(",")],
            ["sqlite", "postgres", "lint"],
        )
        for env, db in (("sqlite", "sqlite"), ("postgres", "postgres")):
            self.assertIn(f"SYNAPSE_LITE_TEST_DB = {db}", self.tox[f"testenv:{env}"]["setenv"])

    def test_suite_command_is_the_readme_s(self) -> None:
        readme_command = re.search(
            r"\.venv/bin/(python -m twisted\.trial [^\n`]*)", read("README.md")
        )
        assert readme_command is not None
        self.assertEqual(self.tox["testenv"]["commands"].strip(), readme_command.group(1).strip())
        self.assertIn("npm ci -s", self.tox["testenv"]["commands_pre"])
        self.assertIn("tests/e2e/js", self.tox["testenv"]["commands_pre"])

    def test_lint_commands_are_ci_s(self) -> None:
        ci = read(".ci/run")
        for command in self.tox["testenv:lint"]["commands"].strip().splitlines():
            self.assertIn(f".venv/bin/{command.strip()}", ci)

    def test_tox_reads_it(self) -> None:
        tox = shutil.which("tox")
        if tox is None:
            raise unittest.SkipTest("tox is not installed (pip install tox) to read tox.ini")
        result = subprocess.run(
            [tox, "config", "-e", "sqlite,postgres,lint", "-k", "commands"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("python -m twisted.trial -j2 tests", result.stdout)
