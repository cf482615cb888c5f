"""End to end (issue 34): a token used on every process right after its
revocation answers is refused everywhere.

Every process serves client requests; each round logs a device in, uses its
token on every process (so each caches the token's owner), revokes it
through a process other than the device_lists writer (the main process), and
at once asks every process, concurrently, who the token belongs to: each
must answer 401. The revocations: ``/logout``, ``/logout/all``, ``DELETE
/devices/{id}``, a password change (which logs the other devices out) and a
deactivation.

Runs on SQLite with TCP when the suite runs on SQLite, and on PostgreSQL with
Redis when it runs on PostgreSQL.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.trial import unittest

from tests.harness.client_api import ClientApi
from tests.harness.databases import create_test_database, test_engine_name
from tests.harness.processes import ServerProcesses, layout_config
from tests.harness.services import require_redis
from tests.rest.test_account_management import password_auth

RESOURCES = ["client", "replication", "health", "metrics"]
WORKERS = {"sync1": RESOURCES, "persister1": RESOURCES, "writer1": RESOURCES}
WRITERS = {
    "events": ["persister1"],
    "to_device": "writer1",
    "typing": "writer1",
    "account_data": "writer1",
    "receipts": "writer1",
    "presence": "writer1",
}
PASSWORD = "secret-pw"
#: Rounds of each revocation: the race it closes lasted ~200 ms.
ROUNDS = 3


class RevocationProcessesTestCase(unittest.TestCase):
    timeout = 300
    engine = "sqlite"
    transport = "tcp"

    async def test_a_revoked_token_is_refused_by_every_process_once_answered(self) -> None:
        if test_engine_name() != self.engine:
            raise unittest.SkipTest(f"runs when SYNAPSE_LITE_TEST_DB={self.engine}")
        if self.transport == "redis":
            require_redis()
        test_db = create_test_database(self.engine)
        self.addCleanup(test_db.drop)
        config = layout_config(test_db, WORKERS, WRITERS, transport=self.transport)
        self.servers = ServerProcesses(self, config)
        await self.servers.start()
        self.names = list(self.servers.processes)
        self.assertEqual(len(self.names), 4)

        user = 0
        for round_number in range(ROUNDS):
            via = self.names[1 + round_number % (len(self.names) - 1)]
            revocations = {
                "logout": lambda c: c.ok("POST", "/logout", {}),
                "logout/all": lambda c: c.ok("POST", "/logout/all", {}),
                "device deletion": self.delete_own_device,
                "password change": self.change_password,
                "deactivation": self.deactivate,
            }
            for what, revoke in revocations.items():
                user += 1
                username = f"u{user}"
                await ClientApi(self, self.servers.url("main")).register(username, PASSWORD)
                token = await self.login(username)
                revoking = ClientApi(self, self.servers.url(via)).as_user(token)
                # A second device whose token is the one checked after a
                # password change (which keeps the changing device's).
                checked = await self.login(username) if what == "password change" else token
                await self.used_everywhere(checked, 200, f"{what}: before")
                await revoke(revoking)
                await self.used_everywhere(checked, 401, f"{what} through {via}")

    # Helpers

    async def login(self, username: str) -> str:
        client = ClientApi(self, self.servers.url("main"))
        body = await client.ok(
            "POST",
            "/login",
            {
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": username},
                "password": PASSWORD,
            },
        )
        return str(body["access_token"])

    async def used_everywhere(self, token: str, expected: int, what: str) -> None:
        """``GET /account/whoami`` with ``token`` on every process at once."""

        async def whoami(name: str) -> tuple[str, int]:
            client = ClientApi(self, self.servers.url(name)).as_user(token)
            code, _ = await client.request("GET", "/account/whoami")
            return name, code

        answers = await defer.gatherResults(
            [defer.ensureDeferred(whoami(name)) for name in self.names]
        )
        self.assertEqual(dict(answers), {name: expected for name in self.names}, what)

    async def delete_own_device(self, client: ClientApi) -> Any:
        device_id = (await client.ok("GET", "/account/whoami"))["device_id"]
        user_id = (await client.ok("GET", "/account/whoami"))["user_id"]
        return await client.ok(
            "DELETE", f"/devices/{device_id}", {"auth": password_auth(user_id, PASSWORD)}
        )

    async def change_password(self, client: ClientApi) -> Any:
        user_id = (await client.ok("GET", "/account/whoami"))["user_id"]
        return await client.ok(
            "POST",
            "/account/password",
            {"new_password": "another-pw", "auth": password_auth(user_id, PASSWORD)},
        )

    async def deactivate(self, client: ClientApi) -> Any:
        user_id = (await client.ok("GET", "/account/whoami"))["user_id"]
        return await client.ok(
            "POST", "/account/deactivate", {"auth": password_auth(user_id, PASSWORD)}
        )


class PostgresRedisRevocationProcessesTestCase(RevocationProcessesTestCase):
    engine = "postgres"
    transport = "redis"
