"""Guest accounts: ``POST /register?kind=guest`` behind ``allow_guest_access``,
guests limited to the spec's list of endpoints (every route checked),
``m.room.guest_access`` enforced on join and guests removed when it is
revoked (by the room's events writer), upgrades to a full account with the
guest's token, display names. On SQLite and PostgreSQL
(``SYNAPSE_LITE_TEST_DB``)."""

from __future__ import annotations

import urllib.parse
from typing import Any

from synapse_lite.api.guest_access import GUEST_SERVLETS, guest_may_call
from synapse_lite.handlers.auth import hash_token
from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase
from tests.harness.spec import assert_spec_response
from tests.rest.test_fuzz_client import ENDS_SESSION, client_routes


def q(value: str | None) -> str:
    assert value is not None
    return urllib.parse.quote(value, safe="")


async def register_guest(client: ClientApi) -> ClientApi:
    body = await client.ok("POST", "/register?kind=guest", {})
    guest = client.as_user(body["access_token"])
    guest.user_id, guest.device_id = body["user_id"], body["device_id"]
    return guest


async def guest_room(owner: ClientApi, **state: str) -> str:
    """A public room guests may join (and with ``history_visibility``, that)."""
    room = await owner.create_room(preset="public_chat")
    await owner.ok("PUT", f"/rooms/{room}/state/m.room.guest_access", {"guest_access": "can_join"})
    if "history_visibility" in state:
        await owner.ok("PUT", f"/rooms/{room}/state/m.room.history_visibility", state)
    return room


class GuestAccessTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(
            self, self.test_db, allow_guest_access=True, limits={"max_sync_timeout_ms": 0}
        )
        self.client = clients["main"]
        self.alice = await ClientApi(self, self.client.base_url).register("alice")

    async def test_registration(self) -> None:
        body = await self.client.ok("POST", "/register?kind=guest", {})
        assert_spec_response(self, "registration.yaml", "/register", "POST", 200, body)
        self.assertEqual(set(body), {"user_id", "access_token", "device_id", "home_server"})
        guest = self.client.as_user(body["access_token"])
        whoami = await guest.ok("GET", "/account/whoami")
        self.assertEqual((whoami["user_id"], whoami["is_guest"]), (body["user_id"], True))
        self.assertFalse((await self.alice.ok("GET", "/account/whoami"))["is_guest"])
        other = await self.client.ok("POST", "/register?kind=guest", {"device_id": "PHONE"})
        self.assertNotEqual(other["user_id"], body["user_id"])
        self.assertEqual(other["device_id"], "PHONE")
        for path, sent in (
            ("/register?kind=admin", {}),
            ("/register?kind=guest", {"initial_device_display_name": 5}),
            ("/register?kind=guest", [1]),
        ):
            code, answer = await self.client.request("POST", path, sent, token=None)
            self.assertEqual(code, 400, path)
            self.assertTrue(answer["errcode"].startswith("M_"))

    async def test_guests_call_only_what_the_spec_lists(self) -> None:
        guest = await register_guest(self.client)
        room = await guest_room(self.alice, history_visibility="world_readable")
        event_id = await self.alice.send(room, "hello")
        values = {
            "room_id": room,
            "user_id": guest.user_id or "",
            "event_id": event_id,
            "receipt_type": "m.read",
            "data_type": "org.example.data",
            "state_key": "",
            "filter_id": "0",
            "device_id": guest.device_id or "",
            "tag": "u.work",
        }
        checked: set[str] = set()
        for route in client_routes(self.servers["main"]):
            if route.servlet in ENDS_SESSION:
                continue  # would end the guest's session: checked last
            variants: list[dict[str, str]] = [{}]
            if "event_type" in route.groups:
                variants = [{"event_type": "m.room.message"}, {"event_type": "org.example.e"}]
            elif "field" in route.groups:
                variants = [{"field": "displayname"}, {"field": "avatar_url"}]
            for variant in variants:
                args = {**values, "txn_id": f"t{len(checked)}", **variant}
                path = route.template
                for group in route.groups:
                    path = path.replace("{" + group + "}", q(args.get(group, "x")), 1)
                if route.servlet == "events":
                    path += f"?room_id={q(room)}&timeout=0"
                body: Any = {} if route.method in ("POST", "PUT") else None
                code, answer = await guest.request(route.method, path, body)
                refused = (
                    code == 403 and (answer or {}).get("errcode") == "M_GUEST_ACCESS_FORBIDDEN"
                )
                path_args = {g: args.get(g, "x") for g in route.groups}
                # A servlet that reads no token does not know a guest is asking.
                code, answer = await guest.request(route.method, path, body, token=None)
                anyone = (code, (answer or {}).get("errcode")) != (401, "M_MISSING_TOKEN")
                allowed = anyone or guest_may_call(route.servlet, route.method, path_args)
                self.assertEqual(refused, not allowed, f"{route.method} {path} -> {code} {answer}")
                checked.add(route.servlet)
        # Media (served by the media instance, main here) is for guests too.
        code, _ = await guest.request("GET", "/_matrix/client/v1/media/config")
        self.assertEqual(code, 200)
        checked |= {"media_download", "media_thumbnail", "media_config"}
        self.assertEqual(set(GUEST_SERVLETS) - checked, {"logout"})
        # A guest may log out, and its token is then gone.
        await guest.ok("POST", "/logout", {})
        code, _ = await guest.request("GET", "/account/whoami")
        self.assertEqual(code, 401)

    async def test_guest_may_preview_but_must_name_the_room(self) -> None:
        guest = await register_guest(self.client)
        code, body = await guest.request("GET", "/events?timeout=0")
        self.assertEqual((code, body["errcode"]), (403, "M_GUEST_ACCESS_FORBIDDEN"))
        room = await guest_room(self.alice, history_visibility="world_readable")
        start = await guest.ok("GET", f"/events?room_id={q(room)}&timeout=0")
        await self.alice.send(room, "for the guest")
        later = await guest.ok("GET", f"/events?room_id={q(room)}&timeout=0&from={start['end']}")
        self.assertEqual(
            [e["content"].get("body") for e in later["chunk"] if e["type"] == "m.room.message"],
            ["for the guest"],
        )

    async def test_display_name(self) -> None:
        guest = await register_guest(self.client)
        room = await guest_room(self.alice)
        await guest.ok("POST", f"/join/{room}", {})
        me = q(guest.user_id)
        await guest.ok("PUT", f"/profile/{me}/displayname", {"displayname": "creeper"})
        self.assertEqual(
            await guest.ok("GET", f"/profile/{me}/displayname"), {"displayname": "creeper"}
        )
        await eventually(
            lambda: self._member_name(guest, room), what="the guest's member event renamed"
        )
        code, body = await guest.request("PUT", f"/profile/{me}/avatar_url", {"avatar_url": "x"})
        self.assertEqual((code, body["errcode"]), (403, "M_GUEST_ACCESS_FORBIDDEN"))

    async def _member_name(self, guest: ClientApi, room: str) -> bool:
        member = await self.alice.ok("GET", f"/rooms/{room}/state/m.room.member/{q(guest.user_id)}")
        return bool(member.get("displayname") == "creeper")

    async def test_upgrade_to_a_full_account(self) -> None:
        guest = await register_guest(self.client)
        other = await register_guest(self.client)
        assert guest.user_id is not None and guest.token is not None
        localpart = guest.user_id[1:].split(":")[0]
        body: dict[str, Any] = {
            "username": localpart,
            "password": "new-password",
            "guest_access_token": guest.token,
        }
        # Nobody else's token upgrades the account: another guest's, a full
        # user's, none at all.
        for token in (other.token, self.alice.token, "nonsense"):
            code, answer = await self.client.request(
                "POST",
                "/register",
                dict(body, guest_access_token=token, auth={"type": "m.login.dummy"}),
                token=None,
            )
            self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"), token)
        code, answer = await self.client.request("POST", "/register", body, token=None)
        self.assertEqual(code, 401)  # the interactive-auth round first
        answer = await self.client.ok(
            "POST",
            "/register",
            dict(body, auth={"type": "m.login.dummy", "session": answer["session"]}),
        )
        self.assertEqual(answer["user_id"], guest.user_id)
        upgraded = self.client.as_user(answer["access_token"])
        self.assertFalse((await upgraded.ok("GET", "/account/whoami"))["is_guest"])
        # The guest token, cached as a guest's on every process, is a full
        # user's now too.
        self.assertFalse((await guest.ok("GET", "/account/whoami"))["is_guest"])
        store = self.servers["main"].store
        owner = await store.get_user_by_access_token(hash_token(guest.token))
        self.assertEqual(owner, (guest.user_id, guest.device_id, False, None))
        # A room without guest access is open to the full account.
        room = await self.alice.create_room(preset="public_chat")
        await upgraded.ok("POST", f"/join/{room}", {})
        login = await self.client.ok(
            "POST",
            "/login",
            {
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": localpart},
                "password": "new-password",
            },
        )
        self.assertEqual(login["user_id"], guest.user_id)
        code, answer = await self.client.request(
            "POST", "/register", dict(body, auth={"type": "m.login.dummy"}), token=None
        )
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"))  # not a guest now


