"""Rooms shared with a real Synapse (``tests/harness/synapse_peer.py``): our
users join rooms created on Synapse (by alias, and by id in room version
12, whose room ids name no server) and see their state in /sync, and leave
them; Synapse sees each membership.

One Synapse for the whole class (started by the first test, stopped in
``tearDownClass`` or when the process exits): starting it is most of the cost. Each test has its own
server of ours. Skipped with the reason when Synapse cannot be installed
here; a failure under ``CI=true``.
"""

from __future__ import annotations

import tempfile
import urllib.parse
from typing import Any

from twisted.trial import unittest

from synapse_lite.storage.id_generators import generator as id_generators
from tests.harness.client_api import ClientApi
from tests.harness.polling import eventually
from tests.harness.synapse_peer import SynapsePeer, start_our_server_listening, synapse_or_skip
from tests.harness.tls import TestCA


def q(value: str | None) -> str:
    return urllib.parse.quote(value or "", safe="")


class SynapsePeerTestCase(unittest.TestCase):
    """One Synapse per test class (started by its first test, stopped after
    its last) and our server per test; no tests of its own."""

    # A cold install of Synapse takes minutes; a warm run, seconds.
    timeout = 1200
    peer: SynapsePeer | None = None
    ca: TestCA | None = None
    #: Users registered so far (Synapse's database outlives each test).
    users = 0
    #: Settings of the class's Synapse beyond the harness's.
    synapse_config: dict[str, Any] = {}

    @classmethod
    def tearDownClass(cls) -> None:
        if cls.peer is not None:
            cls.peer.stop()
            cls.peer = None

    async def setUp(self) -> None:  # type: ignore[override]
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)
        python = await synapse_or_skip(self)
        cls = type(self)
        if cls.peer is None:
            cls.ca = TestCA(tempfile.mkdtemp(prefix="synapse_rooms_ca_"))
            peer = SynapsePeer(python, cls.ca, extra_config=cls.synapse_config)
            await peer.start(None)
            cls.peer = peer
        assert cls.ca is not None
        self.synapse = cls.peer
        # Its federation listener can be stopped and started again (ours
        # down, for Synapse).
        self.hs, self.client_url, self.federation_listener = start_our_server_listening(
            self, cls.ca
        )

    async def user(self, base_url: str, name: str) -> ClientApi:
        # Synapse's database outlives each test: names must not repeat.
        type(self).users += 1
        return await ClientApi(self, base_url).register(f"{name}{type(self).users}")

    async def synapse_members(self, sam: ClientApi, room_id: str) -> set[str]:
        joined = await sam.ok("GET", f"/rooms/{q(room_id)}/joined_members")
        return set(joined["joined"])


