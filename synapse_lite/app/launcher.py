"""``synapse-lite run``: every process of one config, as separate OS processes.

Starts them tier by tier (main, stream writers, the rest; see
:mod:`launch_plan`), each tier once the previous one answers ``/health``;
relays their output, one whole line at a time, to its own stdout; restarts a
process that dies, with a growing delay; on SIGINT/SIGTERM stops them in the
reverse order and exits 0 if they all stopped cleanly. SIGHUP (``synapse-lite
reload``) reads the config again and restarts only the processes whose role
changed (:mod:`launcher_reload`).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterable
from typing import Any, TextIO

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall
from twisted.python.failure import Failure

import synapse_lite
from synapse_lite.app.bytecode import write_package_bytecode
from synapse_lite.app.child_process import ChildProcess, ProcessFailedToStart, describe_exit
from synapse_lite.app.launch_plan import ProcessSpec
from synapse_lite.app.process import LAUNCHER_PID_ENV
from synapse_lite.config.homeserver import HomeServerConfig

logger = logging.getLogger(__name__)

#: Longest a process may take to answer /health after being started.
START_TIMEOUT_SECONDS = 60.0
#: Longest a process may take to stop after SIGTERM before it is killed.
STOP_TIMEOUT_SECONDS = 30.0
#: Delay before restarting a process that died, doubling with each death in a
#: row up to the maximum; a process that ran this long counts as recovered.
RESTART_DELAY_SECONDS = 1.0
MAX_RESTART_DELAY_SECONDS = 30.0
STABLE_AFTER_SECONDS = 30.0


def restart_delay(deaths_in_a_row: int) -> float:
    """Seconds to wait before the restart following the ``n``-th death in a row."""
    return min(RESTART_DELAY_SECONDS * 2 ** (deaths_in_a_row - 1), MAX_RESTART_DELAY_SECONDS)


def child_environment() -> dict[str, str]:
    """The launcher's environment, plus: where the launcher is (children stop if
    it dies) and the synapse_lite it runs (children run the same code)."""
    env = dict(os.environ)
    env[LAUNCHER_PID_ENV] = str(os.getpid())
    source_root = os.path.dirname(os.path.dirname(os.path.abspath(synapse_lite.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [source_root, env.get("PYTHONPATH")]))
    return env


class Launcher:
    """The processes of one config and what to do when they start, die or stop."""

    def __init__(
        self,
        config: HomeServerConfig,
        specs: list[ProcessSpec],
        reactor: Any,
        out: TextIO,
        start_timeout: float = START_TIMEOUT_SECONDS,
    ) -> None:
        self.config = config
        self.specs = {spec.name: spec for spec in specs}
        self.reactor = reactor
        self._out = out
        self._env = child_environment()
        self._start_timeout = start_timeout
        self.children: dict[str, ChildProcess] = {}
        self._deaths_in_a_row: dict[str, int] = {}
        self._pending_restarts: dict[str, IDelayedCall] = {}
        self.stopping = False
        #: What the launcher is in the middle of (a reload waits for it), if anything.
        self.busy: str | None = None
        self._stopped: Deferred[None] | None = None
        #: Non-zero once a process failed to start or to stop cleanly.
        self.exit_code = 0
        #: The processes this launcher runs (``run --only``; None: all).
        self.only: tuple[str, ...] | None = None

    def write_line(self, line: str) -> None:
        """One whole line to the merged output."""
        self._out.write(line + "\n")
        self._out.flush()

    # Starting

    def in_tiers(self, names: Iterable[str]) -> list[list[ProcessSpec]]:
        """The specs of ``names`` grouped by tier, in start order."""
        specs = sorted((self.specs[n] for n in names), key=lambda s: s.tier)
        tiers: list[list[ProcessSpec]] = []
        for spec in specs:
            if tiers and tiers[-1][0].tier == spec.tier:
                tiers[-1].append(spec)
            else:
                tiers.append([spec])
        return tiers

    async def start(self, names: Iterable[str]) -> None:
        """Start processes tier by tier, each tier once every process of the
        one before answers /health. :class:`ProcessFailedToStart` names the
        first process that did not.

        (Spawning every worker at once after the main process measured no
        faster on a busy two-CPU machine: starting a process is CPU-bound.
        So the package's bytecode is written first, where it is missing,
        for the processes to read rather than each compile: ``bytecode.py``.)"""
        write_package_bytecode()
        for tier in self.in_tiers(names):
            if self.stopping:
                return  # stopped meanwhile (Ctrl-C during a start or reload)
            await self._start_together(tier)

    async def _start_together(self, specs: list[ProcessSpec]) -> None:
        children = [self.spawn(spec) for spec in specs]
        results = await defer.DeferredList(
            [defer.ensureDeferred(self._wait_up(child)) for child in children],
            consumeErrors=True,
        )
        for ok, result in results:
            if not ok:
                assert isinstance(result, Failure)
                result.raiseException()

    def spawn(self, spec: ProcessSpec) -> ChildProcess:
        child = ChildProcess(spec, self.reactor, self.write_line)
        self.children[spec.name] = child
        child.spawn(self._env)
        logger.info("Started %s (pid %d): %s", spec.name, child.pid, spec.role)
        child.when_ended().addCallback(lambda _: self._on_exit(child))
        return child

    async def _wait_up(self, child: ChildProcess) -> None:
        await child.wait_healthy(self._start_timeout)
        logger.info(
            "%s is up (pid %d) after %.2f s",
            child.spec.name,
            child.pid,
            time.monotonic() - child.started_at,
        )

    # Deaths and restarts

    def _on_exit(self, child: ChildProcess) -> None:
        name = child.spec.name
        if self.stopping or self.children.get(name) is not child or child.expected_exit:
            return
        ran_for = time.monotonic() - child.started_at
        deaths = 1 if ran_for >= STABLE_AFTER_SECONDS else self._deaths_in_a_row.get(name, 0) + 1
        self._deaths_in_a_row[name] = deaths
        delay = restart_delay(deaths)
        logger.warning(
            "%s (pid %s) died with %s after %.1f s; restarting it in %.1f s (death %d in a row)",
            name,
            child.pid,
            describe_exit(child.exit_reason),
            ran_for,
            delay,
            deaths,
        )
        self._pending_restarts[name] = self.reactor.callLater(delay, self._restart, name)

    def _restart(self, name: str) -> None:
        self._pending_restarts.pop(name, None)
        spec = self.specs.get(name)
        if self.stopping or spec is None:
            return

        async def restart() -> None:
            child = self.spawn(spec)
            try:
                await self._wait_up(child)
            except ProcessFailedToStart as e:
                if self.stopping or e.child.expected_exit:
                    return  # stopped on purpose meanwhile
                logger.warning("Restarting %s failed: %s", name, e.report())
                # Dead: its exit schedules the next try. Hung: kill it, same.
                if e.child.running:
                    await e.child.stop(0)
                return
            logger.info("Restarted %s (pid %d)", name, child.pid)

        defer.ensureDeferred(restart())

    # Stopping

    async def stop(self, names: Iterable[str]) -> None:
        """Stop processes, the last tier first; those in one tier together."""
        for tier in reversed(self.in_tiers(n for n in names if n in self.children)):
            stops = []
            for spec in tier:
                call = self._pending_restarts.pop(spec.name, None)
                if call is not None and call.active():
                    call.cancel()
                child = self.children.pop(spec.name)
                if child.running:
                    child.expected_exit = True
                    logger.info("Stopping %s (pid %s)", spec.name, child.pid)
                    stops.append(defer.ensureDeferred(self._stop_child(child)))
            await defer.DeferredList(stops)

    async def _stop_child(self, child: ChildProcess) -> None:
        reason = await child.stop(STOP_TIMEOUT_SECONDS)
        # Killed by our SIGTERM: it was still starting (no handler yet), so it
        # had nothing to finish.
        if child.exit_code == 0 or child.exit_signal == signal.SIGTERM:
            logger.info("%s stopped", child.spec.name)
        else:
            logger.warning("%s stopped with %s", child.spec.name, describe_exit(reason))
            self.exit_code = 1

    def stop_all(self) -> Deferred[None]:
        """Stop everything (once; later calls wait for the first)."""
        if self._stopped is None:
            self.stopping = True
            for call in self._pending_restarts.values():
                if call.active():
                    call.cancel()
            self._pending_restarts.clear()
            self._stopped = defer.ensureDeferred(self.stop(list(self.children)))
        waiter: Deferred[None] = defer.Deferred()

        def stopped(result: object) -> object:
            waiter.callback(None)
            return result

        self._stopped.addBoth(stopped)
        return waiter

    # Reporting

    def summary(self, seconds: float) -> list[str]:
        """The lines printed once everything is up."""
        lines = [
            f"synapse-lite: {len(self.children)} processes up in {seconds:.2f} s"
            f" ({self.config.config_files[0]})"
        ]
        for name, spec in self.specs.items():
            child = self.children.get(name)
            pid = f"pid {child.pid}" if child is not None else "not running"
            lines.append(f"  {spec.describe()}  {pid}")
        lines.append(
            "synapse-lite: Ctrl-C or `synapse-lite stop` stops them all;"
            " `synapse-lite status` shows them."
        )
        return lines
