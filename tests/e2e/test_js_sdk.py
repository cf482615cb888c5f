"""The real matrix-js-sdk (the SDK Element is built on) against the server.

Each scenario is a small Node script in ``tests/e2e/js/``; see
:mod:`tests.harness.node` for how they run and when they are skipped.
"""

from __future__ import annotations

from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.node import require_js_sdk, run_script
from tests.harness.server import DatabaseTestCase


class JsSdkLoginTestCase(DatabaseTestCase):
    async def test_login_and_whoami(self) -> None:
        require_js_sdk()
        _, clients, _ = start_cluster(self, self.test_db)
        main = clients["main"]
        await ClientApi(self, main.base_url).register("alice", "alice-pw")
        served = await main.ok("GET", "/_matrix/client/versions")
        result = await run_script("login.mjs", main.base_url, "alice", "alice-pw")
        self.assertEqual(result["login_user"], "@alice:test.local")
        self.assertEqual(result["whoami"]["user_id"], "@alice:test.local")
        self.assertEqual(result["versions"], served["versions"])
