"""Adding and removing an events writer with `synapse-lite reload`: only the
process whose role changed starts or stops (and the router, whose routes name
the events writers); every other process keeps running and learns of the
change."""

from __future__ import annotations

import signal
from typing import Any

from twisted.trial import unittest

from synapse_lite.app.launch_plan import plan_processes
from synapse_lite.app.status import parse_positions
from synapse_lite.config.homeserver import load_config
from tests.harness.databases import END_TO_END, one_engine_only
from tests.harness.launcher import edit_config, http_get, launch
from tests.harness.polling import eventually


async def events_writers_seen_by_all(config_path: str) -> dict[str, set[str]]:
    """For each process reading the events stream: the events writers its
    /metrics reports positions of."""
    seen = {}
    for spec in plan_processes(load_config(config_path)):
        assert spec.metrics_url is not None
        if spec.reads is not None and "events" not in spec.reads:
            continue  # the media worker and the router track no events writer
        _, body = await http_get(spec.metrics_url)
        text = body.decode()
        seen[spec.name] = {
            writer
            for writer in ("persister1", "persister2", "persister3")
            if "events" in parse_positions(text, writer)
        }
    return seen


class ReloadTestCase(unittest.TestCase):
    timeout = 180

    async def test_add_then_remove_an_events_writer(self) -> None:
        one_engine_only("sqlite", END_TO_END)
        server = await launch(self)
        command, config_path = server.command, server.config_path
        before = command.running_pids()

        async def reload() -> None:
            request = server.run_command(self, "reload")
            self.assertEqual(await request.wait_exit(), 0, request.output())

        # Add persister3: a new worker and a new events writer (on the free port
        # after the router's federation port).
        port = load_config(config_path).listeners[0].port + 7

        def add(config: dict[str, Any]) -> None:
            config["workers"]["persister3"] = {
                "listeners": [{"port": port, "resources": ["replication", "health", "metrics"]}]
            }
            config["stream_writers"]["events"].append("persister3")

        edit_config(config_path, add)
        await reload()
        await command.wait_for_line(r"Reload of .* done")
        running = command.running_pids()
        # Nobody else restarted, but the router (its routes changed).
        self.assertNotEqual(running["router"], before["router"])
        others = {n: pid for n, pid in before.items() if n != "router"}
        self.assertEqual({n: running[n] for n in others}, others)
        self.assertIn("persister3", running)
        everyone = {"persister1", "persister2", "persister3"}

        async def all_know(writers: set[str]) -> bool:
            return all(
                seen == writers for seen in (await events_writers_seen_by_all(config_path)).values()
            )

        await eventually(lambda: all_know(everyone), 30, "every process to track persister3", 0.2)

        # Remove persister2: only it stops; the others forget it.
        def remove(config: dict[str, Any]) -> None:
            del config["workers"]["persister2"]
            config["stream_writers"]["events"].remove("persister2")

        edit_config(config_path, remove)
        await reload()
        await command.wait_for_line(r"Retired the events writer persister2")
        running = command.running_pids()
        self.assertNotIn("persister2", running)
        for name in ("launcher", "main", "synchrotron1", "persister1"):
            self.assertEqual(running[name], before[name], name)
        await eventually(
            lambda: all_know({"persister1", "persister3"}), 30, "everyone to forget persister2", 0.2
        )
        status = server.run_command(self, "status")
        self.assertEqual(await status.wait_exit(), 0, status.output())

        # A config with a mistake changes nothing: `reload` says so, and so
        # does the launcher if signalled anyway.
        edit_config(config_path, lambda config: config.update(server_name=7))
        request = server.run_command(self, "reload")
        self.assertEqual(await request.wait_exit(), 2)
        self.assertIn("server_name: must be a string", request.output())
        command.signal(signal.SIGHUP)
        await command.wait_for_line(r"Not reloading: .*server_name: must be a string")
        self.assertEqual(command.running_pids(), running)

        command.signal(signal.SIGTERM)
        self.assertEqual(await command.wait_exit(), 0, command.tail())
        self.assertEqual(command.running_pids(), {})
