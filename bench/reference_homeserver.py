"""The reference homeserver's main process alone, for benchmarks that put
its figures beside ours in one run (``--reference PYTHON``).

``PYTHON`` is the Python of a virtualenv where the reference is installed
(``tests/harness/synapse_install.py`` makes one in
``~/.cache/synapse_lite/matrix-synapse-<version>``; or ``python3 -m venv
/tmp/ref && /tmp/ref/bin/pip install 'matrix-synapse[postgres,redis]'``).
The process runs on a scratch PostgreSQL database or (engine ``sqlite``) an
SQLite file, with the client listener only, rate limits lifted, presence
off, and no Redis (nothing to replicate to).
"""

from __future__ import annotations

import os
from typing import Any

from bench.reference_follow import ADMIN_DATABASE, ReferenceCluster, missing_packages


class ReferenceHomeserver(ReferenceCluster):
    """Started by :meth:`start`, stopped (its database dropped) by :meth:`stop`."""

    SERVER_NAME = "bench.local"

    def __init__(self, python: str, engine: str, extra: dict[str, Any] | None = None) -> None:
        """``extra``: top-level settings added to the reference's config
        (e.g. ``app_service_config_files``)."""
        super().__init__(python, ADMIN_DATABASE)
        self.engine = engine
        self.extra = dict(extra or {})

    def _create_database(self) -> None:
        if self.engine == "postgres":
            super()._create_database()

    def _drop_database(self) -> None:
        if self.engine == "postgres":
            super()._drop_database()

    def main_config(self) -> dict[str, Any]:
        config = super().main_config()
        config["server_name"] = self.SERVER_NAME
        # One process: nothing to replicate to.
        config["redis"] = {"enabled": False}
        config["listeners"] = config["listeners"][:1]
        limit = {"per_second": 100_000, "burst_count": 100_000}
        config["rc_room_creation"] = limit
        config["rc_joins_per_room"] = limit
        del config["instance_map"]
        if self.engine == "sqlite":
            config["database"] = {
                "name": "sqlite3",
                "args": {"database": os.path.join(self.dir, "homeserver.db")},
            }
        config.update(self.extra)
        return config

    def start(self) -> None:
        """Raises ``RuntimeError`` saying what to install when the
        reference's Python lacks its PostgreSQL driver (the venv
        ``tests/harness/synapse_install.py`` makes has none)."""
        if self.engine == "postgres":
            missing = missing_packages(self.python, {"psycopg2": "psycopg2-binary"})
            if missing:
                raise RuntimeError(
                    f"{self.python} cannot import psycopg2: install it there"
                    f" ({self.python} -m pip install psycopg2-binary) or use --engine sqlite"
                )
        self._start_main()
