"""The documented cluster route, exercised (issue 30): a Spark standalone
cluster (a master and one worker, started from the pyspark installation,
bound to 127.0.0.1 with little memory) runs ``spark-submit --master
spark://... spark/audit.py --jdbc-jar ...``, reading PostgreSQL over JDBC,
and finds what the local run finds.

Needs Java, PostgreSQL and the JDBC driver jar: without them it is skipped
with the reason, except under ``CI=true``, where that is a failure. Always
PostgreSQL, whatever ``SYNAPSE_LITE_TEST_DB`` says (the JDBC route reads
nothing else), so it runs in the suite's first pass only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from twisted.trial import unittest

from spark.session import LOCAL_JAVA_OPTIONS
from synapse_lite.app.audit_command import REPO_ROOT
from tests.harness.processes import free_port
from tests.harness.services import ServiceMissing, in_ci, require_python_module
from tests.spark.fixture import AuditFixture
from tests.spark.session import DEBIAN_JDBC_JAR, jdbc_jar, require_java

BIN = os.path.dirname(sys.executable)
#: The worker registering, or the audit on the cluster, on a loaded machine.
TIMEOUT = 300
#: Small daemons: the master and the worker only schedule.
DAEMON_ENV = {
    "SPARK_LOCAL_IP": "127.0.0.1",
    "SPARK_DAEMON_MEMORY": "256m",
    "SPARK_DAEMON_JAVA_OPTS": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
    # No history of daemons in the installation's directory.
    "SPARK_NO_DAEMONIZE": "1",
}


def require(condition: bool, message: str) -> None:
    if condition:
        return
    if in_ci():
        raise ServiceMissing(message + " (CI=true: a missing service is a failure)")
    raise unittest.SkipTest(message)


class StandaloneCluster:
    """A Spark standalone master and one worker (1 core, 1 GB for
    executors), each its own process group, stopped at the test's end."""

    def __init__(self, test: unittest.TestCase) -> None:
        from pyspark.find_spark_home import _find_spark_home

        self.spark_class = os.path.join(_find_spark_home(), "bin", "spark-class")
        self.directory = tempfile.mkdtemp(prefix="synapse_lite_spark_cluster_")
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen[bytes]] = []
        test.addCleanup(self.stop)
        self.master_log = self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            ["--host", "127.0.0.1", "--port", str(self.port), "--webui-port", "0"],
        )
        self.worker_log = self._start(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            [
                self.url,
                "--host", "127.0.0.1",
                "--cores", "1",
                "--memory", "1g",
                "--webui-port", "0",
                "--work-dir", os.path.join(self.directory, "work"),
            ],
        )  # fmt: skip

    def _start(self, name: str, main_class: str, args: list[str]) -> str:
        log = os.path.join(self.directory, f"{name}.log")
        with open(log, "wb") as out:
            self.processes.append(
                subprocess.Popen(
                    [self.spark_class, main_class, *args],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=os.environ | DAEMON_ENV,
                    cwd=self.directory,
                    start_new_session=True,  # its group: the executors it starts too
                )
            )
        return log

    def logs(self) -> str:
        text = []
        for path in (self.master_log, self.worker_log):
            with open(path, encoding="utf-8", errors="replace") as f:
                text.append(f"--- {path}\n" + "".join(f.readlines()[-30:]))
        return "\n".join(text)

    def wait_for_worker(self) -> None:
        """Until the worker has registered with the master."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            with open(self.worker_log, encoding="utf-8", errors="replace") as f:
                if "Successfully registered with master" in f.read():
                    return
            for process in self.processes:
                if process.poll() is not None:
                    raise AssertionError(f"a Spark daemon exited:\n{self.logs()}")
            time.sleep(0.2)
        raise AssertionError(f"the worker never registered:\n{self.logs()}")

    def stop(self) -> None:
        """SIGTERM each daemon's process group (the worker's holds its
        executors), then SIGKILL what is left after 10 s."""
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def findings(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (f["kind"], f["stream"], f["writer"], f["count"], f["ids"], f["message"])
        for f in report["findings"]
    ]


class AuditOnStandaloneClusterTestCase(unittest.TestCase):
    def test_cluster_over_jdbc_finds_what_the_local_run_finds(self) -> None:
        require_python_module("pyspark", "spark")
        require_java()
        jar = jdbc_jar()
        require(
            jar is not None,
            f"no PostgreSQL JDBC driver at {DEBIAN_JDBC_JAR} (apt-get install"
            " libpostgresql-jdbc-java, or set SYNAPSE_LITE_JDBC_JAR)",
        )
        assert jar is not None
        db = AuditFixture(self, engine_name="postgres")
        cluster = StandaloneCluster(self)  # starts while the database is seeded

        # Stream faults and graph faults: an id above its sequence, a
        # parent never stored, an extremity with a child, an auth event
        # never stored.
        db.write("events", "main", [1, 2, 3])
        db.write("events", "worker1", [4])
        db.write("events", "worker1", [9], advance_sequence=False)
        db.position("events", "main", 3)
        db.position("events", "worker1", 4)
        ids = {so: e for so, e in db.execute("SELECT stream_ordering, event_id FROM events")}
        db.execute(
            "INSERT INTO event_edges VALUES (?, ?), (?, '$nowhere')", (ids[2], ids[1], ids[3])
        )
        db.execute("INSERT INTO event_auth_edges VALUES (?, '$gone')", (ids[4],))

        local = db.audit()
        self.assertEqual(local.code, 1, local)
        kinds = {f["kind"] for f in local.findings()}
        graph_kinds = {"extremity_has_child", "missing_auth_event", "missing_prev_event"}
        self.assertEqual(kinds & graph_kinds, graph_kinds, local)
        self.assertIn("id_above_sequence", kinds, local)

        cluster.wait_for_worker()
        report_path = os.path.join(db.directory, "cluster.json")
        started = time.monotonic()
        run = subprocess.run(
            [
                os.path.join(BIN, "spark-submit"),
                "--master", cluster.url,
                # The driver's class path (the audit's --jdbc-jar alone
                # reaches only the executors: docs/audit.md).
                "--jars", jar,
                "--conf", "spark.executor.memory=512m",
                "--conf", "spark.cores.max=1",
                # The quick JVMs of a local run (half the CPU time on this
                # small job); the executor's as defaults, which the audit's
                # own extraJavaOptions (its logging) add to.
                "--driver-java-options", LOCAL_JAVA_OPTIONS,
                "--conf", f"spark.executor.defaultJavaOptions={LOCAL_JAVA_OPTIONS}",
                os.path.join(REPO_ROOT, "spark", "audit.py"),
                "-c", db.config_path,
                "--jdbc-jar", jar,
                "--partitions", "2",
                "--executor-python", sys.executable,
                "--json", report_path,
            ],
            capture_output=True,
            text=True,
            env=os.environ | {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"},
            timeout=TIMEOUT,
        )  # fmt: skip
        output = f"{run.stdout}\n{run.stderr}\n{cluster.logs()}"
        self.assertEqual(run.returncode, 1, output)
        with open(report_path, encoding="utf-8") as f:
            report = json.load(f)
        self.assertEqual(report["route"], "jdbc", output)
        # spark-submit's PythonRunner merges the audit's stderr into its stdout.
        self.assertIn(f"audit: started Spark ({cluster.url})", run.stdout + run.stderr)
        self.assertEqual(findings(report), findings(local.report), output)
        self.assertEqual(report["streams"], local.report["streams"])
        self.assertEqual(report["graph"], local.report["graph"])
        # The application ran on the worker: it left its executor's directory.
        work = os.path.join(cluster.directory, "work")
        self.assertTrue(os.path.isdir(work) and os.listdir(work), output)
        sys.stderr.write(f"cluster audit: {time.monotonic() - started:.1f} s\n")

    def test_jdbc_jar_not_given_to_spark_submit(self) -> None:
        """Under spark-submit, a JDBC jar named only to the audit cannot reach
        the driver's class path: a clear error (exit 2), not Spark's
        ``ClassNotFoundException`` half-way through."""
        require_python_module("pyspark", "spark")
        require_java()
        jar = jdbc_jar()
        require(jar is not None, f"no PostgreSQL JDBC driver at {DEBIAN_JDBC_JAR}")
        assert jar is not None
        db = AuditFixture(self, engine_name="postgres")
        run = subprocess.run(
            [
                os.path.join(BIN, "spark-submit"),
                "--master", "local[1]",
                "--driver-java-options", LOCAL_JAVA_OPTIONS,
                os.path.join(REPO_ROOT, "spark", "audit.py"),
                "-c", db.config_path,
                "--jdbc-jar", jar,
            ],
            capture_output=True,
            text=True,
            env=os.environ | {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"},
            timeout=TIMEOUT,
        )  # fmt: skip
        output = run.stdout + run.stderr
        self.assertEqual(run.returncode, 2, output)
        self.assertIn(
            f"audit: error: under spark-submit the JDBC driver must be given to spark-submit"
            f" too: spark-submit --jars {jar}",
            output,
        )
        self.assertNotIn("ClassNotFoundException", output)
