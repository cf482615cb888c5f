"""SyTest, the public Matrix homeserver test suite, against one of our layouts.

    python -m bench.sytest --plugin [--layout monolith|default|sharded]
                           [--database sqlite|postgres] [--sytest-dir DIR]
                           [--out DIR] [tests/...pl ...]
    python -m bench.sytest [--layout ...] [--database ...] [--base-port N] ...

With ``--plugin``, SyTest starts the homeservers itself through our plugin
(``contrib/sytest/``, ``-I SynapseLite``): two of them when a test needs a
remote user, each serving the client and federation APIs over HTTPS with a
certificate of SyTest's CA, with SyTest's application services registered
where synapse_lite knows the setting. The whole suite runs.

Without it, SyTest's Manual mode (``../shared/sytest/run.sh``) runs against
one server started here: a fresh config and data directory for the layout
(the recipe of ``bench/sytest_homeserver.py``, and a server name whose port
nothing listens on, so that SyTest's federation attempts are refused at
once). Tests needing a second homeserver are skipped, federation and
application-service tests fail.

Either way: SyTest's TAP with its progress lines (``results.tap``), the
totals and the per-directory table (printed, and in ``summary.txt``).
SyTest itself is not part of this repository: ``docs/sytest.md`` says where
it comes from.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator

import attr
import yaml

from bench.cluster import create_database, drop_database
from bench.sytest_homeserver import apply_sytest_recipe
from synapse_lite.config.generate import LAYOUTS
from tests.harness.launcher import free_port_block

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
#: Our SyTest plugin: this directory goes on Perl's include path.
PLUGIN_LIB = os.path.join(REPO, "contrib", "sytest", "lib")
#: A port nothing listens on: SyTest's federation requests fail at once.
SERVER_NAME = "localhost:1"
#: Far from the ports the test suite and a default `synapse-lite run` use.
BASE_PORT = 28408
#: Ports SyTest may hand to the plugin's homeservers (two use 28).
PLUGIN_PORTS = 40


def find_shared_sytest() -> str | None:
    """The workplace's SyTest folder (``shared/sytest``: SyTest's snapshot
    in ``src/``, ``run.sh``, the Perl stand-ins in ``perlshim/``) beside
    this checkout or beside one of its parents (CI clones next to
    ``shared/``; a worktree may sit deeper); None where there is none."""
    directory = REPO
    while True:
        candidate = os.path.join(directory, "shared", "sytest")
        if os.path.exists(os.path.join(candidate, "src", "run-tests.pl")):
            return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


#: The Perl modules SyTest loads, one of each Debian package that
#: ``.ci/run`` installs (``../shared/sytest/README.md`` lists them), and the
#: two that ``shared/sytest/perlshim/`` stands in for.
PERL_MODULES = (
    "Class::Method::Modifiers",
    "Data::Dump",
    "DBI",
    "DBD::Pg",
    "Digest::HMAC_SHA1",
    "Email::Address::XS",
    "Email::MIME",
    "File::Slurper",
    "Future",
    "HTTP::Message",
    "IO::Async::Loop",
    "IO::Async::SSL",
    "IO::Socket::SSL",
    "JSON",
    "JSON::PP",
    "List::UtilsBy",
    "Module::Pluggable",
    "Net::Async::HTTP",
    "Net::SSLeay",
    "Struct::Dumb",
    "URI",
    "YAML::XS",
    "CryptX",
    "Crypt::Ed25519",
    "Net::Async::HTTP::Server",
)


def missing_perl_modules(shared_sytest: str | None) -> list[str]:
    """Those of :data:`PERL_MODULES` Perl cannot load (``["perl"]`` when
    there is no Perl)."""
    env = dict(os.environ, PERL5LIB=perl_library_path(shared_sytest))
    script = 'for (@ARGV) { eval "require $_; 1" or print "$_\\n" }'
    try:
        answer = subprocess.run(
            ["perl", "-e", script, *PERL_MODULES],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    except OSError:
        return ["perl"]
    except subprocess.CalledProcessError:
        return list(PERL_MODULES)
    return answer.stdout.split()


# Reading SyTest's TAP

#: A file header SyTest writes before the file's tests (``tests/...pl:``).
_FILE_LINE = re.compile(r"^(tests/\S+\.pl):\s*$")
#: A result line: ``ok N name``, ``not ok N name``, ``ok N name # skip why``.
_RESULT_LINE = re.compile(r"^(not ok|ok) (\d+) (.*)$")
#: A skip's result that SyTest glued onto its progress line.
_GLUED_RESULT = re.compile(r"^(\s+Test (\d+) .*?\.\.\. )((?:not )?ok \2 .*)$")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class TestResult:
    file: str
    name: str
    #: ``pass``, ``fail`` (expected failures too) or ``skip``.
    result: str

    @property
    def directory(self) -> str:
        """SyTest's directory of the test (``tests/30rooms/01state.pl`` ->
        ``30rooms``, ``tests/42tags.pl`` -> ``42tags``)."""
        first = self.file.split("/")[1] if self.file.startswith("tests/") else self.file
        return first.removesuffix(".pl")


def unglued(line: str) -> Iterator[str]:
    """A line of SyTest's merged output, its glued-on result on a line of its own."""
    match = _GLUED_RESULT.match(line)
    if match:
        yield match.group(1)
        yield match.group(3)
    else:
        yield line


