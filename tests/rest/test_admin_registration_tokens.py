"""Registration tokens: the admin API that manages them
(``/_synapse/admin/v1/registration_tokens``) and registration requiring one
(``registration_requires_token``: the ``m.login.registration_token`` stage,
``GET /v1/register/m.login.registration_token/validity``)."""

from __future__ import annotations

import time
from typing import Any

from synapse_lite.handlers.auth import hash_password
from synapse_lite.handlers.registration_tokens import new_token_text
from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.server import DatabaseTestCase

ADMIN = "/_synapse/admin/v1/registration_tokens"
VALIDITY = "/_matrix/client/v1/register/m.login.registration_token/validity"
TOKEN_STAGE = "m.login.registration_token"


class RegistrationTokensTestCase(DatabaseTestCase):
    """Tokens required; the admin exists from the start (a user nobody
    could register without a token), logged in with a password."""

    workers: list[str] = []

    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(
            self, self.test_db, workers=self.workers, registration_requires_token=True
        )
        store = self.servers["main"].store
        await store.register_user("@root:test.local", await hash_password("root-pw"), admin=True)
        self.api = clients[list(clients)[-1]]
        login = await self.api.ok(
            "POST",
            "/login",
            {
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": "root"},
                "password": "root-pw",
            },
        )
        self.admin = self.api.as_user(login["access_token"])
        self.anonymous = self.api.as_user(None)

    async def _register(self, username: str, auth: dict[str, Any] | None) -> tuple[int, Any]:
        body: dict[str, Any] = {"username": username, "password": "pw-" + username}
        if auth is not None:
            body["auth"] = auth
        return await self.anonymous.request("POST", "/register", body)

    async def _register_with(self, username: str, token: str) -> tuple[int, Any]:
        """Both rounds: the 401 with a session, then the token in it."""
        code, first = await self._register(username, None)
        self.assertEqual(code, 401, first)
        return await self._register(
            username, {"type": TOKEN_STAGE, "token": token, "session": first["session"]}
        )

    async def test_manage_tokens(self) -> None:
        future = int(time.time() * 1000) + 3_600_000
        made = await self.admin.ok(
            "POST", ADMIN + "/new", {"token": "abc-1.x~", "uses_allowed": 2, "expiry_time": future}
        )
        self.assertEqual(
            made,
            {
                "token": "abc-1.x~",
                "uses_allowed": 2,
                "pending": 0,
                "completed": 0,
                "expiry_time": future,
            },
        )
        generated = await self.admin.ok("POST", ADMIN + "/new", {"length": 20})
        self.assertEqual(len(generated["token"]), 20)
        default = await self.admin.ok("POST", ADMIN + "/new", {})
        self.assertEqual((len(default["token"]), default["uses_allowed"]), (16, None))
        listed = await self.admin.ok("GET", ADMIN)
        self.assertEqual(
            sorted(t["token"] for t in listed["registration_tokens"]),
            sorted(["abc-1.x~", generated["token"], default["token"]]),
        )
        # Used up: no longer valid.
        changed = await self.admin.ok("PUT", ADMIN + "/abc-1.x~", {"uses_allowed": 0})
        self.assertEqual((changed["uses_allowed"], changed["expiry_time"]), (0, future))
        invalid = await self.admin.ok("GET", ADMIN + "?valid=false")
        self.assertEqual([t["token"] for t in invalid["registration_tokens"]], ["abc-1.x~"])
        valid = await self.admin.ok("GET", ADMIN + "?valid=true")
        self.assertEqual(len(valid["registration_tokens"]), 2)
        lifted = await self.admin.ok(
            "PUT", ADMIN + "/abc-1.x~", {"uses_allowed": None, "expiry_time": None}
        )
        self.assertEqual((lifted["uses_allowed"], lifted["expiry_time"]), (None, None))
        self.assertEqual(await self.admin.ok("GET", ADMIN + "/abc-1.x~"), lifted)
        self.assertEqual(await self.admin.ok("DELETE", ADMIN + "/abc-1.x~"), {})
        code, body = await self.admin.request("GET", ADMIN + "/abc-1.x~")
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))

    async def test_bad_input(self) -> None:
        await self.admin.ok("POST", ADMIN + "/new", {"token": "taken"})
        past = int(time.time() * 1000) - 1000
        for method, path, body, code, errcode in [
            ("POST", "/new", {"token": "taken"}, 400, "M_INVALID_PARAM"),
            ("POST", "/new", {"token": "no spaces"}, 400, "M_INVALID_PARAM"),
            ("POST", "/new", {"token": "x" * 65}, 400, "M_INVALID_PARAM"),
            ("POST", "/new", {"token": ""}, 400, "M_INVALID_PARAM"),
            ("POST", "/new", {"token": 12}, 400, "M_INVALID_PARAM"),
            ("POST", "/new", {"token": "a", "length": 3}, 400, "M_INVALID_PARAM"),
            ("POST", "/new", {"length": 0}, 400, "M_INVALID_PARAM"),
            ("POST", "/new", {"length": 65}, 400, "M_INVALID_PARAM"),
            ("POST", "/new", {"length": "8"}, 400, "M_INVALID_PARAM"),
            ("POST", "/new", {"uses_allowed": -1}, 400, "M_INVALID_PARAM"),
            ("POST", "/new", {"uses_allowed": 1.5}, 400, "M_INVALID_PARAM"),
            ("POST", "/new", {"expiry_time": past}, 400, "M_INVALID_PARAM"),
            ("PUT", "/taken", {"expiry_time": past}, 400, "M_INVALID_PARAM"),
            ("PUT", "/taken", {"uses_allowed": True}, 400, "M_INVALID_PARAM"),
            ("PUT", "/nope", {"uses_allowed": 1}, 404, "M_NOT_FOUND"),
            ("DELETE", "/nope", None, 404, "M_NOT_FOUND"),
            ("GET", "?valid=maybe", None, 400, "M_INVALID_PARAM"),
        ]:
            got, answer = await self.admin.request(method, ADMIN + path, body)
            self.assertEqual((got, answer["errcode"]), (code, errcode), (method, path, body))
        # Nothing was created by the refused requests.
        listed = await self.admin.ok("GET", ADMIN)
        self.assertEqual([t["token"] for t in listed["registration_tokens"]], ["taken"])

    async def test_not_an_admin(self) -> None:
        await self.admin.ok("POST", ADMIN + "/new", {"token": "t1"})
        code, user = await self._register_with("plain", "t1")
        self.assertEqual(code, 200, user)
        plain = self.api.as_user(user["access_token"])
        for method, path in [
            ("GET", ""),
            ("POST", "/new"),
            ("GET", "/t1"),
            ("PUT", "/t1"),
            ("DELETE", "/t1"),
        ]:
            got, answer = await plain.request(method, ADMIN + path, {})
            self.assertEqual((got, answer["errcode"]), (403, "M_FORBIDDEN"), (method, path))
        got, _ = await self.anonymous.request("GET", ADMIN)
        self.assertEqual(got, 401)

    async def test_registration_needs_a_token(self) -> None:
        await self.admin.ok("POST", ADMIN + "/new", {"token": "once", "uses_allowed": 1})
        code, first = await self._register("amy", None)
        self.assertEqual((code, first["flows"]), (401, [{"stages": [TOKEN_STAGE]}]))
        # The dummy stage is not enough, nor a wrong token.
        code, answer = await self._register(
            "amy", {"type": "m.login.dummy", "session": first["session"]}
        )
        self.assertEqual((code, answer.get("errcode")), (401, None))
        code, answer = await self._register(
            "amy", {"type": TOKEN_STAGE, "token": "wrong", "session": first["session"]}
        )
        self.assertEqual((code, answer["errcode"]), (401, "M_UNAUTHORIZED"))
        self.assertEqual(await self.anonymous.ok("GET", VALIDITY + "?token=once"), {"valid": True})
        code, amy = await self._register(
            "amy", {"type": TOKEN_STAGE, "token": "once", "session": first["session"]}
        )
        self.assertEqual((code, amy["user_id"]), (200, "@amy:test.local"), amy)
        # Repeating the last round answers the same user, not a second use.
        code, again = await self._register(
            "amy", {"type": TOKEN_STAGE, "token": "once", "session": first["session"]}
        )
        self.assertEqual((code, again["user_id"]), (200, "@amy:test.local"))
        used = await self.admin.ok("GET", ADMIN + "/once")
        self.assertEqual((used["pending"], used["completed"]), (0, 1))
        self.assertEqual(await self.anonymous.ok("GET", VALIDITY + "?token=once"), {"valid": False})
        code, answer = await self._register_with("bea", "once")
        self.assertEqual((code, answer["errcode"]), (401, "M_UNAUTHORIZED"))

    async def test_failed_registration_gives_the_use_back(self) -> None:
        await self.admin.ok("POST", ADMIN + "/new", {"token": "once", "uses_allowed": 1})
        code, answer = await self._register("root", {"type": TOKEN_STAGE, "token": "once"})
        self.assertEqual((code, answer["errcode"]), (400, "M_USER_IN_USE"))
        token = await self.admin.ok("GET", ADMIN + "/once")
        self.assertEqual((token["pending"], token["completed"]), (0, 0))
        code, _ = await self._register_with("cleo", "once")
        self.assertEqual(code, 200)

    async def test_validity_bad_input(self) -> None:
        code, answer = await self.anonymous.request("GET", VALIDITY)
        self.assertEqual((code, answer["errcode"]), (400, "M_MISSING_PARAM"))
        self.assertEqual(
            await self.anonymous.ok("GET", VALIDITY + "?token=" + new_token_text(8)),
            {"valid": False},
        )


class RegistrationTokensWorkerTestCase(RegistrationTokensTestCase):
    """The same through a worker: the admin API and registration are
    answered from the shared database."""

    workers = ["synchrotron1"]


class RegistrationOffTestCase(DatabaseTestCase):
    async def test_validity_forbidden_without_registration(self) -> None:
        _, clients, _ = start_cluster(
            self, self.test_db, enable_registration=False, registration_requires_token=True
        )
        api: ClientApi = clients["main"]
        code, answer = await api.request("GET", VALIDITY + "?token=abc", token=None)
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"))
