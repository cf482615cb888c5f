"""Applying an edited config to running processes (``synapse-lite reload``).

Only the processes whose :class:`ProcessSpec` changed (listeners, streams
written, address) are stopped and started again, plus those removed or added.
An events writer taken out of ``stream_writers.events`` is retired through the
main process once it has stopped, so the others read the rest of its rows and
stop waiting for it. A change to a setting every process uses (database,
replication, secrets, single-writer streams, ...) restarts everything.
"""

from __future__ import annotations

import logging

from synapse_lite.app.admin_client import AdminRequestError, retire_events_writer
from synapse_lite.app.child_process import ProcessFailedToStart
from synapse_lite.app.launch_plan import only_these, plan_processes, settings_shared_by_all
from synapse_lite.app.launcher import Launcher
from synapse_lite.config.homeserver import MAIN_PROCESS, load_config
from synapse_lite.config.validation import ConfigError

logger = logging.getLogger(__name__)


async def reload(launcher: Launcher) -> None:
    """Read the config file again and apply it. A bad config changes nothing."""
    if launcher.stopping:
        return
    if launcher.busy is not None:
        logger.warning("Not reloading: %s", launcher.busy)
        return
    launcher.busy = "a reload is under way"
    try:
        await _reload(launcher)
    finally:
        launcher.busy = None


async def _reload(launcher: Launcher) -> None:
    path = launcher.config.config_files[0]
    try:
        config = load_config(path)
        specs = only_these(plan_processes(config), launcher.only)
        new_specs = {spec.name: spec for spec in specs}
    except (ConfigError, ValueError) as e:
        logger.error("Not reloading: %s", e)
        return
    old_config, old_specs = launcher.config, launcher.specs
    retiring: list[str] = []
    if settings_shared_by_all(config) != settings_shared_by_all(old_config):
        logger.info("Settings every process uses changed: restarting every process")
        going, coming = list(old_specs), list(new_specs)
    else:
        going = [name for name, spec in old_specs.items() if new_specs.get(name) != spec]
        coming = [name for name, spec in new_specs.items() if old_specs.get(name) != spec]
        retiring = [
            name
            for name in going
            if name != MAIN_PROCESS
            and name in old_config.writers.writers("events")
            and name not in config.writers.writers("events")
        ]
    if not going and not coming:
        logger.info("Reloaded %s: no process changed", path)
        return
    logger.info(
        "Reloading %s: stopping %s; starting %s",
        path,
        ", ".join(going) or "nothing",
        ", ".join(coming) or "nothing",
    )
    await launcher.stop(name for name in going if name != MAIN_PROCESS)
    if MAIN_PROCESS in going:
        await launcher.stop([MAIN_PROCESS])
    launcher.config, launcher.specs = config, new_specs
    try:
        await launcher.start(coming)
    except ProcessFailedToStart as e:
        # It is restarted with backoff like any process that dies.
        logger.error("%s", e.report())
    for name in retiring:
        await _retire(launcher, name)
    logger.info("Reload of %s done", path)


async def _retire(launcher: Launcher, name: str) -> None:
    try:
        answer = await retire_events_writer(launcher.reactor, launcher.config, name)
    except AdminRequestError as e:
        logger.error(
            "Retiring the events writer %s failed: %s. Once the main process is up, run:"
            " synapse-lite retire-events-writer %s -c %s",
            name,
            e,
            name,
            launcher.config.config_files[0],
        )
        return
    logger.info(
        "Retired the events writer %s; events writers now: %s; rooms moved: %s",
        name,
        ", ".join(answer.get("events_writers", [])),
        answer.get("rooms_moved"),
    )
