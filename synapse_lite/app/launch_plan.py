"""Which OS processes a config declares, how to start each, and in what order.

Tiers give the dependency order: the main process first (it creates or
upgrades the schema, which workers refuse to run without, and is the TCP
replication hub), then stream writers (others forward writes to them), then
the rest, then the router (clients reach the others through it, so it opens
the client port last and closes it first). Stopping goes the other way round.
"""

from __future__ import annotations

import hashlib
import sys

import attr

from synapse_lite.app.role import Role
from synapse_lite.config.homeserver import (
    MAIN_PROCESS,
    ROUTER_PROCESS,
    HomeServerConfig,
    InstanceLocation,
    ListenerConfig,
)
from synapse_lite.config.media import MediaConfig
from synapse_lite.config.validation import ConfigError, ConfigProblem
from synapse_lite.streams.catalog import BUILTIN_STREAMS
from synapse_lite.streams.definition import Reader

TIER_MAIN, TIER_WRITERS, TIER_OTHERS, TIER_ROUTER = 0, 1, 2, 3


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ProcessSpec:
    """One process to run. Two specs that compare equal describe the same role:
    a reload restarts only processes whose spec changed."""

    name: str
    tier: int
    argv: tuple[str, ...]
    listeners: tuple[ListenerConfig, ...]
    #: The streams it writes (its role in replication).
    streams: tuple[str, ...]
    #: Where the others send it internal requests, if anywhere.
    location: InstanceLocation | None
    #: The media settings, on the media instance (a change restarts it alone).
    media: MediaConfig | None = None
    #: The streams it receives over replication (its role's subscription;
    #: None: every stream). Changed by a reload, the process restarts and
    #: subscribes anew.
    reads: tuple[str, ...] | None = None
    #: What else its role depends on (the router: every process's listeners
    #: and the stream writers, which make its routes); a change restarts it.
    depends_on: str = ""
    #: On a federation sender, every sender (which destinations it owns
    #: depends on them all): adding or removing a sender restarts the
    #: senders, and only them.
    federation_senders: tuple[str, ...] = ()

    @property
    def health_url(self) -> str:
        return self.url_of("health") + "/health"

    @property
    def metrics_url(self) -> str | None:
        base = self._base_url("metrics")
        return None if base is None else base + "/metrics"

    def url_of(self, resource: str) -> str:
        base = self._base_url(resource)
        if base is None:
            raise KeyError(f"{self.name} has no listener with the {resource!r} resource")
        return base

    def _base_url(self, resource: str) -> str | None:
        for listener in self.listeners:
            if resource in listener.resources:
                host = listener.bind_address
                if host in ("0.0.0.0", "::", ""):
                    host = "127.0.0.1"
                if ":" in host:
                    host = f"[{host}]"
                return f"http://{host}:{listener.port}"
        return None

    @property
    def role(self) -> str:
        """What it does, in a few words."""
        if self.name == ROUTER_PROCESS:
            return "router (the client port)"
        roles = ["main process"] if self.name == MAIN_PROCESS else []
        if "events" in self.streams:
            roles.append("events writer")
        single_keys = BUILTIN_STREAMS.single_writer_keys()
        singles = [s for s in self.streams if s in single_keys]
        if singles and self.name != MAIN_PROCESS:  # the main process's by default
            roles.append("writes " + ", ".join(singles))
        if self.media is not None and self.name != MAIN_PROCESS:
            roles.append("media repository")
        if self.federation_senders and self.name != MAIN_PROCESS:
            roles.append("federation sender")
        if self.name != MAIN_PROCESS and any(
            "federation" in listener.resources for listener in self.listeners
        ):
            roles.append("federation reader")
        if not roles:
            roles.append("client API" if self._base_url("client") else "worker")
        return "; ".join(roles)

    def describe(self) -> str:
        """One line: name, role, where it listens."""
        listening = ", ".join(
            f"{listener.bind_address}:{listener.port} ({', '.join(listener.resources)})"
            for listener in self.listeners
        )
        return f"{self.name:<16} {self.role:<24} {listening}"


