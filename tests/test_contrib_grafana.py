"""contrib/grafana/synapse_lite.json plots only metrics that exist, selected
by the instance/job/index labels the generated prometheus.yml sets."""

from __future__ import annotations

import json
import os
import re
import tempfile

import yaml
from prometheus_client import Counter, Gauge, Histogram
from twisted.trial import unittest

from synapse_lite import metrics
from synapse_lite.config.generate import GenerateOptions, write_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASHBOARD = os.path.join(ROOT, "contrib", "grafana", "synapse_lite.json")


def exported_names() -> set[str]:
    """Every series name our metrics export."""
    names: set[str] = set()
    for value in vars(metrics).values():
        if isinstance(value, Counter):
            names.add(value._name + "_total")
        elif isinstance(value, Histogram):
            names.update(value._name + s for s in ("_bucket", "_sum", "_count"))
        elif isinstance(value, Gauge):
            names.add(value._name)
    return names


class DashboardTestCase(unittest.TestCase):
    def setUp(self) -> None:
        with open(DASHBOARD) as f:
            self.dashboard = json.load(f)
        self.expressions = [
            target["expr"]
            for panel in self.dashboard["panels"]
            for target in panel.get("targets", [])
        ]

    def test_every_metric_exists(self) -> None:
        names = exported_names()
        used = {m for e in self.expressions for m in re.findall(r"synapse_lite_\w+", e)}
        self.assertTrue(used)
        self.assertEqual(used - names, set())
        # And the operators' key ones are there.
        for wanted in (
            "synapse_lite_replication_lag_seconds",
            "synapse_lite_internal_call_seconds_bucket",
            "synapse_lite_stream_stalled_seconds",
            "synapse_lite_router_response_seconds_bucket",
        ):
            self.assertIn(wanted, used)

    def test_selected_by_instance_job_index(self) -> None:
        variables = {v["name"] for v in self.dashboard["templating"]["list"]}
        self.assertLessEqual({"instance", "job", "index"}, variables)
        for expression in self.expressions:
            self.assertIn('instance="$instance",job=~"$job",index=~"$index"', expression)

    def test_generated_scrape_config_sets_those_labels(self) -> None:
        directory = tempfile.mkdtemp()
        written = write_config(
            GenerateOptions(layout="sharded", base_port=30008),
            os.path.join(directory, "homeserver.yaml"),
            directory,
        )
        self.assertIn(os.path.join(directory, "prometheus.yml"), written)
        with open(os.path.join(directory, "prometheus.yml")) as f:
            scrape = yaml.safe_load(f)
        [job] = scrape["scrape_configs"]
        labels = [(c["labels"]["job"], c["labels"]["index"]) for c in job["static_configs"]]
        self.assertEqual(
            labels,
            [
                ("main", "1"),
                ("reader", "1"),
                ("reader", "2"),
                ("events_writer", "1"),
                ("events_writer", "2"),
                ("events_writer", "3"),
                ("stream_writer", "1"),
                ("federation_reader", "1"),
                ("federation_reader", "2"),
                ("federation_sender", "1"),
                ("federation_sender", "2"),
                ("media", "1"),
                ("router", "1"),
            ],
        )
        self.assertTrue(all(c["labels"]["instance"] == "localhost" for c in job["static_configs"]))
        self.assertEqual(job["static_configs"][-1]["targets"], ["127.0.0.1:30022"])
