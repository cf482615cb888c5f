"""The ``synapse-lite run`` command: checks, then the launcher on the reactor."""

from __future__ import annotations

import errno
import logging
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from synapse_lite.app.launch_plan import ProcessSpec, only_these, plan_processes
from synapse_lite.app.pid_files import (
    LAUNCHER,
    pid_file_path,
    remove_pid_file,
    running_pid,
    write_pid_file,
)
from synapse_lite.config.homeserver import MAIN_PROCESS, HomeServerConfig, load_config
from synapse_lite.config.validation import ConfigError

if TYPE_CHECKING:
    from synapse_lite.app.launcher import Launcher

logger = logging.getLogger(__name__)

#: Exit codes: a config that cannot be used; a check before starting failed or
#: a process failed to start.
EXIT_CONFIG_ERROR = 2
EXIT_FAILED = 1


def preflight_problems(config: HomeServerConfig, specs: list[ProcessSpec]) -> list[str]:
    """What would stop the processes from starting that can be seen now: a
    launcher or process of this config already running, a port in use."""
    problems = []
    pid = running_pid(config.data_dir, LAUNCHER)
    if pid is not None:
        problems.append(
            f"synapse-lite run is already running for this config (pid {pid}); stop it with"
            " `synapse-lite stop`"
        )
    for spec in specs:
        pid = running_pid(config.data_dir, spec.name)
        if pid is not None:
            problems.append(f"{spec.name} is already running (pid {pid})")
    ports = [
        (listener.bind_address, listener.port, f"{spec.name}'s listener")
        for spec in specs
        for listener in spec.listeners
    ]
    runs_main = any(spec.name == MAIN_PROCESS for spec in specs)
    if config.replication.transport == "tcp" and len(config.instance_names()) > 1 and runs_main:
        ports.append((config.replication.tcp_host, config.replication.tcp_port, "replication.tcp"))
    for host, port, owner in ports:
        if port and _in_use(host, port):
            problems.append(f"port {port} ({owner} on {host}) is in use by another program")
    return problems


def _in_use(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            # Other failures (an address not on this machine, say) are the
            # process's to report when it starts.
            return e.errno == errno.EADDRINUSE
    return False


def run(
    config_path: str,
    out: TextIO | None = None,
    err: TextIO | None = None,
    start_timeout: float | None = None,
    only: tuple[str, ...] | None = None,
) -> int:
    """Run every process of the config (or those in ``only``) until stopped;
    the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        config = load_config(config_path)
        specs = only_these(plan_processes(config), only)
    except ConfigError as e:
        print(str(e), file=err)
        return EXIT_CONFIG_ERROR
    except ValueError as e:
        print(str(e), file=err)
        return EXIT_CONFIG_ERROR
    problems = preflight_problems(config, specs)
    if problems:
        print("Cannot start:\n" + "\n".join(f"  - {p}" for p in problems), file=err)
        return EXIT_FAILED

    from twisted.internet import defer, reactor

    from synapse_lite.app.launcher import START_TIMEOUT_SECONDS, Launcher
    from synapse_lite.app.logs import setup_logging

    setup_logging("launcher", config.log_level, out)
    # Twisted's own INFO lines (an HTTP client factory per /health poll) drown
    # the processes' output.
    logging.getLogger("twisted").setLevel(logging.WARNING)
    launcher = Launcher(config, specs, reactor, out, start_timeout or START_TIMEOUT_SECONDS)
    launcher.only = only
    pid_path = pid_file_path(config.data_dir, LAUNCHER)
    write_pid_file(pid_path)
    reactor.addSystemEventTrigger("before", "shutdown", launcher.stop_all)
    _reload_on_sighup(launcher, reactor)

    async def start() -> None:
        from synapse_lite.app.child_process import ProcessFailedToStart

        began = time.monotonic()
        launcher.busy = "still starting"
        try:
            await launcher.start(list(launcher.specs))
        except ProcessFailedToStart as e:
            if not launcher.stopping:
                logger.error("%s", e.report())
                logger.error("Stopping the processes already started")
                launcher.exit_code = EXIT_FAILED
                reactor.stop()
            return
        finally:
            launcher.busy = None
        for line in launcher.summary(time.monotonic() - began):
            launcher.write_line(line)

    reactor.callWhenRunning(lambda: defer.ensureDeferred(start()))
    try:
        reactor.run()
    finally:
        remove_pid_file(pid_path)
    return launcher.exit_code


def _reload_on_sighup(launcher: Launcher, reactor: Any) -> None:
    from twisted.internet import defer

    from synapse_lite.app.launcher_reload import reload

    def on_sighup(signum: int, frame: object) -> None:
        reactor.callFromThread(lambda: defer.ensureDeferred(reload(launcher)))

    signal.signal(signal.SIGHUP, on_sighup)
