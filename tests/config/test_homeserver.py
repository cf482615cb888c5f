"""Loading homeserver configs: good ones load, every mistake is named with its key."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import yaml
from twisted.trial import unittest

from synapse_lite.config.homeserver import MAIN_PROCESS, load_config, load_worker_file
from synapse_lite.config.validation import ConfigError


def write_config(directory: str, data: Any, name: str = "homeserver.yaml") -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        if isinstance(data, str):
            f.write(data)
        else:
            yaml.safe_dump(data, f, sort_keys=False)
    return path


def sharded_config() -> dict[str, Any]:
    return {
        "server_name": "example.org",
        "worker_replication_secret": "s3cret",
        "listeners": [{"port": 8008, "resources": ["client", "replication", "health"]}],
        "workers": {
            "synchrotron1": {"listeners": [{"port": 8010, "resources": ["client"]}]},
            "persister1": {"listeners": [{"port": 8011, "resources": ["replication"]}]},
            "persister2": {"listeners": [{"port": 8012, "resources": ["replication"]}]},
        },
        "stream_writers": {"events": ["persister1", "persister2"], "typing": "persister1"},
    }


class LoadConfigTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp()

    def problems(self, data: Any) -> list[str]:
        path = write_config(self.dir, data)
        with self.assertRaises(ConfigError) as cm:
            load_config(path)
        return [str(p) for p in cm.exception.problems]

    def test_minimal_config_has_sane_defaults(self) -> None:
        config = load_config(write_config(self.dir, {"server_name": "example.org"}))
        self.assertEqual(config.server_name, "example.org")
        self.assertEqual(config.database.engine, "sqlite")
        self.assertEqual(
            config.database.args["path"], os.path.join(self.dir, "data", "homeserver.db")
        )
        self.assertEqual(config.replication.transport, "tcp")
        self.assertEqual(config.writers.writers("events"), (MAIN_PROCESS,))
        self.assertFalse(config.enable_registration)
        self.assertFalse(config.allow_guest_access)
        self.assertEqual(config.instance_names(), [MAIN_PROCESS])
        guests = {"server_name": "example.org", "allow_guest_access": True}
        self.assertTrue(load_config(write_config(self.dir, guests)).allow_guest_access)

    def test_sharded_config(self) -> None:
        config = load_config(write_config(self.dir, sharded_config()))
        self.assertEqual(config.writers.writers("events"), ("persister1", "persister2"))
        self.assertEqual(config.writers.single("typing"), "persister1")
        self.assertEqual(config.location_of("persister2").base_url, "http://127.0.0.1:8012")
        self.assertEqual(config.location_of(MAIN_PROCESS).port, 8008)
        self.assertEqual(
            config.instance_names(), ["main", "synchrotron1", "persister1", "persister2"]
        )

    def test_unknown_key_is_named_with_its_path(self) -> None:
        data = sharded_config()
        data["database"] = {"engine": "sqlite", "args": {"pth": "x.db"}}
        problems = self.problems(data)
        self.assertEqual(len(problems), 1)
        self.assertIn(
            "homeserver.yaml: database.args.pth: is not a known setting here", problems[0]
        )

    def test_every_problem_reported_at_once(self) -> None:
        data = sharded_config()
        data["stream_writers"]["typing"] = "typer"  # unknown writer
        data["stream_writers"]["events"] = ["persister1", "synchrotron1"]  # no replication listener
        data["workers"]["persister2"]["listeners"][0]["port"] = 8008  # port clash
        del data["worker_replication_secret"]
        data["replication"] = {"transport": "carrier-pigeon"}
        problems = "\n".join(self.problems(data))
        self.assertIn(
            "stream_writers.typing: 'typer' is not the main process or a declared worker", problems
        )
        self.assertIn("stream_writers.events[1]: writer 'synchrotron1' has no listener", problems)
        self.assertIn(
            "port 8008 is used by both listeners[0] and workers.persister2.listeners[0]", problems
        )
        self.assertIn("worker_replication_secret: is required when workers are declared", problems)
        self.assertIn(
            "replication.transport: must be one of tcp, redis, not 'carrier-pigeon'", problems
        )

    def test_wrong_types(self) -> None:
        problems = "\n".join(
            self.problems(
                {
                    "server_name": 42,
                    "enable_registration": "yes",
                    "allow_guest_access": 1,
                    "listeners": [{"port": "8008"}],
                    "stream_writers": {"typing": ["a", "b"]},
                }
            )
        )
        self.assertIn("server_name: must be a string, not a integer", problems)
        self.assertIn("enable_registration: must be true or false, not a string", problems)
        self.assertIn("allow_guest_access: must be true or false, not a integer", problems)
        self.assertIn("listeners[0].port: must be an integer, not a string", problems)
        self.assertIn("stream_writers.typing: takes exactly one writer, not 2", problems)

    def test_cache_size(self) -> None:
        default = load_config(write_config(self.dir, {"server_name": "example.org"}))
        self.assertEqual(default.caches.event_cache_entries, 10_000)
        data = {"server_name": "example.org", "caches": {"event_cache_entries": 500}}
        self.assertEqual(load_config(write_config(self.dir, data)).caches.event_cache_entries, 500)
        problems = "\n".join(
            self.problems({"server_name": "example.org", "caches": {"event_cache_entries": 5}})
        )
        self.assertIn("caches.event_cache_entries", problems)
        self.assertIn("100", problems)

    def test_missing_server_name(self) -> None:
        self.assertIn("homeserver.yaml: server_name: is required", self.problems({})[0])

    def test_bad_yaml_names_line(self) -> None:
        problems = self.problems("server_name: [unclosed\nlisteners: 3\n")
        self.assertIn("homeserver.yaml: is not valid YAML (line", problems[0])

    def test_not_a_mapping(self) -> None:
        self.assertIn(
            "must be a mapping of keys to values, not a list", self.problems("- a\n- b\n")[0]
        )

    def test_missing_file(self) -> None:
        with self.assertRaises(ConfigError) as cm:
            load_config(os.path.join(self.dir, "nope.yaml"))
        self.assertIn("nope.yaml: file not found", str(cm.exception))

    def test_worker_in_its_own_file(self) -> None:
        data = sharded_config()
        data["workers"]["persister2"] = {"config_file": "persister2.yaml"}
        write_config(
            self.dir,
            {
                "worker_name": "persister2",
                "worker_listeners": [{"port": 8020, "resources": ["replication"]}],
            },
            "persister2.yaml",
        )
        config = load_config(write_config(self.dir, data))
        self.assertEqual(config.location_of("persister2").port, 8020)

    def test_worker_file_problems_name_that_file(self) -> None:
        data = sharded_config()
        data["workers"]["persister2"] = {"config_file": "persister2.yaml"}
        write_config(
            self.dir, {"worker_name": "persister2", "worker_listners": []}, "persister2.yaml"
        )
        problems = self.problems(data)
        self.assertTrue(
            any("persister2.yaml: worker_listners: is not a known setting" in p for p in problems),
            problems,
        )

    def test_generic_worker_file_overrides_listeners(self) -> None:
        config = load_config(write_config(self.dir, sharded_config()))
        path = write_config(
            self.dir,
            {
                "worker_name": "persister1",
                "worker_listeners": [{"port": 8111, "resources": ["replication"]}],
            },
            "w.yaml",
        )
        config, name = load_worker_file(config, path)
        self.assertEqual(name, "persister1")
        self.assertEqual(config.location_of("persister1").port, 8111)

    def test_generic_worker_file_unknown_worker(self) -> None:
        config = load_config(write_config(self.dir, sharded_config()))
        path = write_config(self.dir, {"worker_name": "ghost"}, "w.yaml")
        with self.assertRaises(ConfigError) as cm:
            load_worker_file(config, path)
        self.assertIn(
            "w.yaml: worker_name: 'ghost' is not declared under 'workers'", str(cm.exception)
        )


class RouterConfigTestCase(unittest.TestCase):
    """The router's section and TLS settings: mistakes named with their key."""

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp()

    def problems(self, data: Any) -> list[str]:
        path = write_config(self.dir, data)
        with self.assertRaises(ConfigError) as cm:
            load_config(path)
        return [str(p).split(": ", 1)[1] for p in cm.exception.problems]

    def routed(self) -> dict[str, Any]:
        config = sharded_config()
        config["router"] = {"listeners": [{"port": 8000, "resources": ["client", "health"]}]}
        return config

    def test_router_loads(self) -> None:
        config = load_config(write_config(self.dir, self.routed()))
        assert config.router is not None
        self.assertEqual(config.router.listeners[0].port, 8000)
        self.assertEqual(config.http_address("router", "client").base_url, "http://127.0.0.1:8000")  # type: ignore[union-attr]

    def test_router_mistakes(self) -> None:
        config = self.routed()
        config["router"]["listeners"][0]["resources"] = ["health", "replication"]
        config["listeners"][0]["port"] = 8000
        del config["worker_replication_secret"]
        config["workers"]["router"] = {"listeners": []}
        problems = self.problems(config)
        self.assertIn(
            "router.listeners[0].resources[1]: unknown resource 'replication'; known: client,"
            " federation, health, metrics",
            problems,
        )
        self.assertIn("router.listeners: needs a listener with the 'client' resource", problems)
        self.assertIn("workers.router: 'router' is the name of the router process", problems)
        self.assertTrue(
            any(
                p.startswith("worker_replication_secret: is required with a router")
                for p in problems
            ),
            problems,
        )
        self.assertIn(
            "router.listeners[0]: port 8000 is used by both listeners[0] and router.listeners[0]",
            problems,
        )

    def test_main_needs_a_client_listener_behind_a_router(self) -> None:
        config = self.routed()
        config["listeners"][0]["resources"] = ["replication", "health"]
        self.assertIn(
            "listeners: the main process needs a listener with the 'client' resource when there"
            " is a router: requests no other process serves go there",
            self.problems(config),
        )

    def test_tls_settings(self) -> None:
        config = sharded_config()
        config["listeners"][0]["tls_certificate_path"] = "cert.pem"
        config["replication"] = {"tcp": {"tls_private_key_path": "key.pem"}}
        config["internal_tls"] = {"ca_path": "nowhere/ca.pem"}
        problems = self.problems(config)
        self.assertIn(
            "listeners[0].tls_private_key_path: is required with the other tls_ setting", problems
        )
        self.assertIn(
            "replication.tcp.tls_certificate_path: is required with the other tls_ setting",
            problems,
        )
        self.assertIn(f"internal_tls.ca_path: cannot read {self.dir}/nowhere/ca.pem", problems)

    def test_internal_ca_only_for_listeners_other_processes_call(self) -> None:
        """A TLS listener that no other process calls (a monolith's client
        and federation port, or a second client port of the main process
        behind a router) needs no ``internal_tls.ca_path``; one the router
        relays to, or one serving replication, does."""
        for name in ("cert.pem", "key.pem"):
            with open(os.path.join(self.dir, name), "w") as f:
                f.write("checked when the listener starts\n")
        tls = {"tls_certificate_path": "cert.pem", "tls_private_key_path": "key.pem"}
        monolith = {
            "server_name": "example.org",
            "listeners": [
                {"port": 8448, "resources": ["client", "federation", "keys"], **tls},
                {"port": 8008, "resources": ["health", "metrics"]},
            ],
        }
        load_config(write_config(self.dir, monolith))

        routed = self.routed()
        routed["listeners"].append({"port": 8448, "resources": ["federation", "keys"], **tls})
        load_config(write_config(self.dir, routed))
        routed["listeners"].append({"port": 8449, "resources": ["client"], **tls})
        load_config(write_config(self.dir, routed))

        relayed_to = self.routed()
        relayed_to["listeners"][0].update(tls)
        problems = self.problems(relayed_to)
        self.assertIn(
            "internal_tls.ca_path: is required when the processes use TLS between them (main's"
            " listener on port"
            " 8008): the CA that signed their certificates, so that each can check the others'",
            problems,
        )
        replication = sharded_config()
        replication["workers"]["persister1"]["listeners"][0].update(tls)
        self.assertIn(
            "internal_tls.ca_path: is required when the processes use TLS between them"
            " (persister1's listener on"
            " port 8011): the CA that signed their certificates, so that each can check the"
            " others'",
            self.problems(replication),
        )
