"""The admin API's federation destinations (read from ``destinations``),
their rooms and resetting their backoff, and background updates (none
here)."""

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

    async def test_rooms(self) -> None:
        store = self.servers["main"].store
        # Members of b.example in two rooms (rows as a remote join leaves
        # them), one who left a third, and one of a server whose name only
        # ends the same way.
        for room, user, membership in [
            ("!r2:test.local", "@x:b.example", "join"),
            ("!r1:test.local", "@y:b.example", "join"),
            ("!r1:test.local", "@z:b.example", "join"),
            ("!r3:test.local", "@x:b.example", "leave"),
            ("!r4:test.local", "@w:bb.example", "join"),
        ]:
            await store.db_pool.execute(
                "t",
                "INSERT INTO current_state_events (room_id, type, state_key, event_id,"
                " membership) VALUES (?, 'm.room.member', ?, ?, ?)",
                room,
                user,
                f"$fake-{room}-{user}",
                membership,
            )
        path = ADMIN + "/federation/destinations/b.example/rooms"
        listed = await self.alice.ok("GET", path)
        self.assertEqual(
            listed,
            {
                "rooms": [
                    {"room_id": "!r1:test.local", "stream_ordering": None},
                    {"room_id": "!r2:test.local", "stream_ordering": None},
                ],
                "total": 2,
            },
        )
        paged = await self.alice.ok("GET", path + "?dir=b&limit=1")
        self.assertEqual(
            ([r["room_id"] for r in paged["rooms"]], paged["next_token"]),
            (["!r2:test.local"], "1"),
        )
        empty = await self.alice.ok("GET", ADMIN + "/federation/destinations/a.example/rooms")
        self.assertEqual(empty, {"rooms": [], "total": 0})

    async def test_reset_connection(self) -> None:
        path = ADMIN + "/federation/destinations/{}/reset_connection"
        self.assertEqual(await self.alice.ok("POST", path.format("b.example"), {}), {})
        one = await self.alice.ok("GET", ADMIN + "/federation/destinations/b.example")
        self.assertEqual(
            (one["retry_last_ts"], one["retry_interval"], one["failure_ts"]), (0, 0, None)
        )
        # Nothing to reset any more (nor for a.example, never failing).
        for name in ("b.example", "a.example"):
            got, answer = await self.alice.request("POST", path.format(name), {})
            self.assertEqual((got, answer["errcode"]), (400, "M_INVALID_PARAM"), name)

    async def test_errors(self) -> None:
        for path, code, errcode in [
            ("/federation/destinations/nowhere.example", 404, "M_NOT_FOUND"),
            ("/federation/destinations?order_by=size", 400, "M_INVALID_PARAM"),
            ("/federation/destinations?limit=0", 400, None),
            ("/federation/destinations/nowhere.example/rooms", 404, "M_NOT_FOUND"),
            ("/federation/destinations/a.example/rooms?dir=up", 400, "M_INVALID_PARAM"),
        ]:
            got, answer = await self.alice.request("GET", ADMIN + path)
            self.assertEqual(got, code, path)
            if errcode is not None:
                self.assertEqual(answer["errcode"], errcode, path)
        for path in (
            "/federation/destinations",
            "/federation/destinations/a.example",
            "/background_updates/status",
            "/federation/destinations/a.example/rooms",
        ):
            got, answer = await self.eve.request("GET", ADMIN + path)
            self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"), path)
        reset = "/federation/destinations/b.example/reset_connection"
        got, answer = await self.eve.request("POST", ADMIN + reset, {})
        self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"))
        got, answer = await self.alice.request(
            "POST", ADMIN + "/federation/destinations/nowhere.example/reset_connection", {}
        )
        self.assertEqual((got, answer["errcode"]), (404, "M_NOT_FOUND"))
