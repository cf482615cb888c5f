"""The writer's persist path authorises every event with the pure core
(``event_graph.authorisation``) after its own checks: what they let through
and the spec's rules refuse is a 403 and is never persisted. On SQLite and
PostgreSQL (``SYNAPSE_LITE_TEST_DB``)."""

from __future__ import annotations

from synapse_lite.events import EventSpec
from synapse_lite.handlers.event_auth import RoomAuthState
from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.server import DatabaseTestCase


class CoreAuthorisationTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(self, self.test_db)
        base = clients["main"].base_url
        self.alice = await ClientApi(self, base).register("alice")
        self.bob = await ClientApi(self, base).register("bob")

    async def test_what_our_checks_miss_the_core_refuses(self) -> None:
        room = await self.alice.create_room()
        # Bob is not in the room: this server's checks say 403 ...
        code, body = await self.bob.request(
            "PUT", f"/rooms/{room}/send/m.room.message/t1", {"msgtype": "m.text", "body": "hi"}
        )
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        self.assertNotIn("authorisation rules", body["error"])

        # ... and were they to let it through, the spec's rules still would not.
        def allow_everything(state: RoomAuthState, spec: EventSpec) -> None:
            return None

        self.patch(RoomAuthState, "check", allow_everything)
        code, body = await self.bob.request(
            "PUT", f"/rooms/{room}/send/m.room.message/t2", {"msgtype": "m.text", "body": "hi"}
        )
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        self.assertIn("The room's authorisation rules refuse this event", body["error"])
        store = self.servers["main"].store
        rows = await store.db_pool.select(
            "test_bob_events", "SELECT COUNT(*) FROM events WHERE sender = ?", self.bob.user_id
        )
        self.assertEqual(rows[0][0], 0)
        # The room goes on: alice's next message is persisted.
        await self.alice.send(room, "still here")
