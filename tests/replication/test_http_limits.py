"""Limits of the internal HTTP endpoints between processes: they share the
listener's request body cap and check their own batch sizes, like client
input (a process with the secret is still not trusted to send anything)."""

from __future__ import annotations

from synapse_lite.replication.http.send_events import MAX_EVENTS_PER_REQUEST, SEND_EVENTS
from tests.harness.client_api import start_cluster
from tests.harness.server import DatabaseTestCase

SECRET = "test-secret"  # tests.harness.server.make_config's worker_replication_secret
BODY_LIMIT = 4096


class InternalHttpLimitsTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        _, clients, _ = start_cluster(
            self, self.test_db, limits={"max_request_body_bytes": BODY_LIMIT}
        )
        self.api = clients["main"]
        self.path = f"/_synapse/replication/{SEND_EVENTS.name}"

    async def test_body_over_the_limit_is_413(self) -> None:
        body = {"room_id": "!r:test.local", "events": [{"pad": "x" * BODY_LIMIT}]}
        code, answer = await self.api.request("POST", self.path, body, token=SECRET)
        self.assertEqual((code, answer["errcode"]), (413, "M_TOO_LARGE"))

    async def test_too_many_events_in_one_request(self) -> None:
        for count in (0, MAX_EVENTS_PER_REQUEST + 1):
            body = {"room_id": "!r:test.local", "events": [{}] * count}
            code, answer = await self.api.request("POST", self.path, body, token=SECRET)
            self.assertEqual((code, answer["errcode"]), (400, "M_BAD_JSON"), count)
            self.assertIn(f"1 to {MAX_EVENTS_PER_REQUEST} events", answer["error"])
        # At the cap the count is accepted and the events themselves are
        # checked next (and these empty ones refused for what they are).
        body = {"room_id": "!r:test.local", "events": [{}] * MAX_EVENTS_PER_REQUEST}
        code, answer = await self.api.request("POST", self.path, body, token=SECRET)
        self.assertEqual(code, 400)
        self.assertNotIn("1 to", answer["error"])
