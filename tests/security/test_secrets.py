"""Without the right shared secret, the internal HTTP endpoints between
processes and the admin shared-secret registration refuse, change nothing, and
log the refusal (without the secret). The replication listener's AUTH line is
covered the same way in tests/replication/tcp/test_protocol.py (in memory) and
tests/replication/tcp/test_tcp_real_sockets.py (real sockets)."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from synapse_lite.replication.http.writes import ADD_ACCOUNT_DATA
from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.server import DatabaseTestCase

REPLICATION_LOGGER = "synapse_lite.replication.http.calls"
REGISTER_LOGGER = "synapse_lite.handlers.register"
SECRET = "test-secret"  # tests.harness.server.make_config's worker_replication_secret


class InternalHttpSecretTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(self, self.test_db)
        self.api = clients["main"]
        self.alice = await ClientApi(self, self.api.base_url).register("alice")
        self.path = f"/_synapse/replication/{ADD_ACCOUNT_DATA.name}"
        self.body = {
            "user_id": self.alice.user_id,
            "room_id": None,
            "type": "org.example.planted",
            "content": {"by": "intruder"},
        }

    async def planted(self) -> Any:
        code, body = await self.alice.request(
            "GET", f"/user/{self.alice.user_id}/account_data/org.example.planted"
        )
        return body if code == 200 else None

    async def refused(self, headers: dict[str, list[str]]) -> str:
        """Send the internal request with ``headers``; assert 401 and return
        what was logged."""
        with self.assertLogs(REPLICATION_LOGGER, "WARNING") as logs:
            code, body = await self.api.request(
                "POST", self.path, self.body, token=None, headers=headers
            )
        self.assertEqual((code, body["errcode"]), (401, "M_UNAUTHORIZED"))
        self.assertIsNone(await self.planted())
        output = "\n".join(logs.output)
        self.assertIn("Refused a replication request from", output)
        self.assertIn(self.path, output)
        return output

    async def test_no_credentials_are_refused_and_logged(self) -> None:
        self.assertIn("no credentials", await self.refused({}))

    async def test_wrong_secret_is_refused_and_logged(self) -> None:
        for guess in ("Bearer wrong", f"Bearer {SECRET}x", f"Basic {SECRET}", SECRET):
            output = await self.refused({"Authorization": [guess]})
            self.assertIn("bad credentials", output)
            self.assertNotIn(guess, output)

    async def test_client_access_token_is_not_a_replication_secret(self) -> None:
        self.assertIn("bad credentials", await self.refused({
            "Authorization": [f"Bearer {self.alice.token}"]
        }))  # fmt: skip

    async def test_right_secret_is_accepted(self) -> None:
        """The same request with the secret goes through: the refusals above
        are the secret's doing, not a malformed request."""
        code, _ = await self.api.request("POST", self.path, self.body, token=SECRET)
        self.assertEqual(code, 200)
        self.assertEqual(await self.planted(), {"by": "intruder"})


class InternalHttpWithoutSecretTestCase(DatabaseTestCase):
    """A server configured with no replication secret (allowed when it has
    no workers) serves no internal endpoint at all, whatever is sent."""

    async def test_everything_refused_and_logged(self) -> None:
        _, clients, _ = start_cluster(self, self.test_db, worker_replication_secret=None)
        api = clients["main"]
        alice = await ClientApi(self, api.base_url).register("alice")
        path = f"/_synapse/replication/{ADD_ACCOUNT_DATA.name}"
        body = {
            "user_id": alice.user_id,
            "room_id": None,
            "type": "org.example.planted",
            "content": {"by": "intruder"},
        }
        for headers in ({}, {"Authorization": ["Bearer anything"]}):
            with self.assertLogs(REPLICATION_LOGGER, "WARNING") as logs:
                code, answer = await api.request("POST", path, body, token=None, headers=headers)
            self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"))
            self.assertIn("no worker_replication_secret", "\n".join(logs.output))
        code, _ = await alice.request(
            "GET", f"/user/{alice.user_id}/account_data/org.example.planted"
        )
        self.assertEqual(code, 404)


def _mac(secret: str, nonce: str, username: str, password: str, admin: bool) -> str:
    message = b"\x00".join(
        [nonce.encode(), username.encode(), password.encode(), b"admin" if admin else b"notadmin"]
    )
    return hmac.new(secret.encode(), message, hashlib.sha1).hexdigest()


class SharedSecretRegistrationTestCase(DatabaseTestCase):
    async def start(self, **config: Any) -> ClientApi:
        self.servers, clients, _ = start_cluster(self, self.test_db, **config)
        return clients["main"].as_user(None)

    async def body(self, api: ClientApi, username: str, secret: str) -> dict[str, Any]:
        nonce = (await api.ok("GET", "/_synapse/admin/v1/register"))["nonce"]
        mac = _mac(secret, nonce, username, "pw", True)
        return {"nonce": nonce, "username": username, "password": "pw", "admin": True, "mac": mac}

    async def test_wrong_mac_is_refused_and_logged(self) -> None:
        api = await self.start(registration_shared_secret="the-secret")
        body = await self.body(api, "mallory", "a-guess")
        with self.assertLogs(REGISTER_LOGGER, "WARNING") as logs:
            code, answer = await api.request("POST", "/_synapse/admin/v1/register", body)
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"))
        output = "\n".join(logs.output)
        self.assertIn("Refused shared-secret registration of 'mallory': bad HMAC", output)
        self.assertNotIn("the-secret", output)
        self.assertIsNone(await self.servers["main"].store.get_user("@mallory:test.local"))
        # With the right secret the same request succeeds.
        good = await self.body(api, "mallory", "the-secret")
        result = await api.ok("POST", "/_synapse/admin/v1/register", good)
        self.assertEqual(result["user_id"], "@mallory:test.local")

    async def test_unset_secret_refuses_and_logs(self) -> None:
        api = await self.start()
        for method, body in (("GET", None), ("POST", {"nonce": "1.2.3", "mac": "00"})):
            with self.assertLogs(REGISTER_LOGGER, "WARNING") as logs:
                code, answer = await api.request(method, "/_synapse/admin/v1/register", body)
            self.assertEqual((code, answer["errcode"]), (400, "M_FORBIDDEN"), method)
            self.assertIn("no registration_shared_secret", "\n".join(logs.output))
