"""`synapse-lite run` refusing to run: every config error is reported with its
file and key, the exit code is non-zero, and no process is left running."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

from twisted.trial import unittest

from synapse_lite.config.homeserver import load_config
from tests.harness.launcher import SynapseLiteCommand, edit_config, generated_config, temp_dir

Edit = Callable[[dict[str, Any]], Any]


def _listener(config: dict[str, Any], name: str) -> dict[str, Any]:
    if name == "main":
        return config["listeners"][0]
    listener: dict[str, Any] = config["workers"][name]["listeners"][0]
    return listener


def _set_port_of_persister2_to_mains(config: dict[str, Any]) -> None:
    _listener(config, "persister2")["port"] = _listener(config, "main")["port"]


class RunRefusesTestCase(unittest.TestCase):
    timeout = 120

    def setUp(self) -> None:
        self.dir = temp_dir()
        self.config_path = generated_config(self.dir)

    async def run_expecting(self, edit: Edit | None, exit_code: int, *messages: str) -> str:
        if edit is not None:
            edit_config(self.config_path, edit)
        command = SynapseLiteCommand(self, ["run", "-c", self.config_path], self.dir, self.dir)
        self.assertEqual(await command.start().wait_exit(), exit_code, command.output())
        output = command.output()
        for message in messages:
            self.assertIn(message, output)
        self.assertEqual(command.running_pids(), {})
        return output

    async def test_unknown_writer_name(self) -> None:
        await self.run_expecting(
            lambda c: c["stream_writers"].update(typing="typer"),
            2,
            f"{self.config_path}: stream_writers.typing: 'typer' is not the main process"
            " or a declared worker",
        )

    async def test_writer_without_replication_listener(self) -> None:
        await self.run_expecting(
            lambda c: _listener(c, "persister1").update(resources=["health", "metrics"]),
            2,
            "stream_writers.events[0]: writer 'persister1' has no listener with the"
            " 'replication' resource",
        )

    async def test_two_processes_on_one_port(self) -> None:
        await self.run_expecting(
            _set_port_of_persister2_to_mains,
            2,
            "is used by both listeners[0] and workers.persister2.listeners[0]",
        )

    async def test_missing_secret_with_workers(self) -> None:
        await self.run_expecting(
            lambda c: c.pop("worker_replication_secret"),
            2,
            "worker_replication_secret: is required when workers are declared",
        )

    async def test_process_without_health_listener(self) -> None:
        await self.run_expecting(
            lambda c: _listener(c, "synchrotron1").update(resources=["client"]),
            2,
            "workers.synchrotron1.listeners: synchrotron1 has no listener with the 'health'"
            " resource",
        )

    async def test_problem_in_a_worker_file_names_that_file(self) -> None:
        worker_file = os.path.join(self.dir, "persister2.yaml")
        with open(worker_file, "w") as f:
            f.write("worker_name: persister2\nworker_listners: []\n")
        await self.run_expecting(
            lambda c: c["workers"].update(persister2={"config_file": "persister2.yaml"}),
            2,
            f"{worker_file}: worker_listners: is not a known setting here",
        )

    async def test_missing_config_file(self) -> None:
        self.config_path = os.path.join(self.dir, "nowhere.yaml")
        await self.run_expecting(None, 2, "nowhere.yaml: file not found")

    async def test_port_in_use(self) -> None:
        port = load_config(self.config_path).listeners[0].port
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", port))
            busy.listen()
            await self.run_expecting(
                None,
                1,
                f"port {port} (main's listener on 127.0.0.1) is in use by another program",
            )

    async def test_process_failing_to_start_stops_the_others(self) -> None:
        # An address this machine does not have: only the process finds out.
        output = await self.run_expecting(
            lambda c: _listener(c, "persister2").update(bind_address="192.0.2.1"),
            1,
            "persister2 exited with exit code 1",
            "Its last output:",
            "Stopping main",
        )
        self.assertIn("192.0.2.1", output.split("Its last output:")[1])


class OnlySomeProcessesTestCase(unittest.TestCase):
    """`run --only`: the processes of one machine."""

    def test_only_these(self) -> None:
        from synapse_lite.app.launch_plan import only_these, plan_processes
        from synapse_lite.config.homeserver import load_config

        specs = plan_processes(load_config(generated_config(temp_dir())))
        self.assertEqual(
            [s.name for s in only_these(specs, ("router", "main"))], ["main", "router"]
        )
        self.assertEqual(only_these(specs, None), specs)
        with self.assertRaises(ValueError) as raised:
            only_these(specs, ("main", "nobody"))
        self.assertIn("--only names nobody, not a process of this config", str(raised.exception))

    async def test_unknown_name_is_refused(self) -> None:
        directory = temp_dir()
        path = generated_config(directory)
        command = SynapseLiteCommand(
            self, ["run", "-c", path, "--only", "main,persister9"], directory, directory
        )
        self.assertEqual(await command.start().wait_exit(), 2, command.output())
        self.assertIn("--only names persister9", command.output())
