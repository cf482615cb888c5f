"""bench.reference_follow's pure parts: its command line and the configs it
gives the reference's main process and pure-follower worker. Nothing here
starts the reference (``bench.follow_cost --reference`` does, by hand)."""

from __future__ import annotations

import contextlib
import io
import shutil
from unittest import mock

import yaml
from twisted.trial import unittest

from bench import follow_cost, reference_follow
from bench.reference_follow import WORKER, ReferenceCluster, parse_args
from bench.reference_homeserver import ReferenceHomeserver


class CommandLineTestCase(unittest.TestCase):
    def test_help_is_help(self) -> None:
        # It was once taken for the reference's python.
        out = io.StringIO()
        with contextlib.redirect_stdout(out), self.assertRaises(SystemExit) as exited:
            parse_args(["--help"])
        self.assertEqual(exited.exception.code, 0)
        self.assertIn("usage: python -m bench.reference_follow", out.getvalue())

    def test_python_and_rates(self) -> None:
        args = parse_args(["/ref/bin/python", "--rate", "40", "--rate", "200", "--seconds", "8"])
        self.assertEqual(
            (args.python, args.rates, args.seconds), ("/ref/bin/python", [40.0, 200.0], 8.0)
        )

    def test_defaults_to_the_workers_install(self) -> None:
        with mock.patch.object(reference_follow, "installed_workers_python", lambda: "/w/python"):
            args = parse_args([])
        self.assertEqual((args.python, args.rates, args.seconds), ("/w/python", [40.0, 200.0], 10))

    def test_without_any_reference_says_how_to_install_it(self) -> None:
        err = io.StringIO()
        with (
            mock.patch.object(reference_follow, "installed_workers_python", lambda: None),
            contextlib.redirect_stderr(err),
            self.assertRaises(SystemExit) as exited,
        ):
            parse_args([])
        self.assertEqual(exited.exception.code, 2)
        self.assertIn("synapse_install.py --workers", err.getvalue())

    def test_follow_cost_reference_alone_takes_the_workers_install(self) -> None:
        err = io.StringIO()
        with (
            mock.patch.object(follow_cost, "installed_workers_python", lambda: None),
            contextlib.redirect_stderr(err),
            self.assertRaises(SystemExit) as exited,
        ):
            follow_cost.main(["--reference", "--rate", "40"])
        self.assertEqual(exited.exception.code, 2)
        self.assertIn("synapse_install.py --workers", err.getvalue())


class ConfigTestCase(unittest.TestCase):
    def _cluster(self) -> ReferenceCluster:
        return self._cleaned(ReferenceCluster("/ref/bin/python", reference_follow.ADMIN_DATABASE))

    def _cleaned(self, cluster: ReferenceCluster) -> ReferenceCluster:
        """``cluster``, its scratch directory removed after the test."""
        self.addCleanup(shutil.rmtree, cluster.dir, True)
        return cluster

    def test_worker_follows_main_over_redis(self) -> None:
        cluster = self._cluster()
        main, worker = cluster.main_config(), cluster.worker_config()
        self.assertEqual(main["redis"]["enabled"], True)
        self.assertEqual(main["instance_map"]["main"]["port"], cluster.replication_port)
        self.assertIn(
            ["replication"],
            [r["names"] for listener in main["listeners"] for r in listener["resources"]],
        )
        self.assertEqual(main["database"]["name"], "psycopg2")
        self.assertEqual(main["database"]["args"]["database"], cluster.db_name)
        self.assertEqual(worker["worker_app"], "synapse.app.generic_worker")
        self.assertEqual(worker["worker_name"], WORKER)
        self.assertEqual(worker["worker_listeners"][0]["port"], cluster.worker_port)

    def test_runs_do_not_share_redis_channels(self) -> None:
        # The reference names its Redis channels after the server.
        self.assertNotEqual(self._cluster().server_name, self._cluster().server_name)

    def test_written_configs_are_the_built_ones(self) -> None:
        cluster = self._cluster()
        main_path, worker_path = cluster._write_config()
        with open(main_path) as f:
            self.assertEqual(yaml.safe_load(f), cluster.main_config())
        with open(worker_path) as f:
            self.assertEqual(yaml.safe_load(f), cluster.worker_config())

    def test_lone_homeserver_has_no_replication(self) -> None:
        main = self._cleaned(ReferenceHomeserver("/ref/bin/python", "sqlite")).main_config()
        self.assertEqual(main["redis"], {"enabled": False})
        self.assertNotIn("instance_map", main)
        self.assertEqual(len(main["listeners"]), 1)
        self.assertEqual(main["database"]["name"], "sqlite3")


class PrintReferenceTestCase(unittest.TestCase):
    def test_ratio_and_the_rate_its_main_reached(self) -> None:
        reference = {
            40.0: {"achieved": 39.1, "ms_per_event": {"main": 22.4, WORKER: 1.25}},
            200.0: {"achieved": 81.6, "ms_per_event": {"main": 10.9, WORKER: 0.33}},
        }
        ours = {"rates": {r: {"ms_per_event": {"synchrotron1": 0.25}} for r in (40.0, 200.0)}}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            follow_cost.print_reference(reference, ours)
        at_40, at_200 = out.getvalue().strip().splitlines()[1:]
        self.assertIn("reference / ours 5.00;", at_40)
        self.assertNotIn("not at the same rate", at_40)
        self.assertIn("reference / ours 1.32 (not at the same rate", at_200)