def read_tap(lines: Iterator[str]) -> list[TestResult]:
    """The results of SyTest's merged output (TAP on stdout, file headers on
    stderr), in run order."""
    results = []
    current = "?"
    for raw in lines:
        for line in unglued(raw.rstrip("\n")):
            header = _FILE_LINE.match(line)
            if header:
                current = header.group(1)
                continue
            match = _RESULT_LINE.match(line)
            if not match:
                continue
            status, _, rest = match.groups()
            name, skip, _ = rest.partition(" # skip ")
            name = name.split(" # TODO", 1)[0].removeprefix("(expected fail) ").strip()
            name = re.sub(r"\s*\(\d+ subtests\)$", "", name)
            # An expected failure ("not ok ... # TODO") counts as failed, an
            # unexpected pass as passed.
            result = "skip" if skip else ("pass" if status == "ok" else "fail")
            results.append(TestResult(current, name, result))
    return results


def summary(results: list[TestResult]) -> str:
    """``N passed, M failed, K skipped`` and the counts per directory."""
    totals = Counter(r.result for r in results)
    per_directory: dict[str, Counter[str]] = {}
    for r in results:
        per_directory.setdefault(r.directory, Counter())[r.result] += 1
    lines = [
        f"{totals['pass']} passed, {totals['fail']} failed, {totals['skip']} skipped"
        f" ({len(results)} tests)",
        "",
        f"{'directory':<24} {'pass':>5} {'fail':>5} {'skip':>5} {'total':>6}",
    ]
    for directory, counts in sorted(per_directory.items()):
        lines.append(
            f"{directory:<24} {counts['pass']:>5} {counts['fail']:>5} {counts['skip']:>5}"
            f" {sum(counts.values()):>6}"
        )
    return "\n".join(lines) + "\n"


# The plugin: SyTest starts our homeservers


def perl_library_path(shared_sytest: str | None) -> str:
    """``PERL5LIB`` for SyTest with our plugin: the plugin's lib, the
    stand-ins for the two modules Debian lacks, and what was there."""
    parts = [PLUGIN_LIB]
    if shared_sytest is not None:
        parts.append(os.path.join(shared_sytest, "perlshim"))
    if os.environ.get("PERL5LIB"):
        parts.append(os.environ["PERL5LIB"])
    return os.pathsep.join(parts)