class GuestAccessSwitchedOffTestCase(DatabaseTestCase):
    async def test_no_guests_unless_allowed(self) -> None:
        servers, clients, _ = start_cluster(self, self.test_db)
        client = clients["main"]
        code, body = await client.request("POST", "/register?kind=guest", {}, token=None)
        self.assertEqual((code, body["errcode"]), (403, "M_GUEST_ACCESS_FORBIDDEN"))
        # A guest made while guests were allowed is refused everywhere now.
        store = servers["main"].store
        await store.register_user("@oldguest:test.local", None, guest=True)
        await store.replace_access_tokens("@oldguest:test.local", "D", hash_token("tok"), None)
        guest = client.as_user("tok")
        for method, path in (("GET", "/sync?timeout=0"), ("GET", "/account/whoami")):
            code, body = await guest.request(method, path)
            self.assertEqual((code, body["errcode"]), (403, "M_GUEST_ACCESS_FORBIDDEN"), path)


class GuestRoomsThroughWorkersTestCase(DatabaseTestCase):
    """Joining checked and guests removed by the room's events writer, the
    guest talking to a reader."""

    async def test_guest_access_on_join_and_revocation(self) -> None:
        servers, clients, _ = start_cluster(
            self,
            self.test_db,
            workers=["reader", "writer"],
            stream_writers={"events": ["writer"]},
            allow_guest_access=True,
        )
        await eventually(lambda: all(hs.replication.connected for hs in servers.values()))
        alice = await ClientApi(self, clients["writer"].base_url).register("alice")
        bob = await ClientApi(self, clients["reader"].base_url).register("bob")
        guest = await register_guest(clients["reader"])
        room = await alice.create_room(preset="public_chat")  # guests forbidden
        code, body = await guest.request("POST", f"/join/{room}", {})
        self.assertEqual((code, body["errcode"]), (403, "M_GUEST_ACCESS_FORBIDDEN"))
        guest_access = f"/rooms/{room}/state/m.room.guest_access"
        await alice.ok("PUT", guest_access, {"guest_access": "can_join"})
        await eventually(lambda: self._joins(guest, room), what="the guest joining once guests may")
        await bob.ok("POST", f"/join/{room}", {})
        await alice.ok("PUT", guest_access, {"guest_access": "forbidden"})
        member_path = f"/rooms/{room}/state/m.room.member/{q(guest.user_id)}?format=event"
        member = await alice.ok("GET", member_path)
        self.assertEqual(
            (member["content"]["membership"], member["sender"]), ("leave", guest.user_id)
        )
        bob_member = await alice.ok("GET", f"/rooms/{room}/state/m.room.member/{q(bob.user_id)}")
        self.assertEqual(bob_member["membership"], "join")
        code, body = await guest.request("POST", f"/join/{room}", {})
        self.assertEqual((code, body["errcode"]), (403, "M_GUEST_ACCESS_FORBIDDEN"))

    async def _joins(self, guest: ClientApi, room: str) -> bool:
        code, _ = await guest.request("POST", f"/join/{room}", {})
        return code == 200
