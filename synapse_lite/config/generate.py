"""Writing a commented homeserver config for a chosen layout.

Three layouts, all on loopback, ports counted up from a base port (the client
port: the router's, or the main process's in the monolith): the base port, TCP
replication, then each process in the order listed, then the router's metrics:

* ``monolith``: the main process alone;
* ``default``: the router, the main process, one /sync worker
  (``synchrotron1``), two events writers (``persister1``, ``persister2``) and
  the media repository (``media1``);
* ``sharded``: the router, the main process, two /sync workers, three events
  writers, ``stream_writer1`` for typing, to_device, account_data, receipts,
  presence, push_rules and pushers, ``media1``, two federation readers
  (``federation_reader1``, ``federation_reader2``) and two federation senders
  (``federation_sender1``, ``federation_sender2``).

The routed layouts' router also listens on the federation port (after its
metrics port): other servers' requests go to the federation readers, or to
the main process where there are none. Every process gets ``health`` and
``metrics`` (``synapse-lite run`` and ``status`` need them); writers and the
main process get ``replication``; every other process serves the client API
(the federation readers the federation API instead), so the router can send
each request straight to the process it belongs to. Beside the config, ``prometheus.yml`` says where
to scrape each process's metrics (``config/prometheus.py``).
"""

from __future__ import annotations

import os
import secrets
import time

import attr
import yaml

from synapse_lite.config.homeserver import MAIN_PROCESS, load_config
from synapse_lite.config.prometheus import PROMETHEUS_FILE_NAME, prometheus_config
from synapse_lite.streams.catalog import BUILTIN_STREAMS

LAYOUTS = ("monolith", "default", "sharded")
#: The main process's client port; the others count up from it.
DEFAULT_BASE_PORT = 18008
#: Where ``synapse-lite`` keeps its config and data when not told otherwise.
DEFAULT_DATA_DIR = "synapse-lite-data"
CONFIG_FILE_NAME = "homeserver.yaml"


@attr.s(slots=True, frozen=True, auto_attribs=True)
class GenerateOptions:
    """What ``synapse-lite generate-config`` was asked for."""

    layout: str = "default"
    database: str = "sqlite"
    replication: str = "tcp"
    enable_registration: bool = False
    server_name: str = "localhost"
    base_port: int = DEFAULT_BASE_PORT
    worker_files: bool = False


@attr.s(slots=True, frozen=True, auto_attribs=True)
class _Process:
    name: str
    resources: tuple[str, ...]
    comment: str
    #: One of ``federation_sender_instances``.
    sends_federation: bool = False


_SYNC = ("client", "health", "metrics")
_WRITER = ("client", "replication", "health", "metrics")
_FEDERATION_READER = ("federation", "keys", "health", "metrics")
#: The media worker of the layouts that have one.
MEDIA_WORKER = "media1"
_MEDIA = _Process(MEDIA_WORKER, _SYNC, "The media repository: uploads, downloads, thumbnails.")


def _layout(layout: str) -> tuple[list[_Process], dict[str, object]]:
    """The processes of a layout (main first, the media worker, if any, last)
    and its stream writers."""
    if layout == "monolith":
        main = _Process(
            MAIN_PROCESS, ("client", "federation", "keys", "health", "metrics"), "Everything."
        )
        return [main], {}
    main = _Process(
        MAIN_PROCESS,
        ("client", "federation", "keys", "replication", "health", "metrics"),
        "The client API, the replication hub, and the streams no worker writes.",
    )
    if layout == "default":
        workers = [
            _Process("synchrotron1", _SYNC, "/sync and other reads."),
            _Process("persister1", _WRITER, "Persists the events of its rooms."),
            _Process("persister2", _WRITER, "Persists the events of its rooms."),
            _MEDIA,
        ]
        return [main, *workers], {"events": ["persister1", "persister2"]}
    persisters = [f"persister{i}" for i in (1, 2, 3)]
    workers = [
        _Process("synchrotron1", _SYNC, "/sync and other reads."),
        _Process("synchrotron2", _SYNC, "/sync and other reads."),
        *(_Process(p, _WRITER, "Persists the events of its rooms.") for p in persisters),
        _Process("stream_writer1", _WRITER, "Writes the single-writer streams."),
        *(
            _Process(f"federation_reader{i}", _FEDERATION_READER, "Serves other servers.")
            for i in (1, 2)
        ),
        *(
            _Process(
                f"federation_sender{i}",
                ("health", "metrics"),
                "Sends to its share of the other servers.",
                sends_federation=True,
            )
            for i in (1, 2)
        ),
        _MEDIA,
    ]
    writers: dict[str, object] = {"events": persisters}
    writers.update({key: "stream_writer1" for key in BUILTIN_STREAMS.single_writer_keys()})
    return [main, *workers], writers