def plan_processes(config: HomeServerConfig, for_running: bool = True) -> list[ProcessSpec]:
    """Every process of ``config`` in start order. ``for_running`` checks what
    ``synapse-lite run`` needs beyond a valid config (:class:`ConfigError`): a
    ``health`` resource on a fixed port for every process."""
    config_path = config.config_files[0]
    problems: list[ConfigProblem] = []
    specs = []
    for name in config.instance_names():
        listeners = config.listeners_of(name)
        key = "listeners" if name == MAIN_PROCESS else f"workers.{name}.listeners"
        health = [listener for listener in listeners if "health" in listener.resources]
        if not health:
            problems.append(
                ConfigProblem(
                    config_path,
                    key,
                    f"{name} has no listener with the 'health' resource: synapse-lite run"
                    " checks /health to know the process is up",
                )
            )
        elif health[0].port == 0:
            problems.append(
                ConfigProblem(
                    config_path,
                    key,
                    f"{name} serves /health on port 0 (any free port): synapse-lite run needs"
                    " to know the port",
                )
            )
        streams = tuple(config.writers.streams_written_by(name))
        argv: tuple[str, ...]
        if name == MAIN_PROCESS:
            tier = TIER_MAIN
            argv = ("-m", "synapse_lite.app.homeserver", "-c", config_path)
        else:
            tier = TIER_WRITERS if streams != ("caches",) else TIER_OTHERS
            argv = ("-m", "synapse_lite.app.generic_worker", "-c", config_path)
            argv += ("--worker-name", name)
        specs.append(
            ProcessSpec(
                name=name,
                tier=tier,
                argv=(sys.executable, *argv),
                listeners=listeners,
                streams=streams,
                location=config.instance_map.get(name),
                media=config.media if name == config.media_instance else None,
                reads=Role.of(config, name).subscription(config.streams),
                federation_senders=(
                    tuple(sorted(config.federation_sender_instances))
                    if name in config.federation_sender_instances
                    else ()
                ),
            )
        )
    if config.router is not None:
        specs.append(_router_spec(config, config_path, problems))
    if problems and for_running:
        raise ConfigError(problems)
    return sorted(specs, key=lambda s: s.tier)


#: Listener resources the router never relays requests to.
_NOT_RELAYED = frozenset({"health", "metrics", "replication"})


def _router_spec(
    config: HomeServerConfig, config_path: str, problems: list[ConfigProblem]
) -> ProcessSpec:
    assert config.router is not None
    listeners = config.router.listeners
    if not any("health" in listener.resources and listener.port for listener in listeners):
        problems.append(
            ConfigProblem(
                config_path,
                "router.listeners",
                "the router has no listener with the 'health' resource on a fixed port:"
                " synapse-lite run checks /health to know it is up",
            )
        )
    # Its routes come from the listeners of the processes it relays to and the
    # stream writers. A process it never relays to (a federation sender with
    # only a health listener) is not among them: adding one with a reload
    # does not restart the router (and drop its clients' connections).
    routing = repr(
        (
            [
                (name, config.listeners_of(name))
                for name in config.instance_names()
                if any(
                    set(listener.resources) - _NOT_RELAYED for listener in config.listeners_of(name)
                )
            ],
            sorted(config.stream_writers.by_key.items()),
            getattr(config, "media_instance", MAIN_PROCESS),
            config.internal_tls,
        )
    )
    return ProcessSpec(
        name=ROUTER_PROCESS,
        tier=TIER_ROUTER,
        argv=(sys.executable, "-m", "synapse_lite.app.router", "-c", config_path),
        listeners=listeners,
        streams=(),
        location=None,
        depends_on=hashlib.sha256(routing.encode("utf-8")).hexdigest(),
        reads=tuple(config.streams.read_by([Reader.ROUTER])),
    )


def settings_shared_by_all(config: HomeServerConfig) -> tuple[object, ...]:
    """The settings every process depends on. When one of them changes, a
    reload restarts every process; other changes restart only the processes
    whose :class:`ProcessSpec` changed."""
    writers = config.stream_writers
    return (
        config.server_name,
        config.data_dir,
        config.database,
        config.replication,
        config.worker_replication_secret,
        config.registration_shared_secret,
        config.enable_registration,
        tuple(sorted((key, w) for key, w in writers.by_key.items() if key != "events")),
        # Whether the main process sends itself or feeds sender workers; which
        # workers send is in their specs (a change restarts only them).
        MAIN_PROCESS in config.federation_sender_instances,
        # Every process answers media paths by it (served, or refused naming it).
        config.media_instance,
        config.pusher_instances,
        # Which process sends to which service, and the services themselves
        # (a changed registration file is picked up by `reload`).
        config.appservice_instances,
        config.app_services,
        config.rate_limits,
        config.limits,
        config.log_level,
        config.position_log,
    )


def only_these(specs: list[ProcessSpec], only: tuple[str, ...] | None) -> list[ProcessSpec]:
    """The specs of the processes named in ``only`` (all when None): the
    processes of one machine when a homeserver spans several."""
    if only is None:
        return specs
    known = {spec.name for spec in specs}
    unknown = [name for name in only if name not in known]
    if unknown:
        raise ValueError(
            f"--only names {', '.join(unknown)}, not a process of this config"
            f" (its processes: {', '.join(sorted(known))})"
        )
    return [spec for spec in specs if spec.name in only]
