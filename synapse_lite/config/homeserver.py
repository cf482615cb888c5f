"""The homeserver config: one YAML for the main process and all its workers.

Every value is validated here, at load, into frozen attrs classes; the rest of
the code trusts them. ``docs/configuration.md`` describes each setting.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from typing import Any

import attr

from synapse_lite.appservice.registration import ApplicationServices
from synapse_lite.config.appservices import read_app_services
from synapse_lite.config.federation import FederationConfig
from synapse_lite.config.media import MediaConfig
from synapse_lite.config.outbound import OutboundRequestsConfig
from synapse_lite.config.validation import (
    REQUIRED,
    ConfigError,
    ConfigProblem,
    Section,
    load_yaml_file,
)
from synapse_lite.streams.catalog import BUILTIN_STREAMS
from synapse_lite.streams.definition import StreamCatalog
from synapse_lite.streams.writers import WritersDirectory

#: The instance name of the main process.
MAIN_PROCESS = "main"

#: The name of the router process (``router``), reserved for it.
ROUTER_PROCESS = "router"

#: Resources an HTTP listener can serve.
LISTENER_RESOURCES = ("client", "federation", "keys", "replication", "health", "metrics")
#: Resources a listener of the router can serve (``client``: every request,
#: each relayed to the process that serves it; ``federation``: the federation
#: front door, ``/_matrix/federation``, ``/_matrix/key`` and ``/.well-known``).
ROUTER_RESOURCES = ("client", "federation", "health", "metrics")
#: Bind addresses meaning "every address of this machine".
WILDCARD_ADDRESSES = ("0.0.0.0", "::", "")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class TlsFiles:
    """A certificate and its private key (PEM files) a listener serves TLS with."""

    certificate_path: str
    private_key_path: str

    @classmethod
    def read(cls, section: Section, base_dir: str) -> TlsFiles | None:
        """``tls_certificate_path`` and ``tls_private_key_path`` of a section
        (both or neither), checked readable now rather than at first use."""
        certificate = section.get_optional_str("tls_certificate_path")
        key = section.get_optional_str("tls_private_key_path")
        if certificate is None and key is None:
            return None
        if certificate is None or key is None:
            missing = "tls_certificate_path" if certificate is None else "tls_private_key_path"
            section.problem("is required with the other tls_ setting", missing)
            return None
        paths = []
        for name, value in (("tls_certificate_path", certificate), ("tls_private_key_path", key)):
            path = os.path.join(base_dir, value)
            if not os.access(path, os.R_OK):
                section.problem(f"cannot read {path}", name)
            paths.append(path)
        return cls(paths[0], paths[1])


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ListenerConfig:
    """An HTTP listener of one process."""

    port: int
    bind_address: str
    resources: tuple[str, ...]
    #: Serve HTTPS with these (None: plain HTTP).
    tls: TlsFiles | None = None

    @classmethod
    def read(
        cls,
        section: Section,
        base_dir: str = "",
        allowed: tuple[str, ...] = LISTENER_RESOURCES,
        default_resources: tuple[str, ...] = ("client", "health"),
    ) -> ListenerConfig:
        port = section.get_int("port", minimum=0, maximum=65535)
        bind_address = section.get_str("bind_address", "127.0.0.1")
        resources = section.get_str_list("resources", list(default_resources))
        for i, name in enumerate(resources):
            if name not in allowed:
                section.problem(
                    f"unknown resource {name!r}; known: {', '.join(allowed)}",
                    f"resources[{i}]",
                )
        tls = TlsFiles.read(section, base_dir)
        section.finish()
        return cls(port=port, bind_address=bind_address, resources=tuple(resources), tls=tls)

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"


@attr.s(slots=True, frozen=True, auto_attribs=True)
class DatabaseConfig:
    """Which database, and how to reach it."""

    engine: str
    args: dict[str, Any] = attr.ib(hash=False)
    min_connections: int = 1
    max_connections: int = 5

    @classmethod
    def read(cls, section: Section, data_dir: str) -> DatabaseConfig:
        engine = section.get_str("engine", "sqlite", choices=("sqlite", "postgres"))
        args_section = section.get_section("args")
        args: dict[str, Any] = {}
        if engine == "sqlite":
            path = args_section.get_str("path", "homeserver.db")
            args["path"] = os.path.join(data_dir, path)
            args["busy_timeout_ms"] = args_section.get_int("busy_timeout_ms", 30_000, minimum=0)
        else:
            args["host"] = args_section.get_str("host", "127.0.0.1")
            args["port"] = args_section.get_int("port", 5432, minimum=1, maximum=65535)
            args["user"] = args_section.get_str("user", "postgres")
            password = args_section.get_optional_str("password")
            if password is not None:
                args["password"] = password
            args["dbname"] = args_section.get_str("dbname", "synapse_lite")
            options = args_section.get_optional_str("options")
            if options is not None:
                args["options"] = options
        args_section.finish()
        min_connections = section.get_int("min_connections", 1, minimum=1)
        max_connections = section.get_int("max_connections", 5, minimum=1)
        if max_connections < min_connections:
            section.problem("must not be below min_connections", "max_connections")
        section.finish()
        return cls(engine, args, min_connections, max_connections)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RedisConfig:
    """Where the Redis replication bus is."""

    host: str = "127.0.0.1"
    port: int = 6379
    password: str | None = None
    dbid: int = 0
    #: Prepended to the server name to make the channel: pub/sub channels are
    #: shared by every database of a Redis server.
    channel_prefix: str = ""

    @classmethod
    def read(cls, section: Section) -> RedisConfig:
        result = cls(
            host=section.get_str("host", "127.0.0.1"),
            port=section.get_int("port", 6379, minimum=1, maximum=65535),
            password=section.get_optional_str("password"),
            dbid=section.get_int("dbid", 0, minimum=0),
            channel_prefix=section.get_str("channel_prefix", ""),
        )
        section.finish()
        return result


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ReplicationConfig:
    """How processes replicate: direct TCP to the main process, or Redis."""

    transport: str
    #: Where the main process listens for TCP replication.
    tcp_host: str
    tcp_port: int
    redis: RedisConfig
    #: The main process's replication listener serves TLS with these; workers
    #: then connect with TLS, verifying it against ``internal_tls.ca_path``.
    tcp_tls: TlsFiles | None = None

    @classmethod
    def read(cls, section: Section, base_dir: str = "") -> ReplicationConfig:
        transport = section.get_str("transport", "tcp", choices=("tcp", "redis"))
        tcp = section.get_section("tcp")
        tcp_host = tcp.get_str("host", "127.0.0.1")
        tcp_port = tcp.get_int("port", 9093, minimum=0, maximum=65535)
        tcp_tls = TlsFiles.read(tcp, base_dir)
        tcp.finish()
        redis = RedisConfig.read(section.get_section("redis"))
        section.finish()
        return cls(transport, tcp_host, tcp_port, redis, tcp_tls)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class InternalTlsConfig:
    """How processes check each other's certificates when replication or
    internal HTTP uses TLS (``internal_tls``)."""

    #: PEM file of the CA that signed the processes' certificates.
    ca_path: str | None = None

    @classmethod
    def read(cls, section: Section, base_dir: str) -> InternalTlsConfig:
        ca = section.get_optional_str("ca_path")
        path = None
        if ca is not None:
            path = os.path.join(base_dir, ca)
            if not os.access(path, os.R_OK):
                section.problem(f"cannot read {path}", "ca_path")
        section.finish()
        return cls(path)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RouterConfig:
    """The router: one client port that relays each request to the process
    serving it (``docs/routing.md``)."""

    listeners: tuple[ListenerConfig, ...]

    @classmethod
    def read(cls, section: Section, base_dir: str) -> RouterConfig | None:
        if not section.data:
            section.finish()
            return None
        listeners = tuple(
            ListenerConfig.read(s, base_dir, ROUTER_RESOURCES, ("client", "health"))
            for s in section.get_list_of_sections("listeners")
        )
        if section.data.get("listeners") is not None and not any(
            "client" in listener.resources for listener in listeners
        ):
            section.problem("needs a listener with the 'client' resource", "listeners")
        section.finish()
        return cls(listeners)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class InstanceLocation:
    """Where a process answers internal HTTP requests."""

    host: str
    port: int
    #: It answers with TLS (checked against ``internal_tls.ca_path``).
    tls: bool = False

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"


@attr.s(slots=True, frozen=True, auto_attribs=True)
class WorkerConfig:
    """One worker process declared in the config."""

    name: str
    listeners: tuple[ListenerConfig, ...]

    @classmethod
    def read(cls, name: str, section: Section, base_dir: str = "") -> WorkerConfig:
        listeners = tuple(
            ListenerConfig.read(s, base_dir) for s in section.get_list_of_sections("listeners", [])
        )
        section.finish()
        return cls(name, listeners)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class StreamWriters:
    """Which processes write which streams: ``stream_writers`` entries, one per
    writer key of the stream catalog (``synapse_lite/streams/catalog.py``);
    an entry not given is the main process."""

    by_key: dict[str, tuple[str, ...]] = attr.ib(factory=dict, hash=False)

    @classmethod
    def read(cls, section: Section, streams: StreamCatalog) -> StreamWriters:
        by_key: dict[str, tuple[str, ...]] = {}
        for key, several in streams.writer_keys().items():
            value = section.get_str_list(key, [MAIN_PROCESS], allow_single=True)
            if not value:
                section.problem("needs at least one writer", key)
                value = [MAIN_PROCESS]
            if len(set(value)) != len(value):
                section.problem("lists a writer twice", key)
            if not several and len(value) != 1:
                section.problem(f"takes exactly one writer, not {len(value)}", key)
                value = value[:1]
            by_key[key] = tuple(value)
        section.finish()
        return cls(by_key)

    def writers_of(self, key: str) -> tuple[str, ...]:
        """The writers configured for a ``stream_writers`` key (the main
        process when the key was not given)."""
        return self.by_key.get(key, (MAIN_PROCESS,))

    def directory(self, streams: StreamCatalog) -> WritersDirectory:
        """Who writes each stream, by stream name (``streams/writers.py``)."""
        return WritersDirectory(streams, self.by_key, MAIN_PROCESS)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RateLimitConfig:
    """A token bucket: ``per_second`` sustained, ``burst`` at once."""

    per_second: float
    burst: int

    @classmethod
    def read(cls, section: Section, per_second: float, burst: int) -> RateLimitConfig:
        result = cls(
            per_second=section.get_float("per_second", per_second, minimum=0.0),
            burst=section.get_int("burst", burst, minimum=1),
        )
        section.finish()
        return result


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RateLimitsConfig:
    """Per-user (or per-IP, before login) request limits."""

    enabled: bool
    messages: RateLimitConfig
    login: RateLimitConfig
    registration: RateLimitConfig

    @classmethod
    def read(cls, section: Section) -> RateLimitsConfig:
        result = cls(
            enabled=section.get_bool("enabled", True),
            messages=RateLimitConfig.read(section.get_section("messages"), 50.0, 200),
            login=RateLimitConfig.read(section.get_section("login"), 5.0, 20),
            registration=RateLimitConfig.read(section.get_section("registration"), 5.0, 20),
        )
        section.finish()
        return result


@attr.s(slots=True, frozen=True, auto_attribs=True)
class LimitsConfig:
    """Bounds on what one request or connection may cost."""

    max_request_body_bytes: int
    max_concurrent_syncs_per_user: int
    max_sync_timeout_ms: int

    @classmethod
    def read(cls, section: Section) -> LimitsConfig:
        result = cls(
            max_request_body_bytes=section.get_int(
                "max_request_body_bytes", 1_048_576, minimum=1024
            ),
            max_concurrent_syncs_per_user=section.get_int(
                "max_concurrent_syncs_per_user", 10, minimum=1
            ),
            max_sync_timeout_ms=section.get_int("max_sync_timeout_ms", 60_000, minimum=0),
        )
        section.finish()
        return result


@attr.s(slots=True, frozen=True, auto_attribs=True)
class CachesConfig:
    """How much each process keeps in memory: the bound on its resident size."""

    event_cache_entries: int

    @classmethod
    def read(cls, section: Section) -> CachesConfig:
        result = cls(
            event_cache_entries=section.get_int("event_cache_entries", 10_000, minimum=100),
        )
        section.finish()
        return result


@attr.s(slots=True, frozen=True, auto_attribs=True)
class TurnConfig:
    """The TURN servers handed to clients for VoIP (``GET /voip/turnServer``):
    time-limited credentials signed with the secret shared with the TURN
    server (coturn's ``use-auth-secret``)."""

    uris: tuple[str, ...] = ()
    shared_secret: str | None = None
    user_lifetime_ms: int = 86_400_000

    @classmethod
    def read(cls, section: Section) -> TurnConfig:
        uris = section.get_str_list("uris", [])
        result = cls(
            uris=tuple(uris or ()),
            shared_secret=section.get_optional_str("shared_secret"),
            user_lifetime_ms=section.get_int("user_lifetime_ms", 86_400_000, minimum=1000),
        )
        if result.uris and result.shared_secret is None:
            section.problem("is required when 'uris' is set", "shared_secret")
        section.finish()
        return result


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ServerNoticesConfig:
    """Server notices (``POST /_synapse/admin/v1/send_server_notice``): sent
    by a system user, in a room of its own with each user it writes to.
    Off without ``system_mxid_localpart``."""

    system_mxid_localpart: str | None = None
    system_mxid_display_name: str | None = None
    room_name: str = "Server Notices"

    @classmethod
    def read(cls, section: Section) -> ServerNoticesConfig:
        localpart = section.get_optional_str("system_mxid_localpart")
        if localpart is not None and (
            not localpart or any(c not in _LOCALPART_CHARACTERS for c in localpart)
        ):
            section.problem(
                "must be a user name of a-z, 0-9 and . _ = - / +", "system_mxid_localpart"
            )
        result = cls(
            system_mxid_localpart=localpart,
            system_mxid_display_name=section.get_optional_str("system_mxid_display_name"),
            room_name=section.get_str("room_name", "Server Notices"),
        )
        section.finish()
        return result


_LOCALPART_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789._=-/+")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ExperimentalFeaturesConfig:
    """Unstable Matrix proposals, each off unless switched on."""

    #: MSC2228: an event whose content names ``org.matrix.self_destruct_after``
    #: (a time in ms since the epoch) has its content pruned then.
    msc2228_self_destructing_events: bool = False

    @classmethod
    def read(cls, section: Section) -> ExperimentalFeaturesConfig:
        result = cls(
            msc2228_self_destructing_events=section.get_bool(
                "msc2228_self_destructing_events", False
            ),
        )
        section.finish()
        return result


@attr.s(slots=True, frozen=True, auto_attribs=True)
class HomeServerConfig:
    """Everything a process of this homeserver needs to know."""

    config_files: tuple[str, ...]
    server_name: str
    data_dir: str
    database: DatabaseConfig
    replication: ReplicationConfig
    worker_replication_secret: str | None
    registration_shared_secret: str | None
    enable_registration: bool
    #: Registration needs a registration token (the admin API issues them).
    registration_requires_token: bool
    listeners: tuple[ListenerConfig, ...]
    workers: dict[str, WorkerConfig] = attr.ib(hash=False)
    instance_map: dict[str, InstanceLocation] = attr.ib(hash=False)
    stream_writers: StreamWriters
    #: The processes sending to other servers (``federation_sender_instances``;
    #: the older ``federation_sender`` names one): each destination is sent
    #: to by exactly one of them (``federation/senders.py``). Either the main
    #: process alone or workers only.
    federation_sender_instances: tuple[str, ...]
    federation: FederationConfig
    rate_limits: RateLimitsConfig
    limits: LimitsConfig
    caches: CachesConfig
    log_level: str
    position_log: bool
    #: The process serving the media repository (``/_matrix/media``,
    #: ``/_matrix/client/v1/media``); every other process refuses those paths.
    media_instance: str
    media: MediaConfig
    #: The processes delivering notifications to push gateways; each pusher
    #: is owned by exactly one (a stable hash of it).
    pusher_instances: tuple[str, ...] = (MAIN_PROCESS,)
    #: The processes sending to application services; each service is sent
    #: to by exactly one (a stable hash of its id: ``appservice/sender.py``).
    appservice_instances: tuple[str, ...] = (MAIN_PROCESS,)
    #: The streams this deployment runs (their definitions).
    streams: StreamCatalog = attr.ib(default=BUILTIN_STREAMS, hash=False)
    #: Who writes each of them (built from ``stream_writers`` and ``streams``).
    writers: WritersDirectory = attr.ib(
        default=attr.Factory(
            lambda self: self.stream_writers.directory(self.streams), takes_self=True
        ),
        hash=False,
        init=False,
    )
    #: The router in front of the processes, if there is one.
    router: RouterConfig | None = None
    internal_tls: InternalTlsConfig = attr.ib(factory=InternalTlsConfig)
    turn: TurnConfig = attr.ib(factory=TurnConfig)
    server_notices: ServerNoticesConfig = attr.ib(factory=ServerNoticesConfig)
    #: Whether guest accounts may be registered and used (docs/client-api.md#guests).
    allow_guest_access: bool = False
    experimental: ExperimentalFeaturesConfig = attr.ib(factory=ExperimentalFeaturesConfig)
    outbound_requests: OutboundRequestsConfig = attr.ib(factory=OutboundRequestsConfig)
    #: The application services registered (``app_service_config_files``).
    app_services: ApplicationServices = attr.ib(factory=ApplicationServices, hash=False)

    def instance_names(self) -> list[str]:
        """The main process, then every worker in config order."""
        return [MAIN_PROCESS, *self.workers]

    def federation_readers(self) -> tuple[str, ...]:
        """The workers serving the federation API (a listener with the
        ``federation`` resource), in config order: the router sends
        ``/_matrix/federation`` and ``/_matrix/key`` to them."""
        return tuple(
            name
            for name, worker in self.workers.items()
            if any("federation" in listener.resources for listener in worker.listeners)
        )

    def listeners_of(self, instance_name: str) -> tuple[ListenerConfig, ...]:
        if instance_name == MAIN_PROCESS:
            return self.listeners
        return self.workers[instance_name].listeners

    def http_address(self, instance_name: str, resource: str) -> InstanceLocation | None:
        """Where another process (the router, say) reaches ``instance_name``'s
        first listener serving ``resource``; None if it has none. A listener
        bound to every address is reached at the host ``instance_map`` gives
        for the process (loopback when it gives none)."""
        listeners = (
            self.router.listeners
            if instance_name == ROUTER_PROCESS and self.router is not None
            else self.listeners_of(instance_name)
        )
        for listener in listeners:
            if resource in listener.resources:
                host = listener.bind_address
                if host in WILDCARD_ADDRESSES:
                    known = self.instance_map.get(instance_name)
                    host = known.host if known is not None else "127.0.0.1"
                return InstanceLocation(host, listener.port, listener.tls is not None)
        return None

    def location_of(self, instance_name: str) -> InstanceLocation:
        """Where to send internal HTTP requests for ``instance_name``."""
        try:
            return self.instance_map[instance_name]
        except KeyError:
            raise KeyError(
                f"{instance_name!r} has no listener with the 'replication' resource and no"
                " entry in instance_map"
            ) from None


def _federation_senders_key(root: Section) -> str:
    return (
        "federation_sender" if "federation_sender" in root.data else "federation_sender_instances"
    )


def _federation_senders(root: Section) -> tuple[str, ...]:
    """``federation_sender_instances`` (a list, or one name), or the older
    ``federation_sender`` (one name); not both. The main process sends with
    no worker, or not at all: its queue feeds sender workers."""
    if "federation_sender" in root.data:
        if "federation_sender_instances" in root.data:
            root.accept("federation_sender_instances")
            root.problem(
                "give federation_sender_instances or the older federation_sender, not both",
                "federation_sender",
            )
        return (root.get_str("federation_sender", MAIN_PROCESS),)
    instances = tuple(
        root.get_str_list("federation_sender_instances", [MAIN_PROCESS], allow_single=True)
    )
    if MAIN_PROCESS in instances and len(instances) > 1:
        root.problem(
            "the main process sends alone or not at all (it feeds the sender workers):"
            " list only workers, or only main",
            "federation_sender_instances",
        )
    return instances


def _derive_instance_map(
    explicit: dict[str, InstanceLocation],
    listeners_by_instance: dict[str, Sequence[ListenerConfig]],
) -> dict[str, InstanceLocation]:
    result = dict(explicit)
    for name, listeners in listeners_by_instance.items():
        if name in result:
            continue
        for listener in listeners:
            if "replication" in listener.resources:
                host = listener.bind_address
                if host in WILDCARD_ADDRESSES:
                    host = "127.0.0.1"
                result[name] = InstanceLocation(host, listener.port, listener.tls is not None)
                break
    return result


def _read_workers(section: Section, base_dir: str) -> dict[str, WorkerConfig]:
    workers: dict[str, WorkerConfig] = {}
    for name in section.keys():
        value = section.data[name]
        if not isinstance(name, str) or not name.replace("_", "").replace("-", "").isalnum():
            section.problem("worker names may use letters, digits, '-' and '_' only", str(name))
            continue
        if name == MAIN_PROCESS:
            section.problem(f"{MAIN_PROCESS!r} is the main process and cannot be a worker", name)
            continue
        if name == ROUTER_PROCESS:
            section.problem(f"{ROUTER_PROCESS!r} is the name of the router process", name)
            continue
        if (
            isinstance(value, dict)
            and set(value) == {"config_file"}
            and isinstance(value["config_file"], str)
        ):
            path = os.path.join(base_dir, value["config_file"])
            try:
                data = load_yaml_file(path)
            except ConfigError as e:
                section.problems.extend(e.problems)
                continue
            worker_section = Section(data, path, "", section.problems)
            if worker_section.get_str("worker_name", name) != name:
                worker_section.problem(
                    f"does not match the name {name!r} it is declared with", "worker_name"
                )
            worker_dir = os.path.dirname(os.path.abspath(path))
            listeners = tuple(
                ListenerConfig.read(s, worker_dir)
                for s in worker_section.get_list_of_sections("worker_listeners", [])
            )
            worker_section.finish()
            workers[name] = WorkerConfig(name, listeners)
        else:
            workers[name] = WorkerConfig.read(
                name,
                Section(value, section.file, section.key_path(name), section.problems),
                base_dir,
            )
    return workers


def read_homeserver_config(
    data: dict[str, Any], path: str, streams: StreamCatalog = BUILTIN_STREAMS
) -> HomeServerConfig:
    """Validate a parsed config file; raise :class:`ConfigError` listing every
    problem. ``streams``: the stream catalog (tests add streams of their own)."""
    root = Section(data, path)
    base_dir = os.path.dirname(os.path.abspath(path))

    known_problems = len(root.problems)
    server_name = root.get_str("server_name")
    if len(root.problems) == known_problems and (
        not server_name or any(c in server_name for c in " /@!#")
    ):
        root.problem("must be a host name, optionally with :port", "server_name")
    data_dir = os.path.join(base_dir, root.get_str("data_dir", "data"))
    database = DatabaseConfig.read(root.get_section("database"), data_dir)
    replication = ReplicationConfig.read(root.get_section("replication"), base_dir)
    secret = root.get_optional_str("worker_replication_secret")
    shared_secret = root.get_optional_str("registration_shared_secret")
    enable_registration = root.get_bool("enable_registration", False)
    registration_requires_token = root.get_bool("registration_requires_token", False)
    allow_guest_access = root.get_bool("allow_guest_access", False)
    listeners = tuple(
        ListenerConfig.read(s, base_dir) for s in root.get_list_of_sections("listeners", [])
    )
    workers = _read_workers(root.get_section("workers"), base_dir)
    router = RouterConfig.read(root.get_section("router"), base_dir)
    internal_tls = InternalTlsConfig.read(root.get_section("internal_tls"), base_dir)
    writers = StreamWriters.read(root.get_section("stream_writers"), streams)
    federation_sender_instances = _federation_senders(root)
    federation = FederationConfig.read(root.get_section("federation"), base_dir)
    rate_limits = RateLimitsConfig.read(root.get_section("rate_limiting"))
    limits = LimitsConfig.read(root.get_section("limits"))
    caches = CachesConfig.read(root.get_section("caches"))
    turn = TurnConfig.read(root.get_section("turn"))
    server_notices = ServerNoticesConfig.read(root.get_section("server_notices"))
    experimental = ExperimentalFeaturesConfig.read(root.get_section("experimental_features"))
    outbound_requests = OutboundRequestsConfig.read(root.get_section("outbound_requests"), base_dir)
    log_level = root.get_str("log_level", "INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    position_log = root.get_bool("position_log", False)
    media_instance = root.get_str("media_instance", MAIN_PROCESS)
    media = MediaConfig.read(root.get_section("media"), data_dir, base_dir)
    pusher_instances = tuple(
        root.get_str_list("pusher_instances", [MAIN_PROCESS], allow_single=True)
    )
    appservice_instances = tuple(
        root.get_str_list("appservice_instances", [MAIN_PROCESS], allow_single=True)
    )
    app_services = ApplicationServices()
    app_service_files = root.get_str_list("app_service_config_files", [])
    if app_service_files and isinstance(server_name, str) and server_name:
        try:
            app_services = read_app_services(app_service_files, base_dir, server_name)
        except ConfigError as e:
            root.problems.extend(e.problems)

    explicit_map: dict[str, InstanceLocation] = {}
    map_section = root.get_section("instance_map")
    for name in map_section.keys():
        entry = map_section.get_section(name)
        explicit_map[name] = InstanceLocation(
            entry.get_str("host", "127.0.0.1"),
            entry.get_int("port", minimum=1, maximum=65535),
            entry.get_bool("tls", False),
        )
        entry.finish()
    map_section.finish()
    root.finish()

    known = {MAIN_PROCESS, *workers}
    listeners_by_instance: dict[str, Sequence[ListenerConfig]] = {MAIN_PROCESS: listeners}
    listeners_by_instance.update({n: w.listeners for n, w in workers.items()})
    instance_map = _derive_instance_map(explicit_map, listeners_by_instance)

    for name in explicit_map:
        if name not in known:
            root.problem(
                f"{name!r} is not the main process or a declared worker", f"instance_map.{name}"
            )
    for stream_key, several in streams.writer_keys().items():
        for i, writer in enumerate(writers.writers_of(stream_key)):
            key = f"stream_writers.{stream_key}" + (f"[{i}]" if several else "")
            if writer not in known:
                root.problem(f"{writer!r} is not the main process or a declared worker", key)
            elif writer not in instance_map and (writer != MAIN_PROCESS or workers):
                root.problem(
                    f"writer {writer!r} has no listener with the 'replication' resource"
                    " (other processes send it requests there)",
                    key,
                )
    for key, instances in (
        (_federation_senders_key(root), federation_sender_instances),
        ("pusher_instances", pusher_instances),
        ("appservice_instances", appservice_instances),
    ):
        for name in instances:
            if name not in known:
                root.problem(f"{name!r} is not the main process or a declared worker", key)
        if len(set(instances)) != len(instances) or not instances:
            root.problem("must name one or more processes, each once", key)
    if media_instance not in known:
        root.problem(
            f"{media_instance!r} is not the main process or a declared worker", "media_instance"
        )
    elif "media_instance" in root.data and not any(
        "client" in listener.resources for listener in listeners_by_instance[media_instance]
    ):
        # Checked only when named: a config without media (no client
        # listener on main, as in some test rigs) stays valid.
        root.problem(
            f"{media_instance!r} has no listener with the 'client' resource, so media would be"
            " served nowhere: give it one, or name another process",
            "media_instance",
        )
    if workers and not secret:
        root.problem(
            "is required when workers are declared: it authenticates replication between"
            f" processes (for example: {secrets.token_urlsafe(24)!r})",
            "worker_replication_secret",
        )
    if workers and MAIN_PROCESS not in instance_map:
        root.problem(
            "the main process needs a listener with the 'replication' resource when workers"
            " are declared",
            "listeners",
        )
    if router is not None and not any("client" in lst.resources for lst in listeners):
        root.problem(
            "the main process needs a listener with the 'client' resource when there is a"
            " router: requests no other process serves go there",
            "listeners",
        )
    if router is not None and not secret:
        root.problem(
            "is required with a router: processes trust the client address the router"
            " passes on (X-Forwarded-For) only when it proves it knows this secret",
            "worker_replication_secret",
        )
    _check_internal_tls(
        root, internal_tls, replication, listeners_by_instance, explicit_map, router is not None
    )

    ports: dict[tuple[str, int], str] = {}

    def claim(port: int, bind: str, owner: str) -> None:
        if port == 0:
            return
        for (other_bind, other_port), other_owner in ports.items():
            same_host = bind == other_bind or "0.0.0.0" in (bind, other_bind)
            if other_port == port and same_host:
                root.problem(f"port {port} is used by both {other_owner} and {owner}", owner)
                return
        ports[(bind, port)] = owner

    if workers or replication.transport == "tcp":
        claim(replication.tcp_port, replication.tcp_host, "replication.tcp")
    for name, instance_listeners in listeners_by_instance.items():
        prefix = "listeners" if name == MAIN_PROCESS else f"workers.{name}.listeners"
        for i, listener in enumerate(instance_listeners):
            claim(listener.port, listener.bind_address, f"{prefix}[{i}]")
    if router is not None:
        for i, listener in enumerate(router.listeners):
            claim(listener.port, listener.bind_address, f"router.listeners[{i}]")

    if root.problems:
        raise ConfigError(root.problems)
    return HomeServerConfig(
        config_files=(os.path.abspath(path),),
        server_name=server_name,
        data_dir=data_dir,
        database=database,
        replication=replication,
        worker_replication_secret=secret,
        registration_shared_secret=shared_secret,
        enable_registration=enable_registration,
        registration_requires_token=registration_requires_token,
        listeners=listeners,
        workers=workers,
        instance_map=instance_map,
        stream_writers=writers,
        federation_sender_instances=federation_sender_instances,
        federation=federation,
        rate_limits=rate_limits,
        limits=limits,
        caches=caches,
        log_level=log_level,
        position_log=position_log,
        media_instance=media_instance,
        media=media,
        pusher_instances=pusher_instances,
        appservice_instances=appservice_instances,
        streams=streams,
        router=router,
        internal_tls=internal_tls,
        turn=turn,
        server_notices=server_notices,
        allow_guest_access=allow_guest_access,
        experimental=experimental,
        outbound_requests=outbound_requests,
        app_services=app_services,
    )


def _check_internal_tls(
    root: Section,
    internal_tls: InternalTlsConfig,
    replication: ReplicationConfig,
    listeners_by_instance: dict[str, Sequence[ListenerConfig]],
    explicit_map: dict[str, InstanceLocation],
    routed: bool,
) -> None:
    """Processes that talk to a TLS listener of another (replication, internal
    HTTP, the router relaying to a client listener) must be able to check its
    certificate: ``internal_tls.ca_path`` is then required. A TLS listener
    no other process calls (a monolith's client and federation port, served
    to the outside world with a public certificate) needs no such CA."""
    if internal_tls.ca_path is not None:
        return
    uses_tls = [
        f"{name}'s listener on port {listener.port}"
        for name, listeners in listeners_by_instance.items()
        for listener in _called_by_other_processes(listeners, routed)
        if listener.tls is not None
    ]
    if replication.tcp_tls is not None:
        uses_tls.append("replication.tcp")
    uses_tls += [f"instance_map.{name}" for name, loc in explicit_map.items() if loc.tls]
    if uses_tls:
        root.problem(
            f"is required when the processes use TLS between them ({', '.join(uses_tls)}):"
            " the CA that signed their certificates, so that each can check the others'",
            "internal_tls.ca_path",
        )


def _called_by_other_processes(
    listeners: Sequence[ListenerConfig], routed: bool
) -> list[ListenerConfig]:
    """The listeners of one process that the others call: those serving
    ``replication`` (internal HTTP), and with a router the first serving
    ``client`` and the first serving ``health`` (where it relays requests
    and checks health: :meth:`HomeServerConfig.http_address`)."""
    called = [listener for listener in listeners if "replication" in listener.resources]
    if routed:
        for resource in ("client", "health"):
            first = next((lst for lst in listeners if resource in lst.resources), None)
            if first is not None and first not in called:
                called.append(first)
    return called


def load_config(path: str) -> HomeServerConfig:
    """Load and validate a homeserver config file."""
    return read_homeserver_config(load_yaml_file(path), path)


def load_worker_file(config: HomeServerConfig, path: str) -> tuple[HomeServerConfig, str]:
    """Apply a worker file (``worker_name`` and ``worker_listeners``) to a config,
    for process managers that start each worker with ``-c homeserver.yaml -c worker.yaml``.

    Returns the updated config and the worker's name.
    """
    data = load_yaml_file(path)
    section = Section(data, path)
    name = section.get_str("worker_name")
    worker_dir = os.path.dirname(os.path.abspath(path))
    listeners = tuple(
        ListenerConfig.read(s, worker_dir)
        for s in section.get_list_of_sections("worker_listeners", [])
    )
    section.finish()
    if section.problems:
        raise ConfigError(section.problems)
    if name not in config.workers:
        raise ConfigError(
            [
                ConfigProblem(
                    path,
                    "worker_name",
                    f"{name!r} is not declared under 'workers' in {config.config_files[0]}",
                )
            ]
        )
    workers = dict(config.workers)
    if listeners:
        workers[name] = WorkerConfig(name, listeners)
    listeners_by_instance: dict[str, Sequence[ListenerConfig]] = {MAIN_PROCESS: config.listeners}
    listeners_by_instance.update({n: w.listeners for n, w in workers.items()})
    instance_map = _derive_instance_map(
        {k: v for k, v in config.instance_map.items() if k != name}, listeners_by_instance
    )
    return (
        attr.evolve(
            config,
            workers=workers,
            instance_map=instance_map,
            config_files=(*config.config_files, os.path.abspath(path)),
        ),
        name,
    )


__all__ = ["REQUIRED", "ConfigError", "HomeServerConfig", "load_config", "load_worker_file"]
