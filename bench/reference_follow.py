"""The reference homeserver's follower cost, measured beside ours.

Issue 18 compares a pure follower of ours with the reference homeserver's
workers, whose operators report ~6 ms of CPU per event per worker; issue 35
asks for the ratio in one run. This module measures it here: the
reference's main process and one ``generic_worker`` with no clients (a pure
follower, as ``synchrotron1`` is in ``follow_cost.py``), replicating over
Redis as the reference requires for workers, on a fresh PostgreSQL
database, sent messages at the same rates and with the same client as ours.

The reference is not part of this repository. Its workers need its
``postgres`` and ``redis`` extras, which the cached install of
``tests/harness/synapse_install.py`` lacks (its main process then exits at
once: ``DependencyException: ['txredisapi', 'hiredis']``); ``python3
tests/harness/synapse_install.py --workers`` makes a layer that has them and
prints its python, which is the default ``PYTHON`` when it exists:

    python -m bench.reference_follow [PYTHON] [--rate 40 --rate 200] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from typing import Any

import aiohttp
import yaml

from bench.cluster import free_port, process_cpu_seconds, stop_processes
from bench.scenarios import Client, User
from tests.harness.synapse_install import installed_workers_python

#: The reference's worker, as its docs configure a pure /sync follower.
WORKER = "sync1"
#: Where the scratch databases are created: the machine's PostgreSQL.
ADMIN_DATABASE = {"host": "127.0.0.1", "user": "postgres", "dbname": "postgres"}
#: What the reference needs for workers beyond its base install (its
#: ``postgres`` and ``redis`` extras): module to import, package to install.
WORKER_NEEDS = {"psycopg2": "psycopg2-binary", "txredisapi": "txredisapi", "hiredis": "hiredis"}


def missing_packages(python: str, needs: dict[str, str]) -> list[str]:
    """The packages of ``needs`` (module -> package) whose module ``python``
    cannot import."""
    return [
        package
        for module, package in needs.items()
        if subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode
    ]


def require_packages(python: str, needs: dict[str, str]) -> None:
    """Raises ``RuntimeError`` naming what to install when ``python`` lacks
    any of ``needs``: the reference would otherwise exit at start-up with
    only its log to say why."""
    missing = missing_packages(python, needs)
    if missing:
        raise RuntimeError(
            f"{python} cannot run the reference's workers: it lacks {' '.join(missing)}"
            " (python3 tests/harness/synapse_install.py --workers makes a virtualenv"
            f" that has them, or {python} -m pip install {' '.join(missing)})"
        )


class ReferenceCluster:
    """The reference's main process and one worker on a fresh database."""

    def __init__(self, python: str, database: dict[str, Any]) -> None:
        """``database``: psycopg2 connection arguments of a PostgreSQL server
        where a scratch database may be created."""
        self.python = python
        self.dir = tempfile.mkdtemp(prefix="synapse_lite_bench_reference_")
        self.db_name = f"bench_ref_{uuid.uuid4().hex[:8]}"
        self.admin = database
        self.client_port, self.replication_port, self.worker_port = (
            free_port(),
            free_port(),
            free_port(),
        )
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        # Its own name per run: the reference's processes talk over Redis
        # channels named after the server, and Redis is shared by every
        # run on this machine (two runs with one name would hear each other).
        self.server_name = f"bench-{uuid.uuid4().hex[:8]}.local"

    def _create_database(self) -> None:
        import psycopg2

        conn = psycopg2.connect(**self.admin)
        conn.autocommit = True
        with conn.cursor() as cur:
            # The reference refuses a database whose collation is not C.
            cur.execute(
                f"CREATE DATABASE {self.db_name} ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'"
                " TEMPLATE template0"
            )
        conn.close()

    def _drop_database(self) -> None:
        import psycopg2

        conn = psycopg2.connect(**self.admin)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {self.db_name} WITH (FORCE)")
        conn.close()

    def log_config(self) -> dict[str, Any]:
        """WARNING to stderr, as our processes run in follow_cost.py."""
        return {
            "version": 1,
            "formatters": {"p": {"format": "%(asctime)s %(name)s %(message)s"}},
            "handlers": {"h": {"class": "logging.StreamHandler", "formatter": "p"}},
            "root": {"level": "WARNING", "handlers": ["h"]},
            "disable_existing_loggers": False,
        }

    def main_config(self) -> dict[str, Any]:
        """The main process's config: the client listener, the replication
        listener the worker reaches through ``instance_map``, Redis, rate
        limits lifted, presence off."""
        limit = {"per_second": 100_000, "burst_count": 100_000}
        return {
            "server_name": self.server_name,
            "pid_file": os.path.join(self.dir, "homeserver.pid"),
            "report_stats": False,
            "signing_key_path": os.path.join(self.dir, "signing.key"),
            "media_store_path": os.path.join(self.dir, "media"),
            "log_config": os.path.join(self.dir, "log.yaml"),
            "database": {
                "name": "psycopg2",
                "args": {
                    "user": self.admin.get("user", "postgres"),
                    "host": self.admin.get("host", "127.0.0.1"),
                    "port": self.admin.get("port", 5432),
                    "database": self.db_name,
                    "cp_min": 1,
                    "cp_max": 5,
                },
            },
            "listeners": [
                {
                    "port": self.client_port,
                    "bind_addresses": ["127.0.0.1"],
                    "type": "http",
                    "resources": [{"names": ["client"], "compress": False}],
                },
                {
                    "port": self.replication_port,
                    "bind_addresses": ["127.0.0.1"],
                    "type": "http",
                    "resources": [{"names": ["replication"]}],
                },
            ],
            "instance_map": {"main": {"host": "127.0.0.1", "port": self.replication_port}},
            "redis": {"enabled": True, "host": "127.0.0.1", "port": 6379},
            "enable_registration": True,
            "enable_registration_without_verification": True,
            "registration_shared_secret": "bench",
            "macaroon_secret_key": "bench-macaroon",
            "form_secret": "bench-form",
            "trusted_key_servers": [],
            "suppress_key_server_warning": True,
            "rc_message": limit,
            "rc_registration": limit,
            "rc_joins": {"local": limit, "remote": limit},
            "rc_login": {"address": limit, "account": limit, "failed_attempts": limit},
            "presence": {"enabled": False},
        }

    def worker_config(self) -> dict[str, Any]:
        """The pure follower's config (read after the main one): a client
        listener no client uses, which the start-up wait asks."""
        return {
            "worker_app": "synapse.app.generic_worker",
            "worker_name": WORKER,
            "worker_listeners": [
                {
                    "type": "http",
                    "port": self.worker_port,
                    "bind_addresses": ["127.0.0.1"],
                    "resources": [{"names": ["client"]}],
                }
            ],
            "worker_log_config": os.path.join(self.dir, "log.yaml"),
        }

    def _write_config(self) -> tuple[str, str]:
        """Writes the log, main and worker configs into the run's directory;
        the main and worker config paths."""
        paths = {
            name: os.path.join(self.dir, name)
            for name in ("log.yaml", "homeserver.yaml", f"{WORKER}.yaml")
        }
        for name, config in zip(
            paths, (self.log_config(), self.main_config(), self.worker_config()), strict=True
        ):
            with open(paths[name], "w") as f:
                yaml.safe_dump(config, f)
        return paths["homeserver.yaml"], paths[f"{WORKER}.yaml"]

    def start(self) -> None:
        """Raises ``RuntimeError`` naming what to install when ``python``
        lacks the reference's worker dependencies, or when a process exits
        or does not answer within 2 minutes (its log kept in the run's
        directory until :meth:`stop`)."""
        require_packages(self.python, WORKER_NEEDS)
        main_config, worker_config = self._start_main()
        self._start(
            WORKER,
            ["synapse.app.generic_worker", "-c", main_config, "-c", worker_config],
            self.worker_port,
        )

    def _start_main(self) -> tuple[str, str]:
        """Create the database and the configs, start the main process; the
        main and worker config paths."""
        self._create_database()
        main_config, worker_config = self._write_config()
        generated = subprocess.run(
            [self.python, "-m", "synapse.app.homeserver", "-c", main_config, "--generate-keys"],
            cwd=self.dir,
            capture_output=True,
            text=True,
            env=self._env(),
        )
        if generated.returncode != 0:
            # Its own words: a missing or mismatched dependency, say.
            raise RuntimeError(
                f"the reference's --generate-keys failed: {generated.stdout[-800:]}"
                f" {generated.stderr[-800:]}"
            )
        self._start("main", ["synapse.app.homeserver", "-c", main_config], self.client_port)
        return main_config, worker_config

    def _start(self, name: str, args: list[str], port: int) -> None:
        log = open(os.path.join(self.dir, f"{name}.log"), "wb")
        self.processes[name] = subprocess.Popen(
            [self.python, "-m", *args],
            cwd=self.dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self._env(),
        )
        url = f"http://127.0.0.1:{port}/_matrix/client/versions"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.processes[name].poll() is not None:
                raise RuntimeError(f"the reference's {name} exited: see {self.dir}/{name}.log")
            try:
                with urllib.request.urlopen(url, timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"the reference's {name} did not start: see {self.dir}/{name}.log")

    @staticmethod
    def _env() -> dict[str, str]:
        """Its own virtualenv only: a PYTHONPATH of ours (trial's workers
        get one) would give it our packages, some of versions it refuses."""
        return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def cpu_seconds(self) -> dict[str, float]:
        return {name: process_cpu_seconds(p.pid) for name, p in self.processes.items()}

    def stop(self) -> None:
        stop_processes(list(self.processes.values()))
        try:
            self._drop_database()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


