"""The client API called by an application service with its ``as_token``:
identity assertion, registering its users, logging in as them, exclusive
namespaces, and rate limits."""

from __future__ import annotations

from tests.appservice.registrations import irc_registration, write_registrations
from tests.harness.client_api import q, start_cluster
from tests.harness.server import DatabaseTestCase

AS_TOKEN = "irc-as-token"


class AppServiceClientApiTestCase(DatabaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.servers, self.clients, _ = start_cluster(
            self,
            self.test_db,
            enable_registration=True,
            app_service_config_files=write_registrations(irc_registration()),
            rate_limiting={"messages": {"per_second": 0.001, "burst": 2}},
        )
        self.api = self.clients["main"]
        self.service = self.api.as_user(AS_TOKEN)

    async def register_as_service(self, username: str) -> tuple[int, dict]:
        return await self.service.request(
            "POST",
            "/register",
            {"type": "m.login.application_service", "username": username, "inhibit_login": True},
        )

    async def test_sender_and_asserted_user(self) -> None:
        whoami = await self.service.ok("GET", "/account/whoami")
        self.assertEqual(whoami["user_id"], "@_irc_bot:test.local")
        self.assertNotIn("device_id", whoami)
        code, body = await self.register_as_service("_irc_alice")
        self.assertEqual((code, body["user_id"]), (200, "@_irc_alice:test.local"))
        self.assertNotIn("access_token", body)
        whoami = await self.service.ok("GET", "/account/whoami?user_id=@_irc_alice:test.local")
        self.assertEqual(whoami["user_id"], "@_irc_alice:test.local")

    async def test_assertion_outside_the_namespace_or_unregistered(self) -> None:
        await self.api.register("bob")
        code, body = await self.service.request("GET", "/account/whoami?user_id=@bob:test.local")
        self.assertEqual((code, body["errcode"]), (403, "M_EXCLUSIVE"))
        code, body = await self.service.request(
            "GET", "/account/whoami?user_id=@_irc_nobody:test.local"
        )
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        code, body = await self.api.as_user("no-such-token").request("GET", "/account/whoami")
        self.assertEqual((code, body["errcode"]), (401, "M_UNKNOWN_TOKEN"))

    async def test_device_masquerading(self) -> None:
        await self.register_as_service("_irc_carol")
        code, login = await self.service.request(
            "POST",
            "/login",
            {
                "type": "m.login.application_service",
                "identifier": {"type": "m.id.user", "user": "_irc_carol"},
                "device_id": "CAROLDEV",
            },
        )
        self.assertEqual(code, 200, login)
        self.assertEqual(login["user_id"], "@_irc_carol:test.local")
        whoami = await self.service.ok(
            "GET", "/account/whoami?user_id=@_irc_carol:test.local&device_id=CAROLDEV"
        )
        self.assertEqual(whoami["device_id"], "CAROLDEV")
        code, body = await self.service.request(
            "GET", "/account/whoami?user_id=@_irc_carol:test.local&device_id=NOPE"
        )
        self.assertEqual((code, body["errcode"]), (400, "M_UNKNOWN_DEVICE"))

    async def test_login_outside_the_namespace_and_without_the_token(self) -> None:
        await self.api.register("dave")
        body = {
            "type": "m.login.application_service",
            "identifier": {"type": "m.id.user", "user": "dave"},
        }
        code, answer = await self.service.request("POST", "/login", body)
        self.assertEqual((code, answer["errcode"]), (403, "M_EXCLUSIVE"))
        code, answer = await self.api.request("POST", "/login", body, token=None)
        self.assertEqual((code, answer["errcode"]), (401, "M_MISSING_TOKEN"))

    async def test_exclusive_namespace_refused_to_others(self) -> None:
        code, body = await self.api.request(
            "POST",
            "/register",
            {"username": "irc-mallory", "password": "pw-pw-pw", "auth": {"type": "m.login.dummy"}},
            token=None,
        )
        self.assertEqual((code, body["errcode"]), (400, "M_EXCLUSIVE"))
        code, body = await self.api.request(
            "GET", "/register/available?username=irc-mallory", token=None
        )
        self.assertEqual((code, body["errcode"]), (400, "M_EXCLUSIVE"))
        code, body = await self.register_as_service("irc-mallory")
        self.assertEqual(code, 200, body)
        # A name without the underscore rule: the sender's namespace is exclusive too.
        code, body = await self.register_as_service("someone_else")
        self.assertEqual((code, body["errcode"]), (400, "M_EXCLUSIVE"))
        code, body = await self.api.as_user("bad").request(
            "POST", "/register", {"type": "m.login.application_service", "username": "_irc_x"}
        )
        self.assertEqual((code, body["errcode"]), (401, "M_UNKNOWN_TOKEN"))

    async def test_unlimited_service_is_not_rate_limited(self) -> None:
        room_id = await self.service.create_room()
        for i in range(6):
            await self.service.ok(
                "PUT",
                f"/rooms/{room_id}/send/m.room.message/t{i}",
                {"msgtype": "m.text", "body": str(i)},
            )
        # An ordinary user hits the limit of 2 at once.
        alice = await self.api.register("alice")
        room = await alice.create_room()
        codes = []
        for i in range(4):
            code, _ = await alice.request(
                "PUT", f"/rooms/{room}/send/m.room.message/a{i}", {"msgtype": "m.text", "body": "x"}
            )
            codes.append(code)
        self.assertIn(429, codes)

    async def test_timestamp_massaging(self) -> None:
        room_id = await self.service.create_room()
        sent = await self.service.ok(
            "PUT",
            f"/rooms/{room_id}/send/m.room.message/ts1?ts=1234567890",
            {"msgtype": "m.text", "body": "from the past"},
        )
        event = await self.service.ok("GET", f"/rooms/{room_id}/event/{sent['event_id']}")
        self.assertEqual(event["origin_server_ts"], 1234567890)
        code, body = await self.service.request(
            "PUT", f"/rooms/{room_id}/state/m.room.topic/?ts=soon", {"topic": "x"}
        )
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"))
        # Ignored from ordinary users.
        alice = await self.api.register("alice")
        room = await alice.create_room()
        sent = await alice.ok(
            "PUT", f"/rooms/{room}/send/m.room.message/a?ts=5", {"msgtype": "m.text", "body": "x"}
        )
        event = await alice.ok("GET", f"/rooms/{room}/event/{sent['event_id']}")
        self.assertNotEqual(event["origin_server_ts"], 5)

    async def test_device_management_without_login(self) -> None:
        await self.register_as_service("_irc_dora")
        as_dora = "?user_id=@_irc_dora:test.local"
        code, _ = await self.service.request(
            "PUT", f"/devices/BRIDGEDEV{as_dora}", {"display_name": "bridge"}
        )
        self.assertEqual(code, 201)
        code, _ = await self.service.request(
            "PUT", f"/devices/BRIDGEDEV{as_dora}", {"display_name": "renamed"}
        )
        self.assertEqual(code, 200)
        devices = await self.service.ok("GET", f"/devices{as_dora}")
        self.assertEqual(
            [(d["device_id"], d["display_name"]) for d in devices["devices"]],
            [("BRIDGEDEV", "renamed")],
        )
        # Deleted without interactive auth.
        await self.service.ok("DELETE", f"/devices/BRIDGEDEV{as_dora}", {})
        self.assertEqual((await self.service.ok("GET", f"/devices{as_dora}"))["devices"], [])
        # An ordinary user still cannot make a device this way.
        alice = await self.api.register("alice")
        code, _ = await alice.request("PUT", "/devices/NEWDEV", {})
        self.assertEqual(code, 404)

    async def test_network_room_lists(self) -> None:
        """``PUT /directory/list/appservice/{networkId}/{roomId}``: the room is
        in that network's list only, seen through ``third_party_instance_id``
        ``<as_id>|<network_id>`` and ``include_all_networks``."""
        alice = await self.api.register("alice")
        room_id = await alice.create_room(preset="public_chat", name="Bridged")
        listing = f"/directory/list/appservice/libera/{room_id}"
        await self.service.ok("PUT", listing, {"visibility": "public"})

        async def listed(body: dict) -> list[str]:
            page = await alice.ok("POST", "/publicRooms", body)
            return [entry["room_id"] for entry in page["chunk"]]

        self.assertEqual(await listed({}), [])
        self.assertEqual(await listed({"third_party_instance_id": "irc|libera"}), [room_id])
        self.assertEqual(await listed({"third_party_instance_id": "irc|oftc"}), [])
        self.assertEqual(await listed({"include_all_networks": True}), [room_id])
        # Also in the server's own list: still once with all networks.
        await alice.ok("PUT", f"/directory/list/room/{room_id}", {"visibility": "public"})
        self.assertEqual(await listed({"include_all_networks": True}), [room_id])
        await alice.ok("PUT", f"/directory/list/room/{room_id}", {"visibility": "private"})
        await self.service.ok("PUT", listing, {"visibility": "private"})
        self.assertEqual(await listed({"third_party_instance_id": "irc|libera"}), [])
        await self.service.ok("PUT", listing, {"visibility": "public"})
        await self.service.ok("DELETE", listing)
        self.assertEqual(await listed({"include_all_networks": True}), [])

    async def test_network_room_list_errors(self) -> None:
        alice = await self.api.register("alice")
        room_id = await alice.create_room()
        listing = f"/directory/list/appservice/libera/{room_id}"
        code, body = await alice.request("PUT", listing, {"visibility": "public"})
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        code, body = await self.service.request("PUT", listing, {"visibility": "shown"})
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"))
        code, body = await self.service.request("PUT", listing, {})
        self.assertEqual((code, body["errcode"]), (400, "M_MISSING_PARAM"))
        code, body = await self.service.request(
            "PUT", "/directory/list/appservice/libera/!nowhere:test.local", {"visibility": "public"}
        )
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))
        code, body = await alice.request(
            "POST", "/publicRooms", {"third_party_instance_id": "libera"}
        )
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"))
        code, body = await alice.request(
            "POST",
            "/publicRooms",
            {"third_party_instance_id": "irc|libera", "include_all_networks": True},
        )
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"))

    async def test_service_deactivates_its_user_without_uia(self) -> None:
        await self.register_as_service("_irc_eve")
        as_eve = "?user_id=@_irc_eve:test.local"
        await self.service.ok("POST", "/createRoom" + as_eve, {})
        # No auth dict: the as_token is the authentication.
        await self.service.ok("POST", "/account/deactivate" + as_eve, {})
        self.assertEqual(
            (await self.service.ok("GET", "/joined_rooms" + as_eve))["joined_rooms"], []
        )
        # An ordinary user still goes through interactive auth.
        alice = await self.api.register("alice")
        code, body = await alice.request("POST", "/account/deactivate", {})
        self.assertEqual(code, 401, body)

    async def test_service_places_its_alias_on_a_room_it_is_not_in(self) -> None:
        alice = await self.api.register("alice")
        room_id = (await alice.ok("POST", "/createRoom", {}))["room_id"]
        alias = q("#_irc_elsewhere:test.local")
        await self.service.ok("PUT", f"/directory/room/{alias}", {"room_id": room_id})
        self.assertEqual((await alice.ok("GET", f"/directory/room/{alias}"))["room_id"], room_id)
        # An ordinary user outside the room still may not.
        bob = await self.api.register("bob")
        code, _ = await bob.request(
            "PUT", "/directory/room/" + q("#bobs:test.local"), {"room_id": room_id}
        )
        self.assertEqual(code, 403)
