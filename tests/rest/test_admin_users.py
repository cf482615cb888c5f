"""The admin API's users (``/_synapse/admin/v{1,2,3}/users...``, deactivate,
reset_password, whois) and who may call it: on one process and in the
default layout (each request to another process)."""

from __future__ import annotations

from typing import Any, cast

import treq
from twisted.internet import reactor
from twisted.web.client import HTTPConnectionPool

from tests.harness.client_api import (
    DEFAULT_LAYOUT_STREAM_WRITERS,
    DEFAULT_LAYOUT_WORKERS,
    ClientApi,
    ThreeUsersTestCase,
    q,
)
from tests.harness.polling import eventually

ADMIN = "/_synapse/admin"
NOT_FOUND = "M_NOT_FOUND"


class AdminUsersTestCase(ThreeUsersTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        await super().setUp()
        await self.servers["main"].store.db_pool.execute(
            "t", "UPDATE users SET admin = TRUE WHERE name = ?", self.alice.user_id
        )

    async def admin_ok(self, method: str, path: str, body: Any = None) -> Any:
        return await self.alice.ok(method, ADMIN + path, body)

    async def logged_out(self, client: ClientApi) -> bool:
        code, _ = await client.request("GET", "/account/whoami")
        return code == 401

    async def test_server_version_needs_no_token(self) -> None:
        code, body = await self.bob.request("GET", ADMIN + "/v1/server_version", token=None)
        self.assertEqual(code, 200)
        self.assertTrue(body["server_version"].startswith("synapse_lite "))

    async def test_cors_preflight(self) -> None:
        # A browser UI on another origin asks first, without a token.
        origin: dict[bytes | str, list[bytes | str]] = {"Origin": ["https://admin.example.org"]}
        response = await treq.request(
            "OPTIONS",
            self.alice.base_url + ADMIN + "/v2/users",
            headers=origin,
            pool=HTTPConnectionPool(reactor, persistent=False),
            reactor=cast(Any, reactor),
        )
        await treq.content(response)
        self.assertEqual(response.code, 200)
        headers = response.headers
        self.assertEqual(headers.getRawHeaders("Access-Control-Allow-Origin"), ["*"])
        self.assertIn("Authorization", headers.getRawHeaders("Access-Control-Allow-Headers")[0])

    async def test_only_admins(self) -> None:
        bob = q(self.bob.user_id)
        for method, path, body in [
            ("GET", "/v2/users", None),
            ("GET", f"/v2/users/{bob}", None),
            ("PUT", f"/v2/users/{bob}", {"admin": True}),
            ("GET", f"/v1/users/{bob}/admin", None),
            ("PUT", f"/v1/users/{bob}/admin", {"admin": True}),
            ("POST", f"/v1/deactivate/{bob}", {}),
            ("POST", f"/v1/reset_password/{bob}", {"new_password": "x"}),
            ("GET", f"/v1/whois/{bob}", None),
        ]:
            code, answer = await self.bob.request(method, ADMIN + path, body)
            self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"), path)
            code, answer = await self.bob.request(method, ADMIN + path, body, token=None)
            self.assertEqual((code, answer["errcode"]), (401, "M_MISSING_TOKEN"), path)
        self.assertEqual(await self.admin_ok("GET", f"/v1/users/{bob}/admin"), {"admin": False})

    async def test_grant_admin(self) -> None:
        bob = q(self.bob.user_id)
        await self.admin_ok("PUT", f"/v1/users/{bob}/admin", {"admin": True})
        self.assertEqual(await self.admin_ok("GET", f"/v1/users/{bob}/admin"), {"admin": True})
        # Bob is an admin now: he may list users.
        await self.bob.ok("GET", ADMIN + "/v2/users")
        code, body = await self.alice.request(
            "PUT", ADMIN + f"/v1/users/{q(self.alice.user_id)}/admin", {"admin": False}
        )
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"))
        for path, body, code, errcode in [
            (f"/v1/users/{bob}/admin", {}, 400, "M_BAD_JSON"),
            (f"/v1/users/{bob}/admin", {"admin": "yes"}, 400, "M_BAD_JSON"),
            ("/v1/users/@nobody:test.local/admin", {"admin": True}, 404, "M_NOT_FOUND"),
            ("/v1/users/@someone:elsewhere/admin", {"admin": True}, 400, "M_INVALID_PARAM"),
            ("/v1/users/nobody/admin", {"admin": True}, 400, "M_INVALID_PARAM"),
        ]:
            got, answer = await self.alice.request("PUT", ADMIN + path, body)
            self.assertEqual((got, answer.get("errcode")), (code, errcode), (path, body))

    async def test_list_users(self) -> None:
        body = await self.admin_ok("GET", "/v2/users")
        self.assertEqual(body["total"], 3)
        self.assertNotIn("next_token", body)
        names = [u["name"] for u in body["users"]]
        self.assertEqual(names, sorted([self.alice.user_id, self.bob.user_id, self.eve.user_id]))
        first = body["users"][0]
        self.assertEqual((first["admin"], first["is_guest"], first["deactivated"]), (1, 0, 0))
        self.assertEqual(first["displayname"], "alice")
        v3 = await self.admin_ok("GET", "/v3/users?limit=2&dir=b")
        self.assertEqual([u["name"] for u in v3["users"]], names[::-1][:2])
        self.assertIs(v3["users"][0]["admin"], False)
        self.assertEqual(v3["next_token"], "2")
        rest = await self.admin_ok("GET", "/v3/users?limit=2&dir=b&from=2")
        self.assertEqual([u["name"] for u in rest["users"]], names[:1])
        found = await self.admin_ok("GET", "/v2/users?name=EV")
        self.assertEqual([u["name"] for u in found["users"]], [self.eve.user_id])
        admins = await self.admin_ok("GET", "/v2/users?admins=true")
        self.assertEqual([u["name"] for u in admins["users"]], [self.alice.user_id])
        await self.admin_ok("POST", f"/v1/deactivate/{q(self.eve.user_id)}", {})
        active = await self.admin_ok("GET", "/v2/users")
        self.assertEqual(active["total"], 2)
        every = await self.admin_ok("GET", "/v2/users?deactivated=true&order_by=deactivated&dir=b")
        self.assertEqual(every["users"][0]["name"], self.eve.user_id)
        by_name = await self.admin_ok("GET", "/v2/users?order_by=displayname")
        self.assertEqual(by_name["users"][0]["displayname"], "alice")
        for query in [
            "order_by=password",
            "dir=up",
            "guests=maybe",
            "limit=0",
            "limit=x",
            "from=-1",
        ]:
            code, answer = await self.alice.request("GET", ADMIN + "/v2/users?" + query)
            self.assertEqual((code, answer["errcode"]), (400, "M_INVALID_PARAM"), query)

    async def test_create_and_modify_user(self) -> None:
        path = ADMIN + "/v2/users/" + q("@carol:test.local")
        code, body = await self.alice.request(
            "PUT", path, {"password": "carol-pw", "displayname": "Carol", "admin": False}
        )
        self.assertEqual(code, 201, body)
        self.assertEqual((body["name"], body["displayname"]), ("@carol:test.local", "Carol"))
        self.assertEqual(body["threepids"], [])
        carol = ClientApi(self, self.alice.base_url)
        login = await carol.ok(
            "POST",
            "/login",
            {
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": "carol"},
                "password": "carol-pw",
            },
        )
        carol.token = login["access_token"]
        # Changed: a new password logs her devices out.
        code, body = await self.alice.request(
            "PUT", path, {"password": "new-pw", "displayname": "Caroline", "admin": True}
        )
        self.assertEqual(code, 200, body)
        self.assertEqual((body["displayname"], body["admin"]), ("Caroline", True))
        await eventually(lambda: self.logged_out(carol), what="logged out")
        # Deactivated, then back with a new password.
        body = await self.admin_ok("PUT", path[len(ADMIN) :], {"deactivated": True})
        self.assertIs(body["deactivated"], True)
        code, answer = await self.alice.request("PUT", path, {"deactivated": False})
        self.assertEqual((code, answer["errcode"]), (400, "M_MISSING_PARAM"))
        body = await self.admin_ok(
            "PUT", path[len(ADMIN) :], {"deactivated": False, "password": "back-pw"}
        )
        self.assertIs(body["deactivated"], False)
        for target, content, code, errcode in [
            ("@Upper:test.local", {}, 400, "M_INVALID_USERNAME"),
            ("@new:test.local", {"deactivated": True}, 400, "M_INVALID_PARAM"),
            ("@new:test.local", {"threepids": [{"medium": "email"}]}, 400, "M_INVALID_PARAM"),
            ("@new:test.local", {"password": 5}, 400, "M_BAD_JSON"),
            ("@new:elsewhere", {}, 400, "M_INVALID_PARAM"),
        ]:
            got, answer = await self.alice.request("PUT", ADMIN + "/v2/users/" + q(target), content)
            self.assertEqual((got, answer.get("errcode")), (code, errcode), (target, content))
        code, answer = await self.alice.request("GET", ADMIN + "/v2/users/@new:test.local")
        self.assertEqual((code, answer["errcode"]), (404, "M_NOT_FOUND"))

    async def test_deactivate_and_erase(self) -> None:
        room = await self.eve.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room}", {})
        body = await self.admin_ok("POST", f"/v1/deactivate/{q(self.bob.user_id)}", {"erase": True})
        # Nothing was bound: no identity server was asked.
        self.assertEqual(body, {"id_server_unbind_result": "no-support"})
        await eventually(lambda: self.logged_out(self.bob), what="logged out")
        user = await self.admin_ok("GET", f"/v2/users/{q(self.bob.user_id)}")
        self.assertEqual((user["deactivated"], user["erased"]), (True, True))
        members = await self.eve.ok("GET", f"/rooms/{room}/joined_members")
        self.assertNotIn(self.bob.user_id, members["joined"])
        code, answer = await self.alice.request(
            "POST", ADMIN + "/v1/deactivate/@nobody:test.local", {}
        )
        self.assertEqual((code, answer["errcode"]), (404, "M_NOT_FOUND"))

    async def test_reset_password(self) -> None:
        bob = q(self.bob.user_id)
        await self.admin_ok("POST", f"/v1/reset_password/{bob}", {"new_password": "pw2"})
        await eventually(lambda: self.logged_out(self.bob), what="logged out")
        login = await self.bob.request(
            "POST",
            "/login",
            {
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": "bob"},
                "password": "pw2",
            },
        )
        self.assertEqual(login[0], 200)
        for content, errcode in [
            ({}, "M_MISSING_PARAM"),
            ({"new_password": ""}, "M_INVALID_PARAM"),
        ]:
            code, answer = await self.alice.request(
                "POST", ADMIN + f"/v1/reset_password/{bob}", content
            )
            self.assertEqual((code, answer["errcode"]), (400, errcode), content)

    async def test_whois(self) -> None:
        body = await self.admin_ok("GET", f"/v1/whois/{q(self.bob.user_id)}")
        self.assertEqual(body["user_id"], self.bob.user_id)
        self.assertIn(self.bob.device_id, body["devices"])

    async def test_rooms_and_memberships(self) -> None:
        bob = q(self.bob.user_id)
        joined = await self.bob.create_room()
        invited = await self.eve.create_room()
        await self.eve.ok("POST", f"/rooms/{invited}/invite", {"user_id": self.bob.user_id})
        body = await self.admin_ok("GET", f"/v1/users/{bob}/joined_rooms")
        self.assertEqual(body, {"joined_rooms": [joined], "total": 1})
        body = await self.admin_ok("GET", f"/v1/users/{bob}/memberships")
        self.assertEqual(body, {"memberships": {joined: "join", invited: "invite"}, "total": 2})
        code, answer = await self.alice.request(
            "GET", ADMIN + "/v1/users/@nobody:test.local/joined_rooms"
        )
        self.assertEqual((code, answer["errcode"]), (404, "M_NOT_FOUND"))

    async def test_devices(self) -> None:
        bob = q(self.bob.user_id)
        device = self.bob.device_id
        await self.bob.ok("GET", "/account/whoami")  # seen from an address

        async def seen() -> bool:
            listed = await self.admin_ok("GET", f"/v2/users/{bob}/devices")
            return bool(listed["devices"][0]["last_seen_ip"])

        await eventually(seen, what="bob's device seen")
        body = await self.admin_ok("GET", f"/v2/users/{bob}/devices")
        self.assertEqual(body["total"], 1)
        self.assertEqual(body["devices"][0]["device_id"], device)
        self.assertEqual(body["devices"][0]["user_id"], self.bob.user_id)
        await self.admin_ok("PUT", f"/v2/users/{bob}/devices/{device}", {"display_name": "old"})
        one = await self.admin_ok("GET", f"/v2/users/{bob}/devices/{device}")
        self.assertEqual(one["display_name"], "old")
        await self.admin_ok("DELETE", f"/v2/users/{bob}/devices/{device}")
        # Another process forgets the token when the caches stream tells it.
        await eventually(lambda: self.logged_out(self.bob), what="bob logged out")
        self.assertEqual((await self.admin_ok("GET", f"/v2/users/{bob}/devices"))["total"], 0)
        eve = q(self.eve.user_id)
        # A device made by an admin: listed, with no token anyone was told;
        # made again, nothing changes (eve's own device keeps working).
        for _ in range(2):
            code, answer = await self.alice.request(
                "POST", ADMIN + f"/v2/users/{eve}/devices", {"device_id": "MADE"}
            )
            self.assertEqual((code, answer), (201, {}))
        listed = await self.admin_ok("GET", f"/v2/users/{eve}/devices")
        self.assertEqual(
            sorted(d["device_id"] for d in listed["devices"]), sorted(["MADE", self.eve.device_id])
        )
        await self.eve.ok("GET", "/account/whoami")
        await self.admin_ok(
            "POST", f"/v2/users/{eve}/delete_devices", {"devices": ["X", self.eve.device_id]}
        )
        await eventually(lambda: self.logged_out(self.eve), what="eve logged out")
        for method, path, content, code, errcode in [
            ("GET", f"/v2/users/{bob}/devices/NOPE", None, 404, "M_NOT_FOUND"),
            ("PUT", f"/v2/users/{bob}/devices/NOPE", {}, 404, "M_NOT_FOUND"),
            ("POST", f"/v2/users/{eve}/delete_devices", {"devices": "X"}, 400, "M_BAD_JSON"),
            ("GET", "/v2/users/@nobody:test.local/devices", None, 404, "M_NOT_FOUND"),
            ("POST", "/v2/users/@nobody:test.local/devices", {"device_id": "D"}, 404, NOT_FOUND),
            ("POST", f"/v2/users/{eve}/devices", {}, 400, "M_MISSING_PARAM"),
            ("POST", f"/v2/users/{eve}/devices", {"device_id": "x" * 300}, 400, "M_INVALID_PARAM"),
        ]:
            got, answer = await self.alice.request(method, ADMIN + path, content)
            self.assertEqual((got, answer["errcode"]), (code, errcode), path)

    async def test_username_available(self) -> None:
        body = await self.admin_ok("GET", "/v1/username_available?username=frank")
        self.assertEqual(body, {"available": True})
        for query, errcode in [
            ("username=bob", "M_USER_IN_USE"),
            ("username=b%20b", "M_INVALID_USERNAME"),
            ("", "M_MISSING_PARAM"),
        ]:
            code, answer = await self.alice.request(
                "GET", ADMIN + "/v1/username_available?" + query
            )
            self.assertEqual((code, answer["errcode"]), (400, errcode), query)

    async def test_pushers(self) -> None:
        pusher = {
            "app_id": "org.example.app",
            "pushkey": "key1",
            "kind": "http",
            "app_display_name": "App",
            "device_display_name": "Phone",
            "lang": "en",
            "data": {"url": "https://push.example.org/_matrix/push/v1/notify"},
        }
        await self.bob.ok("POST", "/pushers/set", pusher)
        bob = q(self.bob.user_id)

        async def listed() -> bool:
            body = await self.admin_ok("GET", f"/v1/users/{bob}/pushers")
            return body["total"] == 1

        await eventually(listed, what="bob's pusher listed")
        body = await self.admin_ok("GET", f"/v1/users/{bob}/pushers")
        self.assertEqual(
            (body["pushers"][0]["pushkey"], body["pushers"][0]["user_name"]),
            ("key1", self.bob.user_id),
        )

    async def test_media_and_statistics(self) -> None:
        store = self.servers["main"].store
        for media_id, user, length, created in [
            ("m1", self.bob.user_id, 10, 3),
            ("m2", self.bob.user_id, 30, 1),
            ("m3", self.eve.user_id, 5, 2),
        ]:
            await store.db_pool.execute(
                "t",
                "INSERT INTO local_media (media_id, user_id, created_ts, media_type,"
                " media_length, upload_name, uploaded_ts) VALUES (?, ?, ?, 'text/plain', ?, ?, ?)",
                media_id,
                user,
                created,
                length,
                media_id + ".txt",
                created,
            )
        bob = q(self.bob.user_id)
        body = await self.admin_ok("GET", f"/v1/users/{bob}/media")
        self.assertEqual(([m["media_id"] for m in body["media"]], body["total"]), (["m2", "m1"], 2))
        body = await self.admin_ok(
            "GET", f"/v1/users/{bob}/media?order_by=media_length&dir=b&limit=1"
        )
        self.assertEqual(([m["media_id"] for m in body["media"]], body["next_token"]), (["m2"], 1))
        stats = await self.admin_ok("GET", "/v1/statistics/users/media?order_by=media_length&dir=b")
        self.assertEqual(
            [(u["user_id"], u["media_count"], u["media_length"]) for u in stats["users"]],
            [(self.bob.user_id, 2, 40), (self.eve.user_id, 1, 5)],
        )
        found = await self.admin_ok("GET", "/v1/statistics/users/media?search_term=EVE")
        self.assertEqual([u["user_id"] for u in found["users"]], [self.eve.user_id])
        for path in [f"/v1/users/{bob}/media?order_by=size", "/v1/statistics/users/media?dir=x"]:
            code, answer = await self.alice.request("GET", ADMIN + path)
            self.assertEqual((code, answer["errcode"]), (400, "M_INVALID_PARAM"), path)

    async def test_join(self) -> None:
        room = await self.alice.create_room(preset="public_chat", room_alias_name="hall")
        body = await self.admin_ok(
            "POST", "/v1/join/" + q("#hall:test.local"), {"user_id": self.bob.user_id}
        )
        self.assertEqual(body, {"room_id": room})
        rooms = await self.admin_ok("GET", f"/v1/users/{q(self.bob.user_id)}/joined_rooms")
        self.assertEqual(rooms["joined_rooms"], [room])
        private = await self.alice.create_room()
        for target, content, code, errcode in [
            (private, {"user_id": self.bob.user_id}, 403, "M_FORBIDDEN"),
            ("#nope:test.local", {"user_id": self.bob.user_id}, 404, "M_NOT_FOUND"),
            (room, {"user_id": "@nobody:test.local"}, 404, "M_NOT_FOUND"),
            (room, {}, 400, "M_MISSING_PARAM"),
            ("nonsense", {"user_id": self.bob.user_id}, 400, "M_INVALID_PARAM"),
        ]:
            got, answer = await self.alice.request("POST", ADMIN + "/v1/join/" + q(target), content)
            self.assertEqual((got, answer.get("errcode")), (code, errcode), (target, content))


class AdminUsersDefaultLayoutTestCase(AdminUsersTestCase):
    workers = DEFAULT_LAYOUT_WORKERS
    stream_writers = DEFAULT_LAYOUT_STREAM_WRITERS
