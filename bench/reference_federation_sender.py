"""The reference homeserver as a sending server with its own federation
sender worker, for ``bench/federation_burst.py --reference PYTHON``.

Its worker documentation's settings: the main process lists the sender in
``federation_sender_instances`` (so it sends nothing itself; the legacy
``send_federation: false`` is not needed with the list), and the sender is
a ``synapse.app.generic_worker`` named in that list, replicating from the
main process over Redis with the main process's replication listener in
``instance_map``, on PostgreSQL (the reference runs workers on nothing
else). The main process's client listener also serves ``federation`` over
plain HTTP, which the benchmark's receiving servers call directly for
``make_join``/``send_join``. Outbound, the sender reaches the receivers
(``localhost:<port>``, HTTPS with a certificate from the benchmark's CA) as
the reference's documentation says for a private federation: the CA in
``federation_custom_ca_list`` with ``federation_verify_certificates`` on,
``127.0.0.0/8`` in ``ip_range_whitelist``, no trusted key servers.

``PYTHON`` needs the reference's ``postgres`` and ``redis`` extras
(psycopg2, txredisapi, hiredis); :meth:`ReferenceSender.start` says what
to install when they are missing.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from bench.cluster import free_port
from bench.reference_follow import ADMIN_DATABASE, WORKER_NEEDS, ReferenceCluster, require_packages

#: The sender worker's name.
SENDER = "federation_sender1"


class ReferenceSender(ReferenceCluster):
    """The main process (client and federation APIs, the events writer) and
    one federation sender worker, on a fresh PostgreSQL database."""

    def __init__(self, python: str, ca_path: str) -> None:
        super().__init__(python, ADMIN_DATABASE)
        self.ca_path = ca_path
        self.sender_port = free_port()

    def main_config(self) -> dict[str, Any]:
        config = super().main_config()
        limit = {"per_second": 100_000, "burst_count": 100_000}
        config.update(
            federation_sender_instances=[SENDER],
            federation_custom_ca_list=[self.ca_path],
            federation_verify_certificates=True,
            ip_range_whitelist=["127.0.0.0/8"],
            rc_room_creation=limit,
            rc_joins_per_room=limit,
            rc_key_requests=limit,
            rc_federation={"window_size": 1000, "sleep_limit": 1000, "reject_limit": 1000},
        )
        config["listeners"][0]["resources"] = [
            {"names": ["client", "federation"], "compress": False}
        ]
        return config

    def _write_config(self) -> tuple[str, str]:
        """The base's configs, and the sender's in place of the follower's."""
        main_config, _ = super()._write_config()
        worker_config = os.path.join(self.dir, f"{SENDER}.yaml")
        with open(worker_config, "w") as f:
            yaml.safe_dump(
                {
                    "worker_app": "synapse.app.generic_worker",
                    "worker_name": SENDER,
                    # Only so that the start-up wait has something to ask.
                    "worker_listeners": [
                        {
                            "type": "http",
                            "port": self.sender_port,
                            "bind_addresses": ["127.0.0.1"],
                            "resources": [{"names": ["client"]}],
                        }
                    ],
                    "worker_log_config": os.path.join(self.dir, "log.yaml"),
                },
                f,
            )
        return main_config, worker_config

    def start(self) -> None:
        """Raises ``RuntimeError`` naming what to install when ``python``
        lacks the reference's worker dependencies."""
        require_packages(self.python, WORKER_NEEDS)
        main_config, worker_config = self._start_main()
        self._start(
            SENDER,
            ["synapse.app.generic_worker", "-c", main_config, "-c", worker_config],
            self.sender_port,
        )

    def sender_pid(self) -> int:
        return self.processes[SENDER].pid

    def main_pid(self) -> int:
        return self.processes["main"].pid

    def config(self) -> dict[str, Any]:
        with open(os.path.join(self.dir, "homeserver.yaml")) as f:
            loaded: dict[str, Any] = yaml.safe_load(f)
        return loaded
