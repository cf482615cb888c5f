"""Starting (or reusing) the SparkSession the audit runs in."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

LOG4J_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")


#: A local run is one short-lived JVM doing one pass over the rows on a few
#: cores: no web UI to start; the serial collector (no GC threads competing
#: with the task threads); and the quick JIT compiler only, since the pass is
#: over before the optimising one pays back its compile time (measured on 10M
#: rows: Spark's start and first job about halved, the pass itself as fast).
#: A cluster keeps its own settings.
LOCAL_CONF = {"spark.ui.enabled": "false"}
LOCAL_JAVA_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"


class SparkUnavailable(RuntimeError):
    """Spark cannot run here: pyspark or Java is missing, or the session failed."""


def prepare_environment() -> None:
    """Environment Spark reads at JVM start (see SPARK_NOTES): bind locally
    rather than warn about the host name, and run Python workers with this
    interpreter rather than whatever ``python3`` is on PATH."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def check_java() -> str:
    """The ``java -version`` banner; raises :class:`SparkUnavailable` without Java."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise SparkUnavailable("Java is not installed (Spark needs Java 17 or newer)")
    try:
        result = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SparkUnavailable(f"cannot run {java} -version: {e}") from e
    if result.returncode != 0:
        raise SparkUnavailable(f"{java} -version failed: {result.stderr.strip()}")
    return (result.stderr or result.stdout).strip().splitlines()[0]


def start_session(
    master: str,
    jars: list[str],
    conf: dict[str, str] | None = None,
    app_name: str = "synapse-lite-audit",
) -> tuple[Any, bool]:
    """A SparkSession on ``master``, and whether it was started here (False:
    the process already had one, which its owner will stop)."""
    prepare_environment()
    try:
        from pyspark.sql import SparkSession
    except ImportError as e:
        raise SparkUnavailable("pyspark is not installed: pip install -e '.[spark]'") from e
    check_java()
    java_options = f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}"
    local = master.startswith("local")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.extraJavaOptions", java_options)
    )
    for key, value in (LOCAL_CONF if local else {}).items():
        builder = builder.config(key, value)
    driver_options = f"{LOCAL_JAVA_OPTIONS} {java_options}" if local else java_options
    builder = builder.config("spark.driver.extraJavaOptions", driver_options)
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    existing = SparkSession.getActiveSession()
    try:
        spark = builder.getOrCreate()
    except Exception as e:
        raise SparkUnavailable(f"Spark failed to start on {master}: {e}") from e
    spark.sparkContext.setLogLevel("ERROR")
    return spark, existing is None
