"""The nginx and haproxy configurations ``synapse-lite routes`` writes are
accepted by nginx and haproxy themselves (without a single warning), for
every layout, and the command prints them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

from twisted.trial import unittest

from synapse_lite.config.generate import LAYOUTS
from tests.harness.processes import SOURCE_ROOT
from tests.harness.services import in_ci
from tests.routing.test_table import layout_config, rendered


def require_program(name: str, package: str) -> str:
    path = shutil.which(name) or (
        f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None
    )
    if path:
        return path
    message = f"{name} is not installed (Debian: apt-get install {package})"
    if in_ci():
        raise AssertionError(message + "; CI installs it in .ci/run")
    raise unittest.SkipTest(message)


class ProxiesTestCase(unittest.TestCase):
    def test_nginx_accepts_every_layout(self) -> None:
        nginx = require_program("nginx", "nginx-light")
        for layout in LAYOUTS:
            with self.subTest(layout=layout):
                directory = tempfile.mkdtemp()
                include = os.path.join(directory, "synapse-lite.conf")
                with open(include, "w") as f:
                    f.write(rendered(layout_config(layout), "nginx"))
                main = os.path.join(directory, "nginx.conf")
                with open(main, "w") as f:
                    f.write(
                        f"pid {directory}/nginx.pid;\nerror_log {directory}/error.log;\n"
                        f"events {{}}\nhttp {{\n  access_log off;\n"
                        f"  client_body_temp_path {directory}/body;\n  include {include};\n}}\n"
                    )
                result = subprocess.run(
                    [nginx, "-t", "-c", main, "-p", directory],
                    capture_output=True,
                    text=True,
                )
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertNotIn("[warn]", result.stderr)

    def test_haproxy_accepts_every_layout(self) -> None:
        haproxy = require_program("haproxy", "haproxy")
        for layout in LAYOUTS:
            with self.subTest(layout=layout):
                path = os.path.join(tempfile.mkdtemp(), "haproxy.cfg")
                with open(path, "w") as f:
                    f.write(rendered(layout_config(layout), "haproxy"))
                # -dW: a warning is an error.
                result = subprocess.run(
                    [haproxy, "-c", "-dW", "-f", path], capture_output=True, text=True
                )
                self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_routes_command(self) -> None:
        config = layout_config("default")
        env = dict(os.environ, PYTHONPATH=SOURCE_ROOT)
        command = [sys.executable, "-m", "synapse_lite.app.cli", "routes"]
        result = subprocess.run(
            [*command, "-c", config.config_files[0]], capture_output=True, text=True, env=env
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        table = json.loads(result.stdout)
        self.assertEqual(table["default"]["instances"], ["main"])
        result = subprocess.run(
            [*command, "-c", config.config_files[0], "--format", "haproxy"],
            capture_output=True,
            text=True,
            env=env,
        )
        self.assertIn("backend syl_readers", result.stdout)
        result = subprocess.run(
            [*command, "-c", config.config_files[0], "--format", "caddy"],
            capture_output=True,
            text=True,
            env=env,
        )
        self.assertEqual(result.returncode, 2)
        self.assertIn("invalid choice: 'caddy'", result.stderr)
