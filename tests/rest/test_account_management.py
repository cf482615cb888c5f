"""Changing the password, deactivating the account, and the 3PID endpoints
answering that no identity server is used; on one process and through
workers (the room's events on a worker, the request arriving at another)."""

from __future__ import annotations

from typing import Any

from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase
from tests.harness.spec import assert_spec_response

ADMIN_CONTACT = "administrative_contact.yaml"
ACCOUNT = "account_deactivation.yaml"
PASSWORD = "old password"
FAILED = "M_THREEPID_AUTH_FAILED"


def password_auth(user_id: str, password: str, session: str | None = None) -> dict[str, Any]:
    auth: dict[str, Any] = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": user_id},
        "password": password,
    }
    if session is not None:
        auth["session"] = session
    return auth


class AccountManagementTestCase(DatabaseTestCase):
    workers: list[str] = []
    stream_writers: dict[str, Any] | None = None
    #: The process the account requests are sent to.
    entry = "main"

    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, self.clients, _ = start_cluster(
            self, self.test_db, workers=self.workers, stream_writers=self.stream_writers
        )
        base = self.clients[self.entry].base_url
        self.alice = await ClientApi(self, base).register("alice", PASSWORD)
        self.bob = await ClientApi(self, base).register("bob")

    async def login(self, user: str, password: str) -> tuple[int, Any]:
        return await self.alice.request(
            "POST",
            "/login",
            {"type": "m.login.password", "user": user, "password": password},
            token=None,
        )

    async def second_device(self) -> ClientApi:
        code, body = await self.login("alice", PASSWORD)
        self.assertEqual(code, 200, body)
        return self.alice.as_user(body["access_token"])

    async def test_password_change_needs_the_old_password(self) -> None:
        code, body = await self.alice.request("POST", "/account/password", {"new_password": "n"})
        self.assertEqual(code, 401, body)
        self.assertEqual(body["flows"], [{"stages": ["m.login.password"]}])
        session = body["session"]
        code, body = await self.alice.request(
            "POST",
            "/account/password",
            {"new_password": "n", "auth": password_auth("alice", "wrong", session)},
        )
        self.assertEqual(code, 401, body)
        self.assertEqual(body["errcode"], "M_FORBIDDEN")
        self.assertEqual(body["session"], session)
        for key in ("error", "params", "completed", "flows"):
            self.assertIn(key, body)
        self.assertEqual((await self.login("alice", PASSWORD))[0], 200)

    async def test_password_change_logs_other_devices_out(self) -> None:
        other = await self.second_device()
        await self.alice.ok(
            "POST",
            "/account/password",
            {"new_password": "new password", "auth": password_auth("alice", PASSWORD)},
        )
        self.assertEqual((await self.login("alice", PASSWORD))[0], 403)
        self.assertEqual((await self.login("alice", "new password"))[0], 200)
        await self.alice.ok("GET", "/account/whoami")
        code, body = await other.request("GET", "/account/whoami")
        self.assertEqual((code, body["errcode"]), (401, "M_UNKNOWN_TOKEN"))

    async def test_password_change_can_keep_other_devices(self) -> None:
        other = await self.second_device()
        await self.alice.ok(
            "POST",
            "/account/password",
            {
                "new_password": "new password",
                "logout_devices": False,
                "auth": password_auth(self.alice.user_id or "", PASSWORD),
            },
        )
        await other.ok("GET", "/account/whoami")

    async def test_password_change_bad_input(self) -> None:
        auth = password_auth("alice", PASSWORD)
        for body, code, errcode in [
            ({"auth": auth}, 400, "M_MISSING_PARAM"),
            ({"new_password": 5, "auth": auth}, 400, "M_BAD_JSON"),
            ({"new_password": "", "auth": auth}, 400, "M_INVALID_PARAM"),
            ({"new_password": "x", "auth": "password"}, 400, "M_BAD_JSON"),
            ({"new_password": "x", "logout_devices": "no"}, 400, "M_BAD_JSON"),
            (
                {"new_password": "x", "auth": {**auth, "session": "?"}},
                400,
                "M_UNKNOWN",
            ),
            # Another user's password proves nothing about this one.
            ({"new_password": "x", "auth": password_auth("bob", "secret-pw")}, 403, "M_FORBIDDEN"),
        ]:
            got, answer = await self.alice.request("POST", "/account/password", body)
            self.assertEqual((got, answer.get("errcode")), (code, errcode), body)
        code, _ = await self.alice.request("POST", "/account/password", {}, token=None)
        self.assertEqual(code, 401)
        self.assertEqual((await self.login("alice", PASSWORD))[0], 200)

    async def test_deactivate(self) -> None:
        joined = await self.bob.create_room(preset="public_chat")
        await self.alice.ok("POST", f"/join/{joined}", {})
        invited = await self.bob.create_room()
        await self.bob.ok("POST", f"/rooms/{invited}/invite", {"user_id": self.alice.user_id})
        other = await self.second_device()

        code, body = await self.alice.request(
            "POST", "/account/deactivate", {"auth": password_auth("alice", "wrong")}
        )
        self.assertEqual((code, body["errcode"]), (401, "M_FORBIDDEN"))
        body = await self.alice.ok(
            "POST", "/account/deactivate", {"auth": password_auth("alice", PASSWORD)}
        )
        self.assertEqual(body, {"id_server_unbind_result": "no-support"})
        assert_spec_response(self, ACCOUNT, "/account/deactivate", "POST", 200, body)

        for client in (self.alice, other):
            code, _ = await client.request("GET", "/account/whoami")
            self.assertEqual(code, 401)
        self.assertEqual((await self.login("alice", PASSWORD))[0], 403)
        for room in (joined, invited):
            state = await self.bob.ok(
                "GET", f"/rooms/{room}/state/m.room.member/{self.alice.user_id}"
            )
            self.assertEqual(state["membership"], "leave", room)
        rows = await self.servers["main"].store.db_pool.select(
            "t", "SELECT COUNT(*) FROM devices WHERE user_id = ?", self.alice.user_id
        )
        self.assertEqual(rows[0][0], 0)
        # Deactivated without "erase": not erased.
        self.assertIsNone(await self.servers["main"].store.get_erasure_position(self.alice.user_id))
        # The name is never free again.
        code, body = await self.bob.request(
            "POST",
            "/register",
            {"username": "alice", "password": "x", "auth": {"type": "m.login.dummy"}},
            token=None,
        )
        self.assertEqual((code, body["errcode"]), (400, "M_USER_IN_USE"))

    async def test_erasure_keeps_events_for_those_who_could_see_them(self) -> None:
        """The spec: whoever joins after the erasure is served redacted
        copies of the erased user's events; whoever had visibility on them
        before keeps seeing them."""
        base = self.clients[self.entry].base_url
        carol = await ClientApi(self, base).register("carol")
        dave = await ClientApi(self, base).register("dave")
        room = await self.alice.create_room(preset="public_chat", name="Alice's room")
        await self.bob.ok("POST", f"/join/{room}", {})
        message = await self.alice.send(room, "body1")
        await carol.ok("POST", f"/join/{room}", {})  # after the message, before the erasure
        # The main process has looked alice up (not erased) before: the
        # erasure must reach its cache (caches stream) for the last check.
        on_main = self.clients["main"]
        await on_main.as_user(self.bob.token).sync()
        await self.alice.ok(
            "POST",
            "/account/deactivate",
            {"auth": password_auth("alice", PASSWORD), "erase": True},
        )
        await dave.ok("POST", f"/join/{room}", {})

        async def seen_by(client: ClientApi) -> list[Any]:
            sync = await client.sync(filter='{"room":{"timeline":{"limit":50}}}')
            timeline = sync["rooms"]["join"][room]["timeline"]["events"]
            page = await client.ok("GET", f"/rooms/{room}/messages?dir=b&limit=50")
            event = await client.ok("GET", f"/rooms/{room}/event/{message}")
            context = await client.ok("GET", f"/rooms/{room}/context/{message}")
            name = await client.ok("GET", f"/rooms/{room}/state/m.room.name")
            return [
                next(e["content"] for e in timeline if e["event_id"] == message),
                next(e["content"] for e in page["chunk"] if e["event_id"] == message),
                event["content"],
                context["event"]["content"],
                name,
            ]

        for client in (self.bob, carol):
            self.assertEqual(
                await seen_by(client),
                [{"msgtype": "m.text", "body": "body1"}] * 4 + [{"name": "Alice's room"}],
            )
        self.assertEqual(await seen_by(dave), [{}] * 5)
        dave_on_main = on_main.as_user(dave.token)

        async def redacted_on_main() -> bool:
            event = await dave_on_main.ok("GET", f"/rooms/{room}/event/{message}")
            return bool(event["content"] == {})

        await eventually(redacted_on_main, what="the erasure on the main process")
        rows = await self.servers["main"].store.db_pool.select(
            "t", "SELECT name FROM users WHERE erased_at_position IS NOT NULL"
        )
        self.assertEqual(rows, [(self.alice.user_id,)])

    async def test_capabilities(self) -> None:
        body = await self.alice.ok("GET", "/capabilities")
        assert_spec_response(self, "capabilities.yaml", "/capabilities", "GET", 200, body)
        self.assertEqual(body["capabilities"]["m.change_password"], {"enabled": True})
        self.assertEqual(body["capabilities"]["m.3pid_changes"], {"enabled": False})

    async def test_threepids(self) -> None:
        body = await self.alice.ok("GET", "/account/3pid")
        self.assertEqual(body, {"threepids": []})
        assert_spec_response(self, ADMIN_CONTACT, "/account/3pid", "GET", 200, body)
        for path, request, code, errcode in [
            (
                "/account/3pid/email/requestToken",
                {"client_secret": "s", "email": "a@b.c", "send_attempt": 1},
                400,
                "M_THREEPID_MEDIUM_NOT_SUPPORTED",
            ),
            (
                "/account/3pid/msisdn/requestToken",
                {"client_secret": "s", "country": "GB", "phone_number": "1", "send_attempt": 1},
                400,
                "M_THREEPID_MEDIUM_NOT_SUPPORTED",
            ),
            ("/account/3pid/add", {"client_secret": "s", "sid": "1"}, 400, FAILED),
            ("/account/3pid/add", {"sid": "1"}, 400, "M_MISSING_PARAM"),
            (
                "/account/3pid",
                {"three_pid_creds": {"client_secret": "s", "sid": "1", "id_server": "i"}},
                403,
                "M_THREEPID_AUTH_FAILED",
            ),
            # An identity server on a private address (refused by default).
            (
                "/account/3pid/bind",
                {
                    "client_secret": "s",
                    "sid": "1",
                    "id_server": "127.0.0.1:1",
                    "id_access_token": "t",
                },
                400,
                "M_SERVER_NOT_TRUSTED",
            ),
            ("/account/3pid/delete", {"medium": "fax", "address": "1"}, 400, "M_INVALID_PARAM"),
        ]:
            got, answer = await self.alice.request("POST", path, request)
            self.assertEqual((got, answer.get("errcode")), (code, errcode), path)
        for action in ("delete", "unbind"):
            path = f"/account/3pid/{action}"
            body = await self.alice.ok("POST", path, {"medium": "email", "address": "a@b.c"})
            self.assertEqual(body, {"id_server_unbind_result": "no-support"})
            assert_spec_response(self, ADMIN_CONTACT, path, "POST", 200, body)
        code, _ = await self.alice.request("GET", "/account/3pid", token=None)
        self.assertEqual(code, 401)


class AccountManagementThroughWorkersTestCase(AccountManagementTestCase):
    """Rooms on an events-writer worker; the account requests arrive at a
    reader worker, which forwards device changes to main and leaves rooms
    through their writer."""

    workers = ["writer1", "reader1"]
    stream_writers = {"events": ["writer1"]}
    entry = "reader1"
