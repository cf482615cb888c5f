"""The homeserver config SyTest's tests need, for its Manual mode
(``bench/sytest.py``) and for our SyTest plugin (``contrib/sytest/``), which
runs this module to write the config of each homeserver it starts:

    python -m bench.sytest_homeserver write-config --directory DIR --layout L
        --database sqlite|postgres --server-name localhost:PORT --base-port B
        --port-count N --federation-port F --client-port C
        --tls-certificate CRT --tls-key KEY --sytest-dir SYTEST
        [--app-service-file FILE ...]
    python -m bench.sytest_homeserver drop-database --directory DIR

``write-config`` writes ``DIR/homeserver.yaml``: the layout as
``synapse-lite generate-config`` writes it on the ports counted up from
``--base-port``, a fresh data directory ``DIR/data`` (and, on PostgreSQL, a
fresh database), the recipe of :func:`apply_sytest_recipe`, and SyTest's
HTTPS ports (:func:`add_https_front`). Exit status 2 with the config's
problems when it does not load.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import attr
import yaml

from bench.cluster import create_database, drop_database
from synapse_lite.config.generate import LAYOUTS, GenerateOptions, generate_config
from synapse_lite.config.homeserver import MAIN_PROCESS, read_homeserver_config
from synapse_lite.config.validation import ConfigError

#: What SyTest signs its shared-secret registrations with.
REGISTRATION_SECRET = "reg_secret"
#: Where SyTest lists the application services it registers; passed on once
#: synapse_lite knows the setting (until then SyTest's application-service
#: tests fail, as in Manual mode).
APP_SERVICE_KEY = "app_service_config_files"
#: The config file and data directory inside a homeserver's directory.
CONFIG_FILE = "homeserver.yaml"
DATA_DIR = "data"
#: PostgreSQL databases of SyTest's homeservers are called so (and only
#: such a database is ever dropped).
DATABASE_PREFIX = "sytest_"


def apply_sytest_recipe(config: dict[str, Any], sytest_dir: str) -> None:
    """What every SyTest run needs beside the layout: open registration,
    SyTest's shared secret, rate limits off, and the features SyTest tests
    that are off by default."""
    config["enable_registration"] = True
    config["registration_shared_secret"] = REGISTRATION_SECRET
    config["rate_limiting"] = {"enabled": False}
    # SyTest's guest tests register guests (POST /register?kind=guest).
    config["allow_guest_access"] = True
    media = config.setdefault("media", {})
    # SyTest predates authenticated media (Matrix 1.11): it reads
    # /_matrix/media/v3/config, one of the deprecated endpoints that are off
    # by default. An operator serving such clients turns them on.
    media["legacy_unauthenticated_endpoints"] = True
    media["url_previews"] = True
    # SyTest tests MSC2228 (self-destructing events), an unstable proposal
    # that is off by default (docs/configuration.md).
    config["experimental_features"] = {"msc2228_self_destructing_events": True}
    # SyTest's push gateway and pages to preview are served over HTTPS with
    # certificates of SyTest's own CA, its identity server with a
    # self-signed one: both trusted besides the system's CAs. They are on
    # this host: the loopback address is allowed for the users SyTest makes
    # (a real server refuses it: it is this host).
    keys = os.path.join(sytest_dir, "keys")
    config["outbound_requests"] = {
        "extra_ca_paths": [os.path.join(keys, "ca.crt"), os.path.join(keys, "tls-selfsigned.crt")],
        "ip_range_allowlist": ["127.0.0.0/8", "::1/128"],
    }


@attr.s(slots=True, frozen=True, auto_attribs=True)
class HttpsFront:
    """The ports SyTest talks to, over HTTPS with a certificate of its CA:
    the federation API (its port is part of the server name) and the client
    API (the same port on a layout without a router)."""

    certificate_path: str
    key_path: str
    federation_port: int
    client_port: int


def add_https_front(config: dict[str, Any], front: HttpsFront, sytest_dir: str) -> None:
    """Serve SyTest's ports, and trust SyTest's CA for other servers (its own
    federation peer and the second homeserver). The federation port is a
    listener of the one process serving ``federation``; the client port is
    the router's, else that same listener. Raises ``ValueError`` for a
    layout this cannot serve."""
    tls = {"tls_certificate_path": front.certificate_path, "tls_private_key_path": front.key_path}
    serving = [name for name, listeners in _listeners(config) if _serves(listeners, "federation")]
    if len(serving) != 1:
        raise ValueError(
            f"SyTest needs one federation port; {len(serving)} processes serve federation"
            f" ({', '.join(serving) or 'none'}) and the router does not route it"
        )
    [federation_process] = serving
    federation_listener: dict[str, Any] = {
        "port": front.federation_port,
        "bind_address": "127.0.0.1",
        "resources": ["federation", "keys"],
        **tls,
    }
    router = config.get("router")
    if router is not None:
        if front.client_port == front.federation_port:
            raise ValueError("behind a router the client port differs from the federation port")
        router["listeners"].append(
            {"port": front.client_port, "bind_address": "127.0.0.1", "resources": ["client"], **tls}
        )
    elif front.client_port == front.federation_port:
        federation_listener["resources"].insert(0, "client")
    else:
        raise ValueError("without a router the client and federation ports are one")
    dict(_listeners(config))[federation_process].append(federation_listener)
    federation = config.setdefault("federation", {})
    federation["extra_ca_paths"] = [os.path.join(sytest_dir, "keys", "ca.crt")]
    # SyTest's federation peer and the other homeservers are on this host.
    federation["ip_range_allowlist"] = ["127.0.0.0/8", "::1/128"]


def _listeners(config: dict[str, Any]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Each process's name and its (mutable) list of listeners."""
    yield MAIN_PROCESS, config.setdefault("listeners", [])
    for name, worker in (config.get("workers") or {}).items():
        yield name, worker.setdefault("listeners", [])


