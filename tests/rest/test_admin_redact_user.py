"""Redacting a user's events through the admin API (``POST
/_synapse/admin/v1/user/{userId}/redact``) and the job's status; a job
interrupted by the process stopping resumes in the next one."""

from __future__ import annotations

from typing import Any

from synapse_lite.handlers.redact_user import RedactUserHandler
from tests.harness.client_api import (
    DEFAULT_LAYOUT_STREAM_WRITERS,
    DEFAULT_LAYOUT_WORKERS,
    ThreeUsersTestCase,
    q,
)
from tests.harness.polling import eventually

ADMIN = "/_synapse/admin/v1"


class AdminRedactUserTestCase(ThreeUsersTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        await super().setUp()
        await self.servers["main"].store.db_pool.execute(
            "t", "UPDATE users SET admin = TRUE WHERE name = ?", self.alice.user_id
        )
        self.room = await self.alice.create_room(preset="public_chat")
        self.other = await self.alice.create_room(preset="public_chat")
        for room in (self.room, self.other):
            await self.bob.ok("POST", f"/join/{q(room)}", {})
        self.spam = [await self.bob.send(self.room, f"spam{i}") for i in range(3)]
        self.spam.append(await self.bob.send(self.other, "more spam"))
        self.kept = await self.alice.send(self.room, "alice's")

    async def bodies(self, room: str) -> list[tuple[str, Any]]:
        """(sender, body) of each message, oldest first (body None once redacted)."""

        async def read() -> list[tuple[str, Any]]:
            page = await self.alice.ok("GET", ADMIN + f"/rooms/{q(room)}/messages?dir=f&limit=100")
            return [
                (e["sender"], e["content"].get("body"))
                for e in page["chunk"]
                if e["type"] == "m.room.message"
            ]

        return await read()

    async def redacted(self, body: dict[str, Any], user_id: str | None = None) -> dict[str, Any]:
        user_id = user_id or self.bob.user_id
        redact_id = (await self.alice.ok("POST", ADMIN + f"/user/{q(user_id)}/redact", body))[
            "redact_id"
        ]
        status = ADMIN + f"/user/redact_status/{redact_id}"

        async def done() -> bool:
            return bool((await self.alice.ok("GET", status))["status"] in ("complete", "failed"))

        await eventually(done, what="the redaction over")
        return dict(await self.alice.ok("GET", status))

    async def test_redact_everywhere(self) -> None:
        status = await self.redacted({"rooms": [], "reason": "spam"})
        self.assertEqual(status, {"status": "complete", "failed_redactions": {}})
        bob, alice = self.bob.user_id, self.alice.user_id

        async def all_redacted() -> bool:
            return await self.bodies(self.room) == [(bob, None)] * 3 + [(alice, "alice's")] and (
                await self.bodies(self.other) == [(bob, None)]
            )

        await eventually(all_redacted, what="bob's messages redacted, alice's kept")
        # Bob's join was redacted too, as himself and with the reason.
        page = await self.alice.ok("GET", ADMIN + f"/rooms/{q(self.room)}/messages?limit=100")
        redactions = [e for e in page["chunk"] if e["type"] == "m.room.redaction"]
        self.assertEqual(len(redactions), 4)
        self.assertTrue(all(e["sender"] == bob for e in redactions))
        self.assertTrue(all(e["content"].get("reason") == "spam" for e in redactions))
        # Again: nothing left to redact, no redaction sent twice.
        await self.redacted({"rooms": [self.room]})
        page = await self.alice.ok("GET", ADMIN + f"/rooms/{q(self.room)}/messages?limit=100")
        self.assertEqual(len([e for e in page["chunk"] if e["type"] == "m.room.redaction"]), 4)

    async def test_limit_rooms_and_failures(self) -> None:
        # One room, the newest two only.
        await self.redacted({"rooms": [self.room], "limit": 2})
        bob = self.bob.user_id

        async def newest_two() -> bool:
            return [b for s, b in await self.bodies(self.room) if s == bob] == ["spam0", None, None]

        await eventually(newest_two, what="the newest two redacted")
        self.assertEqual(await self.bodies(self.other), [(bob, "more spam")])
        # Bob left the other room: as himself he may not redact there any
        # more; the failure is reported. As the admin (its creator) it works.
        await self.bob.ok("POST", f"/rooms/{q(self.other)}/leave", {})
        status = await self.redacted({"rooms": [self.other]})
        self.assertEqual(status["status"], "complete")
        self.assertIn(self.spam[3], status["failed_redactions"])
        status = await self.redacted({"rooms": [self.other], "use_admin": True})
        self.assertEqual(status, {"status": "complete", "failed_redactions": {}})

        async def other_redacted() -> bool:
            return await self.bodies(self.other) == [(bob, None)]

        await eventually(other_redacted, what="redacted by the admin")

    async def test_errors(self) -> None:
        bob = ADMIN + f"/user/{q(self.bob.user_id)}/redact"
        for path, body, code, errcode in [
            (bob, {}, 400, "M_MISSING_PARAM"),
            (bob, {"rooms": "all"}, 400, "M_BAD_JSON"),
            (bob, {"rooms": [5]}, 400, "M_BAD_JSON"),
            (bob, {"rooms": ["not-a-room"]}, 400, None),
            (bob, {"rooms": [], "limit": 0}, 400, "M_INVALID_PARAM"),
            (bob, {"rooms": [], "use_admin": "yes"}, 400, "M_BAD_JSON"),
            (ADMIN + "/user/@nobody:test.local/redact", {"rooms": []}, 404, "M_NOT_FOUND"),
            (ADMIN + "/user/nobody/redact", {"rooms": []}, 400, None),
        ]:
            got, answer = await self.alice.request("POST", path, body)
            self.assertEqual(got, code, (path, body))
            if errcode is not None:
                self.assertEqual(answer["errcode"], errcode, (path, body))
        got, answer = await self.alice.request("GET", ADMIN + "/user/redact_status/nope")
        self.assertEqual((got, answer["errcode"]), (404, "M_NOT_FOUND"))
        for method, path in [("POST", bob), ("GET", ADMIN + "/user/redact_status/x")]:
            got, answer = await self.eve.request(method, path, {"rooms": []})
            self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"), path)

    async def test_interrupted_job_resumes(self) -> None:
        main = self.servers["main"]
        handler = main.handlers.redact_user
        # Stopping before it starts: the job stays scheduled, for the next process.
        handler.stop()
        body = {"rooms": [self.room, self.other]}
        redact_id = (
            await self.alice.ok("POST", ADMIN + f"/user/{q(self.bob.user_id)}/redact", body)
        )["redact_id"]
        status = ADMIN + f"/user/redact_status/{redact_id}"

        async def stopped() -> bool:
            return redact_id not in handler.running

        await eventually(stopped, what="the job stopped with its process")
        self.assertEqual((await self.alice.ok("GET", status))["status"], "active")
        restarted = RedactUserHandler(main.store, "test.local", main.handlers.events)
        restarted.start()
        self.addCleanup(restarted.stop)

        async def complete() -> bool:
            return bool((await self.alice.ok("GET", status))["status"] == "complete")

        await eventually(complete, what="the resumed job complete")
        bob = self.bob.user_id

        async def all_redacted() -> bool:
            return [b for s, b in await self.bodies(self.room) if s == bob] == [None] * 3

        await eventually(all_redacted, what="bob's messages redacted")


class AdminRedactUserDefaultLayoutTestCase(AdminRedactUserTestCase):
    workers = DEFAULT_LAYOUT_WORKERS
    stream_writers = DEFAULT_LAYOUT_STREAM_WRITERS
