"""Each client-facing limit, at its edge: the largest accepted value passes
and one more is refused with the documented errcode, and nothing is stored.
The limits table in docs/reliability.md points here."""

from __future__ import annotations

import io
import json
import time
from typing import Any, cast

import treq
from twisted.internet import reactor
from twisted.web.client import UNKNOWN_LENGTH, FileBodyProducer, HTTPConnectionPool

from synapse_lite.api.content import MAX_EVENT_CONTENT_BYTES
from synapse_lite.api.content import MAX_TO_DEVICE_RECIPIENTS as MAX_RECIPIENTS
from synapse_lite.handlers.filtering import MAX_FILTER_BYTES
from synapse_lite.handlers.presence import MAX_STATUS_MSG_LENGTH
from synapse_lite.handlers.room import MAX_INITIAL_STATE, MAX_INVITES
from synapse_lite.http.server import MAX_JSON_DEPTH
from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.server import DatabaseTestCase

#: limits.max_request_body_bytes's default.
DEFAULT_BODY_LIMIT = 1_048_576


def padded_content(size: int) -> dict[str, Any]:
    """Event content whose compact JSON is exactly ``size`` bytes, as the
    server measures it (json.dumps with its default separators)."""
    overhead = len(json.dumps({"body": ""}))
    return {"body": "x" * (size - overhead)}


class ClientLimitsTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        # The default limits: only the sync timeout cap is lowered (tested below).
        self.servers, clients, _ = start_cluster(
            self, self.test_db, limits={"max_sync_timeout_ms": 300}
        )
        self.alice = await ClientApi(self, clients["main"].base_url).register("alice")
        self.room = await self.alice.create_room(preset="private_chat")

    async def timeline(self) -> list[str]:
        page = await self.alice.ok("GET", f"/rooms/{self.room}/messages?dir=b&limit=1000")
        return [e["event_id"] for e in page["chunk"]]

    async def test_request_body_over_the_default_limit_is_413(self) -> None:
        before = await self.timeline()
        path = f"/rooms/{self.room}/send/m.room.message/"
        # One byte over, with a Content-Length: refused before any servlet runs.
        over = json.dumps({"body": "x" * DEFAULT_BODY_LIMIT}).encode()[: DEFAULT_BODY_LIMIT + 1]
        code, body = await self.alice.request("PUT", path + "t1", raw=over)
        self.assertEqual((code, body["errcode"]), (413, "M_TOO_LARGE"))
        # The same without a Content-Length (chunked): counted as it arrives.
        producer = FileBodyProducer(io.BytesIO(over))
        producer.length = UNKNOWN_LENGTH
        headers: dict[bytes | str, list[bytes | str]] = {
            "Authorization": [f"Bearer {self.alice.token}"]
        }
        response = await treq.request(
            "PUT",
            self.alice.base_url + "/_matrix/client/v3" + path + "t2",
            data=producer,
            headers=headers,
            reactor=cast(Any, reactor),
            pool=HTTPConnectionPool(reactor, persistent=False),
        )
        answer = json.loads(await treq.content(response))
        self.assertEqual((response.code, answer["errcode"]), (413, "M_TOO_LARGE"))
        # At the limit the body is read and parsed (then refused for the
        # event size, a separate limit), so the 413 above is the body limit's.
        at_limit = b'{"body": "' + b"x" * (DEFAULT_BODY_LIMIT - 12) + b'"}'
        self.assertEqual(len(at_limit), DEFAULT_BODY_LIMIT)
        code, body = await self.alice.request("PUT", path + "t3", raw=at_limit)
        self.assertEqual((code, body["errcode"]), (413, "M_TOO_LARGE"))
        self.assertTrue(body["error"].startswith("Event is too large"), body)
        self.assertEqual(await self.timeline(), before)

    async def test_json_nesting_depth(self) -> None:
        def nested(depth: int) -> dict[str, Any]:
            value: dict[str, Any] = {}
            for _ in range(depth):
                value = {"a": value}
            return value

        path = f"/user/{self.alice.user_id}/account_data/org.example.deep"
        await self.alice.ok("PUT", path, nested(MAX_JSON_DEPTH))
        code, body = await self.alice.request("PUT", path, nested(MAX_JSON_DEPTH + 1))
        self.assertEqual((code, body["errcode"]), (400, "M_BAD_JSON"))
        self.assertEqual(await self.alice.ok("GET", path), nested(MAX_JSON_DEPTH))

    async def test_event_content_size(self) -> None:
        path = f"/rooms/{self.room}/send/m.room.message/"
        before = await self.timeline()
        code, body = await self.alice.request(
            "PUT", path + "big", padded_content(MAX_EVENT_CONTENT_BYTES + 1)
        )
        self.assertEqual((code, body["errcode"]), (413, "M_TOO_LARGE"))
        self.assertEqual(await self.timeline(), before)
        # The limit is the whole event's: content of the limit's size is too
        # large once the event around it is counted; a little less fits.
        code, body = await self.alice.request(
            "PUT", path + "whole", padded_content(MAX_EVENT_CONTENT_BYTES)
        )
        self.assertEqual((code, body["errcode"]), (413, "M_TOO_LARGE"))
        await self.alice.ok("PUT", path + "fits", padded_content(MAX_EVENT_CONTENT_BYTES - 400))
        self.assertEqual(len(await self.timeline()), len(before) + 1)
        # Account data and state content have the same cap.
        code, body = await self.alice.request(
            "PUT",
            f"/user/{self.alice.user_id}/account_data/org.big",
            padded_content(MAX_EVENT_CONTENT_BYTES + 1),
        )
        self.assertEqual((code, body["errcode"]), (413, "M_TOO_LARGE"))
        code, body = await self.alice.request(
            "PUT", f"/rooms/{self.room}/state/org.big", padded_content(MAX_EVENT_CONTENT_BYTES + 1)
        )
        self.assertEqual((code, body["errcode"]), (413, "M_TOO_LARGE"))

    async def test_sync_timeout_is_capped(self) -> None:
        since = (await self.alice.sync())["next_batch"]
        started = time.monotonic()
        result = await self.alice.sync(since=since, timeout=60_000)
        elapsed = time.monotonic() - started
        # Capped at limits.max_sync_timeout_ms (300 ms here): it waited, then
        # answered empty, long before the 60 s the client asked for.
        self.assertGreaterEqual(elapsed, 0.25)
        self.assertLess(elapsed, 5)
        self.assertNotIn(self.room, str(result.get("rooms", {})))

    async def test_filter_size(self) -> None:
        path = f"/user/{self.alice.user_id}/filter"
        big = {"room": {"timeline": {"limit": 5}}, "pad": "x" * MAX_FILTER_BYTES}
        code, body = await self.alice.request("POST", path, big)
        self.assertEqual((code, body["errcode"]), (400, "M_TOO_LARGE"))
        # (An inline /sync filter has the same cap, but a URL carrying one
        # would be over Twisted's 16 KiB request line limit first.)
        await self.alice.ok("POST", path, {"room": {"timeline": {"limit": 5}}})

    async def test_to_device_recipients(self) -> None:
        user = self.alice.user_id or ""
        too_many = {user: {f"D{i}": {"n": i} for i in range(MAX_RECIPIENTS + 1)}}
        code, body = await self.alice.request(
            "PUT", "/sendToDevice/m.test/t1", {"messages": too_many}
        )
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"))
        enough = {user: {f"D{i}": {"n": i} for i in range(MAX_RECIPIENTS)}}
        await self.alice.ok("PUT", "/sendToDevice/m.test/t2", {"messages": enough})

    async def test_create_room_invites_and_initial_state(self) -> None:
        rooms = (await self.alice.ok("GET", "/joined_rooms"))["joined_rooms"]
        invites = [f"@u{i}:test.local" for i in range(MAX_INVITES + 1)]
        code, body = await self.alice.request("POST", "/createRoom", {"invite": invites})
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"))
        state = [
            {"type": "org.example", "state_key": str(i), "content": {}}
            for i in range(MAX_INITIAL_STATE + 1)
        ]
        code, body = await self.alice.request("POST", "/createRoom", {"initial_state": state})
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"))
        self.assertEqual((await self.alice.ok("GET", "/joined_rooms"))["joined_rooms"], rooms)
        await self.alice.ok("POST", "/createRoom", {"initial_state": state[:MAX_INITIAL_STATE]})

    async def test_id_and_status_lengths(self) -> None:
        code, body = await self.alice.request(
            "PUT", f"/rooms/{self.room}/send/{'t' * 256}/t1", {"body": "x"}
        )
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"))
        await self.alice.ok("PUT", f"/rooms/{self.room}/send/{'t' * 255}/t1", {"body": "x"})
        path = f"/presence/{self.alice.user_id}/status"
        code, body = await self.alice.request(
            "PUT", path, {"presence": "online", "status_msg": "s" * (MAX_STATUS_MSG_LENGTH + 1)}
        )
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"))
        await self.alice.ok(
            "PUT", path, {"presence": "online", "status_msg": "s" * MAX_STATUS_MSG_LENGTH}
        )