def _serves(listeners: list[dict[str, Any]], resource: str) -> bool:
    return any(resource in listener.get("resources", ()) for listener in listeners)


def ports_of(config: dict[str, Any]) -> set[int]:
    """Every port a config listens on."""
    ports = {listener["port"] for _, listeners in _listeners(config) for listener in listeners}
    ports.update(listener["port"] for listener in (config.get("router") or {}).get("listeners", []))
    tcp = (config.get("replication") or {}).get("tcp") or {}
    if "port" in tcp:
        ports.add(tcp["port"])
    return ports


def layout_config(layout: str, server_name: str, base_port: int, port_count: int) -> dict[str, Any]:
    """``generate-config``'s config of ``layout`` on ports counted up from
    ``base_port``; ``ValueError`` if it needs more than ``port_count``."""
    options = GenerateOptions(
        layout=layout, server_name=server_name, base_port=base_port, enable_registration=True
    )
    config: dict[str, Any] = yaml.safe_load(generate_config(options, DATA_DIR)[CONFIG_FILE])
    outside = sorted(p for p in ports_of(config) if not base_port <= p < base_port + port_count)
    if outside:
        raise ValueError(
            f"the {layout} layout uses ports {outside}, beyond the {port_count} from {base_port}"
        )
    return config


def write_config(
    directory: str,
    config: dict[str, Any],
    optional_keys: tuple[str, ...] = (),
) -> tuple[str, list[str]]:
    """Write ``directory/homeserver.yaml`` once it loads. Keys in
    ``optional_keys`` that this synapse_lite does not know are left out:
    the config's path and the keys left out. ``ConfigError`` otherwise."""
    path = os.path.join(directory, CONFIG_FILE)
    left_out = []
    while True:
        try:
            read_homeserver_config(config, path)
            break
        except ConfigError as e:
            unknown = {p.path for p in e.problems if p.path in optional_keys}
            if not unknown or len(unknown) != len(e.problems):
                raise
            for key in unknown:
                del config[key]
            left_out.extend(sorted(unknown))
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return path, left_out


def fresh_data(directory: str, database: str) -> dict[str, Any] | None:
    """Empty ``directory/data``; on PostgreSQL a fresh database's config
    section (None: the layout's SQLite file in the data directory)."""
    data = os.path.join(directory, DATA_DIR)
    shutil.rmtree(data, ignore_errors=True)
    os.makedirs(data)
    if database == "sqlite":
        return None
    return create_database(database, data, DATABASE_PREFIX + secrets.token_hex(6))


def drop_homeserver_database(directory: str) -> str | None:
    """Drop the PostgreSQL database of the config in ``directory`` if it is
    one of ours (named ``sytest_...``): its name, or None."""
    with open(os.path.join(directory, CONFIG_FILE), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    database = config.get("database") or {}
    name = (database.get("args") or {}).get("dbname", "")
    if database.get("engine") != "postgres" or not name.startswith(DATABASE_PREFIX):
        return None
    drop_database(database)
    return str(name)


def _write_config_command(args: argparse.Namespace) -> int:
    directory = os.path.abspath(args.directory)
    try:
        config = layout_config(args.layout, args.server_name, args.base_port, args.port_count)
        front = HttpsFront(
            os.path.abspath(args.tls_certificate),
            os.path.abspath(args.tls_key),
            args.federation_port,
            args.client_port,
        )
        add_https_front(config, front, args.sytest_dir)
    except ValueError as e:
        print(f"cannot serve SyTest: {e}", file=sys.stderr)
        return 2
    apply_sytest_recipe(config, args.sytest_dir)
    if args.app_service_file:
        config[APP_SERVICE_KEY] = [os.path.abspath(p) for p in args.app_service_file]
    database = fresh_data(directory, args.database)
    if database is not None:
        config["database"] = database
    try:
        path, left_out = write_config(directory, config, (APP_SERVICE_KEY,))
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    for key in left_out:
        print(f"this synapse_lite does not know {key}: left out", file=sys.stderr)
    print(f"wrote {path}")
    return 0


def _drop_database_command(args: argparse.Namespace) -> int:
    name = drop_homeserver_database(os.path.abspath(args.directory))
    print(f"dropped {name}" if name else "no database of ours to drop")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.sytest_homeserver")
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("write-config", help="write a homeserver's config for SyTest")
    write.add_argument("--directory", required=True, help="the homeserver's directory")
    write.add_argument("--layout", choices=LAYOUTS, default="monolith")
    write.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    write.add_argument("--server-name", required=True)
    write.add_argument("--base-port", type=int, required=True)
    write.add_argument("--port-count", type=int, required=True)
    write.add_argument("--federation-port", type=int, required=True)
    write.add_argument("--client-port", type=int, required=True)
    write.add_argument("--tls-certificate", required=True)
    write.add_argument("--tls-key", required=True)
    write.add_argument("--sytest-dir", required=True, help="SyTest's checkout (its keys/)")
    write.add_argument("--app-service-file", action="append", default=[])
    write.set_defaults(run=_write_config_command)
    drop = commands.add_parser("drop-database", help="drop a homeserver's PostgreSQL database")
    drop.add_argument("--directory", required=True)
    drop.set_defaults(run=_drop_database_command)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
