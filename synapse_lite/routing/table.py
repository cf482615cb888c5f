"""The routing table: for every client path and method, which processes serve it.

Built from three things: the servlets (their paths, read from the client API's
registration), the declarations of who serves each (``rest/client/served_by.py``,
main when a servlet has none) and the config (which workers exist and serve the
client API, who writes each stream, which is the media instance). The router
process matches requests against it; ``synapse-lite routes`` prints it for
other proxies (``formats.py``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, cast

import attr

from synapse_lite.config.homeserver import MAIN_PROCESS, HomeServerConfig, InstanceLocation
from synapse_lite.http.path_alternation import PathAlternation, group_prefix
from synapse_lite.http.server import JsonResource
from synapse_lite.rest.client import ClientHandlers, register_servlets
from synapse_lite.rest.client.served_by import MEDIA, MEDIA_PATH_PREFIXES, served_by
from synapse_lite.streams.writers import (
    FEDERATION_READERS_ROLE,
    MAIN,
    READERS_ROLE,
    ROOM_EVENTS_WRITER_ROLE,
    STREAM_WRITER_ROLE,
    ServedBy,
)

#: Paths the router never relays: internal calls between processes.
INTERNAL_PATH_PREFIXES = ("/_synapse/replication/",)

#: The federation front door: these paths go to the federation readers
#: (``/.well-known`` stays with the main process, as every path not routed).
FEDERATION_PATH_PREFIXES = ("/_matrix/federation/", "/_matrix/key/")
FEDERATION_READERS = ServedBy(FEDERATION_READERS_ROLE)

#: Paths without parameters remembered with their route (bounds the memory a
#: client sending odd paths can take).
MAX_FIXED_PATHS = 1024

#: How a route picks among its instances.
BALANCE_USER = "user"  # a hash of the user id: one user stays on one process
BALANCE_ROOM = "room"  # the room's events writer (rooms.event_writer)
BALANCE_SINGLE = "single"  # one process
BALANCE_ORIGIN = "origin"  # a hash of the requesting server: one server stays on one process


class RoutingError(Exception):
    """The config cannot be routed (a declaration names an unknown stream...)."""


class _Unbuilt:
    """Stands in for the client handlers when only the servlets' paths are
    wanted: registering a servlet reads handler attributes (``auth =
    handlers.auth``) but calls nothing until a request comes."""

    def __getattr__(self, name: str) -> _Unbuilt:
        return self


def client_servlets() -> list[tuple[str, str, str]]:
    """``(method, path pattern, servlet)`` of every client API servlet, in the
    order the client resource matches them."""
    resource = JsonResource("routing")
    register_servlets(cast(ClientHandlers, _Unbuilt()), resource)
    return resource.registered()


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Route:
    """Requests whose method is in ``methods`` (all, when empty) and whose
    path matches ``pattern`` (whole, or as a prefix for ``prefix`` routes)."""

    servlet: str | None
    methods: tuple[str, ...]
    pattern: str
    served_by: ServedBy
    #: The processes that may answer, as the config stands.
    instances: tuple[str, ...]
    balance: str
    prefix: bool = False
    regex: re.Pattern[str] = attr.ib(eq=False, repr=False, default=None)

    def matches(self, method: str, path: str) -> re.Match[str] | None:
        if self.methods and method not in self.methods:
            return None
        if self.prefix:
            return self.regex.match(path)
        return self.regex.fullmatch(path)

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "servlet": self.servlet,
            "methods": list(self.methods),
            ("path_prefix" if self.prefix else "path"): self.pattern,
            "role": self.served_by.name,
            "instances": list(self.instances),
            "balance": self.balance,
        }
        return result


def relay_address(config: HomeServerConfig, name: str) -> InstanceLocation | None:
    """Where a proxy sends ``name`` requests: its first listener with the
    ``client`` resource or, without one, its first with ``federation`` (a
    federation reader); None if it has neither."""
    return config.http_address(name, "client") or config.http_address(name, "federation")


def _relay_serves(config: HomeServerConfig, name: str, resource: str) -> bool:
    """Whether the listener requests are relayed to serves ``resource``."""
    address = relay_address(config, name)
    return address is not None and address == config.http_address(name, resource)


def _with_client_api(config: HomeServerConfig, names: Sequence[str]) -> tuple[str, ...]:
    return tuple(n for n in names if config.http_address(n, "client") is not None)


class PathMatch:
    """The parameters of a path that matched a route's pattern (``room_id``)."""

    __slots__ = ("_found", "_prefix")

    def __init__(self, found: re.Match[str], prefix: str) -> None:
        self._found = found
        self._prefix = prefix

    def group(self, name: str) -> str:
        return self._found.group(self._prefix + name)


class _Combined:
    """The routes one method may take as one regex (:class:`PathAlternation`:
    each route's pattern whole, or as a prefix), in the table's order."""

    def __init__(self, routes: Sequence[Route], method: str) -> None:
        taken = [r for r in routes if not r.methods or method in r.methods]
        self.alternation = PathAlternation.of([(r.pattern, not r.prefix) for r in taken])
        #: In the alternation's order: (route, whether its pattern has parameters).
        self.routes = [(r, bool(r.regex.groupindex)) for r in taken]


