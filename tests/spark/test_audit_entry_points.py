"""The commands a user types (issue 22, item 9), run as subprocesses:
``synapse-lite audit`` and ``spark-submit spark/audit.py`` from the venv's
``bin/`` without activating it, with the exit codes of ``docs/audit.md`` and
Spark's own logging quiet under the audit's progress lines.

Always on SQLite, so in CI's first pass only: what these tests prove is the
commands (how each finds Spark, Python and the audit, exits and logs), the
same on either engine; each engine's export and checks are the in-process
audit tests', which run on both. Each of these starts a JVM of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from twisted.trial import unittest

from spark.session import LOCAL_JAVA_OPTIONS
from synapse_lite.app.audit_command import REPO_ROOT
from tests.spark.fixture import AuditFixture
from tests.spark.session import require_java

BIN = os.path.dirname(sys.executable)
#: Spark's start and one small job in a fresh JVM, on a loaded machine.
TIMEOUT = 600


def not_activated_env(**extra: str) -> dict[str, str]:
    """The environment of a shell where the venv is not activated."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "SPARK_HOME")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if os.path.abspath(p) != BIN]
    env["PATH"] = os.pathsep.join(path)
    env.pop("PYSPARK_PYTHON", None)
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    return env | extra


def spark_log_lines(stderr: str) -> list[str]:
    """Lines of Spark's (log4j) logging below ERROR."""
    return [
        line
        for line in stderr.splitlines()
        if not line.startswith("audit:") and (" INFO " in line or " WARN " in line)
    ]


class AuditEntryPointsTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.hs = AuditFixture(self, engine_name="sqlite")
        self.hs.write("events", "main", [1, 2])
        self.hs.write("events", "worker1", [3])
        self.hs.position("events", "main", 3)
        self.hs.position("events", "worker1", 3)

    def run_command(self, argv: list[str], env: dict[str, str]) -> Any:
        return subprocess.run(
            argv, capture_output=True, text=True, cwd="/", env=env, timeout=TIMEOUT
        )

    def test_synapse_lite_audit(self) -> None:
        command = os.path.join(BIN, "synapse-lite")
        if not os.path.exists(command):
            raise unittest.SkipTest("synapse-lite is not installed in this venv")
        bad = os.path.join(self.hs.directory, "missing.yaml")
        refused = self.run_command([command, "audit", "-c", bad], not_activated_env())
        self.assertEqual(refused.returncode, 2, refused.stderr)
        self.assertIn("missing.yaml", refused.stderr)

        require_java()
        clean = self.run_command(
            [command, "audit", "-c", self.hs.config_path, "--partitions", "1"],
            not_activated_env(),
        )
        self.assertEqual(clean.returncode, 0, clean.stdout + clean.stderr)
        self.assertIn("Result: clean (exit 0)", clean.stdout)
        self.assertIn("audit: route: parquet (exporting a snapshot of", clean.stderr)
        self.assertEqual(spark_log_lines(clean.stderr), [])

    def test_spark_submit_from_the_venv(self) -> None:
        """As docs/audit.md says: ``PYSPARK_PYTHON=.venv/bin/python
        .venv/bin/spark-submit spark/audit.py``, with the JVM options it
        suggests for a local master (half the CPU time of Spark's defaults);
        a planted fault gives exit 1."""
        require_java()
        submit = os.path.join(BIN, "spark-submit")
        if not os.path.exists(submit):
            raise unittest.SkipTest("pyspark is not installed in this venv")
        self.hs.position("evnets", "main", 3)  # a stream_positions row of no stream
        result = self.run_command(
            [
                submit,
                "--master",
                "local[1]",
                "--driver-java-options",
                LOCAL_JAVA_OPTIONS,
                os.path.join(REPO_ROOT, "spark", "audit.py"),
                "-c",
                self.hs.config_path,
                "--partitions",
                "1",
            ],
            # SPARK_LOCAL_IP as docs/audit.md suggests: else spark-submit warns
            # about the host name before the audit even starts.
            not_activated_env(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1"),
        )
        output = result.stdout + result.stderr  # spark-submit sends Python's stderr to stdout
        self.assertEqual(result.returncode, 1, output)
        self.assertIn("[unexpected_stream_position]", result.stdout)
        self.assertIn("audit: started Spark (local[1])", output)
        # Spark's start logs 40-odd INFO lines unless the audit quiets it.
        self.assertEqual(spark_log_lines(output), [])
