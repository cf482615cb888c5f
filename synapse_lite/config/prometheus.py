"""A Prometheus scrape configuration for every process of a config.

Each process is one target, labelled the way the reference homeserver's
Grafana dashboard and ours (``contrib/grafana/``) expect: ``instance`` is the
server name (one homeserver, many processes), ``job`` the kind of process and
``index`` its number among processes of that kind (1, 2, ...). Our metrics
use none of those label names themselves, so nothing is renamed on scrape.
"""

from __future__ import annotations

import attr
import yaml

from synapse_lite.config.homeserver import MAIN_PROCESS, ROUTER_PROCESS, HomeServerConfig

PROMETHEUS_FILE_NAME = "prometheus.yml"
SCRAPE_INTERVAL = "15s"


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ScrapeTarget:
    name: str
    job: str
    index: int
    address: str


def metrics_job(config: HomeServerConfig, name: str) -> str:
    """The ``job`` label of a process: what kind of process it is."""
    if name == ROUTER_PROCESS:
        return "router"
    if name == MAIN_PROCESS:
        return "main"
    if name in config.writers.writers("events"):
        return "events_writer"
    if config.writers.streams_written_by(name) != ["caches"]:
        return "stream_writer"
    if name in config.federation_sender_instances:
        return "federation_sender"
    if name in config.federation_readers():
        return "federation_reader"
    if name == config.media_instance:
        return "media"
    return "reader"


def scrape_targets(config: HomeServerConfig) -> list[ScrapeTarget]:
    """Every process with a ``metrics`` listener, main first, the router last."""
    names = config.instance_names()
    if config.router is not None:
        names.append(ROUTER_PROCESS)
    counts: dict[str, int] = {}
    targets = []
    for name in names:
        address = config.http_address(name, "metrics")
        if address is None:
            continue
        job = metrics_job(config, name)
        counts[job] = counts.get(job, 0) + 1
        host = f"[{address.host}]" if ":" in address.host else address.host
        targets.append(ScrapeTarget(name, job, counts[job], f"{host}:{address.port}"))
    return targets


def prometheus_config(config: HomeServerConfig) -> str:
    """The text of ``prometheus.yml`` for ``config``."""
    static_configs = [
        {
            "targets": [t.address],
            "labels": {
                "instance": config.server_name,
                "job": t.job,
                "index": str(t.index),
                "process": t.name,
            },
        }
        for t in scrape_targets(config)
    ]
    scheme = (
        {"https"}
        if any(
            (a := config.http_address(t.name, "metrics")) is not None and a.tls
            for t in scrape_targets(config)
        )
        else set()
    )
    job: dict[str, object] = {
        "job_name": "synapse_lite",
        "scrape_interval": SCRAPE_INTERVAL,
        "metrics_path": "/metrics",
        "static_configs": static_configs,
    }
    if scheme:
        job["scheme"] = "https"
    header = (
        f"# Prometheus: scrape every process of {config.server_name} (written by\n"
        "# `synapse-lite generate-config`). Add this job to your prometheus.yml, or run\n"
        "# `prometheus --config.file prometheus.yml`. The labels instance/job/index are\n"
        "# what contrib/grafana/synapse_lite.json (and the reference dashboard) select on.\n"
    )
    return header + yaml.safe_dump({"scrape_configs": [job]}, sort_keys=False)