class RoutingTable:
    """Every route of one config, first match wins, then the default (main)."""

    def __init__(self, config: HomeServerConfig, routes: list[Route], default: Route) -> None:
        self.config = config
        self.routes = routes
        self.default = default
        #: ``(method, path)`` of paths without parameters (``/sync``, ...) ->
        #: their route: most requests skip the scan.
        self._fixed: dict[tuple[str, str], Route] = {}
        #: Per method (as requests name them), every route's pattern in one regex.
        self._combined: dict[str, _Combined] = {}

    @classmethod
    def build(cls, config: HomeServerConfig) -> RoutingTable:
        """The table for ``config`` (:class:`RoutingError` if it has none)."""
        if config.http_address(MAIN_PROCESS, "client") is None:
            raise RoutingError(
                "the main process has no listener with the 'client' resource: requests no"
                " other process serves go there"
            )
        resolver = _Resolver(config)
        routes: list[Route] = []
        grouped: dict[tuple[str, str, ServedBy], list[str]] = {}
        for method, pattern, servlet in client_servlets():
            declared = served_by(servlet, method)
            if declared is None or declared == MAIN:
                continue  # the default; a media servlet falls to the media prefixes
            grouped.setdefault((servlet, pattern, declared), []).append(method)
        for (servlet, pattern, declared), methods in grouped.items():
            routes.append(resolver.route(servlet, tuple(methods), pattern, declared))
        for prefix in MEDIA_PATH_PREFIXES:
            routes.append(resolver.route(None, (), re.escape(prefix), MEDIA, prefix=True))
        for prefix in FEDERATION_PATH_PREFIXES:
            routes.append(
                resolver.route(None, (), re.escape(prefix), FEDERATION_READERS, prefix=True)
            )
        default = resolver.route(None, (), "", MAIN, prefix=True)
        return cls(config, routes, default)

    def match(self, method: str, path: str) -> tuple[Route, PathMatch | None]:
        """The route of a request and its path's parameters (None for the
        default, and for a path without parameters)."""
        fixed = self._fixed.get((method, path))
        if fixed is not None:
            return fixed, None
        combined = self._combined.get(method)
        if combined is None:
            combined = self._combined[method] = _Combined(self.routes, method)
        found = combined.alternation.match(path)
        if found is None:
            return self.default, None
        position, match = found
        route, has_parameters = combined.routes[position]
        if not has_parameters:
            if len(self._fixed) < MAX_FIXED_PATHS:
                self._fixed[(method, path)] = route
            return route, None
        return route, PathMatch(match, group_prefix(position))

    def instances(self) -> list[str]:
        """Every process some route may send to, main first."""
        seen: dict[str, None] = {}
        for route in [self.default, *self.routes]:
            seen.update(dict.fromkeys(route.instances))
        return list(seen)

    def to_json(self) -> dict[str, Any]:
        config = self.config
        instances: dict[str, Any] = {}
        for name in self.instances():
            address = relay_address(config, name)
            health = config.http_address(name, "health")
            assert address is not None
            instances[name] = {
                "address": address.base_url,
                "health": None if health is None else health.base_url + "/health",
            }
        return {
            "server_name": config.server_name,
            "instances": instances,
            "routes": [route.to_json() for route in self.routes],
            "default": self.default.to_json(),
            "never_routed": list(INTERNAL_PATH_PREFIXES),
        }


class _Resolver:
    """Turns a declaration into the instances that serve it for one config."""

    def __init__(self, config: HomeServerConfig) -> None:
        self._config = config

    def route(
        self,
        servlet: str | None,
        methods: tuple[str, ...],
        pattern: str,
        declared: ServedBy,
        prefix: bool = False,
    ) -> Route:
        instances, balance = self._instances(declared, servlet, pattern)
        regex = re.compile(pattern)
        if balance == BALANCE_ROOM and "room_id" not in regex.groupindex:
            raise RoutingError(f"servlet {servlet!r} goes to a room's writer but has no room_id")
        return Route(servlet, methods, pattern, declared, instances, balance, prefix, regex)

    def _instances(
        self, declared: ServedBy, servlet: str | None, pattern: str
    ) -> tuple[tuple[str, ...], str]:
        config = self._config
        main = (MAIN_PROCESS,)
        if declared.role == READERS_ROLE:
            # Workers that write no stream (every process writes caches) and
            # are not the media worker, whose CPU and memory go to media.
            readers = _with_client_api(
                config,
                [
                    n
                    for n in config.workers
                    if config.writers.streams_written_by(n) == ["caches"]
                    and n != config.media_instance
                ],
            )
            return (readers, BALANCE_USER) if readers else (main, BALANCE_SINGLE)
        if declared.role == ROOM_EVENTS_WRITER_ROLE:
            writers = _with_client_api(config, config.writers.writers("events"))
            # Rooms of a writer without a client listener go to main (which forwards).
            if writers and writers != main:
                return writers, BALANCE_ROOM
            return main, BALANCE_SINGLE
        if declared.role == STREAM_WRITER_ROLE:
            assert declared.stream is not None
            if declared.stream not in config.streams:
                raise RoutingError(
                    f"servlet {servlet!r} is declared to go to the writer of stream"
                    f" {declared.stream!r}, which is not a stream of the catalog"
                )
            writers = config.writers.writers(declared.stream)
            served = _with_client_api(config, writers[:1])
            return (served or main), BALANCE_SINGLE
        if declared.role == FEDERATION_READERS_ROLE:
            # /_matrix/key needs the keys resource where requests are relayed.
            resource = "keys" if pattern.startswith(re.escape("/_matrix/key/")) else "federation"
            readers = tuple(
                n for n in config.federation_readers() if _relay_serves(config, n, resource)
            )
            return (readers, BALANCE_ORIGIN) if readers else (main, BALANCE_SINGLE)
        if declared.role == MEDIA.role:
            return (_with_client_api(config, [config.media_instance]) or main), BALANCE_SINGLE
        return main, BALANCE_SINGLE
