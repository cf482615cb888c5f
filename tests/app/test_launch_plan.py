"""What `synapse-lite run` starts, in what order, and what a reload restarts."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import attr
from twisted.trial import unittest

from synapse_lite.app.launch_plan import (
    TIER_MAIN,
    TIER_OTHERS,
    TIER_ROUTER,
    TIER_WRITERS,
    plan_processes,
    settings_shared_by_all,
)
from synapse_lite.app.launcher import restart_delay
from synapse_lite.app.role import Role
from synapse_lite.config.generate import GenerateOptions, write_config
from synapse_lite.config.homeserver import HomeServerConfig, StreamWriters, load_config
from synapse_lite.config.validation import ConfigError
from synapse_lite.streams.definition import Reader
from tests.harness.launcher import edit_config


def sharded() -> tuple[str, HomeServerConfig]:
    directory = tempfile.mkdtemp()
    path = os.path.join(directory, "homeserver.yaml")
    write_config(GenerateOptions(layout="sharded", base_port=31008), path, directory)
    return path, load_config(path)


class LaunchPlanTestCase(unittest.TestCase):
    def test_tiers_and_roles(self) -> None:
        _, config = sharded()
        specs = plan_processes(config)
        tiers = {spec.name: spec.tier for spec in specs}
        self.assertEqual(tiers["main"], TIER_MAIN)
        self.assertEqual(tiers["persister2"], TIER_WRITERS)
        self.assertEqual(tiers["stream_writer1"], TIER_WRITERS)
        self.assertEqual(tiers["synchrotron2"], TIER_OTHERS)
        self.assertEqual(tiers["router"], TIER_ROUTER)
        self.assertEqual([s.tier for s in specs], sorted(s.tier for s in specs))
        roles = {spec.name: spec.role for spec in specs}
        self.assertEqual(roles["main"], "main process")
        self.assertEqual(roles["persister1"], "events writer")
        self.assertEqual(
            roles["stream_writer1"],
            "writes presence, typing, receipts, account_data, to_device, push_rules, pushers",
        )
        self.assertEqual(roles["synchrotron1"], "client API")
        self.assertEqual(roles["media1"], "media repository")
        self.assertEqual(tiers["media1"], TIER_OTHERS)
        self.assertEqual(roles["router"], "router (the client port)")
        # The client port is the router's; the main process comes after TCP replication.
        self.assertEqual(specs[0].health_url, "http://127.0.0.1:31010/health")
        self.assertEqual(specs[-1].health_url, "http://127.0.0.1:31008/health")
        self.assertIn("--worker-name", specs[-2].argv)
        self.assertIn("synapse_lite.app.router", specs[-1].argv)

    def test_reload_restarts_only_changed_roles(self) -> None:
        path, before = sharded()
        specs_before = {s.name: s for s in plan_processes(before)}

        def add_persister4(config: dict[str, Any]) -> None:
            config["workers"]["persister4"] = {
                "listeners": [{"port": 31099, "resources": ["replication", "health"]}]
            }
            config["stream_writers"]["events"].append("persister4")
            del config["workers"]["persister1"]
            config["stream_writers"]["events"].remove("persister1")

        edit_config(path, add_persister4)
        after = load_config(path)
        specs_after = {s.name: s for s in plan_processes(after)}
        self.assertEqual(settings_shared_by_all(before), settings_shared_by_all(after))
        changed = {n for n, s in specs_before.items() if specs_after.get(n) != s}
        added = {n for n, s in specs_after.items() if specs_before.get(n) != s}
        # The router's routes name the events writers' addresses: it restarts too.
        self.assertEqual(changed, {"persister1", "router"})
        self.assertEqual(added, {"persister4", "router"})

        moved = attr.evolve(
            after,
            stream_writers=StreamWriters(
                {**after.stream_writers.by_key, "typing": ("synchrotron1",)}
            ),
        )
        self.assertNotEqual(settings_shared_by_all(moved), settings_shared_by_all(after))

    def test_reload_after_a_media_change(self) -> None:
        path, before = sharded()
        specs_before = {s.name: s for s in plan_processes(before)}
        edit_config(path, lambda c: c["media"].update(max_upload_size="10M"))
        after = load_config(path)
        changed = {s.name for s in plan_processes(after) if specs_before[s.name] != s}
        # The media settings restart the media worker alone...
        self.assertEqual(changed, {"media1"})
        self.assertEqual(settings_shared_by_all(before), settings_shared_by_all(after))
        # ...moving media restarts everything (each process names it).
        moved = attr.evolve(after, media_instance="synchrotron1")
        self.assertNotEqual(settings_shared_by_all(moved), settings_shared_by_all(after))

    def test_each_process_subscribes_to_what_its_role_reads(self) -> None:
        _, config = sharded()
        reads = {spec.name: spec.reads for spec in plan_processes(config)}
        client = tuple(config.streams.read_by([Reader.CLIENT]))
        self.assertIsNone(reads["main"])  # every stream
        self.assertEqual(reads["media1"], ("caches",))
        for name in ("synchrotron1", "persister1", "stream_writer1"):
            self.assertEqual(reads[name], client, name)
        self.assertNotIn("federation", client)
        self.assertNotIn("pushers", client)

    def test_a_role_change_changes_the_subscription_and_restarts(self) -> None:
        _, config = sharded()
        media_only = Role.of(config, "media1")
        self.assertEqual(media_only.readers, {Reader.MEDIA})
        # Given a stream to write, or pushes to deliver, it reads as a client.
        writing = attr.evolve(media_only, writes_a_stream=True)
        self.assertEqual(writing.readers, {Reader.CLIENT})
        pushing = attr.evolve(media_only, delivers_pushes=True)
        self.assertEqual(pushing.readers, {Reader.CLIENT, Reader.PUSHER})
        self.assertIn("pushers", pushing.subscription(config.streams) or ())
        sender = attr.evolve(Role.of(config, "synchrotron1"), sends_federation=True)
        self.assertIn("federation", sender.subscription(config.streams) or ())
        # media moved away: media1 becomes a reader, and its spec changes.
        moved = attr.evolve(config, media_instance="synchrotron1")
        before = {s.name: s for s in plan_processes(config)}
        after = {s.name: s for s in plan_processes(moved)}
        self.assertIn("events", after["media1"].reads or ())
        self.assertNotEqual(before["media1"], after["media1"])

    def test_missing_health_is_reported_with_its_key(self) -> None:
        path, _ = sharded()
        edit_config(
            path,
            lambda c: c["workers"]["synchrotron2"]["listeners"][0].update(resources=["client"]),
        )
        with self.assertRaises(ConfigError) as cm:
            plan_processes(load_config(path))
        self.assertIn(
            f"{path}: workers.synchrotron2.listeners: synchrotron2 has no listener with the"
            " 'health' resource",
            str(cm.exception),
        )
        self.assertEqual(len(plan_processes(load_config(path), for_running=False)), 9)

    def test_restart_delay_doubles_up_to_a_limit(self) -> None:
        self.assertEqual([restart_delay(n) for n in (1, 2, 3, 4)], [1.0, 2.0, 4.0, 8.0])
        self.assertEqual(restart_delay(20), 30.0)
