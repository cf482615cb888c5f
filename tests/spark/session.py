"""The one SparkSession every audit test shares.

Created on first use with the fast test settings measured in SPARK_NOTES (one
core, one shuffle partition, no whole-stage codegen, no UI, a quick JVM) and
stopped when the test process exits: each new session costs about ten seconds.
"""

from __future__ import annotations

import atexit
import os
import subprocess
from typing import Any

from twisted.trial.unittest import SkipTest

from tests.harness.services import ServiceMissing, require_python_module

#: Where Debian's libpostgresql-jdbc-java puts the driver.
DEBIAN_JDBC_JAR = "/usr/share/java/postgresql.jar"

_session: Any = None


def jdbc_jar() -> str | None:
    """The PostgreSQL JDBC driver jar, if this machine has one."""
    path = os.environ.get("SYNAPSE_LITE_JDBC_JAR") or DEBIAN_JDBC_JAR
    return path if os.path.isfile(path) else None


def require_java() -> None:
    """Skip (or fail under CI=true) without a working ``java``."""
    try:
        ok = subprocess.run(["java", "-version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if ok:
        return
    message = (
        "java is not installed (Spark needs Java 17+: apt-get install openjdk-17-jre-headless)"
    )
    if os.environ.get("CI", "").lower() == "true":
        raise ServiceMissing(message + " (CI=true: a missing service is a failure)")
    raise SkipTest(message)


def shared_spark() -> Any:
    """The process's SparkSession, started on first use."""
    global _session
    require_python_module("pyspark", "spark")
    require_java()
    if _session is None:
        from pyspark.sql import SparkSession

        from spark.session import LOCAL_JAVA_OPTIONS, LOG4J_CONFIG, prepare_environment

        prepare_environment()
        java_options = f"{LOCAL_JAVA_OPTIONS} -Dlog4j2.configurationFile=file:{LOG4J_CONFIG}"
        builder = (
            SparkSession.builder.master("local[1]")
            .appName("synapse-lite-audit-tests")
            .config("spark.sql.shuffle.partitions", "1")
            .config("spark.sql.codegen.wholeStage", "false")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.extraJavaOptions", java_options)
        )
        jar = jdbc_jar()
        if jar:
            builder = builder.config("spark.jars", jar)
        _session = builder.getOrCreate()
        _session.sparkContext.setLogLevel("ERROR")
        atexit.register(_session.stop)
    return _session
