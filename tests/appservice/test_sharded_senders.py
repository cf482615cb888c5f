"""Services spread over ``appservice_instances``: each sent to by exactly
one process, chosen by a stable hash of its id, the others' included."""

from __future__ import annotations

from collections.abc import Callable

from synapse_lite.appservice import sender as sender_module
from synapse_lite.appservice.sender import sender_of
from tests.appservice.fake_service import FakeApplicationService
from tests.appservice.registrations import irc_registration, write_registrations
from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase

INSTANCES = ["main", "as1"]


def ids_one_per_instance() -> dict[str, str]:
    """Instance -> a service id it owns."""
    found: dict[str, str] = {}
    for i in range(100):
        found.setdefault(sender_of(f"bridge{i}", INSTANCES), f"bridge{i}")
    return found


class ShardedSendersTestCase(DatabaseTestCase):
    def test_owner_is_stable_and_spread(self) -> None:
        owners = [sender_of(f"s{i}", INSTANCES) for i in range(200)]
        self.assertEqual(
            owners, [sender_of(f"s{i}", list(reversed(INSTANCES))) for i in range(200)]
        )
        self.assertEqual(set(owners), set(INSTANCES))

    async def test_each_service_is_sent_to_by_its_owner(self) -> None:
        self.patch(sender_module, "POLL_SECONDS", 0.05)
        services: dict[str, FakeApplicationService] = {}
        registrations = []
        for n, (instance, service_id) in enumerate(sorted(ids_one_per_instance().items())):
            fake = FakeApplicationService(hs_token=f"hs{n}")
            url = fake.listen()
            self.addCleanup(fake.port.stopListening)
            services[instance] = fake
            registration = irc_registration(
                url,
                id=service_id,
                as_token=f"as{n}",
                hs_token=f"hs{n}",
                sender_localpart=f"bot{n}",
            )
            registration["namespaces"] = {}
            registrations.append(registration)
        servers, clients, _ = start_cluster(
            self,
            self.test_db,
            workers=["as1"],
            appservice_instances=INSTANCES,
            app_service_config_files=write_registrations(*registrations),
        )
        alice = await ClientApi(self, clients["main"].base_url).register("alice")
        room_id = await alice.create_room(preset="public_chat")
        for n in range(2):
            bot = clients["main"].as_user(f"as{n}")
            await bot.ok("POST", f"/join/{room_id}", {})
        await alice.send(room_id, "hello both")
        for fake in services.values():
            await eventually(_received(fake, "hello both"), what="delivery")
        for instance, server in servers.items():
            senders = [
                loop
                for loop in server.loops._loops
                if isinstance(loop, sender_module.ApplicationServiceSender)
            ]
            self.assertEqual(
                [s.id for sender in senders for s in sender.services],
                [ids_one_per_instance()[instance]],
            )


def _received(fake: FakeApplicationService, body: str) -> Callable[[], bool]:
    return lambda: body in fake.bodies()
