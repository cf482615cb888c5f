"""The admin API's federation destinations (read from ``destinations``) and
background updates (none here)."""

from __future__ import annotations

from tests.harness.client_api import ThreeUsersTestCase

ADMIN = "/_synapse/admin/v1"


class AdminDestinationsTestCase(ThreeUsersTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        await super().setUp()
        store = self.servers["main"].store
        await store.db_pool.execute(
            "t", "UPDATE users SET admin = TRUE WHERE name = ?", self.alice.user_id
        )
        for destination, last, interval, failure, sent in [
            ("a.example", 0, 0, None, 7),
            ("b.example", 1000, 60000, 500, 0),
            ("c.other", 2000, 120000, 900, 3),
        ]:
            await store.db_pool.execute(
                "t",
                "INSERT INTO destinations (destination, retry_last_ts, retry_interval,"
                " failure_ts, last_sent_stream_id) VALUES (?, ?, ?, ?, ?)",
                destination,
                last,
                interval,
                failure,
                sent,
            )

    async def test_list_and_one(self) -> None:
        listed = await self.alice.ok("GET", ADMIN + "/federation/destinations")
        self.assertEqual(
            [d["destination"] for d in listed["destinations"]],
            ["a.example", "b.example", "c.other"],
        )
        self.assertEqual(listed["total"], 3)
        paged = await self.alice.ok(
            "GET", ADMIN + "/federation/destinations?order_by=retry_interval&dir=b&limit=1"
        )
        self.assertEqual(
            ([d["destination"] for d in paged["destinations"]], paged["next_token"]),
            (["c.other"], "1"),
        )
        found = await self.alice.ok("GET", ADMIN + "/federation/destinations?destination=EXAMPLE")
        self.assertEqual(found["total"], 2)
        one = await self.alice.ok("GET", ADMIN + "/federation/destinations/b.example")
        self.assertEqual(
            one,
            {
                "destination": "b.example",
                "retry_last_ts": 1000,
                "retry_interval": 60000,
                "failure_ts": 500,
                "last_successful_stream_ordering": None,
            },
        )
        updates = await self.alice.ok("GET", ADMIN + "/background_updates/status")
        self.assertEqual(updates, {"enabled": False, "current_updates": {}})

    async def test_errors(self) -> None:
        for path, code, errcode in [
            ("/federation/destinations/nowhere.example", 404, "M_NOT_FOUND"),
            ("/federation/destinations?order_by=size", 400, "M_INVALID_PARAM"),
            ("/federation/destinations?limit=0", 400, None),
        ]:
            got, answer = await self.alice.request("GET", ADMIN + path)
            self.assertEqual(got, code, path)
            if errcode is not None:
                self.assertEqual(answer["errcode"], errcode, path)
        for path in (
            "/federation/destinations",
            "/federation/destinations/a.example",
            "/background_updates/status",
        ):
            got, answer = await self.eve.request("GET", ADMIN + path)
            self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"), path)
