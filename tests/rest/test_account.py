"""Registration, login, logout, whoami, tokens and shared-secret registration."""

from __future__ import annotations

import hashlib
import hmac

from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.server import DatabaseTestCase


class AccountTestCase(DatabaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.servers, self.clients, _ = start_cluster(
            self, self.test_db, registration_shared_secret="shared-secret"
        )
        self.api = self.clients["main"]

    async def test_register_needs_an_interactive_auth_round(self) -> None:
        code, body = await self.api.request(
            "POST", "/register", {"username": "carol", "password": "pw-pw-pw"}, token=None
        )
        self.assertEqual(code, 401)
        self.assertEqual(body["flows"], [{"stages": ["m.login.dummy"]}])
        session = body["session"]
        code, body = await self.api.request(
            "POST",
            "/register",
            {
                "username": "carol",
                "password": "pw-pw-pw",
                "auth": {"type": "m.login.dummy", "session": session},
            },
            token=None,
        )
        self.assertEqual(code, 200, body)
        self.assertEqual(body["user_id"], "@carol:test.local")
        whoami = await self.api.as_user(body["access_token"]).ok("GET", "/account/whoami")
        self.assertEqual(whoami["user_id"], "@carol:test.local")
        self.assertEqual(whoami["device_id"], body["device_id"])

    async def test_unknown_session_is_refused(self) -> None:
        code, body = await self.api.request(
            "POST",
            "/register",
            {"username": "dan", "auth": {"type": "m.login.dummy", "session": "nope"}},
            token=None,
        )
        self.assertEqual((code, body["errcode"]), (400, "M_UNKNOWN"))

    async def test_username_rules(self) -> None:
        for username, errcode in [
            ("with space", "M_INVALID_USERNAME"),
            ("_reserved", "M_INVALID_USERNAME"),
            ("ünïcode", "M_INVALID_USERNAME"),
            ("", "M_INVALID_USERNAME"),
            ("x" * 300, "M_INVALID_PARAM"),
        ]:
            code, body = await self.api.request(
                "POST",
                "/register",
                {"username": username, "auth": {"type": "m.login.dummy"}},
                token=None,
            )
            self.assertEqual((code, body["errcode"]), (400, errcode), username)
        await ClientApi(self, self.api.base_url).register("erin")
        code, body = await self.api.request(
            "POST", "/register", {"username": "erin", "auth": {"type": "m.login.dummy"}}, token=None
        )
        self.assertEqual((code, body["errcode"]), (400, "M_USER_IN_USE"))
        code, body = await self.api.request("GET", "/register/available?username=erin", token=None)
        self.assertEqual(body["errcode"], "M_USER_IN_USE")
        # Capitals are downcased: "Erin" is "erin", taken.
        code, body = await self.api.request("GET", "/register/available?username=Erin", token=None)
        self.assertEqual(body["errcode"], "M_USER_IN_USE")
        upper = await ClientApi(self, self.api.base_url).register("Frank-UPPER")
        self.assertEqual(upper.user_id, "@frank-upper:test.local")

    async def test_guest_registration_is_refused(self) -> None:
        code, body = await self.api.request("POST", "/register?kind=guest", {}, token=None)
        self.assertEqual((code, body["errcode"]), (403, "M_GUEST_ACCESS_FORBIDDEN"))

    async def test_login_logout(self) -> None:
        await ClientApi(self, self.api.base_url).register("frank", "correct horse")
        code, body = await self.api.request(
            "POST",
            "/login",
            {
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": "frank"},
                "password": "wrong",
            },
            token=None,
        )
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        body = await self.api.as_user(None).ok(
            "POST",
            "/login",
            {"type": "m.login.password", "user": "@frank:test.local", "password": "correct horse"},
        )
        frank = self.api.as_user(body["access_token"])
        devices = await frank.ok("GET", "/devices")
        self.assertIn(body["device_id"], [d["device_id"] for d in devices["devices"]])
        await frank.ok("POST", "/logout", {})
        code, body = await frank.request("GET", "/account/whoami")
        self.assertEqual((code, body["errcode"]), (401, "M_UNKNOWN_TOKEN"))

    async def test_logout_all(self) -> None:
        first = await ClientApi(self, self.api.base_url).register("gina", "pw")
        body = await self.api.as_user(None).ok(
            "POST", "/login", {"type": "m.login.password", "user": "gina", "password": "pw"}
        )
        second = self.api.as_user(body["access_token"])
        await second.ok("POST", "/logout/all", {})
        for client in (first, second):
            code, _ = await client.request("GET", "/account/whoami")
            self.assertEqual(code, 401)

    async def test_tokens_are_stored_hashed(self) -> None:
        user = await ClientApi(self, self.api.base_url).register("hank")
        assert user.token is not None
        rows = await self.servers["main"].store.db_pool.select(
            "t", "SELECT token_hash FROM access_tokens"
        )
        stored = [r[0] for r in rows]
        self.assertNotIn(user.token, stored)
        self.assertIn(hashlib.sha256(user.token.encode()).hexdigest(), stored)

    async def test_missing_and_bad_tokens(self) -> None:
        code, body = await self.api.request("GET", "/account/whoami", token=None)
        self.assertEqual((code, body["errcode"]), (401, "M_MISSING_TOKEN"))
        code, body = await self.api.request("GET", "/account/whoami", token="nonsense")
        self.assertEqual((code, body["errcode"]), (401, "M_UNKNOWN_TOKEN"))
        code, body = await self.api.request(
            "GET", "/account/whoami", token=None, headers={"Authorization": ["Basic abc"]}
        )
        self.assertEqual((code, body["errcode"]), (401, "M_MISSING_TOKEN"))
        code, body = await self.api.request(
            "GET", "/account/whoami?access_token=%ff%fe", token=None
        )
        self.assertEqual((code, body["errcode"]), (401, "M_UNKNOWN_TOKEN"))

    async def _shared_secret_body(
        self, username: str, secret: str = "shared-secret", admin: bool = False
    ) -> dict[str, object]:
        nonce = (await self.api.ok("GET", "/_synapse/admin/v1/register"))["nonce"]
        message = b"\x00".join(
            [nonce.encode(), username.encode(), b"pw", b"admin" if admin else b"notadmin"]
        )
        mac = hmac.new(secret.encode(), message, hashlib.sha1).hexdigest()
        return {"nonce": nonce, "username": username, "password": "pw", "admin": admin, "mac": mac}

    async def test_shared_secret_registration(self) -> None:
        body = await self._shared_secret_body("admin1", admin=True)
        result = await self.api.as_user(None).ok("POST", "/_synapse/admin/v1/register", body)
        self.assertEqual(result["user_id"], "@admin1:test.local")
        user = await self.servers["main"].store.get_user("@admin1:test.local")
        assert user is not None
        self.assertTrue(user["admin"])
        bad = await self._shared_secret_body("admin2", secret="wrong")
        code, answer = await self.api.request("POST", "/_synapse/admin/v1/register", bad)
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"))
        forged = dict(await self._shared_secret_body("admin3"), nonce="1.2.3")
        code, answer = await self.api.request("POST", "/_synapse/admin/v1/register", forged)
        self.assertEqual(code, 400)


class RegistrationSettingsTestCase(DatabaseTestCase):
    async def test_registration_disabled_and_no_shared_secret(self) -> None:
        _, clients, _ = start_cluster(self, self.test_db, enable_registration=False)
        api = clients["main"]
        code, body = await api.request(
            "POST", "/register", {"username": "x", "auth": {"type": "m.login.dummy"}}, token=None
        )
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        code, body = await api.request("GET", "/_synapse/admin/v1/register", token=None)
        self.assertEqual(code, 400)

    async def test_login_is_rate_limited(self) -> None:
        _, clients, _ = start_cluster(
            self,
            self.test_db,
            rate_limiting={"enabled": True, "login": {"per_second": 0.1, "burst": 2}},
        )
        api = clients["main"]
        codes = []
        for _ in range(4):
            code, body = await api.request(
                "POST", "/login", {"type": "m.login.password", "user": "nobody", "password": "x"}
            )
            codes.append(code)
        self.assertEqual(codes, [403, 403, 429, 429])
        self.assertEqual(body["errcode"], "M_LIMIT_EXCEEDED")
        self.assertGreater(body["retry_after_ms"], 0)


class RegistrationSessionTestCase(DatabaseTestCase):
    """A registration's interactive-auth session remembers its first
    request's parameters and, once done, its user: the last round repeated
    answers the same user. A session authorises only the operation it was
    begun for. Rounds on two processes (the session is in the database)."""

    workers: list[str] = ["reader"]

    def setUp(self) -> None:
        super().setUp()
        self.servers, self.clients, _ = start_cluster(self, self.test_db, workers=self.workers)
        self.first = self.clients["main"]
        self.then = self.clients[self.workers[-1]] if self.workers else self.first

    async def begin(self, body: dict[str, object]) -> str:
        code, answer = await self.first.request("POST", "/register", body, token=None)
        self.assertEqual(code, 401, answer)
        return str(answer["session"])

    async def complete(self, session: str, **body: object) -> dict[str, object]:
        code, answer = await self.then.request(
            "POST",
            "/register",
            {**body, "auth": {"type": "m.login.dummy", "session": session}},
            token=None,
        )
        self.assertEqual(code, 200, answer)
        return dict(answer)

    async def test_repeating_the_last_round_answers_the_same_user(self) -> None:
        session = await self.begin({"password": "pw-pw-pw"})
        first = await self.complete(session, password="pw-pw-pw")
        again = await self.complete(session, password="pw-pw-pw")
        self.assertEqual(again["user_id"], first["user_id"])
        for answer in (first, again):
            whoami = await self.then.as_user(str(answer["access_token"])).ok(
                "GET", "/account/whoami"
            )
            self.assertEqual(whoami["user_id"], first["user_id"])
        named = await self.begin({"username": "gina", "password": "pw-pw-pw"})
        done = await self.complete(named, username="gina", password="pw-pw-pw")
        repeated = await self.complete(named, username="gina", password="pw-pw-pw")
        self.assertEqual((done["user_id"], repeated["user_id"]), ("@gina:test.local",) * 2)
        # Without the session, the name is taken.
        code, answer = await self.then.request(
            "POST", "/register", {"username": "gina", "auth": {"type": "m.login.dummy"}}, token=None
        )
        self.assertEqual((code, answer["errcode"]), (400, "M_USER_IN_USE"))

    async def test_the_first_requests_parameters_are_remembered(self) -> None:
        session = await self.begin(
            {
                "username": "hal",
                "password": "pw-pw-pw",
                "device_id": "XYZZY",
                "initial_device_display_name": "hal's phone",
            }
        )
        answer = await self.complete(session)
        self.assertEqual((answer["user_id"], answer["device_id"]), ("@hal:test.local", "XYZZY"))
        hal = self.then.as_user(str(answer["access_token"]))
        device = await hal.ok("GET", "/devices/XYZZY")
        self.assertEqual(device["display_name"], "hal's phone")
        # The password of the first round is the account's.
        login = await self.then.ok(
            "POST",
            "/login",
            {
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": "hal"},
                "password": "pw-pw-pw",
            },
        )
        self.assertEqual(login["user_id"], "@hal:test.local")
        rows = await self.servers["main"].store.db_pool.select(
            "t", "SELECT params FROM ui_auth_sessions WHERE session_id = ?", session
        )
        self.assertNotIn("pw-pw-pw", rows[0][0])  # only its hash is kept

    async def test_inhibit_login_is_remembered(self) -> None:
        session = await self.begin({"username": "ida", "password": "pw", "inhibit_login": True})
        answer = await self.complete(session)
        self.assertEqual(answer["user_id"], "@ida:test.local")
        self.assertNotIn("access_token", answer)
        self.assertNotIn("device_id", answer)
        code, answer = await self.first.request(
            "POST",
            "/register",
            {"inhibit_login": "yes", "auth": {"type": "m.login.dummy"}},
            token=None,
        )
        self.assertEqual((code, answer["errcode"]), (400, "M_BAD_JSON"))

    async def test_a_session_authorises_only_its_operation(self) -> None:
        kim = await ClientApi(self, self.first.base_url).register("kim")
        for device in ("ONE", "TWO"):
            await self.first.ok(
                "POST",
                "/login",
                {
                    "type": "m.login.password",
                    "identifier": {"type": "m.id.user", "user": "kim"},
                    "password": "secret-pw",
                    "device_id": device,
                },
            )
        code, answer = await kim.request("DELETE", "/devices/ONE", {})
        self.assertEqual(code, 401)
        proof = {
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": "kim"},
            "password": "secret-pw",
            "session": answer["session"],
        }
        on_then = self.then.as_user(kim.token)
        code, refused = await on_then.request("DELETE", "/devices/TWO", {"auth": proof})
        self.assertEqual((code, refused["errcode"]), (403, "M_FORBIDDEN"))
        await on_then.ok("GET", "/devices/TWO")  # still there
        # Nor another kind of request: a registration session cannot delete.
        session = await self.begin({})
        code, refused = await on_then.request(
            "DELETE", "/devices/TWO", {"auth": {**proof, "session": session}}
        )
        self.assertEqual((code, refused["errcode"]), (403, "M_FORBIDDEN"))
        await on_then.ok("DELETE", "/devices/ONE", {"auth": proof})
        code, _ = await on_then.request("GET", "/devices/ONE")
        self.assertEqual(code, 404)


class RegistrationSessionOneProcessTestCase(RegistrationSessionTestCase):
    workers: list[str] = []
