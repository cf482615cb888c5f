"""The Prometheus metrics an operator watches, scraped from real processes."""

from __future__ import annotations

import signal

from prometheus_client.parser import text_string_to_metric_families
from twisted.trial import unittest

from tests.harness.databases import END_TO_END, one_engine_only
from tests.harness.launcher import http_get, launch
from tests.harness.polling import eventually

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(url: str) -> Samples:
    code, body = await http_get(url)
    assert code == 200, code
    samples: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def find(samples: Samples, name: str, **labels: str) -> list[float]:
    """Values of the samples called ``name`` that carry (at least) ``labels``."""
    wanted = set(labels.items())
    return [v for (n, ls), v in samples.items() if n == name and wanted <= set(ls)]


class MetricsTestCase(unittest.TestCase):
    timeout = 120

    async def test_every_process_exports_what_operators_watch(self) -> None:
        one_engine_only("postgres", END_TO_END)
        server = await launch(self)
        command = server.command
        specs = server.specs()
        for name in ("main", "synchrotron1"):
            code, _ = await http_get(specs[name].url_of("client") + "/_matrix/client/versions")
            self.assertEqual(code, 200)

        for name, spec in specs.items():
            assert spec.metrics_url is not None
            if name == "router":
                continue  # below
            samples = await scrape(spec.metrics_url)
            # Positions of every writer and the stream's persisted-up-to.
            for writer in ("persister1", "persister2"):
                self.assertEqual(
                    len(
                        find(
                            samples, "synapse_lite_stream_position", stream="events", writer=writer
                        )
                    ),
                    1,
                    (name, writer),
                )
            self.assertTrue(
                find(samples, "synapse_lite_stream_persisted_upto", stream="events"), name
            )
            # Transactions by name, with their durations (startup reads at least).
            self.assertTrue(find(samples, "synapse_lite_db_transaction_seconds_count"), name)
            self.assertTrue(find(samples, "synapse_lite_db_transaction_seconds_sum"), name)
            # Open /sync requests (none).
            self.assertEqual(find(samples, "synapse_lite_open_sync_requests"), [0.0], name)
        for name in ("main", "synchrotron1"):
            samples = await scrape(specs[name].metrics_url or "")
            self.assertEqual(
                find(
                    samples,
                    "synapse_lite_http_requests_total",
                    servlet="versions",
                    method="GET",
                    code="200",
                ),
                [1.0],
                name,
            )

        # Replication lag, per stream and writer, once positions have arrived.
        async def main_reports_lag() -> bool:
            samples = await scrape(specs["main"].metrics_url or "")
            return bool(
                find(
                    samples,
                    "synapse_lite_replication_lag_ids",
                    stream="events",
                    writer="persister1",
                )
            )

        await eventually(main_reports_lag, 30, "main to report replication lag", 0.2)
        samples = await scrape(specs["main"].metrics_url or "")
        self.assertEqual(
            find(
                samples,
                "synapse_lite_replication_lag_seconds",
                stream="events",
                writer="persister1",
            ),
            [0.0],
        )
        self.assertTrue(
            find(
                samples,
                "synapse_lite_stream_announced_position",
                stream="events",
                writer="persister1",
            )
        )

        # The router: each process as its health checks see it.
        router = await scrape(specs["router"].metrics_url or "")
        for name in ("main", "synchrotron1", "persister1", "persister2"):
            self.assertEqual(
                find(router, "synapse_lite_router_backend_up", backend=name), [1.0], name
            )

        command.signal(signal.SIGTERM)
        self.assertEqual(await command.wait_exit(), 0, command.tail())
