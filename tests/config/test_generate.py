"""`synapse-lite generate-config`: every layout, database and replication
choice gives a config that loads, validates and can be launched."""

from __future__ import annotations

import itertools
import os
import tempfile

import yaml
from twisted.trial import unittest

from synapse_lite.app.cli import dispatch
from synapse_lite.app.launch_plan import plan_processes
from synapse_lite.config.generate import LAYOUTS, GenerateOptions, write_config
from synapse_lite.config.homeserver import MAIN_PROCESS, load_config


class GenerateConfigTestCase(unittest.TestCase):
    def test_every_combination_loads_and_can_be_launched(self) -> None:
        for layout, database, replication, worker_files in itertools.product(
            LAYOUTS, ("sqlite", "postgres"), ("tcp", "redis"), (False, True)
        ):
            with self.subTest(layout=layout, db=database, repl=replication, files=worker_files):
                directory = tempfile.mkdtemp()
                path = os.path.join(directory, "homeserver.yaml")
                options = GenerateOptions(
                    layout=layout,
                    database=database,
                    replication=replication,
                    worker_files=worker_files,
                    base_port=30008,
                )
                written = write_config(options, path, os.path.join(directory, "data"))
                config = load_config(path)
                specs = plan_processes(config)  # every process has /health

                self.assertEqual(config.database.engine, database)
                self.assertEqual(config.replication.transport, replication)
                self.assertEqual(config.data_dir, os.path.join(directory, "data"))
                self.assertEqual(specs[0].name, MAIN_PROCESS)
                self.assertTrue(all(spec.metrics_url for spec in specs))
                ports = [lst.port for spec in specs for lst in spec.listeners]
                self.assertEqual(len(ports), len(set(ports)))
                client_port = specs[-1].listeners[0].port
                self.assertEqual(client_port, 30008)
                workers = {"monolith": 0, "default": 4, "sharded": 11}[layout]
                routed = workers > 0  # a router in front, on the client port
                self.assertEqual(len(specs), 1 + workers + routed)
                # homeserver.yaml, the worker files, prometheus.yml
                self.assertEqual(len(written), 1 + (workers if worker_files else 0) + 1)
                self.assertEqual(specs[-1].name, "router" if routed else MAIN_PROCESS)
                if workers:
                    self.assertTrue(config.worker_replication_secret)
                    self.assertTrue(config.location_of(MAIN_PROCESS))

    def test_layouts_assign_writers(self) -> None:
        directory = tempfile.mkdtemp()
        path = os.path.join(directory, "homeserver.yaml")
        write_config(GenerateOptions(layout="sharded"), path, directory)
        config = load_config(path)
        self.assertEqual(
            config.writers.writers("events"), ("persister1", "persister2", "persister3")
        )
        self.assertEqual(config.writers.single("typing"), "stream_writer1")
        self.assertEqual(config.writers.single("presence"), "stream_writer1")
        self.assertFalse(config.enable_registration)
        self.assertNotEqual(config.worker_replication_secret, config.registration_shared_secret)

    def test_comments_and_registration_flag(self) -> None:
        directory = tempfile.mkdtemp()
        path = os.path.join(directory, "homeserver.yaml")
        write_config(GenerateOptions(enable_registration=True), path, directory)
        with open(path) as f:
            text = f.read()
        self.assertIn("# Which process writes which stream", text)
        self.assertIn("docs/configuration.md", text)
        self.assertTrue(yaml.safe_load(text)["enable_registration"])
        self.assertIs(yaml.safe_load(text)["allow_guest_access"], False)

    def test_command_refuses_to_overwrite(self) -> None:
        directory = tempfile.mkdtemp()
        args = ["generate-config", "--data-dir", directory, "--layout", "monolith"]
        self.assertEqual(dispatch(args), 0)
        self.assertEqual(dispatch(args), 1)
        config = load_config(os.path.join(directory, "homeserver.yaml"))
        self.assertEqual(config.instance_names(), [MAIN_PROCESS])
