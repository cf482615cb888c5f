"""EDUs shared with a real Synapse (``tests/harness/synapse_peer.py``): in a
room of Synapse's that our user joined, typing and read receipts both ways,
and each server's /keys/query answering the other's user (ours asks
Synapse's ``/user/devices``; Synapse asks ours). Slow (one Synapse for the
class, as ``test_synapse_rooms.py``); skipped with the reason when Synapse
cannot be installed here, a failure under ``CI=true``."""

from __future__ import annotations

from typing import Any

from tests.federation import test_synapse_rooms as rooms
from tests.federation.test_edus import device_keys, readers_in, typing_in
from tests.harness.client_api import ClientApi
from tests.harness.polling import eventually
from tests.harness.synapse_peer import sync_until


class SynapseEdusTestCase(rooms.SynapsePeerTestCase):
    # The same Synapse set-up as the rooms tests (one peer per class).

    async def shared_room(self) -> tuple[ClientApi, ClientApi, str]:
        sam = await self.user(self.synapse.client_url, "sam")
        room_id = await sam.create_room(preset="public_chat")
        alice = await self.user(self.client_url, "alice")
        await alice.ok(
            "POST",
            f"/join/{rooms.q(room_id)}?via={rooms.q(self.synapse.server_name)}",
            {},
        )
        return sam, alice, room_id

    async def sees(self, user: ClientApi, since: str, check: Any, what: str) -> None:
        await sync_until(user, since, check, what, timeout=20)

    async def test_typing_and_receipts_both_ways(self) -> None:
        sam, alice, room_id = await self.shared_room()
        s_since = (await sam.sync())["next_batch"]
        a_since = (await alice.sync())["next_batch"]
        await sam.ok(
            "PUT",
            f"/rooms/{rooms.q(room_id)}/typing/{rooms.q(sam.user_id)}",
            {"typing": True, "timeout": 30000},
        )
        await self.sees(
            alice,
            a_since,
            lambda s: typing_in(s, room_id) == [sam.user_id],
            "Synapse's typing here",
        )
        await alice.ok(
            "PUT",
            f"/rooms/{rooms.q(room_id)}/typing/{rooms.q(alice.user_id)}",
            {"typing": True, "timeout": 30000},
        )
        await self.sees(
            sam,
            s_since,
            lambda s: alice.user_id in (typing_in(s, room_id) or []),
            "our typing on Synapse",
        )

        event_id = await sam.send(room_id, "read me")

        async def alice_has_it() -> bool:
            page = await alice.ok("GET", f"/rooms/{rooms.q(room_id)}/messages?dir=b&limit=5")
            return any(e["event_id"] == event_id for e in page["chunk"])

        await eventually(alice_has_it, timeout=20, what="Synapse's message here")
        s_since = (await sam.sync())["next_batch"]
        await alice.ok("POST", f"/rooms/{rooms.q(room_id)}/receipt/m.read/{rooms.q(event_id)}", {})
        await self.sees(
            sam,
            s_since,
            lambda s: readers_in(s, room_id).get(alice.user_id or "") == event_id,
            "our receipt on Synapse",
        )
        a_since = (await alice.sync())["next_batch"]
        await sam.ok("POST", f"/rooms/{rooms.q(room_id)}/receipt/m.read/{rooms.q(event_id)}", {})
        await self.sees(
            alice,
            a_since,
            lambda s: readers_in(s, room_id).get(sam.user_id or "") == event_id,
            "Synapse's receipt here",
        )

    async def test_device_keys_both_ways(self) -> None:
        sam, alice, _room_id = await self.shared_room()
        for user, key in ((sam, "S"), (alice, "A")):
            assert user.user_id is not None and user.device_id is not None
            await user.ok(
                "POST",
                "/keys/upload",
                {"device_keys": device_keys(user.user_id, user.device_id, key)},
            )

        async def keys_of(asker: ClientApi, target: ClientApi) -> bool:
            answer = await asker.ok("POST", "/keys/query", {"device_keys": {target.user_id: []}})
            return target.device_id in answer["device_keys"].get(target.user_id, {})

        await eventually(lambda: keys_of(alice, sam), timeout=20, what="Synapse's user's keys here")
        await eventually(lambda: keys_of(sam, alice), timeout=20, what="our user's keys on Synapse")
