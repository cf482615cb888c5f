"""The routing table for other proxies: ``synapse-lite routes --format json|nginx|haproxy``.

JSON is the table itself, for tools. The nginx and haproxy configurations do
what the built-in router does, as far as each can without a database:

* /sync and reads go to the readers, hashed (consistently) on the user's part
  of the access token (``api/access_tokens.py``), so one user stays on one;
* a room's events go to the events writers hashed on the room id. Unlike the
  built-in router, which reads each room's writer from ``rooms.event_writer``,
  a proxy without a database may pick another writer, which forwards the
  request to the right one (one internal hop; correct either way);
* stream writes to their writer, media to the media instance, the rest to main;
* ``/_matrix/federation`` and ``/_matrix/key`` to the federation readers,
  hashed on the requesting server (nginx; haproxy balances them round-robin),
  on the client port and on the router's federation port alike;
* internal paths (``/_synapse/replication``) are refused;
* ``X-Forwarded-For`` is set to the client's address, with the router's proof
  (``http/forwarded.py``) so the processes believe it.
"""

from __future__ import annotations

import json
import re

from synapse_lite.config.homeserver import MAIN_PROCESS, InstanceLocation, ListenerConfig
from synapse_lite.http.forwarded import router_proof
from synapse_lite.routing.table import (
    BALANCE_ORIGIN,
    BALANCE_ROOM,
    BALANCE_USER,
    INTERNAL_PATH_PREFIXES,
    Route,
    RoutingTable,
    relay_address,
)

FORMATS = ("json", "nginx", "haproxy")
#: Proxy timeouts must outlast a /sync long-poll (clients ask for up to a few
#: minutes; the server caps it at ``limits.max_sync_timeout_ms``).
LONG_POLL_MARGIN_SECONDS = 60


def render(table: RoutingTable, form: str) -> str:
    if form == "json":
        return json.dumps(table.to_json(), indent=2) + "\n"
    if form == "nginx":
        return NginxConfig(table).text()
    if form == "haproxy":
        return HaproxyConfig(table).text()
    raise ValueError(f"unknown format {form!r}; known: {', '.join(FORMATS)}")


def _upstream_name(route: Route) -> str:
    """One upstream per way of choosing: the readers, the events writers by
    room, or one process (named after it)."""
    if route.balance == BALANCE_USER:
        name = "readers"
    elif route.balance == BALANCE_ORIGIN:
        name = "federation_readers"
    elif route.balance == BALANCE_ROOM:
        name = "room_events_writers"
    else:
        name = route.instances[0]
    return "syl_" + re.sub(r"[^A-Za-z0-9]+", "_", name)


def _plain_groups(pattern: str) -> str:
    """A pattern without named groups, for regex engines that lack them."""
    return re.sub(r"\(\?P<[a-z_]+>", "(", pattern)


def _front_door(table: RoutingTable) -> ListenerConfig | None:
    router = table.config.router
    if router is None:
        return None
    for listener in router.listeners:
        if "client" in listener.resources:
            return listener
    return None


def _federation_doors(table: RoutingTable) -> list[ListenerConfig]:
    """The router's listeners with ``federation`` and not ``client``: a
    proxy listens there too (and serves every route on both)."""
    router = table.config.router
    if router is None:
        return []
    return [
        listener
        for listener in router.listeners
        if "federation" in listener.resources and "client" not in listener.resources
    ]


def _header(table: RoutingTable, tool: str) -> list[str]:
    config = table.config
    return [
        f"# {tool} in front of the synapse_lite homeserver {config.server_name}: written by",
        f"# `synapse-lite routes --format {tool}` from {config.config_files[0]}.",
        "# Regenerate it when the config's workers or stream writers change.",
        "# docs/routing.md explains each route.",
    ]


def _proof(table: RoutingTable) -> str:
    secret = table.config.worker_replication_secret
    return router_proof(secret) if secret else ""


def _timeout_seconds(table: RoutingTable) -> int:
    return table.config.limits.max_sync_timeout_ms // 1000 + LONG_POLL_MARGIN_SECONDS


