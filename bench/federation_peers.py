"""Two servers of ours and two Synapses federating on loopback, for the
federation benchmarks (``bench/federation_latency.py``,
``bench/remote_join.py``).

Ours run inside the benchmark's Python process (built as the Synapse
interop tests build them: ``tests/harness/synapse_peer.start_our_server``,
HTTPS federation with a certificate from one test CA, loopback allowed);
each Synapse is its own process (``SynapsePeer``, its own data directory
and server name ``localhost:<port>``). All four trust the same CA, so any
two of them federate. Our servers therefore share one process (and one
core's worth of the reactor) with each other and with the benchmark's
clients, while each Synapse has its own: the comparison leans, if
anything, in Synapse's favour.
"""

from __future__ import annotations

import os
import tempfile
import urllib.parse
from dataclasses import dataclass

from bench.soak import Cleanups
from synapse_lite.storage.id_generators import generator as id_generators
from tests.harness.client_api import ClientApi
from tests.harness.synapse_install import SynapseUnavailable, install_synapse, installed_python
from tests.harness.synapse_peer import SynapsePeer, start_our_server
from tests.harness.tls import TestCA

#: Synapse's bcrypt cost for the benchmark's users: hashing passwords is not
#: what is measured, and 1,000 users at its default (12 rounds) take minutes.
SYNAPSE_BCRYPT_ROUNDS = 4


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


@dataclass
class Server:
    """One homeserver of the run: what kind it is, its server name and the
    plain-HTTP base URL of its client API."""

    label: str
    kind: str  # "ours" or "synapse"
    server_name: str
    client_url: str


def synapse_python() -> str:
    """The Synapse virtualenv's python, installing it if needed; raises
    :class:`SynapseUnavailable` when that fails."""
    return installed_python() or install_synapse()


class Peers:
    """Starts servers of ours and Synapses, all trusting one CA; everything
    started is stopped by :meth:`stop`."""

    def __init__(self) -> None:
        self.cleanups = Cleanups()
        self.ca = TestCA(tempfile.mkdtemp(prefix="fed_bench_ca_"))
        self._synapse_python: str | None = None
        # Our servers' stream positions are written at once, as in the tests.
        self._write_delay = id_generators.STREAM_POSITIONS_WRITE_DELAY
        id_generators.STREAM_POSITIONS_WRITE_DELAY = 0

    def ours(self, label: str) -> Server:
        hs, url = start_our_server(self.cleanups, self.ca)  # type: ignore[arg-type]
        return Server(label, "ours", hs.config.server_name, url)

    async def synapse(self, label: str) -> Server:
        if self._synapse_python is None:
            self._synapse_python = synapse_python()
        directory = tempfile.mkdtemp(prefix=f"fed_bench_{label}_")
        peer = SynapsePeer(
            self._synapse_python,
            self.ca,
            directory,
            extra_config={
                "bcrypt_rounds": SYNAPSE_BCRYPT_ROUNDS,
                # Hundreds of users join one room within seconds.
                "rc_joins_per_room": {"per_second": 1000, "burst_count": 1000},
            },
        )
        self.cleanups.addCleanup(peer.stop)
        await peer.start(None)
        return Server(label, "synapse", peer.server_name, peer.client_url)

    async def stop(self) -> None:
        await self.cleanups.run()
        id_generators.STREAM_POSITIONS_WRITE_DELAY = self._write_delay


async def register(server: Server, name: str) -> ClientApi:
    """A new user on ``server`` (dummy auth), its token kept."""
    return await ClientApi(None, server.client_url).register(name)  # type: ignore[arg-type]


def skip_reason() -> str | None:
    """Why the Synapse comparison cannot run here, or None."""
    try:
        synapse_python()
    except SynapseUnavailable as e:
        return str(e)
    return None


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of ``values`` (not empty)."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[index]


def run_label() -> str:
    """Where and on what the run happened, for the printed header."""
    load = os.getloadavg()[0]
    engine = os.environ.get("SYNAPSE_LITE_TEST_DB", "sqlite")
    return f"ours on {engine}, Synapse on SQLite, load average {load:.1f}"
