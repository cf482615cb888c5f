"""Running one process from the command line (main process or worker)."""

from __future__ import annotations

import argparse
import logging
import sys

from synapse_lite.config.homeserver import (
    MAIN_PROCESS,
    HomeServerConfig,
    load_config,
    load_worker_file,
)
from synapse_lite.config.validation import ConfigError
from synapse_lite.storage.engines import IncorrectDatabaseSetup
from synapse_lite.storage.prepare_database import SchemaVersionError

logger = logging.getLogger(__name__)


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


def run_process(argv: list[str], worker: bool) -> int:
    """Start the process and run until stopped; the exit code."""
    try:
        config, name = parse_process_args(argv, worker)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    from twisted.internet import reactor

    from synapse_lite.app._base import setup_logging, start
    from synapse_lite.server import HomeServer

    setup_logging(name, config.log_level)
    hs = HomeServer(config, name, reactor)
    try:
        start(hs)
    except (SchemaVersionError, IncorrectDatabaseSetup) as e:
        logger.error("%s", e)
        hs.shutdown()
        return 3
    except Exception as e:
        logger.exception("%s failed to start: %s", name, e)
        hs.shutdown()
        return 1
    reactor.run()
    return 0
