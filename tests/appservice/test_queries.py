"""The homeserver asking a service about unknown users and aliases in its
namespaces (the service makes them while the lookup waits), exclusive
aliases, and pings."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, reactor
from twisted.internet.task import deferLater

from synapse_lite.appservice import sender as sender_module
from tests.appservice.fake_service import FakeApplicationService
from tests.appservice.registrations import irc_registration, write_registrations
from tests.harness.client_api import ClientApi, q, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase

AS_TOKEN = "irc-as-token"


class QueriesTestCase(DatabaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.patch(sender_module, "POLL_SECONDS", 0.05)
        self.service = FakeApplicationService()
        url = self.service.listen()
        self.addCleanup(self.service.port.stopListening)
        silent = irc_registration(
            None, id="silent", as_token="s-as", hs_token="s-hs", sender_localpart="silent"
        )
        silent["namespaces"] = {}
        _, clients, _ = start_cluster(
            self,
            self.test_db,
            app_service_config_files=write_registrations(
                irc_registration(url, protocols=["irc", "gone"]), silent
            ),
        )
        self.api = clients["main"]
        self.bridge = self.api.as_user(AS_TOKEN)

    async def test_unknown_alias_is_made_by_the_service_while_the_lookup_waits(self) -> None:
        made: dict[str, str] = {}

        async def make_room(kind: str, alias: str) -> None:
            # The bridge creates the room and alias through the client API
            # of the homeserver whose lookup is waiting for this answer.
            room_id = (
                await self.bridge.ok("POST", "/createRoom", {"room_alias_name": "_irc_chan"})
            )["room_id"]
            made[alias] = room_id
            self.service.known_aliases.add(alias)

        self.service.on_query = lambda kind, alias: defer.ensureDeferred(make_room(kind, alias))
        alice = await ClientApi(self, self.api.base_url).register("alice")
        answer = await alice.ok("GET", "/directory/room/" + q("#_irc_chan:test.local"))
        self.assertEqual(answer["room_id"], made["#_irc_chan:test.local"])
        self.assertEqual(self.service.queries, [("rooms", "#_irc_chan:test.local")])
        # Known now: no second query.
        code, _ = await alice.request("POST", "/join/" + q("#_irc_chan:test.local"), {})
        self.assertIn(code, (200, 403))  # the room is private: asked, found, refused
        self.assertEqual(len(self.service.queries), 1)

    async def test_alias_outside_every_namespace_is_not_asked(self) -> None:
        alice = await ClientApi(self, self.api.base_url).register("alice")
        code, body = await alice.request("GET", "/directory/room/" + q("#nope:test.local"))
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))
        code, body = await alice.request("GET", "/directory/room/" + q("#_irc_x:test.local"))
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))
        self.assertEqual(self.service.queries, [("rooms", "#_irc_x:test.local")])

    async def test_exclusive_alias_refused_to_others(self) -> None:
        alice = await ClientApi(self, self.api.base_url).register("alice")
        code, body = await alice.request("POST", "/createRoom", {"room_alias_name": "_irc_x"})
        self.assertEqual((code, body["errcode"]), (400, "M_EXCLUSIVE"))
        room_id = await alice.create_room()
        code, body = await alice.request(
            "PUT", "/directory/room/" + q("#_irc_y:test.local"), {"room_id": room_id}
        )
        self.assertEqual((code, body["errcode"]), (400, "M_EXCLUSIVE"))
        # The service may not make aliases outside its namespace either.
        code, body = await self.bridge.request("POST", "/createRoom", {"room_alias_name": "plain"})
        self.assertEqual((code, body["errcode"]), (400, "M_EXCLUSIVE"))

    async def test_unknown_user_is_made_by_the_service(self) -> None:
        async def register(kind: str, user_id: str) -> None:
            localpart = user_id[1:].split(":")[0]
            await self.bridge.ok(
                "POST",
                "/register",
                {
                    "type": "m.login.application_service",
                    "username": localpart,
                    "inhibit_login": True,
                },
            )
            self.service.known_users.add(user_id)

        self.service.on_query = lambda kind, user_id: defer.ensureDeferred(register(kind, user_id))
        profile = await self.api.as_user(None).request(
            "GET", "/profile/" + q("@_irc_new:test.local")
        )
        self.assertEqual(profile[0], 200, profile)
        # Inviting an unknown namespaced user asks too.
        alice = await ClientApi(self, self.api.base_url).register("alice")
        room_id = await alice.create_room()
        await alice.ok("POST", f"/rooms/{room_id}/invite", {"user_id": "@_irc_other:test.local"})
        self.assertEqual(
            self.service.queries,
            [("users", "@_irc_new:test.local"), ("users", "@_irc_other:test.local")],
        )
        code, _ = await alice.request(
            "POST", f"/rooms/{room_id}/invite", {"user_id": "@nobody:test.local"}
        )
        self.assertEqual(code, 404)
        self.assertEqual(len(self.service.queries), 2)

    async def test_ping(self) -> None:
        answer = await self.bridge.ok(
            "POST", "/_matrix/client/v1/appservice/irc/ping", {"transaction_id": "t1"}
        )
        self.assertGreaterEqual(answer["duration_ms"], 0)
        self.assertEqual(self.service.pings, [{"transaction_id": "t1"}])
        self.service.mode = "error"
        code, body = await self.bridge.request("POST", "/_matrix/client/v1/appservice/irc/ping", {})
        self.assertEqual((code, body["errcode"], body["status"]), (502, "M_BAD_STATUS", 500))
        code, body = await self.bridge.request(
            "POST", "/_matrix/client/v1/appservice/silent/ping", {}
        )
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        code, body = await self.api.as_user("s-as").request(
            "POST", "/_matrix/client/v1/appservice/silent/ping", {}
        )
        self.assertEqual((code, body["errcode"]), (400, "M_URL_NOT_SET"))
        await self.service.port.stopListening()
        code, body = await self.bridge.request("POST", "/_matrix/client/v1/appservice/irc/ping", {})
        self.assertEqual((code, body["errcode"]), (502, "M_CONNECTION_FAILED"))

    async def test_a_ping_sends_what_waits_at_once(self) -> None:
        self.patch(sender_module, "FIRST_BACKOFF_SECONDS", 3600.0)
        await self.bridge.ok("POST", "/createRoom", {})
        await eventually(lambda: self.service.events, what="the room's events")
        self.service.mode = "error"
        room_id = (await self.bridge.ok("POST", "/createRoom", {}))["room_id"]
        await eventually(lambda: len(self.service.attempts) >= 2, what="a refused transaction")
        self.service.mode = "ok"
        await deferLater(reactor, 0.2, lambda: None)
        self.assertFalse(any(e["room_id"] == room_id for e in self.service.events))
        await self.bridge.ok("POST", "/_matrix/client/v1/appservice/irc/ping", {})
        await eventually(
            lambda: any(e["room_id"] == room_id for e in self.service.events),
            what="the waiting transaction",
        )

    async def test_thirdparty_protocols_come_from_the_services(self) -> None:
        irc: dict[str, Any] = {
            "user_fields": ["network", "nickname"],
            "location_fields": ["network", "channel"],
            "icon": "mxc://example.org/irc",
            "field_types": {},
            "instances": [{"network_id": "libera", "desc": "Libera", "fields": {}}],
        }
        self.service.protocols = {"irc": irc}
        alice = await ClientApi(self, self.api.base_url).register("alice")
        # "gone" is listed but its service does not describe it: left out.
        # Each instance is named for /publicRooms' third_party_instance_id.
        named = {**irc, "instances": [{**irc["instances"][0], "instance_id": "irc|libera"}]}
        self.assertEqual(await alice.ok("GET", "/thirdparty/protocols"), {"irc": named})
        self.assertEqual(await alice.ok("GET", "/thirdparty/protocol/irc"), named)
        code, body = await alice.request("GET", "/thirdparty/protocol/gone")
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))

    async def test_protocol_described_by_the_last_good_answer(self) -> None:
        irc = {"user_fields": ["nickname"], "location_fields": [], "icon": "", "instances": []}
        self.service.protocols = {"irc": irc}
        alice = await ClientApi(self, self.api.base_url).register("alice")
        self.assertEqual(await alice.ok("GET", "/thirdparty/protocol/irc"), irc)
        # The service stops describing it: its earlier description stands.
        self.service.protocols = {}
        self.assertEqual(await alice.ok("GET", "/thirdparty/protocol/irc"), irc)
        self.assertEqual(await alice.ok("GET", "/thirdparty/protocols"), {"irc": irc})

    async def test_thirdparty_user_and_location_lookups_go_to_the_service(self) -> None:
        user = {"protocol": "irc", "fields": {"nickname": "bob"}, "userid": "@_irc_bob:test.local"}
        self.service.thirdparty = {("user", "irc"): [user], ("location", "irc"): []}
        alice = await ClientApi(self, self.api.base_url).register("alice")
        self.assertEqual(await alice.ok("GET", "/thirdparty/user/irc?nickname=bob"), [user])
        # The fields reach the service; the caller's token does not.
        self.assertEqual(self.service.thirdparty_queries, [{b"nickname": [b"bob"]}])
        self.assertEqual(await alice.ok("GET", "/thirdparty/location/irc?channel=x"), [])
        code, body = await alice.request("GET", "/thirdparty/user/nothere?nickname=bob")
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))

    async def test_service_sender_is_invited_and_joins_without_registering(self) -> None:
        alice = await ClientApi(self, self.api.base_url).register("alice")
        room_id = (await alice.ok("POST", "/createRoom", {}))["room_id"]
        await alice.ok("POST", f"/rooms/{q(room_id)}/invite", {"user_id": "@silent:test.local"})
        silent = self.api.as_user("s-as")
        await silent.ok("POST", "/join/" + q(room_id) + "?user_id=" + q("@silent:test.local"), {})
        members = await alice.ok("GET", f"/rooms/{q(room_id)}/joined_members")
        self.assertIn("@silent:test.local", members["joined"])
        self.assertEqual(self.service.queries, [])