class SynapseRoomsTestCase(SynapsePeerTestCase):
    async def test_join_a_synapse_room_by_alias_and_leave(self) -> None:
        sam = await self.user(self.synapse.client_url, "sam")
        alias_name = f"lobby{type(self).users}"
        room_id = await sam.create_room(
            preset="public_chat", name="Synapse Lobby", room_alias_name=alias_name
        )
        await sam.send(room_id, "hello from Synapse")
        alice = await self.user(self.client_url, "alice")
        alias = f"#{alias_name}:{self.synapse.server_name}"
        joined = await alice.ok("POST", f"/join/{q(alias)}", {})
        self.assertEqual(joined["room_id"], room_id)

        sync = await alice.sync()
        room = sync["rooms"]["join"][room_id]
        state = {(e["type"], e["state_key"]): e for e in room["state"]["events"]}
        self.assertEqual(state[("m.room.name", "")]["content"]["name"], "Synapse Lobby")
        self.assertEqual(state[("m.room.member", sam.user_id)]["content"]["membership"], "join")
        self.assertEqual(room["timeline"]["events"][-1]["state_key"], alice.user_id)
        self.assertEqual(await self.synapse_members(sam, room_id), {sam.user_id, alice.user_id})

        # Messages both ways in Synapse's room: Synapse's reach our /sync
        # (its /send to us), ours reach Synapse's /messages (our sender).
        await sam.send(room_id, "welcome, alice")
        await alice.send(room_id, "hello from ours")

        async def alice_sees() -> bool:
            joined = (await alice.sync())["rooms"]["join"]
            events = joined.get(room_id, {}).get("timeline", {}).get("events", [])
            return "welcome, alice" in [e["content"].get("body") for e in events]

        async def sam_sees() -> bool:
            page = await sam.ok("GET", f"/rooms/{q(room_id)}/messages?dir=b&limit=20")
            return "hello from ours" in [e["content"].get("body") for e in page["chunk"]]

        await eventually(alice_sees, timeout=15, what="Synapse's message in our /sync")
        await eventually(sam_sees, timeout=15, what="our message on Synapse")

        await alice.ok("POST", f"/rooms/{q(room_id)}/leave", {})

        async def left() -> bool:
            return await self.synapse_members(sam, room_id) == {sam.user_id}

        await eventually(left, timeout=10, what="Synapse saw the leave")

    async def test_join_a_version_12_room_by_id(self) -> None:
        sam = await self.user(self.synapse.client_url, "sam")
        room_id = await sam.create_room(preset="public_chat", name="Twelve", room_version="12")
        self.assertNotIn(":", room_id)
        alice = await self.user(self.client_url, "alice")
        await alice.ok("POST", f"/join/{q(room_id)}?via={q(self.synapse.server_name)}", {})
        name = await alice.ok("GET", f"/rooms/{q(room_id)}/state/m.room.name")
        self.assertEqual(name["name"], "Twelve")
        self.assertEqual(await self.synapse_members(sam, room_id), {sam.user_id, alice.user_id})

    async def test_synapse_invites_ours_and_ours_accepts(self) -> None:
        sam = await self.user(self.synapse.client_url, "sam")
        room_id = await sam.create_room(preset="private_chat", name="Invited")
        alice = await self.user(self.client_url, "alice")
        await sam.ok("POST", f"/rooms/{q(room_id)}/invite", {"user_id": alice.user_id})

        async def invited() -> Any:
            return (await alice.sync())["rooms"]["invite"].get(room_id)

        await eventually(invited, timeout=10, what="our user saw Synapse's invite")
        invite_state = (await invited())["invite_state"]["events"]
        names = [e for e in invite_state if e["type"] == "m.room.name"]
        self.assertEqual(names[0]["content"]["name"], "Invited")
        await alice.ok("POST", f"/rooms/{q(room_id)}/join", {})
        self.assertEqual(await self.synapse_members(sam, room_id), {sam.user_id, alice.user_id})
        name = await alice.ok("GET", f"/rooms/{q(room_id)}/state/m.room.name")
        self.assertEqual(name["name"], "Invited")

    async def test_ours_invites_a_synapse_user(self) -> None:
        alice = await self.user(self.client_url, "alice")
        room_id = await alice.create_room(preset="private_chat", name="Ours")
        sam = await self.user(self.synapse.client_url, "sam")
        await alice.ok("POST", f"/rooms/{q(room_id)}/invite", {"user_id": sam.user_id})
        member = await alice.ok("GET", f"/rooms/{q(room_id)}/state/m.room.member/{q(sam.user_id)}")
        self.assertEqual(member["membership"], "invite")

        async def invited() -> Any:
            return (await sam.sync())["rooms"]["invite"].get(room_id)

        await eventually(invited, timeout=10, what="Synapse's user saw our invite")
        # Synapse's user accepts: Synapse joins our room (make_join/send_join).
        await sam.ok("POST", f"/rooms/{q(room_id)}/join", {})
        joined = await alice.ok("GET", f"/rooms/{q(room_id)}/joined_members")
        self.assertEqual(set(joined["joined"]), {alice.user_id, sam.user_id})

    async def test_spaces_walked_both_ways(self) -> None:
        # Each side's space has a public child room on its own server that
        # the other side is not in: the walk asks the child's server for it
        # (GET /_matrix/federation/v1/hierarchy), both ways.
        sam = await self.user(self.synapse.client_url, "sam")
        alice = await self.user(self.client_url, "alice")
        ours, theirs = self.hs.config.server_name, self.synapse.server_name
        space = {"creation_content": {"type": "m.space"}}
        for owner, server, joiner in ((sam, theirs, alice), (alice, ours, sam)):
            space_id = await owner.create_room(
                preset="public_chat", name=f"Space {server}", **space
            )
            child_id = await owner.create_room(preset="public_chat", name=f"Child {server}")
            await owner.ok(
                "PUT",
                f"/rooms/{q(space_id)}/state/m.space.child/{q(child_id)}",
                {"via": [server]},
            )
            await joiner.ok("POST", f"/join/{q(space_id)}?server_name={q(server)}", {})
            page = await joiner.ok("GET", f"/_matrix/client/v1/rooms/{q(space_id)}/hierarchy")
            self.assertEqual(
                [(r["room_id"], r.get("name")) for r in page["rooms"]],
                [(space_id, f"Space {server}"), (child_id, f"Child {server}")],
                server,
            )
