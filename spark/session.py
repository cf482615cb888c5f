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


def prepare_environment(local: bool = True, executor_python: str | None = None) -> None:
    """Environment Spark reads at JVM start (see SPARK_NOTES): bind locally
    rather than warn about the host name, and run Python workers with
    ``executor_python`` (a path every node has) or, on a local master, this
    interpreter rather than whatever ``python3`` is on PATH. A cluster's nodes
    may not have this interpreter's path: there an unset ``PYSPARK_PYTHON``
    leaves the choice to the cluster."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if executor_python:
        os.environ["PYSPARK_PYTHON"] = executor_python
    elif local:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def quiet_submitted_jvm() -> None:
    """Under ``spark-submit`` the JVM is already running, with Spark's default
    logging (INFO): load our logging configuration into it before the
    SparkContext starts and logs its 40-odd INFO lines. Run as a plain Python
    program, the JVM is started with it instead (``spark.driver.extraJavaOptions``).

    spark-submit marks Spark's logging uninitialised for the application, so
    the SparkContext would load Spark's defaults over ours: it is marked
    initialised. That flag is Spark-internal (the compiled name of
    ``Logging.initialized``); should it move in another Spark version, Spark
    simply logs as it would anyway."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return
    from pyspark import SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM
    jvm: Any = SparkContext._jvm
    context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
    context.setConfigLocation(jvm.java.net.URI.create(f"file:{LOG4J_CONFIG}"))
    logging_state = getattr(getattr(jvm.org.apache.spark.internal, "Logging$"), "MODULE$")
    getattr(logging_state, "org$apache$spark$internal$Logging$$initialized_$eq")(True)


def resolve_master(master: str | None) -> str:
    """The master to run on: ``master``, else the one ``spark-submit`` was
    given (its JVM holds it as a system property), else ``local[*]``."""
    if master:
        return master
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        try:
            from pyspark import SparkConf, SparkContext

            SparkContext._ensure_initialized()  # connects to spark-submit's JVM
            return str(SparkConf().get("spark.master", "local[*]"))
        except ImportError:
            pass
    return "local[*]"


def jars_of_spark_submit() -> list[str] | None:
    """The jars ``spark-submit`` was given (``--jars``, ``spark.jars``) as
    real paths, or None when the audit does not run under spark-submit.

    Under spark-submit the driver's JVM is running before the audit starts,
    and a jar the audit then adds to ``spark.jars`` reaches the executors
    but not the driver's class path: Spark's JDBC reader, which resolves the
    table's columns on the driver, fails with ``ClassNotFoundException:
    org.postgresql.Driver``. Only spark-submit's own ``--jars`` puts a jar
    on the driver's class path."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM
    given = str(SparkConf().get("spark.jars", "") or "")
    return [
        os.path.realpath(jar.removeprefix("file://").removeprefix("file:"))
        for jar in given.split(",")
        if jar
    ]


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
    verbose: bool = False,
    executor_python: str | None = None,
) -> tuple[Any, bool]:
    """A SparkSession on ``master``, and whether it was started here (False:
    the process already had one, which its owner will stop). Spark logs
    errors only unless ``verbose``."""
    local = master.startswith("local")
    prepare_environment(local, executor_python)
    try:
        from pyspark.sql import SparkSession
    except ImportError as e:
        raise SparkUnavailable("pyspark is not installed: pip install -e '.[spark]'") from e
    check_java()
    java_options = "" if verbose else f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}"
    if not verbose:
        try:
            quiet_submitted_jvm()
        except Exception:  # only the logging is at stake: Spark logs as usual
            pass
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.showConsoleProgress", "false")
    )
    if java_options:
        builder = builder.config("spark.executor.extraJavaOptions", java_options)
    for key, value in (LOCAL_CONF if local else {}).items():
        builder = builder.config(key, value)
    driver_options = f"{LOCAL_JAVA_OPTIONS} {java_options}".strip() if local else java_options
    if driver_options:
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
    if not verbose:
        spark.sparkContext.setLogLevel("ERROR")
    return spark, existing is None
