"""Running one process from the command line (main process or worker)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

from twisted.internet.error import CannotListenError

from synapse_lite.app.composition import build_homeserver
from synapse_lite.app.logs import setup_logging
from synapse_lite.app.pid_files import pid_file_path, remove_pid_file, write_pid_file
from synapse_lite.app.services import CallbackService, ProcessService
from synapse_lite.config.homeserver import (
    MAIN_PROCESS,
    HomeServerConfig,
    load_config,
    load_worker_file,
)
from synapse_lite.config.validation import ConfigError
from synapse_lite.federation.crypto import SigningKeyFileError
from synapse_lite.storage.engines import IncorrectDatabaseSetup
from synapse_lite.storage.prepare_database import SchemaVersionError

logger = logging.getLogger(__name__)

#: Set by ``synapse-lite run`` in the environment of the processes it starts.
LAUNCHER_PID_ENV = "SYNAPSE_LITE_LAUNCHER_PID"
#: How often a launched process checks that its launcher is still there.
LAUNCHER_CHECK_SECONDS = 1.0


def parse_process_args(argv: list[str], worker: bool) -> tuple[HomeServerConfig, str]:
    """``-c homeserver.yaml [-c worker.yaml] [--worker-name NAME]`` -> config and name."""
    parser = argparse.ArgumentParser(
        prog="python -m synapse_lite.app." + ("generic_worker" if worker else "homeserver")
    )
    parser.add_argument(
        "-c", "--config", action="append", required=True, help="homeserver.yaml, then a worker file"
    )
    if worker:
        parser.add_argument("--worker-name", help="a worker declared under 'workers'")
    args = parser.parse_args(argv)
    config = load_config(args.config[0])
    name = MAIN_PROCESS
    for extra in args.config[1:]:
        config, name = load_worker_file(config, extra)
    if worker:
        if args.worker_name:
            name = args.worker_name
        if name == MAIN_PROCESS:
            parser.error("name the worker: --worker-name NAME, or -c worker.yaml with worker_name")
        if name not in config.workers:
            parser.error(f"{name!r} is not declared under 'workers' in {args.config[0]}")
    return config, name


#: Allocations at least this large get their own mapping, unmapped when freed.
MMAP_THRESHOLD_BYTES = 1024 * 1024


def return_large_allocations_to_the_os() -> None:
    """Fix glibc's mmap threshold so large blocks are always unmapped when freed.

    Password hashing (scrypt) allocates 16 MiB per hash on a thread. glibc
    raises its mmap threshold after the first such block is freed, so later
    ones come from the heap and stay resident: a process would keep tens of
    megabytes after a few logins. A fixed threshold keeps resident memory flat.
    Does nothing where the C library is not glibc.
    """
    import ctypes
    import ctypes.util

    m_mmap_threshold = -3  # from malloc.h
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(m_mmap_threshold, MMAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):
        logger.debug("mallopt is not available: large allocations stay as the C library says")


def run_process(argv: list[str], worker: bool) -> int:
    """Start the process and run until stopped; the exit code."""
    launcher_pid = detach_from_terminal_signals()
    read_start = time.monotonic()
    try:
        config, name = parse_process_args(argv, worker)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    read_seconds = time.monotonic() - read_start
    from twisted.internet import reactor

    return_large_allocations_to_the_os()
    setup_logging(name, config.log_level)
    logger.info("Read the config (%s) in %.3f s", ", ".join(config.config_files), read_seconds)
    start = time.monotonic()
    logger.info("Starting %s (writes %s)", name, ", ".join(config.writers.streams_written_by(name)))
    try:
        hs = build_homeserver(config, name, reactor)
    except (SchemaVersionError, IncorrectDatabaseSetup, SigningKeyFileError) as e:
        logger.error("%s", e)
        return 3
    except Exception as e:
        logger.exception("%s failed to start: %s", name, e)
        return 1
    process = ProcessService(hs.clock, name)
    # Added first, so stopped last: the pid file goes once everything has stopped.
    pid_path = pid_file_path(config.data_dir, name)
    CallbackService(
        "pid file", start=lambda: write_pid_file(pid_path), stop=lambda: remove_pid_file(pid_path)
    ).setServiceParent(process)
    hs.service.setServiceParent(process)
    try:
        process.startService()
    except CannotListenError as e:
        logger.error(
            "%s cannot listen on %s:%d: %s. Is another program using the port, or is the"
            " address not one of this machine's?",
            name,
            e.interface or "*",
            e.port,
            getattr(e.socketError, "strerror", None) or e.socketError,
        )
        _stop_now(reactor, process)
        return 1
    except Exception as e:
        logger.exception("%s failed to start: %s", name, e)
        _stop_now(reactor, process)
        return 1
    logger.info(
        "%s started in %.3f s: writes %s",
        name,
        time.monotonic() - start,
        ", ".join(hs.streamer.sourced_stream_names),
    )
    reactor.addSystemEventTrigger("before", "shutdown", _stopper(name, process))
    if launcher_pid is not None:
        stop_when_launcher_goes(launcher_pid)
    reactor.run()
    return 0


def _stopper(name: str, process: ProcessService) -> Any:
    def stop() -> Any:
        logger.info("Shutting down %s", name)
        d = process.stopService()
        d.addCallback(lambda _: logger.info("%s stopped", name))
        return d

    return stop


def _stop_now(reactor: Any, process: ProcessService) -> None:
    """Stop what started before a failed start (the reactor is not running:
    run it until the stop is done)."""
    d = process.stopService()
    d.addBoth(lambda _: reactor.stop())
    if not d.called:
        reactor.run()


def detach_from_terminal_signals() -> int | None:
    """Under ``synapse-lite run``: leave the launcher's process group, so that a
    Ctrl-C in its terminal reaches only the launcher, which stops the processes
    in order. Returns the launcher's pid (None when not launched by it)."""
    value = os.environ.get(LAUNCHER_PID_ENV)
    if not value or not value.isdigit():
        return None
    os.setpgrp()
    return int(value)


def stop_when_launcher_goes(launcher_pid: int) -> None:
    """A launched process stops cleanly if its launcher dies (killed with
    SIGKILL, say), rather than run on unsupervised."""
    from twisted.internet import reactor, task

    def check() -> None:
        if os.getppid() != launcher_pid:
            logger.warning("The launcher (pid %d) has gone; stopping", launcher_pid)
            loop.stop()
            reactor.stop()

    loop = task.LoopingCall(check)
    loop.start(LAUNCHER_CHECK_SECONDS, now=True)