class NginxConfig:
    """An nginx ``http {}`` include (``conf.d/synapse-lite.conf``)."""

    def __init__(self, table: RoutingTable) -> None:
        self._table = table
        self._upstreams: dict[str, Route] = {}
        for route in [table.default, *table.routes]:
            self._upstreams.setdefault(_upstream_name(route), route)

    def text(self) -> str:
        table = self._table
        config = table.config
        lines = _header(table, "nginx")
        lines += [
            "# Include it inside http { }: it defines maps, upstreams and one server.",
            "",
            "# The user's part of the access token (or the whole token) keys the readers.",
            "map $http_authorization $syl_header_user {",
            '    "~^Bearer syl_(?<syl_u>[A-Za-z0-9_-]+)\\." $syl_u;',
            "    default $http_authorization;",
            "}",
            "map $arg_access_token $syl_query_user {",
            '    "~^syl_(?<syl_q>[A-Za-z0-9_-]+)\\." $syl_q;',
            "    default $arg_access_token;",
            "}",
            "map $http_authorization $syl_user {",
            '    "" $syl_query_user$remote_addr;',
            "    default $syl_header_user;",
            "}",
            "# The requesting server (X-Matrix origin) keys the federation readers.",
            "map $http_authorization $syl_origin {",
            '    "~origin=\\"?(?<syl_o>[^\\",]+)" $syl_o;',
            "    default $remote_addr;",
            "}",
            "",
        ]
        for name, route in self._upstreams.items():
            lines.append(f"upstream {name} {{")
            if route.balance == BALANCE_USER:
                lines.append("    hash $syl_user consistent;")
            elif route.balance == BALANCE_ORIGIN:
                lines.append("    hash $syl_origin consistent;")
            elif route.balance == BALANCE_ROOM:
                lines.append("    hash $room_id consistent;")
            for instance in route.instances:
                address = relay_address(config, instance)
                assert address is not None
                lines.append(f"    server {_host_port(address)};  # {instance}")
            lines += ["    keepalive 32;", "}", ""]
        front = _front_door(table)
        listen = f"{front.bind_address}:{front.port}" if front else "8008"
        lines += [
            "server {",
            f"    listen {listen};",
            *(f"    listen {door.bind_address}:{door.port};" for door in _federation_doors(table)),
            f"    server_name {config.server_name.split(':')[0]};",
            f"    client_max_body_size {config.limits.max_request_body_bytes};",
            "    proxy_http_version 1.1;",
            '    proxy_set_header Connection "";',
            "    proxy_set_header Host $host;",
            "    proxy_set_header X-Forwarded-For $remote_addr;",
            f'    proxy_set_header X-Synapse-Lite-Router "{_proof(table)}";',
            "    # Long-polls and uploads stream through, unbuffered.",
            "    proxy_buffering off;",
            "    proxy_request_buffering off;",
            f"    proxy_read_timeout {_timeout_seconds(table)}s;",
        ]
        lines += self._tls_lines()
        for prefix in INTERNAL_PATH_PREFIXES:
            lines += [f"    location ^~ {prefix} {{ return 404; }}"]
        lines += ["    location = /metrics { return 404; }"]
        by_pattern: dict[tuple[str, bool], list[Route]] = {}
        for route in table.routes:
            by_pattern.setdefault((route.pattern, route.prefix), []).append(route)
        for (pattern, is_prefix), routes in by_pattern.items():
            lines += self._location(pattern, is_prefix, routes)
        lines += [
            "    location / {",
            f"        proxy_pass {self._scheme(table.default)}://{_upstream_name(table.default)};",
            "    }",
            "}",
            "",
        ]
        return "\n".join(lines)

    def _tls_lines(self) -> list[str]:
        ca = self._table.config.internal_tls.ca_path
        if ca is None:
            return []
        return [
            "    # The processes answer with TLS: check them against the internal CA.",
            f"    proxy_ssl_trusted_certificate {ca};",
            "    proxy_ssl_verify on;",
        ]

    def _scheme(self, route: Route) -> str:
        config = self._table.config
        tls = [relay_address(config, i) for i in route.instances]
        return "https" if any(a is not None and a.tls for a in tls) else "http"

    def _location(self, pattern: str, prefix: bool, routes: list[Route]) -> list[str]:
        if prefix:
            head = f"    location ^~ {pattern.replace(chr(92), '')} {{"
        else:
            head = f'    location ~ "^{pattern}$" {{'
        lines = [head]
        names = {_upstream_name(r) for r in routes}
        # One upstream for the path: other methods get their 405 there.
        if len(names) == 1:
            route = routes[0]
            lines.append(f"        proxy_pass {self._scheme(route)}://{_upstream_name(route)};")
        else:
            # Several methods, several upstreams: choose by method. Methods no
            # route names go to the main process, as the router does.
            default = self._table.default
            lines.append(f"        set $syl_upstream {_upstream_name(default)};")
            for route in routes:
                methods = "|".join(route.methods)
                lines.append(
                    f'        if ($request_method ~ "^({methods})$")'
                    f" {{ set $syl_upstream {_upstream_name(route)}; }}"
                )
            scheme = "https" if any(self._scheme(r) == "https" for r in routes) else "http"
            lines.append(f"        proxy_pass {scheme}://$syl_upstream;")
        lines.append("    }")
        return lines


