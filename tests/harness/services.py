"""Reaching the real PostgreSQL and Redis the tests need.

A test needing a service that is not running is skipped with the reason, except
under ``CI=true``, where a missing service is a failure: CI must test the real
thing.
"""

from __future__ import annotations

import os
import socket

from twisted.trial.unittest import SkipTest


class ServiceMissing(AssertionError):
    """A service CI requires is not running."""


def in_ci() -> bool:
    """Whether this is a CI run, where a missing service is a failure."""
    return os.environ.get("CI", "").lower() == "true"


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def postgres_args() -> dict[str, object]:
    """Connection arguments for the test PostgreSQL server (env overridable)."""
    return {
        "host": os.environ.get("SYNAPSE_LITE_TEST_PG_HOST", "127.0.0.1"),
        "port": int(os.environ.get("SYNAPSE_LITE_TEST_PG_PORT", "5432")),
        "user": os.environ.get("SYNAPSE_LITE_TEST_PG_USER", "postgres"),
        "password": os.environ.get("SYNAPSE_LITE_TEST_PG_PASSWORD", ""),
    }


def redis_address() -> tuple[str, int]:
    """Host and port of the test Redis server (env overridable)."""
    return (
        os.environ.get("SYNAPSE_LITE_TEST_REDIS_HOST", "127.0.0.1"),
        int(os.environ.get("SYNAPSE_LITE_TEST_REDIS_PORT", "6379")),
    )


def require_service(name: str, host: str, port: int, hint: str) -> None:
    """Skip (or, under CI=true, fail) unless ``host:port`` accepts connections."""
    if _reachable(host, port):
        return
    message = f"{name} is not reachable at {host}:{port}; {hint}"
    if in_ci():
        raise ServiceMissing(message + " (CI=true: a missing service is a failure)")
    raise SkipTest(message)


def require_postgres() -> None:
    args = postgres_args()
    require_service(
        "PostgreSQL",
        str(args["host"]),
        int(args["port"]),  # type: ignore[call-overload]
        "start it or set SYNAPSE_LITE_TEST_PG_HOST/PORT/USER/PASSWORD",
    )


def require_redis() -> None:
    host, port = redis_address()
    require_service("Redis", host, port, "start it or set SYNAPSE_LITE_TEST_REDIS_HOST/PORT")


def require_python_module(module: str, extra: str) -> None:
    """Skip (or fail under CI) when an optional dependency is not installed."""
    try:
        __import__(module)
    except ImportError as e:
        message = f"{module} is not installed: pip install -e '.[{extra}]'"
        if in_ci():
            raise ServiceMissing(message) from e
        raise SkipTest(message) from e
