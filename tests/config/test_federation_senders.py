"""``federation_sender_instances`` (and the older ``federation_sender``):
defaults, the shapes allowed, clear errors; and what a reload restarts
when the senders change."""

from __future__ import annotations

import tempfile
from typing import Any

from twisted.trial import unittest

from synapse_lite.app.launch_plan import plan_processes, settings_shared_by_all
from synapse_lite.config.homeserver import load_config
from synapse_lite.config.validation import ConfigError
from tests.config.test_homeserver import sharded_config, write_config


def with_senders(**changes: Any) -> dict[str, Any]:
    data = sharded_config()
    for name in ("fs1", "fs2", "fs3"):
        data["workers"][name] = {"listeners": [{"port": 0, "resources": ["health"]}]}
    data.update(changes)
    return data


class FederationSenderInstancesTestCase(unittest.TestCase):
    def load(self, **changes: Any) -> Any:
        return load_config(write_config(tempfile.mkdtemp(), with_senders(**changes)))

    def test_default_and_named(self) -> None:
        self.assertEqual(self.load().federation_sender_instances, ("main",))
        self.assertEqual(self.load(federation_sender="fs1").federation_sender_instances, ("fs1",))
        config = self.load(federation_sender_instances=["fs1", "fs2"])
        self.assertEqual(config.federation_sender_instances, ("fs1", "fs2"))
        self.assertEqual(
            self.load(federation_sender_instances="fs2").federation_sender_instances, ("fs2",)
        )

    def test_bad_values_are_refused_with_the_reason(self) -> None:
        cases: list[tuple[dict[str, Any], str, str]] = [
            (
                {"federation_sender_instances": ["nobody"]},
                "federation_sender_instances",
                "'nobody' is not the main process or a declared worker",
            ),
            (
                {"federation_sender": "nobody"},
                "federation_sender",
                "'nobody' is not the main process or a declared worker",
            ),
            (
                {"federation_sender_instances": ["fs1", "fs1"]},
                "federation_sender_instances",
                "must name one or more processes, each once",
            ),
            (
                {"federation_sender_instances": []},
                "federation_sender_instances",
                "must name one or more processes, each once",
            ),
            (
                {"federation_sender_instances": ["main", "fs1"]},
                "federation_sender_instances",
                "the main process sends alone or not at all",
            ),
            (
                {"federation_sender_instances": ["fs1"], "federation_sender": "fs2"},
                "federation_sender",
                "give federation_sender_instances or the older federation_sender, not both",
            ),
        ]
        for changes, key, reason in cases:
            with self.subTest(changes=changes):
                with self.assertRaises(ConfigError) as raised:
                    self.load(**changes)
                self.assertIn(f"{key}: {reason}", str(raised.exception))


class ReloadTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.directory = tempfile.mkdtemp()  # one config file, edited

    def plan(self, senders: list[str]) -> tuple[Any, dict[str, Any]]:
        data = with_senders(federation_sender_instances=senders)
        for i, name in enumerate(data["workers"]):
            # Fixed ports, as synapse-lite run needs.
            for listener in data["workers"][name]["listeners"]:
                listener["port"] = 32000 + i
        config = load_config(write_config(self.directory, data))
        return config, {spec.name: spec for spec in plan_processes(config, for_running=False)}

    def test_adding_or_removing_a_sender_restarts_only_the_senders(self) -> None:
        two, before = self.plan(["fs1", "fs2"])
        three, after = self.plan(["fs1", "fs2", "fs3"])
        self.assertEqual(settings_shared_by_all(two), settings_shared_by_all(three))
        changed = {name for name in before if after[name] != before[name]}
        # fs3 was a worker already (not sending): it restarts as a sender.
        self.assertEqual(changed, {"fs1", "fs2", "fs3"})
        self.assertIn("federation sender", after["fs3"].role)
        one, fewer = self.plan(["fs2"])
        self.assertEqual(settings_shared_by_all(one), settings_shared_by_all(two))
        self.assertEqual({n for n in before if fewer[n] != before[n]}, {"fs1", "fs2"})

    def test_moving_sending_to_or_from_main_restarts_everything(self) -> None:
        main, _ = self.plan(["main"])
        workers, _ = self.plan(["fs1"])
        self.assertNotEqual(settings_shared_by_all(main), settings_shared_by_all(workers))
