"""Replication benchmark: latency and sustained throughput, TCP and Redis.

Three real processes share one database: ``persister1`` writes events, ``main``
and ``synchrotron1`` receive them (over TCP, main relays to synchrotron1).
Figures, per transport:

* latency: from an event's commit on the writer to its row reaching a receiver
  (its position there has advanced), p50 and p99, for events sent one at a time;
* throughput: events per second from one writer to both receivers, sent in
  batches as fast as the writer commits them, and how many were lost (must be 0).

Baseline, measured in the same run: a raw Redis PUBLISH to message round trip
(no synapse_lite involved). Targets: latency p50 within 3x the raw round trip on
each transport; at least 5,000 rows/s with no row lost.

    python bench/replication.py [--engine sqlite|postgres] [--events 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def make_database(engine: str, directory: str) -> tuple[dict[str, Any], Any]:
    if engine == "sqlite":
        return {"engine": "sqlite", "args": {"path": os.path.join(directory, "bench.db")}}, None
    import psycopg2

    name = f"synapse_lite_bench_repl_{os.getpid()}_{int(time.time())}"
    conn = psycopg2.connect(host="127.0.0.1", user="postgres", dbname="postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")

    def drop() -> None:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.close()

    return {
        "engine": "postgres",
        "args": {"host": "127.0.0.1", "user": "postgres", "dbname": name},
    }, drop


def wait_healthy(port: int, process: subprocess.Popen[bytes], log: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"process exited early; see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"process did not become healthy; see {log}")


def run_transport(transport: str, engine: str, events: int) -> dict[str, Any]:
    directory = tempfile.mkdtemp(prefix=f"bench_repl_{transport}_")
    database, drop = make_database(engine, directory)
    ports = {name: free_port() for name in ("main", "synchrotron1", "persister1")}
    config = {
        "server_name": "bench.local",
        "data_dir": os.path.join(directory, "data"),
        "database": database,
        "worker_replication_secret": "bench",
        "log_level": "WARNING",
        "replication": {
            "transport": transport,
            "tcp": {"port": free_port()},
            "redis": {"channel_prefix": f"bench-{os.getpid()}-"},
        },
        "listeners": [{"port": ports["main"], "resources": ["replication", "health"]}],
        "workers": {
            name: {"listeners": [{"port": ports[name], "resources": ["replication", "health"]}]}
            for name in ("synchrotron1", "persister1")
        },
        "stream_writers": {"events": ["persister1"]},
    }
    config_path = os.path.join(directory, "homeserver.yaml")
    with open(config_path, "w") as f:
        yaml.safe_dump(config, f)
    processes: dict[str, subprocess.Popen[bytes]] = {}
    outputs = {name: os.path.join(directory, f"{name}.jsonl") for name in ports}
    roles = {"main": "receiver", "synchrotron1": "receiver", "persister1": "writer"}
    try:
        for name in ("main", "synchrotron1", "persister1"):
            log = os.path.join(directory, f"{name}.log")
            processes[name] = subprocess.Popen(
                [
                    sys.executable,
                    os.path.join(ROOT, "bench", "replication_node.py"),
                    "--config",
                    config_path,
                    "--name",
                    name,
                    "--role",
                    roles[name],
                    "--out",
                    outputs[name],
                    "--throughput-events",
                    str(events),
                ],
                stdout=open(log, "wb"),
                stderr=subprocess.STDOUT,
                cwd=directory,
            )
            wait_healthy(ports[name], processes[name], log)
        for process in processes.values():
            process.wait(timeout=300)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
        if drop is not None:
            drop()

    def read(name: str) -> list[dict[str, Any]]:
        with open(outputs[name]) as f:
            return [json.loads(line) for line in f]

    writer_records = read("persister1")
    written = {r["id"]: r for r in writer_records if "id" in r}
    latency_ids = {i for i, r in written.items() if r["phase"] == "latency"}
    throughput = [r for r in written.values() if r["phase"] == "throughput"]
    latencies: list[float] = []
    lost = 0
    last_arrival = 0.0
    for receiver in ("main", "synchrotron1"):
        received = {r["id"]: r["t"] for r in read(receiver)}
        lost += len(set(written) - set(received))
        latencies += [(received[i] - written[i]["t"]) * 1000 for i in latency_ids if i in received]
        last_arrival = max(
            [last_arrival] + [received[r["id"]] for r in throughput if r["id"] in received]
        )
    start = min(r["t"] for r in throughput) if throughput else 0.0
    writer_end = max(r["t"] for r in throughput) if throughput else 0.0
    # The first batch's commit is the start; its own commit took time too.
    duration = max(last_arrival - start, 1e-9)
    read_back = [r["ms"] for r in writer_records if r["phase"] == "read_back"]
    read_to_sent = [r["ms"] for r in writer_records if r["phase"] == "read_to_sent"]
    return {
        "read_back_p50_ms": percentile(read_back, 50) if read_back else float("nan"),
        "read_to_sent_p50_ms": percentile(read_to_sent, 50) if read_to_sent else float("nan"),
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "rows_per_s": len(throughput) / duration,
        "writer_rows_per_s": len(throughput) / max(writer_end - start, 1e-9),
        "lost": lost,
        "events": len(throughput),
    }


def redis_round_trip(iterations: int = 1000) -> tuple[float, float]:
    """p50 and p99 (ms) of PUBLISH to the subscriber receiving the message."""
    channel = f"bench-raw-{os.getpid()}".encode()
    sub = socket.create_connection(("127.0.0.1", 6379))
    pub = socket.create_connection(("127.0.0.1", 6379))
    sub.sendall(b"*2\r\n$9\r\nSUBSCRIBE\r\n$%d\r\n%s\r\n" % (len(channel), channel))
    sub.recv(4096)
    payload = b'RDATA events persister1 12345 ["ev",["$abcdef:bench.local","!room:bench.local"]]'
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        pub.sendall(
            b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n"
            % (len(channel), channel, len(payload), payload)
        )
        data = b""
        while payload not in data:
            data += sub.recv(65536)
        samples.append((time.perf_counter() - start) * 1000)
        pub.recv(64)
    sub.close()
    pub.close()
    return percentile(samples, 50), percentile(samples, 99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args()

    raw_p50, raw_p99 = redis_round_trip()
    print(f"Replication benchmark ({args.engine}, {args.events} events to 2 receivers)")
    print(
        f"  baseline: raw Redis PUBLISH->message round trip p50 {raw_p50:.3f} ms, "
        f"p99 {raw_p99:.3f} ms"
    )
    print(
        f"  {'transport':<10}{'p50 ms':>9}{'p99 ms':>9}{'x raw':>8}{'rows/s':>10}"
        f"{'written/s':>11}{'lost':>6}  verdict"
    )
    for transport in ("tcp", "redis"):
        r = run_transport(transport, args.engine, args.events)
        ratio = r["p50_ms"] / raw_p50
        ok = ratio <= 3 and r["rows_per_s"] >= 5000 and r["lost"] == 0
        print(
            f"  {transport:<10}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}{ratio:>8.1f}"
            f"{r['rows_per_s']:>10.0f}{r['writer_rows_per_s']:>11.0f}{r['lost']:>6}"
            f"  {'PASS' if ok else 'FAIL'}"
            " (targets: p50 <= 3x raw, >= 5000 rows/s, 0 lost)"
        )
        print(
            f"  {'':<10}writer's share (latency phase, p50): reading the new rows back"
            f" {r['read_back_p50_ms']:.3f} ms; from that read's start to the RDATA"
            f" leaving {r['read_to_sent_p50_ms']:.3f} ms"
        )


if __name__ == "__main__":
    main()