def run_with_plugin(
    sytest_dir: str,
    out: str,
    tests: list[str],
    layout: str = "monolith",
    database: str = "sqlite",
    timeout: float | None = None,
) -> list[TestResult]:
    """Run SyTest in ``sytest_dir`` with ``-I SynapseLite``: ``out`` gets
    ``results.tap`` (TAP and progress lines, merged) and SyTest's working
    files (``work/``: each homeserver's config and ``server.log``). The
    results; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
    work = os.path.join(out, "work")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    first_port = free_port_block(PLUGIN_PORTS)
    command = [
        "perl",
        "run-tests.pl",
        "-I",
        "SynapseLite",
        "--layout",
        layout,
        "--database",
        database,
        "--synapse-lite-directory",
        REPO,
        "--python",
        sys.executable,
        "--work-directory",
        work,
        "--port-range",
        f"{first_port}:{first_port + PLUGIN_PORTS}",
        "-O",
        "tap",
        *tests,
    ]
    env = dict(os.environ, PERL5LIB=perl_library_path(find_shared_sytest()))
    tap_path = os.path.join(out, "results.tap")
    with open(tap_path, "w", encoding="utf-8") as tap:
        process = subprocess.Popen(
            command,
            cwd=sytest_dir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            assert process.stdout is not None
            for line in process.stdout:
                tap.writelines(part + "\n" for part in unglued(line.rstrip("\n")))
                if deadline is not None and time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(command, timeout or 0)
            process.wait()
        finally:
            if process.poll() is None:
                # SyTest stops its homeservers on SIGINT (their launchers stop
                # every process of the layout).
                os.killpg(process.pid, signal.SIGINT)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
    with open(tap_path, encoding="utf-8") as f:
        return read_tap(f)


def _plugin_main(args: argparse.Namespace) -> int:
    missing = missing_perl_modules(find_shared_sytest())
    if missing:
        print(
            f"SyTest's Perl modules are missing ({', '.join(missing)}): install the Debian"
            " packages ../shared/sytest/README.md lists",
            file=sys.stderr,
        )
        return 2
    sytest_dir = os.path.abspath(args.sytest_dir)
    out = os.path.abspath(args.out or tempfile.mkdtemp(prefix=f"sytest_plugin_{args.layout}_"))
    os.makedirs(out, exist_ok=True)
    started = time.monotonic()
    results = run_with_plugin(sytest_dir, out, args.tests, args.layout, args.database)
    text = summary(results)
    text += (
        f"\nSyTest ran {time.monotonic() - started:.0f} s through the plugin"
        f" ({args.layout} layout, {args.database})\n"
    )
    with open(os.path.join(out, "summary.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    print(f"results: {out}/results.tap; servers' configs and logs: {out}/work/server-*")
    return 0


# Manual mode: one server started here


def write_manual_config(
    directory: str, layout: str, database: str, base_port: int, sytest_dir: str
) -> tuple[str, dict[str, object] | None]:
    """Generate the layout's config, then set what SyTest needs: its path,
    and the PostgreSQL database created for it (None on SQLite)."""
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
    apply_sytest_recipe(config, sytest_dir)
    created = None
    if database == "postgres":
        created = create_database(database, directory, f"sytest_{os.getpid()}_{int(time.time())}")
        config["database"] = created
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return path, created


def wait_until_serving(base_url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base_url}/_matrix/client/versions", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"the server did not answer at {base_url} within {timeout:.0f} s")


def _manual_main(args: argparse.Namespace) -> int:
    shared = find_shared_sytest()
    if shared is None:
        print("no shared/sytest (run.sh) beside this checkout: see docs/sytest.md", file=sys.stderr)
        return 2
    run_sh = os.path.join(shared, "run.sh")
    directory = tempfile.mkdtemp(prefix=f"sytest_{args.layout}_")
    out = args.out or os.path.join(directory, "results")
    config, created = write_manual_config(
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
        if created is not None:
            drop_database(created)
    with open(os.path.join(out, "summary.txt"), encoding="utf-8") as f:
        print(f.read())
    print(f"results: {out}/results.tap; server log: {directory}/server.log")
    if not args.keep and not args.out:
        shutil.rmtree(os.path.join(directory, "data"), ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    shared = find_shared_sytest()
    default_sytest = os.environ.get("SYTEST_DIR") or (
        os.path.join(shared, "src") if shared is not None else None
    )
    parser = argparse.ArgumentParser(prog="python -m bench.sytest")
    parser.add_argument(
        "--plugin",
        action="store_true",
        help="let SyTest start the homeservers through our plugin (contrib/sytest/): two"
        " homeservers, federation and application services; without it, Manual mode",
    )
    parser.add_argument("--layout", choices=LAYOUTS, default="monolith")
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument(
        "--sytest-dir",
        default=default_sytest,
        help=f"a SyTest checkout (default: $SYTEST_DIR, else the shared snapshot {default_sytest})",
    )
    parser.add_argument("--out", help="where results.tap and summary.txt go (default: a temp dir)")
    parser.add_argument(
        "--keep", action="store_true", help="Manual mode: keep the server's data directory"
    )
    parser.add_argument(
        "--base-port",
        type=int,
        default=BASE_PORT,
        help=f"Manual mode: first of the layout's ports (default {BASE_PORT}); give each"
        " concurrent run its own (the plugin finds free ports itself)",
    )
    parser.add_argument("tests", nargs="*", help="SyTest files, e.g. tests/31sync/04timeline.pl")
    args = parser.parse_args(argv)

    if not args.sytest_dir or not os.path.exists(os.path.join(args.sytest_dir, "run-tests.pl")):
        print(f"no SyTest checkout at {args.sytest_dir}: see docs/sytest.md", file=sys.stderr)
        return 2
    return _plugin_main(args) if args.plugin else _manual_main(args)


if __name__ == "__main__":
    sys.exit(main())