async def measure(
    python: str, database: dict[str, Any], rates: list[float], seconds: float
) -> dict[float, dict[str, Any]]:
    """Per rate: ``{"achieved": events/s, "ms_per_event": {process: CPU ms}}``
    of the reference's main process (the rooms' writer) and its worker."""
    # Imported here: follow_cost imports this module.
    from bench.follow_cost import send_at_rate

    cluster = ReferenceCluster(python, database)
    results: dict[float, dict[str, Any]] = {}
    try:
        cluster.start()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            client = Client(session)
            base = cluster.url()
            people: list[User] = [await client.register(base, f"user{i}") for i in range(2)]
            rooms = []
            for _ in range(4):
                created = await client.call(
                    "POST", base, "/createRoom", people[0], {"preset": "public_chat"}
                )
                await client.call("POST", base, f"/join/{created['room_id']}", people[1], {})
                rooms.append(created["room_id"])
            await send_at_rate(client, base, people, rooms, 50, 1.0)  # warm up
            await asyncio.sleep(1.0)
            for rate in rates:
                before = cluster.cpu_seconds()
                sent, elapsed = await send_at_rate(client, base, people, rooms, rate, seconds)
                await asyncio.sleep(0.5)
                after = cluster.cpu_seconds()
                results[rate] = {
                    "achieved": sent / elapsed,
                    "ms_per_event": {
                        n: (after[n] - before[n]) * 1000 / max(sent, 1) for n in after
                    },
                }
    finally:
        cluster.stop()
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``python`` defaults to the workers' layer of
    ``tests/harness/synapse_install.py --workers`` (an error without it)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.reference_follow",
        description="The reference homeserver's pure-follower worker: CPU ms per event of its"
        " main process and of the worker at each send rate (PostgreSQL, Redis). In a whole run"
        " beside ours: python -m bench.follow_cost --reference.",
    )
    parser.add_argument(
        "python", nargs="?", metavar="PYTHON",
        help="the Python of a virtualenv with the reference and its postgres and redis extras"
        " (default: the one python3 tests/harness/synapse_install.py --workers made)",
    )  # fmt: skip
    parser.add_argument(
        "--rate", dest="rates", action="append", type=float,
        help="events/s; repeatable (default: 40 and 200)",
    )  # fmt: skip
    parser.add_argument("--seconds", type=float, default=10.0, help="of sends per rate")
    args = parser.parse_args(argv)
    args.rates = args.rates or [40.0, 200.0]
    if args.python is None:
        args.python = installed_workers_python()
        if args.python is None:
            parser.error(
                "no PYTHON given and no reference with its worker extras installed:"
                " python3 tests/harness/synapse_install.py --workers makes one"
            )
    return args


def main(argv: list[str] | None = None) -> int:
    """The reference's figures alone."""
    args = parse_args(argv)
    results = asyncio.run(measure(args.python, ADMIN_DATABASE, args.rates, args.seconds))
    for rate, r in results.items():
        ms = ", ".join(f"{n} {v:.3f}" for n, v in r["ms_per_event"].items())
        print(f"{rate:g}/s asked, {r['achieved']:.1f}/s achieved: CPU ms per event: {ms}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
