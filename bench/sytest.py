"""SyTest, the public Matrix homeserver test suite, against one of our layouts.

    python -m bench.sytest --layout monolith|default [--database sqlite|postgres]
                           [--sytest-dir DIR] [--out DIR] [--base-port N] [tests/...pl ...]

Writes a fresh config and data directory for the layout (open registration,
guest access on, the shared registration secret SyTest expects, rate limits off, the deprecated
unauthenticated media endpoints on, a server name
whose port nothing listens on so that SyTest's federation attempts are
refused at once), starts it with ``synapse-lite run``, runs SyTest's Manual
mode against the client port (``../shared/sytest/run.sh``), stops the server
and prints SyTest's summary. SyTest itself is not part of this repository:
``docs/sytest.md`` says how to get it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
#: The SyTest runner beside this checkout (``../shared/sytest``), else the
#: workplace's (a worktree or clone made elsewhere has no ``../shared``).
SHARED_SYTEST = next(
    (
        path
        for path in (
            os.path.join(REPO, "..", "shared", "sytest"),
            "/work/shared/sytest",
        )
        if os.path.exists(os.path.join(path, "run.sh"))
    ),
    os.path.join(REPO, "..", "shared", "sytest"),
)
#: A port nothing listens on: SyTest's federation requests fail at once.
SERVER_NAME = "localhost:1"
#: What SyTest signs its shared-secret registrations with.
REGISTRATION_SECRET = "reg_secret"
#: Far from the ports the test suite and a default `synapse-lite run` use.
BASE_PORT = 28408


def write_config(
    directory: str, layout: str, database: str, base_port: int, sytest_dir: str
) -> str:
    """Generate the layout's config, then set what SyTest needs."""
    path = os.path.join(directory, "homeserver.yaml")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "synapse_lite.app.cli",
            "generate-config",
            "--layout",
            layout,
            "--database",
            database,
            "--server-name",
            SERVER_NAME,
            "--base-port",
            str(base_port),
            "--enable-registration",
            "--data-dir",
            directory,
            "-o",
            path,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    with open(path, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    config["registration_shared_secret"] = REGISTRATION_SECRET
    config["rate_limiting"] = {"enabled": False}
    # SyTest's guest tests register guests (POST /register?kind=guest).
    config["allow_guest_access"] = True
    # SyTest predates authenticated media (Matrix 1.11): it reads
    # /_matrix/media/v3/config, one of the deprecated endpoints that are off
    # by default. An operator serving such clients turns them on.
    config.setdefault("media", {})["legacy_unauthenticated_endpoints"] = True
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
    config["media"]["url_previews"] = True
    if database == "postgres":
        name = f"sytest_{os.getpid()}_{int(time.time())}"
        subprocess.run(
            ["psql", "-h", "127.0.0.1", "-U", "postgres", "-c", f"CREATE DATABASE {name}"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        config["database"]["args"]["dbname"] = name
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return path


def wait_until_serving(base_url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base_url}/_matrix/client/versions", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"the server did not answer at {base_url} within {timeout:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sytest")
    parser.add_argument("--layout", choices=("monolith", "default", "sharded"), default="monolith")
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument(
        "--sytest-dir",
        default=os.environ.get("SYTEST_DIR", "/work/sytest-checkout"),
        help="a matrix-org/sytest checkout (default: $SYTEST_DIR or /work/sytest-checkout)",
    )
    parser.add_argument("--out", help="where results.tap and summary.txt go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the server's data directory")
    parser.add_argument(
        "--base-port",
        type=int,
        default=BASE_PORT,
        help=f"first of the layout's ports (default {BASE_PORT}); give each concurrent run its own",
    )
    parser.add_argument("tests", nargs="*", help="SyTest files, e.g. tests/31sync/04timeline.pl")
    args = parser.parse_args(argv)

    run_sh = os.path.join(SHARED_SYTEST, "run.sh")
    if not os.path.exists(os.path.join(args.sytest_dir, "run-tests.pl")):
        print(f"no SyTest checkout at {args.sytest_dir}: see docs/sytest.md", file=sys.stderr)
        return 2
    directory = tempfile.mkdtemp(prefix=f"sytest_{args.layout}_")
    out = args.out or os.path.join(directory, "results")
    config = write_config(
        directory, args.layout, args.database, args.base_port, os.path.abspath(args.sytest_dir)
    )
    base_url = f"http://127.0.0.1:{args.base_port}"
    log = open(os.path.join(directory, "server.log"), "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "synapse_lite.app.cli", "run", "-c", config],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until_serving(base_url, 60)
        started = time.monotonic()
        subprocess.run(
            ["bash", run_sh, args.sytest_dir, base_url, SERVER_NAME, out, *args.tests],
            check=False,
        )
        print(f"SyTest ran for {time.monotonic() - started:.0f} s against the {args.layout} layout")
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    with open(os.path.join(out, "summary.txt"), encoding="utf-8") as f:
        print(f.read())
    print(f"results: {out}/results.tap; server log: {directory}/server.log")
    if not args.keep and not args.out:
        shutil.rmtree(os.path.join(directory, "data"), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
