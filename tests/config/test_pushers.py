"""``pusher_instances``: its default, and a clear error for a bad one."""

from __future__ import annotations

import tempfile
from typing import Any

from twisted.trial import unittest

from synapse_lite.config.homeserver import load_config
from synapse_lite.config.validation import ConfigError
from synapse_lite.handlers.pusher_delivery import owner_of
from tests.config.test_homeserver import sharded_config, write_config


class PusherInstancesTestCase(unittest.TestCase):
    def load(self, **changes: Any) -> Any:
        data = sharded_config()
        data.update(changes)
        return load_config(write_config(tempfile.mkdtemp(), data))

    def test_default_and_named(self) -> None:
        self.assertEqual(self.load().pusher_instances, ("main",))
        workers = list(sharded_config()["workers"])
        config = self.load(pusher_instances=["main", workers[0]])
        self.assertEqual(config.pusher_instances, ("main", workers[0]))
        self.assertEqual(self.load(pusher_instances=workers[0]).pusher_instances, (workers[0],))

    def test_bad_names_are_refused_with_the_reason(self) -> None:
        for value, reason in [
            (["nobody"], "'nobody' is not the main process or a declared worker"),
            (["main", "main"], "must name one or more processes, each once"),
            ([], "must name one or more processes, each once"),
            ([3], "must be a string"),
        ]:
            with self.assertRaises(ConfigError) as raised:
                self.load(pusher_instances=value)
            self.assertIn(reason, str(raised.exception))
            self.assertIn("pusher_instances", str(raised.exception))

    def test_each_pusher_has_one_stable_owner(self) -> None:
        instances = ["main", "pusher1", "pusher2"]
        keys = [("org.app", f"key{i}", f"@u{i}:x") for i in range(300)]
        owners = [owner_of(k, instances) for k in keys]
        self.assertEqual(owners, [owner_of(k, list(instances)) for k in keys])
        # Spread over every instance.
        self.assertEqual(set(owners), set(instances))
