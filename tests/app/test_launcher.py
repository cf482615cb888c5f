"""``synapse-lite run`` as an operator uses it: real processes, real ports.

Startup times are printed, never asserted (the machine may be busy).
"""

from __future__ import annotations

import os
import signal
import socket
import time

from twisted.trial import unittest

from synapse_lite.app.pid_files import pid_alive
from synapse_lite.config.generate import DEFAULT_BASE_PORT, DEFAULT_DATA_DIR
from synapse_lite.config.homeserver import load_config
from tests.harness.databases import END_TO_END, one_engine_only
from tests.harness.launcher import SynapseLiteCommand, http_get, launch, temp_dir
from tests.harness.polling import eventually

DEFAULT_PROCESSES = ("main", "synchrotron1", "persister1", "persister2", "media1", "router")


def ports_free(ports: list[int]) -> bool:
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


async def health_of_all(config_path: str) -> dict[str, int]:
    """name -> /health status code, for every process of the config."""
    from synapse_lite.app.launch_plan import plan_processes

    codes = {}
    for spec in plan_processes(load_config(config_path)):
        code, body = await http_get(spec.health_url)
        codes[spec.name] = code
        assert spec.name.encode() in body, body
    return codes


class DefaultCommandTestCase(unittest.TestCase):
    """The README's command, `synapse-lite run`, in an empty directory."""

    timeout = 180

    async def test_default_command_from_empty_directory(self) -> None:
        # The default command always runs on SQLite, whatever the run's engine.
        one_engine_only("sqlite", END_TO_END)
        default_ports = list(range(DEFAULT_BASE_PORT, DEFAULT_BASE_PORT + 8))
        if not ports_free(default_ports):
            raise unittest.SkipTest(f"the default ports {default_ports} are in use")
        directory = temp_dir()
        data_dir = os.path.join(directory, DEFAULT_DATA_DIR)
        started = time.monotonic()
        command = SynapseLiteCommand(self, ["run"], directory, data_dir).start()
        up = await command.wait_for_line(r"(\d+) processes up in ([0-9.]+) s")
        wall = time.monotonic() - started
        print(f"\n  default layout: every process healthy {wall:.2f} s after the command")
        self.assertEqual(up.group(1), "6")
        self.assertIn("first run: wrote a config for the default layout", command.output())

        config_path = os.path.join(data_dir, "homeserver.yaml")
        self.assertEqual(
            await health_of_all(config_path), {name: 200 for name in DEFAULT_PROCESSES}
        )
        self.assertEqual(set(command.running_pids()), {"launcher", *DEFAULT_PROCESSES})
        # Every process's lines carry its name.
        for name in DEFAULT_PROCESSES:
            self.assertTrue(any(f" {name} INFO " in line for line in command.stdout), name)

        status = SynapseLiteCommand(self, ["status"], directory, data_dir).start()
        self.assertEqual(await status.wait_exit(), 0, status.output())
        for name in DEFAULT_PROCESSES:
            line = next(line for line in status.stdout if line.startswith(name + " "))
            self.assertIn(" running ", line)
            self.assertIn(" ok ", line)
        persister_line = next(line for line in status.stdout if line.startswith("persister1"))
        self.assertRegex(persister_line, r"events=\d+ backfill=-?\d+")

        command.signal(signal.SIGTERM)
        self.assertEqual(await command.wait_exit(), 0, command.tail())
        self.assertEqual(command.running_pids(), {})
        self.assertTrue(ports_free(default_ports))
        # Workers stop before the main process.
        stopped = [
            line.split()[-2]
            for line in command.stdout
            if line.endswith(" stopped") and " launcher " in line
        ]
        self.assertEqual(stopped[-1], "main")
        self.assertEqual(set(stopped), set(DEFAULT_PROCESSES))

        # The second run reuses the config (and so the database).
        again = SynapseLiteCommand(self, ["run"], directory, data_dir).start()
        await again.wait_for_line(r"processes up in")
        self.assertNotIn("first run", again.output())
        again.signal(signal.SIGTERM)
        self.assertEqual(await again.wait_exit(), 0, again.tail())


class LauncherTestCase(unittest.TestCase):
    """The launcher on free ports, on SQLite (the engine of its default)."""

    timeout = 180

    def setUp(self) -> None:
        one_engine_only("sqlite", END_TO_END)

    async def test_killed_worker_is_restarted_and_ctrl_c_stops_everything(self) -> None:
        server = await launch(self)
        command = server.command
        old_pid = command.running_pids()["persister1"]
        before_kill = command.mark()
        os.kill(old_pid, signal.SIGKILL)
        await command.wait_for_line(
            r"persister1 \(pid \d+\) died with signal 9 \(SIGKILL\).*restarting it in"
        )
        await command.wait_for_line(r"Restarted persister1 \(pid \d+\)")
        new_pid = command.running_pids()["persister1"]
        self.assertNotEqual(new_pid, old_pid)
        self.assertEqual(
            await health_of_all(server.config_path), {name: 200 for name in DEFAULT_PROCESSES}
        )
        # It is back on replication: main knows it again.
        await command.wait_for_line(
            r" main .*connection .* is persister1", timeout=30, after=before_kill
        )

        command.signal(signal.SIGINT)  # Ctrl-C
        self.assertEqual(await command.wait_exit(), 0, command.tail())
        self.assertEqual(command.running_pids(), {})

    async def test_processes_stop_when_the_launcher_is_killed(self) -> None:
        command = (await launch(self, layout="monolith")).command
        main_pid = command.running_pids()["main"]
        command.signal(signal.SIGKILL)
        await command.wait_exit()
        await eventually(lambda: not pid_alive(main_pid), what="main to stop", timeout=20)
        self.assertEqual(command.running_pids(), {})

    async def test_sharded_layout_starts_and_stops(self) -> None:
        server = await launch(self, layout="sharded")
        names = list(server.specs())
        self.assertEqual(len(names), 13)
        self.assertEqual(await health_of_all(server.config_path), {name: 200 for name in names})
        status = server.run_command(self, "status")
        self.assertEqual(await status.wait_exit(), 0, status.output())
        stream_writer = next(line for line in status.stdout if line.startswith("stream_writer1"))
        self.assertRegex(stream_writer, r"receipts=\d+ account_data=\d+ to_device=\d+")
        # The federation roles, as the plan describes them.
        specs = server.specs()
        self.assertIn("federation reader", specs["federation_reader2"].role)
        self.assertIn("federation sender", specs["federation_sender1"].role)
        stop = server.run_command(self, "stop")
        self.assertEqual(await stop.wait_exit(), 0, stop.output())
        self.assertEqual(await server.command.wait_exit(), 0, server.command.tail())
        self.assertEqual(server.command.running_pids(), {})
