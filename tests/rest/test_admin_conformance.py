"""The admin UI's calls (``bench/admin_conformance.py``: every call Ketesa,
formerly synapse-admin, makes on its pages) against the main process alone
and the default layout: each endpoint served answers with the status and
shape the UI reads; the ones not served are the ones
``docs/admin-api.md`` says are not."""

from __future__ import annotations

import os
import sys
from typing import Any

from twisted.internet import reactor, utils
from twisted.internet.task import deferLater

from bench.admin_conformance import report, run
from tests.harness.client_api import (
    DEFAULT_LAYOUT_STREAM_WRITERS,
    DEFAULT_LAYOUT_WORKERS,
    ClientApi,
    start_cluster,
)
from tests.harness.server import DatabaseTestCase

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: The calls the UI makes that this server does not serve
#: (``docs/admin-api.md``, "Not served").
NOT_SERVED = {
    "POST /_synapse/admin/v1/users/{user_q}/_allow_cross_signing_replacement_without_uia",
}


class AdminConformanceTestCase(DatabaseTestCase):
    workers: list[str] = []
    stream_writers: dict[str, Any] = {}

    async def test_every_ui_call(self) -> None:
        servers, clients, _ = start_cluster(
            self,
            self.test_db,
            workers=self.workers,
            stream_writers=self.stream_writers,
            server_notices={"system_mxid_localpart": "notices"},
        )
        # The UI talks to one address: the main process (the router sends
        # every admin path there).
        admin = await ClientApi(self, next(iter(clients.values())).base_url).register("admin")
        await servers["main"].store.db_pool.execute(
            "t", "UPDATE users SET admin = TRUE WHERE name = ?", admin.user_id
        )

        async def caller(
            method: str,
            path: str,
            body: Any = None,
            token: str | None = None,
            raw: bytes | None = None,
        ) -> tuple[int, Any]:
            headers = {"Content-Type": ["text/plain"]} if raw is not None else None
            return await admin.request(method, path, body, raw=raw, token=token, headers=headers)

        assert admin.token is not None and admin.user_id is not None

        async def sleep(seconds: float) -> None:
            await deferLater(reactor, seconds)

        outcomes = await run(caller, admin.token, admin.user_id, "test.local", sleep)
        print(report(outcomes))
        wrong = [o for o in outcomes if o.verdict in ("shape", "status", "skipped")]
        self.assertEqual(wrong, [], report(wrong))
        not_served = {
            f"{o.call.method} {o.call.path}" for o in outcomes if o.verdict == "not served"
        }
        self.assertEqual(not_served, NOT_SERVED)


class AdminConformanceCommandTestCase(DatabaseTestCase):
    async def test_command_line(self) -> None:
        """``python -m bench.admin_conformance`` (its own HTTP client)
        against a served process: one line a call, the summary, exit 0
        with ``--strict``."""
        servers, clients, _ = start_cluster(
            self, self.test_db, server_notices={"system_mxid_localpart": "notices"}
        )
        main = clients["main"]
        admin = await ClientApi(self, main.base_url).register("admin", "admin-pw")
        await servers["main"].store.db_pool.execute(
            "t", "UPDATE users SET admin = TRUE WHERE name = ?", admin.user_id
        )
        out, err, code = await utils.getProcessOutputAndValue(
            sys.executable,
            (
                "-m",
                "bench.admin_conformance",
                "--base-url",
                main.base_url,
                "--user",
                "admin",
                "--password",
                "admin-pw",
                "--strict",
            ),
            env=dict(os.environ),
            path=REPO,
        )
        text = out.decode() + err.decode()
        self.assertEqual(code, 0, text)
        summary = text.strip().splitlines()[-1]
        self.assertRegex(summary, r"^conformance: \d+ ok, 0 shape, 0 status, 1 not served")


class AdminConformanceDefaultLayoutTestCase(AdminConformanceTestCase):
    workers = DEFAULT_LAYOUT_WORKERS
    stream_writers = DEFAULT_LAYOUT_STREAM_WRITERS
