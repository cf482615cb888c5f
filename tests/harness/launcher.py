"""The ``synapse-lite`` command as a real subprocess, for end-to-end tests.

:class:`SynapseLiteCommand` runs ``python -m synapse_lite.app.cli ARGS`` in a
directory, keeps its output lines, and waits for lines or for its exit. Its
cleanup stops it (SIGTERM, then SIGKILL) and kills anything still running
whose pid file is in the data directory, so no test leaves processes behind.
:func:`generated_config` writes a config with ``generate-config`` on free ports.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import sys
import tempfile
import time
from typing import Any

import attr
import treq
import yaml
from twisted.internet import defer, protocol, reactor, task
from twisted.trial import unittest

from synapse_lite.app.launch_plan import ProcessSpec, plan_processes
from synapse_lite.app.pid_files import pid_alive, read_pid_file
from synapse_lite.config.generate import GenerateOptions, write_config
from synapse_lite.config.homeserver import load_config
from tests.harness.databases import TestDatabase, create_test_database
from tests.harness.processes import NO_KEEPALIVE, SOURCE_ROOT, free_port_block


def generated_config(
    directory: str,
    test_db: TestDatabase | None = None,
    **options: Any,
) -> str:
    """Write a config with ``generate-config`` (on a free block of ports, unless
    ``base_port`` is given) into ``directory``; the config's path. With
    ``test_db`` the config uses that database instead of the generated one."""
    options.setdefault("base_port", free_port_block(10))
    path = os.path.join(directory, "homeserver.yaml")
    write_config(GenerateOptions(**options), path, directory)
    if test_db is not None and test_db.engine_name != "sqlite":
        edit_config(path, lambda config: config.update(database=test_db.config()))
    return path


def edit_config(path: str, change: Any) -> None:
    """Load a YAML config, let ``change(dict)`` edit it, write it back."""
    with open(path) as f:
        config = yaml.safe_load(f)
    change(config)
    with open(path, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)


class _OutputProtocol(protocol.ProcessProtocol):
    def __init__(self, command: SynapseLiteCommand) -> None:
        self._command = command
        self._partial = {1: b"", 2: b""}

    def childDataReceived(self, fd: int, data: bytes) -> None:
        *lines, self._partial[fd] = (self._partial.get(fd, b"") + data).split(b"\n")
        for line in lines:
            self._command.got_line(fd, line.decode("utf-8", "replace"))

    def processEnded(self, reason: Any) -> None:
        self._command.got_exit(reason.value)


class SynapseLiteCommand:
    """One run of ``synapse-lite ARGS`` in ``cwd``."""

    def __init__(
        self, testcase: unittest.TestCase, args: list[str], cwd: str, data_dir: str
    ) -> None:
        self.args = args
        self.cwd = cwd
        self.data_dir = data_dir
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        #: Both, in the order they arrived.
        self.lines: list[str] = []
        self.exit_code: int | None = None
        self.exit_signal: int | None = None
        self.running = False
        self.started_at = 0.0
        self._ended: list[defer.Deferred[None]] = []
        self._transport: Any = None
        testcase.addCleanup(self.cleanup)

    def start(self) -> SynapseLiteCommand:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [SOURCE_ROOT, env.get("PYTHONPATH")]))
        argv = [sys.executable, "-m", "synapse_lite.app.cli", *self.args]
        self.started_at = time.monotonic()
        self._transport = reactor.spawnProcess(
            _OutputProtocol(self), sys.executable, argv, env=env, path=self.cwd
        )
        self.running = True
        return self

    @property
    def pid(self) -> int:
        return int(self._transport.pid)

    def got_line(self, fd: int, line: str) -> None:
        (self.stdout if fd == 1 else self.stderr).append(line)
        self.lines.append(line)
        if os.environ.get("SYNAPSE_LITE_TEST_VERBOSE"):
            print(f"[{'out' if fd == 1 else 'err'}] {line}")

    def got_exit(self, value: Any) -> None:
        self.running = False
        self.exit_code = getattr(value, "exitCode", None)
        self.exit_signal = getattr(value, "signal", None)
        for d in self._ended:
            d.callback(None)
        self._ended.clear()

    def output(self) -> str:
        return "\n".join(self.lines)

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.lines[-lines:])

    def mark(self) -> int:
        """A place in the output, for :meth:`wait_for_line`'s ``after``."""
        return len(self.lines)

    async def wait_for_line(
        self, pattern: str, timeout: float = 60.0, after: int = 0
    ) -> re.Match[str]:
        """The first output line matching ``pattern`` (waiting for it), among
        the lines printed since :meth:`mark` returned ``after``."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        checked = after
        while True:
            lines = self.lines
            for line in lines[checked:]:
                match = regex.search(line)
                if match:
                    return match
            checked = len(lines)
            if not self.running:
                raise AssertionError(
                    f"exited ({self.exit_code}) before printing {pattern!r}:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no line matching {pattern!r} in {timeout} s:\n{self.tail()}")
            await task.deferLater(reactor, 0.05, lambda: None)

    async def wait_exit(self, timeout: float = 60.0) -> int | None:
        if self.running:
            d: defer.Deferred[None] = defer.Deferred()
            self._ended.append(d)
            try:
                await d.addTimeout(timeout, reactor)
            except defer.TimeoutError:
                raise AssertionError(
                    f"synapse-lite {' '.join(self.args)} still running after {timeout} s:\n"
                    f"{self.tail()}"
                ) from None
        return self.exit_code

    def signal(self, sig: int) -> None:
        if self.running:
            self._transport.signalProcess(sig)

    def running_pids(self) -> dict[str, int]:
        """Every process with a live pid file in the data directory."""
        found = {}
        for path in glob.glob(os.path.join(self.data_dir, "run", "*.pid")):
            pid = read_pid_file(path)
            if pid_alive(pid):
                assert pid is not None
                found[os.path.basename(path)[: -len(".pid")]] = pid
        return found

    async def cleanup(self) -> None:
        if self.running:
            self.signal(signal.SIGTERM)
            try:
                await self.wait_exit(40)
            except AssertionError:
                self.signal(signal.SIGKILL)
                await self.wait_exit(10)
        for pid in self.running_pids().values():
            os.kill(pid, signal.SIGKILL)


def temp_dir(prefix: str = "synapse_lite_run_") -> str:
    return tempfile.mkdtemp(prefix=prefix)


async def http_get(url: str) -> tuple[int, bytes]:
    response = await treq.get(url, timeout=5, pool=NO_KEEPALIVE)
    return response.code, await treq.content(response)


@attr.s(auto_attribs=True)
class LaunchedServer:
    """A generated config run by `synapse-lite run -c` (see :func:`launch`)."""

    command: SynapseLiteCommand
    config_path: str
    directory: str
    test_db: TestDatabase

    def specs(self) -> dict[str, ProcessSpec]:
        """The processes of the config as it is now (it may have been edited)."""
        return {s.name: s for s in plan_processes(load_config(self.config_path))}

    def url(self, name: str, resource: str = "client") -> str:
        return self.specs()[name].url_of(resource)

    def run_command(self, testcase: unittest.TestCase, *args: str) -> SynapseLiteCommand:
        """Start `synapse-lite ARGS -c CONFIG` (status, reload, ...)."""
        command = SynapseLiteCommand(
            testcase, [*args, "-c", self.config_path], self.directory, self.directory
        )
        return command.start()


async def launch(testcase: unittest.TestCase, **options: Any) -> LaunchedServer:
    """Generate a config (``options`` as for generate-config) on free ports and
    the run's database engine, run it, and wait until every process is up."""
    test_db = create_test_database()
    testcase.addCleanup(test_db.drop)
    directory = temp_dir()
    config_path = generated_config(directory, test_db, **options)
    command = SynapseLiteCommand(testcase, ["run", "-c", config_path], directory, directory)
    await command.start().wait_for_line(r"processes up in")
    return LaunchedServer(command, config_path, directory, test_db)
