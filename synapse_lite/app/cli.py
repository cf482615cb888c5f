"""The ``synapse-lite`` command: parses arguments and hands each subcommand on.

``synapse-lite run`` with no ``-c`` uses ``./synapse-lite-data/homeserver.yaml``
(``--data-dir`` to choose another directory), writing a config for the
default layout there the first time. The other commands find the config the
same way.
"""

from __future__ import annotations

import argparse
import getpass
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from synapse_lite.config.generate import (
    CONFIG_FILE_NAME,
    DEFAULT_BASE_PORT,
    DEFAULT_DATA_DIR,
    LAYOUTS,
    GenerateOptions,
    write_config,
)
from synapse_lite.config.homeserver import HomeServerConfig, load_config
from synapse_lite.config.validation import ConfigError

#: How long `synapse-lite stop` waits for the launcher to exit.
STOP_WAIT_SECONDS = 120.0


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", help="the homeserver.yaml to use")
    parser.add_argument(
        "--data-dir",
        default=DEFAULT_DATA_DIR,
        help=f"without -c: use DATA_DIR/{CONFIG_FILE_NAME} (default: ./{DEFAULT_DATA_DIR})",
    )


def _add_generate_args(parser: argparse.ArgumentParser, first_run: bool) -> None:
    if not first_run:
        parser.add_argument("--layout", choices=LAYOUTS, default="default")
        parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
        parser.add_argument("--replication", choices=("tcp", "redis"), default="tcp")
        parser.add_argument("--server-name", default="localhost")
        parser.add_argument(
            "--worker-files",
            action="store_true",
            help="write each worker's listeners to workers/NAME.yaml",
        )
    parser.add_argument(
        "--enable-registration",
        action="store_true",
        help="let anyone register, without verification (off by default)",
    )
    parser.add_argument(
        "--base-port",
        type=int,
        default=DEFAULT_BASE_PORT,
        help=f"the main process's client port; the others count up from it"
        f" (default {DEFAULT_BASE_PORT})",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="synapse-lite",
        description="Run a synapse_lite homeserver: the main process and its workers.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    generate = commands.add_parser("generate-config", help="write a commented homeserver.yaml")
    _add_generate_args(generate, first_run=False)
    generate.add_argument(
        "--data-dir", default=DEFAULT_DATA_DIR, help=f"default: ./{DEFAULT_DATA_DIR}"
    )
    generate.add_argument(
        "-o", "--config", help=f"where to write the config (default: DATA_DIR/{CONFIG_FILE_NAME})"
    )

    run = commands.add_parser("run", help="start every process of the config; Ctrl-C stops")
    _add_config_args(run)
    run.add_argument("--start-timeout", type=float, help="seconds each process has to come up")
    run.add_argument(
        "--only",
        metavar="NAMES",
        help="run only these processes (comma-separated, e.g. main,router): the ones of this"
        " machine when the homeserver spans several (docs/deployment.md)",
    )
    first_run_options = run.add_argument_group("when there is no config yet (first run without -c)")
    _add_generate_args(first_run_options, first_run=True)  # type: ignore[arg-type]

    for name, help_text in (
        ("status", "show each process, its pid, health and stream positions"),
        ("stop", "stop a running `synapse-lite run` (and so every process)"),
        ("reload", "apply an edited config, restarting only processes whose role changed"),
    ):
        _add_config_args(commands.add_parser(name, help=help_text))

    register = commands.add_parser("register-user", help="create a user (shared secret)")
    _add_config_args(register)
    register.add_argument("user", nargs="?", help="the localpart, e.g. alice")
    register.add_argument("-p", "--password", help="asked for when not given")
    register.add_argument("--admin", action="store_true", help="make the user a server admin")
    register.add_argument("--url", help="the client API's base URL (default: the main process)")

    routes = commands.add_parser(
        "routes", help="print which process serves each client path (for a proxy in front)"
    )
    _add_config_args(routes)
    routes.add_argument(
        "--format",
        choices=("json", "nginx", "haproxy"),
        default="json",
        help="json (the table), or a configuration for nginx or haproxy (default: json)",
    )

    from synapse_lite.app.audit_arguments import add_arguments as add_audit_arguments

    audit = commands.add_parser(
        "audit",
        help="check offline, with Spark, that every stream position handed out is backed by"
        " rows (docs/audit.md); exit 0 clean, 1 findings, 2 could not run",
    )
    add_audit_arguments(audit, config_required=False)
    audit.add_argument(
        "--data-dir",
        default=DEFAULT_DATA_DIR,
        help=f"without -c: audit DATA_DIR/{CONFIG_FILE_NAME} (default: ./{DEFAULT_DATA_DIR})",
    )

    retire = commands.add_parser(
        "retire-events-writer",
        help="tell the running processes that a stopped events writer is gone for good",
    )
    _add_config_args(retire)
    retire.add_argument("name", help="the events writer, e.g. persister2")
    return parser


def config_path_of(args: argparse.Namespace) -> str:
    return args.config or os.path.join(args.data_dir, CONFIG_FILE_NAME)


def _load(args: argparse.Namespace) -> HomeServerConfig:
    path = config_path_of(args)
    if not args.config and not os.path.exists(path):
        raise ConfigError([])  # reported by the caller as "no config"
    return load_config(path)


def _react(work: Callable[[Any], Awaitable[int]]) -> int:
    """Run ``work(reactor)`` on the reactor; its exit code."""
    from twisted.internet import defer, task

    codes: list[int] = []

    async def main(reactor: Any) -> None:
        codes.append(await work(reactor))

    try:
        task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
    except SystemExit:
        pass
    return codes[0] if codes else 1


def cmd_generate_config(args: argparse.Namespace) -> int:
    options = GenerateOptions(
        layout=args.layout,
        database=args.database,
        replication=args.replication,
        enable_registration=args.enable_registration,
        server_name=args.server_name,
        base_port=args.base_port,
        worker_files=args.worker_files,
    )
    path = config_path_of(args)
    try:
        written = write_config(options, path, args.data_dir)
    except FileExistsError as e:
        print(f"{e.args[0]} exists already; not overwriting it", file=sys.stderr)
        return 1
    for file in written:
        print(f"Wrote {file}")
    print(f"Start it with: synapse-lite run -c {path}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from synapse_lite.app.run import run

    path = config_path_of(args)
    if not args.config and not os.path.exists(path):
        options = GenerateOptions(
            enable_registration=args.enable_registration, base_port=args.base_port
        )
        write_config(options, path, args.data_dir)
        print(f"synapse-lite: first run: wrote a config for the default layout to {path}")
        if not args.enable_registration:
            print(
                "synapse-lite: create users with: synapse-lite register-user"
                f" --data-dir {args.data_dir} NAME"
            )
    only = tuple(n.strip() for n in args.only.split(",") if n.strip()) if args.only else None
    return run(path, start_timeout=args.start_timeout, only=only)


def cmd_status(args: argparse.Namespace, config: HomeServerConfig) -> int:
    from synapse_lite.app.status import show_status

    return _react(lambda reactor: show_status(reactor, config, sys.stdout))


def _launcher_pid(config: HomeServerConfig) -> int | None:
    from synapse_lite.app.pid_files import LAUNCHER, running_pid

    pid = running_pid(config.data_dir, LAUNCHER)
    if pid is None:
        print(f"synapse-lite run is not running for {config.config_files[0]}", file=sys.stderr)
    return pid


def cmd_stop(args: argparse.Namespace, config: HomeServerConfig) -> int:
    from synapse_lite.app.pid_files import pid_alive

    pid = _launcher_pid(config)
    if pid is None:
        return 1
    os.kill(pid, signal.SIGTERM)
    print(f"Stopping synapse-lite run (pid {pid})...")
    deadline = time.monotonic() + STOP_WAIT_SECONDS
    while pid_alive(pid):
        if time.monotonic() > deadline:
            print(f"pid {pid} is still running after {STOP_WAIT_SECONDS:.0f} s", file=sys.stderr)
            return 1
        time.sleep(0.1)
    print("Stopped.")
    return 0


def cmd_reload(args: argparse.Namespace, config: HomeServerConfig) -> int:
    pid = _launcher_pid(config)
    if pid is None:
        return 1
    os.kill(pid, signal.SIGHUP)
    print(f"Asked synapse-lite run (pid {pid}) to reload; its output says what changed.")
    return 0


def cmd_register_user(args: argparse.Namespace, config: HomeServerConfig) -> int:
    from synapse_lite.app.admin_client import AdminRequestError, register_user
    from synapse_lite.app.launch_plan import plan_processes

    secret = config.registration_shared_secret
    if not secret:
        print("Set registration_shared_secret in the config first.", file=sys.stderr)
        return 1
    url = args.url
    if url is None:
        try:
            url = plan_processes(config, for_running=False)[0].url_of("client")
        except KeyError as e:
            print(f"{e.args[0]}; pass --url", file=sys.stderr)
            return 1
    user = args.user or input("User name: ").strip()
    password = args.password
    if password is None:
        password = getpass.getpass("Password: ")
        if getpass.getpass("Password again: ") != password:
            print("The passwords differ.", file=sys.stderr)
            return 1

    async def work(reactor: Any) -> int:
        try:
            answer = await register_user(reactor, url, secret, user, password, args.admin)
        except AdminRequestError as e:
            print(f"Registration failed: {e}", file=sys.stderr)
            return 1
        print(f"Registered {answer.get('user_id')}" + (" (admin)" if args.admin else ""))
        return 0

    return _react(work)


def cmd_retire_events_writer(args: argparse.Namespace, config: HomeServerConfig) -> int:
    from synapse_lite.app.admin_client import AdminRequestError, retire_events_writer

    async def work(reactor: Any) -> int:
        try:
            answer = await retire_events_writer(reactor, config, args.name)
        except AdminRequestError as e:
            print(f"Retiring {args.name} failed: {e}", file=sys.stderr)
            return 1
        state = "Retired" if answer.get("retired") else "Already retired:"
        writers = ", ".join(answer.get("events_writers", []))
        print(f"{state} {args.name}. Events writers now: {writers}")
        print(f"Rooms moved to the remaining writers: {answer.get('rooms_moved')}")
        return 0

    return _react(work)


def cmd_routes(args: argparse.Namespace, config: HomeServerConfig) -> int:
    from synapse_lite.routing.formats import render
    from synapse_lite.routing.table import RoutingError, RoutingTable

    try:
        table = RoutingTable.build(config)
    except RoutingError as e:
        print(f"Cannot route {config.config_files[0]}: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(render(table, args.format))
    return 0


_WITH_CONFIG = {
    "status": cmd_status,
    "stop": cmd_stop,
    "reload": cmd_reload,
    "register-user": cmd_register_user,
    "retire-events-writer": cmd_retire_events_writer,
    "routes": cmd_routes,
}


def dispatch(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "generate-config":
        return cmd_generate_config(args)
    if args.command == "run":
        return cmd_run(args)
    if args.command == "audit":
        # The audit reads its config itself, and reports a bad one with exit 2.
        from synapse_lite.app import audit_command

        args.config = config_path_of(args)
        return audit_command.run(args)
    try:
        config = _load(args)
    except ConfigError as e:
        if not e.problems:
            print(f"No config at {config_path_of(args)}: pass -c or --data-dir", file=sys.stderr)
        else:
            print(str(e), file=sys.stderr)
        return 2
    return _WITH_CONFIG[args.command](args, config)


def main() -> None:
    sys.exit(dispatch())


if __name__ == "__main__":
    main()