def _host_port(address: InstanceLocation) -> str:
    host = f"[{address.host}]" if ":" in address.host else address.host
    return f"{host}:{address.port}"


class HaproxyConfig:
    """A whole haproxy configuration (``haproxy -f``)."""

    def __init__(self, table: RoutingTable) -> None:
        self._table = table

    def text(self) -> str:
        table = self._table
        config = table.config
        front = _front_door(table)
        bind = f"{front.bind_address}:{front.port}" if front else "*:8008"
        timeout = _timeout_seconds(table)
        lines = _header(table, "haproxy")
        lines += [
            "global",
            "    maxconn 4096",
            "",
            "defaults",
            "    mode http",
            "    option http-keep-alive",
            "    timeout connect 5s",
            "    timeout http-request 30s",
            f"    timeout client {timeout}s",
            f"    timeout server {timeout}s",
            "    timeout check 2s",
            "",
            "frontend synapse_lite",
            f"    bind {bind}",
            *(f"    bind {door.bind_address}:{door.port}" for door in _federation_doors(table)),
            f"    http-request deny deny_status 413 if {{ req.body_size gt"
            f" {config.limits.max_request_body_bytes} }}",
        ]
        lines += [
            f"    http-request deny deny_status 404 if {{ path_beg {p} }}"
            for p in INTERNAL_PATH_PREFIXES
        ]
        lines += [
            "    http-request deny deny_status 404 if { path /metrics }",
            "    # The client's address, with the router's proof so the processes believe it.",
            "    http-request set-header X-Forwarded-For %[src]",
            f"    http-request set-header X-Synapse-Lite-Router {_proof(table)}",
            "    # The user's part of the access token (or the whole token) keys the readers.",
            "    http-request set-var(txn.syl_user) src,ipmask(32)",
            "    http-request set-var(txn.syl_user) url_param(access_token),field(1,.)"
            " if { url_param(access_token) -m found }",
            "    http-request set-var(txn.syl_user) req.hdr(authorization),word(2,' '),field(1,.)"
            " if { req.hdr(authorization) -m found }",
        ]
        backends: dict[str, Route] = {}
        choices: list[str] = []
        for i, route in enumerate(table.routes):
            name = _upstream_name(route)
            backends.setdefault(name, route)
            acl = f"syl_route{i}"
            if route.prefix:
                lines.append(f"    acl {acl} path_beg {route.pattern.replace(chr(92), '')}")
            else:
                lines.append(f"    acl {acl} path_reg ^{_plain_groups(route.pattern)}$")
            condition = acl
            if route.methods:
                condition += " { method " + " ".join(route.methods) + " }"
            if route.balance == BALANCE_ROOM:
                segment = route.pattern.split("(?P<room_id>")[0].count("/") + 1
                lines.append(
                    f"    http-request set-var(txn.syl_room) path,field({segment},/) if {condition}"
                )
            choices.append(f"    use_backend {name} if {condition}")
        lines += choices
        default_name = _upstream_name(table.default)
        backends.setdefault(default_name, table.default)
        lines += [f"    default_backend {default_name}", ""]
        for name, route in backends.items():
            lines += self._backend(name, route)
        return "\n".join(lines) + "\n"

    def _backend(self, name: str, route: Route) -> list[str]:
        config = self._table.config
        lines = [f"backend {name}"]
        if route.balance == BALANCE_USER:
            lines += ["    balance hash var(txn.syl_user)", "    hash-type consistent"]
        elif route.balance == BALANCE_ROOM:
            lines += ["    balance hash var(txn.syl_room)", "    hash-type consistent"]
        lines += ["    option httpchk GET /health"]
        ca = config.internal_tls.ca_path
        for instance in route.instances:
            address = relay_address(config, instance)
            health = config.http_address(instance, "health")
            assert address is not None
            server = f"    server {instance} {_host_port(address)}"
            if health is not None:
                server += f" check port {health.port}"
                if health.tls and ca:
                    server += " check-ssl"
            if address.tls and ca:
                server += f" ssl verify required ca-file {ca}"
            lines.append(server)
        lines.append("")
        return lines


__all__ = ["FORMATS", "MAIN_PROCESS", "render"]
