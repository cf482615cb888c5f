"""Launching a homeserver layout for a benchmark: a fresh database, a config in
a temporary directory, one OS process per instance, and their resident memory.

Layouts: ``single`` (the main process alone) and ``split`` (main, a /sync
worker, two persisters, a typing writer), configs of the benchmark's own; and
``default`` (and ``monolith``, ``sharded``), the config ``synapse-lite
generate-config`` writes for that layout (for ``default``: the router in front
of main, ``synchrotron1`` and two persisters), as ``synapse-lite run`` would
run it, on free ports and the benchmark's database.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import yaml

from tests.harness.launcher import free_port_block

SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: name -> (listener resources, streams it writes besides the defaults)
LAYOUTS: dict[str, dict[str, list[str]]] = {
    "single": {},
    "split": {
        "sync1": ["client", "health"],
        "persister1": ["client", "replication", "health"],
        "persister2": ["client", "replication", "health"],
        "typing1": ["replication", "health"],
    },
    # The main process and a media worker (bench/media.py).
    "media": {"media1": ["client", "health"]},
    # The main process and a reader, both serving clients (bench/e2e_keys.py).
    "pair": {"reader1": ["client", "health"]},
}
WRITERS: dict[str, dict[str, Any]] = {
    "single": {},
    "split": {"events": ["persister1", "persister2"], "typing": "typing1"},
    "media": {},
    "pair": {},
}
#: Where each layout's clients send events and long-poll /sync.
SEND_TO = {"single": ["main"], "split": ["persister1", "persister2"], "default": ["router"]}
#: Layouts whose config is generate-config's.
GENERATED = ("monolith", "default", "sharded")
SYNC_ON = {"single": "main", "split": "sync1", "default": "router"}


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop_processes(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process in turn, then wait for all (20 s each, then SIGKILL)."""
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def database_server_cpu_seconds() -> float:
    """CPU time so far of every PostgreSQL server process on this machine
    (its backends, one per connection, are pooled and outlive a measurement;
    other users of the server are counted too)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                if f.read().strip() != "postgres":
                    continue
            total += process_cpu_seconds(int(entry))
        except OSError:
            continue  # gone meanwhile
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def create_database(engine: str, directory: str, name: str | None = None) -> dict[str, Any]:
    """A fresh database: a file in ``directory`` (SQLite), or a PostgreSQL
    database on 127.0.0.1 called ``name`` (by default one per process),
    dropped first if it exists. Its ``database`` config section."""
    if engine == "sqlite":
        return {"engine": "sqlite", "args": {"path": os.path.join(directory, "bench.db")}}
    import psycopg2

    name = name or f"synapse_lite_bench_{os.getpid()}"
    conn = psycopg2.connect(host="127.0.0.1", user="postgres", dbname="postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        cur.execute(f"CREATE DATABASE {name} TEMPLATE template0")
    conn.close()
    return {
        "engine": "postgres",
        "args": {"host": "127.0.0.1", "user": "postgres", "dbname": name},
        "max_connections": 10,
    }


def drop_database(database: dict[str, Any]) -> None:
    """Drop a PostgreSQL database :func:`create_database` made (SQLite: nothing)."""
    if database["engine"] != "postgres":
        return
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", user="postgres", dbname="postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {database['args']['dbname']} WITH (FORCE)")
    conn.close()


def _redis_running() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=1):
            return True
    except OSError:
        return False


class Cluster:
    """The processes of one layout, started by :meth:`start`, stopped by :meth:`stop`."""

    def __init__(
        self,
        layout: str,
        engine: str,
        extra: dict[str, Any] | None = None,
        replication: str = "tcp",
        source_root: str | None = None,
    ) -> None:
        """``extra``: top-level config settings added to the layout's.
        ``source_root``: another checkout whose code the processes run (a
        baseline measured in the same run), which also writes a generated
        layout's config (its router may not know this code's resources).
        ``replication``: the transport of a generated layout (``tcp`` or
        ``redis``, on 127.0.0.1:6379)."""
        self.layout = layout
        self.dir = tempfile.mkdtemp(prefix=f"synapse_lite_bench_{layout}_")
        self.database = create_database(engine, self.dir)
        self.ports: dict[str, int] = {}
        #: Where a process serves /metrics when not on its client port.
        self.metrics_ports: dict[str, int] = {}
        #: Where the processes import synapse_lite from (another checkout
        #: measures a baseline in the same run).
        self.source_root = source_root or SOURCE_ROOT
        #: Processes to run under cProfile (bench/profiled_process.py): name -> stats file.
        self.profiled: dict[str, str] = {}
        #: Processes to run with stage timestamps (bench/traced_process.py): name -> trace file.
        self.traced: dict[str, str] = {}
        if layout in GENERATED:
            self._generated(layout, replication)
            return
        workers = LAYOUTS[layout]
        transport = "redis" if workers and engine == "postgres" and _redis_running() else "tcp"
        self.transport = transport
        self.ports["main"] = free_port()
        config: dict[str, Any] = {
            "server_name": "bench.local",
            "data_dir": os.path.join(self.dir, "data"),
            "database": self.database,
            "worker_replication_secret": "bench-secret",
            "enable_registration": True,
            "log_level": "WARNING",
            "replication": {
                "transport": transport,
                "tcp": {"port": free_port()},
                "redis": {"channel_prefix": self._channel_prefix()},
            },
            "listeners": [
                {
                    "port": self.ports["main"],
                    "resources": ["client", "replication", "health"],
                }
            ],
            "workers": {},
            "stream_writers": WRITERS[layout],
            "rate_limiting": {"enabled": False},
            **(extra or {}),
        }
        for name, resources in workers.items():
            self.ports[name] = free_port()
            config["workers"][name] = {
                "listeners": [{"port": self.ports[name], "resources": resources}]
            }
        self.names = ["main", *workers]
        self._write(config)

    def _write(self, config: dict[str, Any]) -> None:
        self.config_path = os.path.join(self.dir, "homeserver.yaml")
        with open(self.config_path, "w") as f:
            yaml.safe_dump(config, f)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def _generated(self, layout: str, replication: str) -> None:
        """A layout as generate-config writes it (``default``: the README's),
        with the router when it has one, TCP replication, and the benchmark's
        database, logging and limits."""
        base_port = free_port_block(12)
        data_dir = os.path.join(self.dir, "data")
        if os.path.abspath(self.source_root) == os.path.abspath(SOURCE_ROOT):
            from synapse_lite.config.generate import GenerateOptions, generate_config

            text = generate_config(
                GenerateOptions(layout=layout, base_port=base_port, replication=replication),
                data_dir,
            )["homeserver.yaml"]
        else:
            # The other checkout's generate-config, in its own interpreter.
            script = (
                "import sys\n"
                "from synapse_lite.config.generate import GenerateOptions, generate_config\n"
                "options = GenerateOptions(layout=sys.argv[1], base_port=int(sys.argv[2]),"
                " replication=sys.argv[3])\n"
                "sys.stdout.write(generate_config(options, sys.argv[4])['homeserver.yaml'])\n"
            )
            text = subprocess.run(
                [sys.executable, "-c", script, layout, str(base_port), replication, data_dir],
                env=dict(os.environ, PYTHONPATH=self.source_root),
                cwd=self.source_root,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        config: dict[str, Any] = yaml.safe_load(text)
        config.update(
            database=self.database,
            enable_registration=True,
            log_level="WARNING",
            rate_limiting={"enabled": False},
        )
        config.setdefault("replication", {}).setdefault("redis", {})["channel_prefix"] = (
            self._channel_prefix()
        )
        self.transport = replication
        self.ports["main"] = config["listeners"][0]["port"]
        workers = config.get("workers") or {}
        for name, worker in workers.items():
            self.ports[name] = worker["listeners"][0]["port"]
        for name, listeners in [
            ("main", config["listeners"]),
            *((n, w["listeners"]) for n, w in workers.items()),
        ]:
            for listener in listeners:
                if "metrics" in listener.get("resources", ()):
                    self.metrics_ports[name] = listener["port"]
        self.names = ["main", *workers]
        if "router" in config:
            self.ports["router"] = config["router"]["listeners"][0]["port"]
            self.names.append("router")
        self._write(config)

    def _channel_prefix(self) -> str:
        """A Redis channel prefix of this cluster's own: every run on this
        machine shares one Redis, and clusters all named ``bench.local``
        (two benchmarks at once) would otherwise hear each other."""
        return os.path.basename(self.dir) + "-"

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def metrics_url(self, name: str) -> str:
        """Where ``name`` serves /metrics (its own listener, or its client port)."""
        return f"http://127.0.0.1:{self.metrics_ports.get(name, self.ports[name])}/metrics"

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=self.source_root)
        for name in self.names:
            app = {"main": "homeserver", "router": "router"}.get(name, "generic_worker")
            args = [sys.executable, "-m", f"synapse_lite.app.{app}", "-c", self.config_path]
            if name in self.profiled:
                wrapper = os.path.join(SOURCE_ROOT, "bench", "profiled_process.py")
                args[1:1] = [wrapper, self.profiled[name]]
            elif name in self.traced:
                wrapper = os.path.join(SOURCE_ROOT, "bench", "traced_process.py")
                args[1:1] = [wrapper, self.traced[name]]
            if app == "generic_worker":
                args += ["--worker-name", name]
            log = open(os.path.join(self.dir, f"{name}.log"), "wb")
            # Run from the source root too: ``-m`` puts the working directory
            # first on sys.path, ahead of PYTHONPATH (a baseline checkout).
            self.processes[name] = subprocess.Popen(
                args, stdout=log, stderr=log, env=env, cwd=self.source_root
            )
            self._wait_healthy(name)

    def _wait_healthy(self, name: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.processes[name].poll() is not None:
                raise RuntimeError(f"{name} exited; see {self.dir}/{name}.log")
            try:
                with urllib.request.urlopen(self.url(name) + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{name} did not start; see {self.dir}/{name}.log")

    def room_writers(self) -> dict[str, str]:
        """Each room's events writer, as stored with the room."""
        if self.database["engine"] == "sqlite":
            import sqlite3

            conn: Any = sqlite3.connect(self.database["args"]["path"])
        else:
            import psycopg2

            conn = psycopg2.connect(**self.database["args"])
        try:
            cursor = conn.cursor()
            cursor.execute("SELECT room_id, event_writer FROM rooms")
            return {room: writer for room, writer in cursor.fetchall()}
        finally:
            conn.close()

    def events_writers(self) -> list[str]:
        """The events writers the layout's config names (``main`` when none)."""
        with open(self.config_path) as f:
            config = yaml.safe_load(f)
        writers = (config.get("stream_writers") or {}).get("events") or ["main"]
        return [writers] if isinstance(writers, str) else list(writers)

    def rss_mb(self) -> dict[str, float]:
        """Resident memory of each process, from /proc."""
        result = {}
        for name, process in self.processes.items():
            with open(f"/proc/{process.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        result[name] = int(line.split()[1]) / 1024
        return result

    def cpu_seconds(self) -> dict[str, float]:
        """User plus system CPU time of each process so far, from /proc."""
        return {name: process_cpu_seconds(p.pid) for name, p in self.processes.items()}

    def stop(self, keep: bool = False) -> None:
        stop_processes(list(reversed(list(self.processes.values()))))
        drop_database(self.database)
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def started_monolith(engine: str, source: str | None = None) -> Iterator[Cluster]:
    """The monolith (layout ``single``) of this checkout, or of the checkout
    ``source``, started on ``engine`` for the block and stopped after it."""
    cluster = Cluster("single", engine)
    if source is not None:
        cluster.source_root = source
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
