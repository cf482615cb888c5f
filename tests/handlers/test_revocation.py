"""A revoked token is refused by every process once the revocation answers
(``handlers/revocation.py``): two processes on an in-memory bus whose
delivery to one of them is held back, so that without the wait that process
would still accept the token from its cache."""

from __future__ import annotations

from twisted.internet import reactor

from synapse_lite.handlers import revocation
from synapse_lite.replication.tcp.commands import Command
from synapse_lite.server import HomeServer
from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import BusEndpoint, DatabaseTestCase

#: How long commands to the slow process are held back.
HELD_SECONDS = 0.5


class RevocationEverywhereTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, self.clients, self.bus = start_cluster(self, self.test_db, workers=["sync1"])
        await eventually(lambda: all(hs.replication.connected for hs in self.servers.values()))
        # alice's device_lists writer is the main process: her logouts are
        # written there, and sync1 learns of them over the bus.
        self.alice = await ClientApi(self, self.clients["main"].base_url).register("alice")
        self.alice_on_sync1 = self.clients["sync1"].as_user(self.alice.token)
        # sync1 now has alice's token in its cache.
        await self.alice_on_sync1.ok("GET", "/account/whoami")

    def hold_commands_to(self, name: str, seconds: float | None) -> None:
        """Deliver commands to ``name`` ``seconds`` late (never when None)."""
        deliver = self.bus._deliver

        def late(endpoint: BusEndpoint, cmd: Command) -> None:
            hs: HomeServer = endpoint.hs
            if hs.instance_name != name:
                deliver(endpoint, cmd)
            elif seconds is not None:
                reactor.callLater(seconds, deliver, endpoint, cmd)

        self.patch(self.bus, "_deliver", late)

    async def whoami_on_sync1(self) -> int:
        code, _ = await self.alice_on_sync1.request("GET", "/account/whoami")
        return code

    async def test_a_logged_out_token_is_refused_by_a_lagging_process_at_once(self) -> None:
        self.hold_commands_to("sync1", HELD_SECONDS)
        await self.alice.ok("POST", "/logout", {})
        self.assertEqual(await self.whoami_on_sync1(), 401)

    async def test_logout_all_and_device_deletion_hold_everywhere(self) -> None:
        second = (
            await ClientApi(self, self.clients["main"].base_url)
            .as_user(None)
            .request(
                "POST",
                "/login",
                {
                    "type": "m.login.password",
                    "identifier": {"type": "m.id.user", "user": "alice"},
                    "password": "secret-pw",
                },
            )
        )
        token = second[1]["access_token"]
        other_on_sync1 = self.clients["sync1"].as_user(token)
        await other_on_sync1.ok("GET", "/account/whoami")
        self.hold_commands_to("sync1", HELD_SECONDS)
        await self.alice.ok("POST", "/logout/all", {})
        self.assertEqual(await self.whoami_on_sync1(), 401)
        code, _ = await other_on_sync1.request("GET", "/account/whoami")
        self.assertEqual(code, 401)

    async def test_a_process_that_never_confirms_is_logged_and_the_logout_answers(
        self,
    ) -> None:
        self.patch(revocation, "APPLY_WAIT_SECONDS", 0.2)
        self.patch(revocation, "CONFIRM_WAIT_SECONDS", 1.0)
        self.hold_commands_to("sync1", None)
        unconfirmed = revocation.REVOCATIONS_UNCONFIRMED.labels("sync1")
        before = unconfirmed._value.get()
        with self.assertLogs("synapse_lite.handlers.revocation", "WARNING") as logs:
            await self.alice.ok("POST", "/logout", {})
        self.assertEqual(unconfirmed._value.get(), before + 1)
        self.assertTrue(any("before sync1 confirmed" in line for line in logs.output))