def _value(value: object) -> str:
    """One YAML value on one line (quoted when it needs to be)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return text.removesuffix("\n...").strip()


def _listener(port: int, resources: tuple[str, ...], indent: str) -> list[str]:
    return [
        f"{indent}- port: {port}",
        f"{indent}  bind_address: 127.0.0.1",
        f"{indent}  resources: {_value(list(resources))}",
    ]


def _database_lines(database: str) -> list[str]:
    if database == "sqlite":
        return [
            "# sqlite: one file in data_dir, no server to run. Every process opens it;",
            "# for production use postgres.",
            "database:",
            "  engine: sqlite",
            "  args:",
            "    path: homeserver.db",
        ]
    return [
        "# postgres: create the database first, for example:",
        "#   createdb -h 127.0.0.1 -U postgres synapse_lite",
        "database:",
        "  engine: postgres",
        "  args:",
        "    host: 127.0.0.1",
        "    port: 5432",
        "    user: postgres",
        "    # password: ...",
        "    dbname: synapse_lite",
        "  # Connections each process keeps open.",
        "  min_connections: 1",
        "  max_connections: 5",
    ]


def _replication_lines(replication: str, tcp_port: int) -> list[str]:
    lines = ["# How the processes keep each other current: tcp (every worker connects to"]
    lines.append("# the main process) or redis (every process publishes and subscribes).")
    lines += ["replication:", f"  transport: {replication}"]
    if replication == "tcp":
        lines += [
            "  tcp:",
            "    # Where the main process listens for workers. Keep it private.",
            "    host: 127.0.0.1",
            f"    port: {tcp_port}",
        ]
    else:
        lines += [
            "  redis:",
            "    host: 127.0.0.1",
            "    port: 6379",
            "    # password: ...",
        ]
    return lines


def generate_config(options: GenerateOptions, data_dir: str) -> dict[str, str]:
    """The files of a config: ``{relative path: text}``, ``homeserver.yaml``
    first (then ``workers/NAME.yaml`` with ``worker_files``). ``data_dir`` is
    written as given: relative paths are relative to the config file."""
    processes, writers = _layout(options.layout)
    routed = len(processes) > 1
    # The client port is the router's when there is one, else the main process's.
    first = options.base_port + 2 if routed else options.base_port
    ports = {p.name: first + i for i, p in enumerate(processes)}
    tcp_port = options.base_port + 1
    router_metrics_port = first + len(processes)
    federation_port = router_metrics_port + 1
    senders = [p.name for p in processes if p.sends_federation]
    main = processes[0]
    lines = [
        f"# synapse_lite config, layout {options.layout!r}: written by",
        f"# `synapse-lite generate-config` on {time.strftime('%Y-%m-%d')}.",
        "# Every setting is described in docs/configuration.md; the processes and",
        "# streams in docs/workers.md. Start everything with: synapse-lite run -c <this file>",
        "",
        "# The server's name: the part after ':' in user ids (@alice:NAME).",
        f"server_name: {_value(options.server_name)}",
        "",
        "# The database, the run/ directory (pid files) and other state. Relative",
        "# paths are relative to this file.",
        f"data_dir: {_value(data_dir)}",
        "",
        *_database_lines(options.database),
        "",
        *_replication_lines(options.replication, tcp_port),
        "",
        "# Authenticates the processes to each other (replication and internal HTTP).",
        f"worker_replication_secret: {_value(secrets.token_urlsafe(32))}",
        "# Lets `synapse-lite register-user` create users. Keep it secret.",
        f"registration_shared_secret: {_value(secrets.token_urlsafe(32))}",
        "# Whether anyone may register, without verification. Only for a private server.",
        f"enable_registration: {_value(options.enable_registration)}",
        "# Whether guest accounts (POST /register?kind=guest) may be made and used.",
        "allow_guest_access: false",
        "",
        *_router_lines(options.base_port, router_metrics_port, federation_port, routed),
        "# The main process's HTTP listeners. Resources: client (the Matrix client API),",
        "# federation and keys (other servers: docs/federation.md), replication",
        "# (requests from the other processes: never expose it), health (GET /health),",
        "# metrics (Prometheus, GET /metrics). All on loopback"
        + (": clients come through the router." if routed else ": put a reverse proxy in"),
        *(
            []
            if routed
            else ["# front of the client and federation listeners for the outside world."]
        ),
        f"# {main.comment}",
        "listeners:",
        *_listener(ports[MAIN_PROCESS], main.resources, "  "),
        "",
    ]
    if senders:
        lines += [
            "# The processes sending to other servers, each destination by one of them",
            "# (a stable hash of its name); adding or removing one with `synapse-lite",
            "# reload` restarts only the senders (docs/federation.md#across-workers).",
            f"federation_sender_instances: {_value(senders)}",
            "",
        ]
    if writers:
        lines += ["# Which process writes which stream (docs/workers.md). events takes a"]
        lines += ["# list; every other stream one process. Unlisted streams: main."]
        lines += ["stream_writers:"]
        lines += [f"  {stream}: {_value(value)}" for stream, value in writers.items()]
        lines += [""]
    files: dict[str, str] = {}
    if len(processes) > 1:
        lines += [
            "# The worker processes. `synapse-lite run` starts them all; a process",
            "# manager can start one with: python -m synapse_lite.app.generic_worker",
            "#   -c homeserver.yaml --worker-name NAME",
            "workers:",
        ]
        for process in processes[1:]:
            port = ports[process.name]
            if options.worker_files:
                path = f"workers/{process.name}.yaml"
                lines += [f"  {process.name}: {{config_file: {path}}}  # {process.comment}"]
                files[path] = "\n".join(
                    [
                        f"# {process.name}: {process.comment}",
                        f"worker_name: {process.name}",
                        "worker_listeners:",
                        *_listener(port, process.resources, "  "),
                        "",
                    ]
                )
            else:
                lines += [f"  # {process.comment}", f"  {process.name}:", "    listeners:"]
                lines += _listener(port, process.resources, "      ")
        lines += [""]
    media_instance = MEDIA_WORKER if len(processes) > 1 else MAIN_PROCESS
    lines += [
        "# The process serving the media repository (/_matrix/media and",
        "# /_matrix/client/v1/media); the others answer those paths with an error",
        "# naming it, so route them there (docs/media.md).",
        f"media_instance: {media_instance}",
        "# Uploads: where they are kept (relative to data_dir), how large they may",
        "# be, the thumbnails made of images, and more: docs/configuration.md#media.",
        "media:",
        "  store_path: media",
        "  max_upload_size: 50M",
        "  # The deprecated /_matrix/media/v3/download, thumbnail and config, which",
        "  # serve media without an access token.",
        "  legacy_unauthenticated_endpoints: false",
        "  upload_rate_limit: {per_second: 1, burst: 20}",
        "",
        "# Other homeservers: found as the spec says (.well-known, SRV, port 8448)",
        "# unless `destinations` names their base URL; never at private or loopback",
        "# addresses unless ip_range_allowlist allows them; timeouts and retry",
        "# backoff. See docs/federation.md.",
        "# federation:",
        "#   destinations:",
        '#     other.example: "http://127.0.0.1:8448"',
        "#   ip_range_allowlist: []",
        "#   # Served at /.well-known/matrix/server and /client:",
        '#   well_known_server: "matrix.example.com:443"',
        '#   well_known_client: {"m.homeserver": {"base_url": "https://matrix.example.com"}}',
        "",
        "# Application services (bridges, bots): one registration file each, in the",
        "# format bridges generate (id, url, as_token, hs_token, sender_localpart,",
        "# namespaces, rate_limited, protocols, receive_ephemeral). Relative paths",
        "# are relative to this file. See docs/appservices.md.",
        "# app_service_config_files:",
        "#   - bridges/irc-registration.yaml",
        "# The processes sending them transactions, each service by one of them",
        "# (a stable hash of its id); main by default.",
        "# appservice_instances: [main]",
        "",
        "# DEBUG, INFO, WARNING or ERROR.",
        "log_level: INFO",
        "",
    ]
    return {"homeserver.yaml": "\n".join(lines), **files}


def _router_lines(
    client_port: int, metrics_port: int, federation_port: int, routed: bool
) -> list[str]:
    if not routed:
        return []
    return [
        "# The router: the one client port. It sends each request to the process that",
        "# serves it (docs/routing.md): /sync and reads to the readers (each user to one),",
        "# a room's events to the room's events writer, typing, receipts, account data",
        "# and to-device messages to their writers, the rest to the main process. Point",
        "# clients (or your TLS terminator) here. `synapse-lite routes` prints the table,",
        "# also as an nginx or haproxy configuration. Keep the metrics listener private.",
        "router:",
        "  listeners:",
        *_listener(client_port, ("client", "health"), "    "),
        *_listener(metrics_port, ("metrics",), "    "),
        "    # The federation port: /_matrix/federation and /_matrix/key go to the",
        "    # federation readers (each other server to one), federation media to the",
        "    # media instance, /.well-known to main.",
        *_listener(federation_port, ("federation",), "    "),
        "",
    ]


def write_config(options: GenerateOptions, config_path: str, data_dir: str) -> list[str]:
    """Write the config files beside ``config_path``, and ``prometheus.yml``
    (where to scrape each process); the paths written. Refuses
    (``FileExistsError``) to overwrite any of them."""
    base = os.path.dirname(os.path.abspath(config_path))
    relative_data_dir = os.path.relpath(os.path.abspath(data_dir), base)
    files = generate_config(options, relative_data_dir)
    targets = {
        os.path.abspath(config_path) if name == CONFIG_FILE_NAME else os.path.join(base, name): text
        for name, text in files.items()
    }
    prometheus_path = os.path.join(base, PROMETHEUS_FILE_NAME)
    for path in [*targets, prometheus_path]:
        if os.path.exists(path):
            raise FileExistsError(path)
    for path, text in targets.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    with open(prometheus_path, "w", encoding="utf-8") as f:
        f.write(prometheus_config(load_config(os.path.abspath(config_path))))
    return [*targets, prometheus_path]
