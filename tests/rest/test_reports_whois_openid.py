"""Reporting events, rooms and users; ``GET /admin/whois``; OpenID tokens and
the federation API's ``/openid/userinfo``. On one process and through a
reader worker (requests there, the room on an events-writer worker)."""

from __future__ import annotations

import json
from typing import Any, cast

import treq
from twisted.internet import reactor
from twisted.web.client import HTTPConnectionPool

from synapse_lite.http.server import make_site
from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase
from tests.harness.spec import assert_spec_response

_reactor = cast(Any, reactor)
RESOURCES = ("client", "replication", "federation", "keys")


class ReportsWhoisOpenIdTestCase(DatabaseTestCase):
    workers: list[str] = []
    stream_writers: dict[str, Any] | None = None
    entry = "main"

    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(
            self,
            self.test_db,
            workers=self.workers,
            stream_writers=self.stream_writers,
            resources=RESOURCES,
        )
        base = clients[self.entry].base_url
        self.alice = await ClientApi(self, base).register("alice")
        self.bob = await ClientApi(self, base).register("bob")

    async def reports(self) -> list[tuple[Any, ...]]:
        return await self.servers["main"].store.db_pool.select(
            "t",
            "SELECT reporter, room_id, event_id, reported_user_id, reason FROM content_reports"
            " ORDER BY received_ts",
        )

    async def test_report_event(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        event_id = await self.alice.send(room, "rude")
        other_room = await self.alice.create_room(preset="public_chat")
        other_event = await self.alice.send(other_room, "elsewhere")
        # Not joined: as if the event did not exist.
        code, body = await self.bob.request(
            "POST", f"/rooms/{room}/report/{event_id}", {"reason": "r"}
        )
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))
        await self.bob.ok("POST", f"/join/{room}", {})
        body = await self.bob.ok(
            "POST", f"/rooms/{room}/report/{event_id}", {"reason": "this makes me sad"}
        )
        self.assertEqual(body, {})
        assert_spec_response(
            self, "report_content.yaml", "/rooms/{roomId}/report/{eventId}", "POST", 200, body
        )
        await self.bob.ok("POST", f"/rooms/{room}/report/{event_id}", {"score": -100})
        for path, content, code, errcode in [
            (f"/rooms/{room}/report/$nope", {}, 404, "M_NOT_FOUND"),
            (f"/rooms/{room}/report/{other_event}", {}, 404, "M_NOT_FOUND"),
            (f"/rooms/{room}/report/{event_id}", {"reason": 5}, 400, "M_BAD_JSON"),
            (f"/rooms/{room}/report/{event_id}", {"reason": "x" * 5000}, 400, "M_INVALID_PARAM"),
            (f"/rooms/{room}/report/{event_id}", {"score": 1}, 400, "M_INVALID_PARAM"),
            (f"/rooms/{room}/report/{event_id}", {"score": "-1"}, 400, "M_INVALID_PARAM"),
            (f"/rooms/not-a-room/report/{event_id}", {}, 400, "M_INVALID_PARAM"),
        ]:
            got, answer = await self.bob.request("POST", path, content)
            self.assertEqual((got, answer.get("errcode")), (code, errcode), (path, content))
        self.assertEqual(
            [tuple(r) for r in await self.reports()],
            [
                (self.bob.user_id, room, event_id, None, "this makes me sad"),
                (self.bob.user_id, room, event_id, None, None),
            ],
        )

    async def test_report_room_and_user(self) -> None:
        room = await self.alice.create_room()
        # No need to be in the room.
        await self.bob.ok("POST", f"/rooms/{room}/report", {"reason": ""})
        await self.bob.ok("POST", f"/users/{self.alice.user_id}/report", {"reason": "spam"})
        for path, content, code, errcode in [
            (f"/rooms/{room}/report", {}, 400, "M_MISSING_PARAM"),
            ("/rooms/!nope:test.local/report", {"reason": "r"}, 404, "M_NOT_FOUND"),
            ("/users/@nobody:test.local/report", {"reason": "r"}, 404, "M_NOT_FOUND"),
            ("/users/nobody/report", {"reason": "r"}, 400, "M_INVALID_PARAM"),
        ]:
            got, answer = await self.bob.request("POST", path, content)
            self.assertEqual((got, answer.get("errcode")), (code, errcode), path)
        self.assertEqual(
            [tuple(r) for r in await self.reports()],
            [
                (self.bob.user_id, room, None, None, ""),
                (self.bob.user_id, None, None, self.alice.user_id, "spam"),
            ],
        )

    async def test_whois(self) -> None:
        path = f"/admin/whois/{self.alice.user_id}"
        await self.alice.request("GET", "/account/whoami", headers={"User-Agent": ["tester/1"]})

        seen: list[Any] = []

        async def recorded() -> bool:
            seen.append(await self.alice.ok("GET", path))
            connections = seen[-1]["devices"][self.alice.device_id]["sessions"][0]["connections"]
            return any(c["user_agent"] == "tester/1" for c in connections)

        await eventually(recorded, what="alice's user agent in whois")
        body = seen[-1]
        self.assertEqual(body["user_id"], self.alice.user_id)
        connection = next(
            c
            for c in body["devices"][self.alice.device_id]["sessions"][0]["connections"]
            if c["user_agent"] == "tester/1"
        )
        self.assertEqual(connection["ip"], "127.0.0.1")
        assert_spec_response(self, "admin.yaml", "/v3/admin/whois/{userId}", "GET", 200, body)

        code, body = await self.bob.request("GET", path)
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        await self.servers["main"].store.db_pool.execute(
            "t", "UPDATE users SET admin = TRUE WHERE name = ?", self.bob.user_id
        )
        body = await self.bob.ok("GET", path)
        self.assertIn(self.alice.device_id, body["devices"])
        code, body = await self.bob.request("GET", "/admin/whois/@nobody:test.local")
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))
        code, body = await self.bob.request("GET", "/admin/whois/nobody")
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"))

    def federation_url(self) -> str:
        hs = self.servers[self.entry]
        site = make_site(hs.listeners.resources.tree(("federation",)), 1_048_576)
        port = _reactor.listenTCP(0, site, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        return f"http://127.0.0.1:{port.getHost().port}/_matrix/federation/v1/openid/userinfo"

    async def userinfo(self, query: str) -> tuple[int, Any]:
        pool = HTTPConnectionPool(_reactor, persistent=False)
        response = await treq.get(self.federation_url() + query, pool=pool, reactor=_reactor)
        return response.code, json.loads(await treq.content(response))

    async def test_openid(self) -> None:
        path = f"/user/{self.alice.user_id}/openid/request_token"
        body = await self.alice.ok("POST", path, {})
        assert_spec_response(
            self, "openid.yaml", "/user/{userId}/openid/request_token", "POST", 200, body
        )
        self.assertEqual(body["token_type"], "Bearer")
        self.assertEqual(body["matrix_server_name"], "test.local")
        self.assertEqual(body["expires_in"], 3600)
        code, info = await self.userinfo(f"?access_token={body['access_token']}")
        self.assertEqual((code, info), (200, {"sub": self.alice.user_id}))
        # Not an access token: the client API refuses it.
        code, _ = await self.alice.as_user(body["access_token"]).request("GET", "/account/whoami")
        self.assertEqual(code, 401)

        for query, errcode in [
            ("?access_token=nope", "M_UNKNOWN_TOKEN"),
            ("", "M_MISSING_TOKEN"),
            (f"?access_token={self.alice.token}", "M_UNKNOWN_TOKEN"),
        ]:
            code, info = await self.userinfo(query)
            self.assertEqual((code, info["errcode"]), (401, errcode), query)

        code, answer = await self.bob.request("POST", path, {})
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"))
        code, answer = await self.alice.request("POST", path, raw=b"[]")
        self.assertEqual((code, answer["errcode"]), (400, "M_BAD_JSON"))

    async def test_openid_tokens_expire(self) -> None:
        hs = self.servers[self.entry]
        body = await self.alice.ok("POST", f"/user/{self.alice.user_id}/openid/request_token", {})
        await hs.store.db_pool.execute("t", "UPDATE openid_tokens SET valid_until_ms = 1")
        code, info = await self.userinfo(f"?access_token={body['access_token']}")
        self.assertEqual((code, info["errcode"]), (401, "M_UNKNOWN_TOKEN"))


class ReportsWhoisOpenIdThroughWorkersTestCase(ReportsWhoisOpenIdTestCase):
    workers = ["writer1", "reader1"]
    stream_writers = {"events": ["writer1"]}
    entry = "reader1"
