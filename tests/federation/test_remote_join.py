"""Our users joining and leaving rooms of other servers (docs/federation.md,
"Joining rooms of other servers"): two servers of ours on loopback, ``a.test``
(main only) joining rooms of ``b.test`` (main, the events writer, and
``fed1``, a federation worker) by id with ``server_name`` and by alias, each
room version we create; the room and its state in the joiner's /sync; a
leave; and send_join answers tampered in flight (a forged state event, a bad
signature, a state that does not allow the join) refused with nothing stored.
"""

from __future__ import annotations

import copy
import urllib.parse
from typing import Any

from synapse_lite.api.room_versions import KNOWN_ROOM_VERSIONS
from synapse_lite.event_graph.hashing import event_id_of, sign_event
from synapse_lite.federation.client import FederationClient
from synapse_lite.federation.crypto import SigningKey, load_or_create_signing_key
from synapse_lite.storage.id_generators import generator as id_generators
from tests.harness.client_api import ClientApi
from tests.harness.federation import LoopbackServers
from tests.harness.polling import eventually


def q(value: str | None) -> str:
    return urllib.parse.quote(value or "", safe="")


class RemoteJoinTestCase(LoopbackServers):
    def setUp(self) -> None:
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)
        self.a = self.make_server("a.test", [])
        self.b = self.make_server("b.test", ["fed1"])
        self.connect(self.a, self.b)

    def client(self, server: dict[str, Any]) -> ClientApi:
        return ClientApi(self, server["main"].config.instance_map["main"].base_url)

    async def b_room(self, **body: Any) -> tuple[ClientApi, str]:
        self.alices = getattr(self, "alices", 0) + 1
        alice = await self.client(self.b).register(f"alice{self.alices}")
        room_id = await alice.create_room(**{"preset": "public_chat", "name": "The Lobby", **body})
        await alice.send(room_id, "hello from b")
        return alice, room_id

    async def members(self, user: ClientApi, room_id: str) -> set[str]:
        joined = await user.ok("GET", f"/rooms/{q(room_id)}/joined_members")
        return set(joined["joined"])

    async def test_join_by_alias_and_id_then_leave(self) -> None:
        alice, room_id = await self.b_room(room_alias_name="lobby")
        # By alias: a.test asks b.test's directory for the room and servers.
        carol = await self.client(self.a).register("carol")
        joined = await carol.ok("POST", f"/join/{q('#lobby:b.test')}", {})
        self.assertEqual(joined["room_id"], room_id)

        # carol's /sync: the room, its name and members, her join in the timeline.
        sync = await carol.sync()
        room = sync["rooms"]["join"][room_id]
        state = {(e["type"], e["state_key"]): e for e in room["state"]["events"]}
        self.assertEqual(state[("m.room.name", "")]["content"]["name"], "The Lobby")
        self.assertEqual(state[("m.room.member", alice.user_id)]["content"]["membership"], "join")
        timeline = room["timeline"]["events"]
        self.assertEqual(timeline[-1]["type"], "m.room.member")
        self.assertEqual(timeline[-1]["state_key"], carol.user_id)
        # The room's state and members as a.test's clients read them.
        name = await carol.ok("GET", f"/rooms/{q(room_id)}/state/m.room.name")
        self.assertEqual(name["name"], "The Lobby")
        self.assertEqual(await self.members(carol, room_id), {alice.user_id, carol.user_id})
        # b.test has carol as a member too.
        self.assertEqual(await self.members(alice, room_id), {alice.user_id, carol.user_id})
        # carol can send in it (here: sending it out is the outbound slice's)
        # and page back through it.
        await carol.send(room_id, "hello from a")
        page = await carol.ok("GET", f"/rooms/{q(room_id)}/messages?dir=b&limit=10")
        self.assertEqual(page["chunk"][0]["content"]["body"], "hello from a")
        # Joining again changes nothing.
        again = await carol.ok("POST", f"/rooms/{q(room_id)}/join", {})
        self.assertEqual(again["room_id"], room_id)

        # With carol in the room a.test is resident: bob's join (by id) and
        # leave are local, and reach b.test as PDUs of a.test's sender.
        bob = await self.client(self.a).register("bob")
        await bob.ok("POST", f"/join/{q(room_id)}?server_name=b.test", {})
        self.assertIn(bob.user_id, await self.members(carol, room_id))
        await bob.ok("POST", f"/rooms/{q(room_id)}/leave", {})
        self.assertNotIn(bob.user_id, await self.members(carol, room_id))

        # carol, the last user of a.test, leaves through b.test.
        await carol.ok("POST", f"/rooms/{q(room_id)}/leave", {"reason": "bye"})

        async def only_alice() -> bool:
            if await self.members(alice, room_id) != {alice.user_id}:
                return False
            # bob's leave arrived too (not merely his join not yet).
            path = f"/rooms/{q(room_id)}/state/m.room.member/{q(bob.user_id)}"
            code, body = await alice.request("GET", path)
            return code == 200 and body.get("membership") == "leave"

        # bob's join and leave may reach b.test after carol's send_leave.
        await eventually(only_alice, timeout=10, what="b.test's members after the leaves")
        left = await carol.sync(since=sync["next_batch"])
        self.assertIn(room_id, left["rooms"]["leave"])
        # And back in, rejoining through b.test.
        await carol.ok("POST", f"/join/{q(room_id)}?via=b.test", {})
        self.assertEqual(await self.members(alice, room_id), {alice.user_id, carol.user_id})
        self.assertEqual(await self.members(carol, room_id), {alice.user_id, carol.user_id})

    async def test_every_room_version(self) -> None:
        bob = await self.client(self.a).register("bob")
        for identifier in ("1", "2", "3", "4", "6", "9", "10", "11"):
            version = KNOWN_ROOM_VERSIONS[identifier]
            _alice, room_id = await self.b_room(room_version=version.identifier)
            await bob.ok("POST", f"/join/{q(room_id)}?server_name=b.test", {})
            name = await bob.ok("GET", f"/rooms/{q(room_id)}/state/m.room.name")
            self.assertEqual(name["name"], "The Lobby", identifier)

    async def test_unknown_server_and_refusal(self) -> None:
        _alice, room_id = await self.b_room(preset="private_chat")
        bob = await self.client(self.a).register("bob")
        # b.test's rules refuse (invite only): 403 with its reason.
        code, body = await bob.request("POST", f"/join/{q(room_id)}?server_name=b.test", {})
        self.assertEqual(code, 403, body)
        self.assertIn("b.test", body["error"])
        # No server to ask at all.
        code, body = await bob.request("POST", f"/join/{q('!nowhere:a.test')}", {})
        self.assertEqual(code, 404, body)

    async def hostile_join(self, tamper: Any) -> dict[str, Any]:
        """bob@a.test joins a room of b.test while ``tamper`` changes the
        send_join answer in flight; returns the refusal bob gets, after
        checking a.test stored nothing of the room."""
        _alice, room_id = await self.b_room()
        bob = await self.client(self.a).register("bob")
        original = FederationClient.put_json

        async def put_json(client: Any, destination: str, path: str, content: Any) -> Any:
            answer = await original(client, destination, path, content)
            if "/send_join/" in path:
                answer = copy.deepcopy(answer)
                tamper(answer)
            return answer

        self.patch(FederationClient, "put_json", put_json)
        code, body = await bob.request("POST", f"/join/{q(room_id)}?server_name=b.test", {})
        self.assertEqual(code, 404, body)
        store = self.a["main"].store
        self.assertFalse(await store.room_exists(room_id))
        self.assertEqual(await store.get_received_pdus([body["error"]]), {})
        rows = await store.db_pool.select(
            "count", "SELECT COUNT(*) FROM events WHERE room_id = ?", room_id
        )
        self.assertEqual(rows[0][0], 0)
        return body

    @staticmethod
    def state_event(answer: dict[str, Any], event_type: str) -> dict[str, Any]:
        return next(e for e in answer["state"] if e["type"] == event_type)

    async def test_forged_state_event_is_dropped(self) -> None:
        # A forged event the join does not need is dropped, the join made.
        _alice, room_id = await self.b_room()
        bob = await self.client(self.a).register("bob")
        original = FederationClient.put_json

        async def put_json(client: Any, destination: str, path: str, content: Any) -> Any:
            answer = await original(client, destination, path, content)
            if "/send_join/" in path:
                answer = copy.deepcopy(answer)
                self.state_event(answer, "m.room.name")["content"]["name"] = "Forged"
            return answer

        self.patch(FederationClient, "put_json", put_json)
        await bob.ok("POST", f"/join/{q(room_id)}?server_name=b.test", {})
        code, body = await bob.request("GET", f"/rooms/{q(room_id)}/state/m.room.name")
        self.assertEqual(code, 404, body)

    async def test_bad_signature_is_refused(self) -> None:
        def tamper(answer: dict[str, Any]) -> None:
            # Every copy of the create event (it is in the auth chain too).
            for create in answer["state"] + answer["auth_chain"]:
                if create["type"] == "m.room.create":
                    for signatures in create["signatures"].values():
                        for key_id in signatures:
                            signatures[key_id] = "A" * 86

        # Dropped as forged: the state then has no create event.
        body = await self.hostile_join(tamper)
        self.assertIn("no m.room.create event", body["error"])

    async def test_state_that_does_not_allow_the_join_is_refused(self) -> None:
        # b.test's own key signs an invite-only join rule (a resident server
        # lying about the state): each event is valid, the join is not.
        b_key = load_or_create_signing_key(self.b["main"].config.data_dir, create=False)
        version = KNOWN_ROOM_VERSIONS["10"]

        def tamper(answer: dict[str, Any]) -> None:
            rules = self.state_event(answer, "m.room.join_rules")
            bare = {k: v for k, v in rules.items() if k not in ("event_id", "unsigned")}
            bare["content"] = {"join_rule": "invite"}
            bare.pop("signatures")
            forged = sign_event(version, bare, "b.test", b_key)
            answer["state"] = [
                forged if e["type"] == "m.room.join_rules" else e for e in answer["state"]
            ]

        body = await self.hostile_join(tamper)
        self.assertIn("does not allow it", body["error"])

    async def test_invites_across_servers(self) -> None:
        # b.test invites bob@a.test (b's outbound /v2/invite, a's inbound).
        alice, room_id = await self.b_room(preset="private_chat", name="Secret")
        bob = await self.client(self.a).register("bob")
        await alice.ok("POST", f"/rooms/{q(room_id)}/invite", {"user_id": bob.user_id})
        invited = (await bob.sync())["rooms"]["invite"][room_id]["invite_state"]["events"]
        by_key = {(e["type"], e["state_key"]): e for e in invited}
        self.assertEqual(by_key[("m.room.name", "")]["content"]["name"], "Secret")
        self.assertEqual(by_key[("m.room.member", bob.user_id)]["content"]["membership"], "invite")
        self.assertEqual(by_key[("m.room.member", bob.user_id)]["sender"], alice.user_id)
        # b.test holds the invite as it went, signed by both servers.
        member = await alice.ok("GET", f"/rooms/{q(room_id)}/state/m.room.member/{q(bob.user_id)}")
        self.assertEqual(member["membership"], "invite")

        # bob accepts: a remote join through the inviter's server.
        await bob.ok("POST", f"/rooms/{q(room_id)}/join", {})
        self.assertEqual(await self.members(alice, room_id), {alice.user_id, bob.user_id})
        sync = await bob.sync()
        self.assertIn(room_id, sync["rooms"]["join"])
        self.assertNotIn(room_id, sync["rooms"]["invite"])

        # carol rejects hers: a remote leave through the inviter's server.
        _alice, other_room = await self.b_room(preset="private_chat")
        carol = await self.client(self.a).register("carol")
        await _alice.ok("POST", f"/rooms/{q(other_room)}/invite", {"user_id": carol.user_id})
        since = (await carol.sync())["next_batch"]
        await carol.ok("POST", f"/rooms/{q(other_room)}/leave", {})
        member = await _alice.ok(
            "GET", f"/rooms/{q(other_room)}/state/m.room.member/{q(carol.user_id)}"
        )
        self.assertEqual(member["membership"], "leave")
        self.assertIn(other_room, (await carol.sync(since=since))["rooms"]["leave"])

        # A user a.test does not have: b.test's client hears a.test's 404.
        code, body = await alice.request(
            "POST", f"/rooms/{q(room_id)}/invite", {"user_id": "@nobody:a.test"}
        )
        self.assertEqual(code, 404, body)
        self.assertIn("Unknown user", body["error"])

    async def test_create_room_inviting_users_of_both_servers(self) -> None:
        """``createRoom``'s ``invite`` with a user of ours and one of a.test:
        ours in the founding events, a.test's by /v2/invite once the room
        exists (``is_direct`` kept); a user a.test lacks fails the request."""
        alice = await self.client(self.b).register("alice")
        dave = await self.client(self.b).register("dave")
        bob = await self.client(self.a).register("bob")
        room_id = await alice.create_room(
            preset="private_chat", name="Both", invite=[bob.user_id, dave.user_id], is_direct=True
        )
        invited = (await bob.sync())["rooms"]["invite"][room_id]["invite_state"]["events"]
        by_key = {(e["type"], e["state_key"]): e for e in invited}
        self.assertEqual(by_key[("m.room.name", "")]["content"]["name"], "Both")
        member = by_key[("m.room.member", bob.user_id)]
        self.assertEqual(member["content"], {"membership": "invite", "is_direct": True})
        self.assertIn(room_id, (await dave.sync())["rooms"]["invite"])
        await bob.ok("POST", f"/rooms/{q(room_id)}/join", {})
        self.assertEqual(await self.members(alice, room_id), {alice.user_id, bob.user_id})

        code, body = await alice.request("POST", "/createRoom", {"invite": ["@nobody:a.test"]})
        self.assertEqual(code, 404, body)

    async def test_remote_members_found_by_the_name_their_join_shows(self) -> None:
        # alice of b.test has a display name; a.test has no profile of
        # hers, only her join event: carol of a.test, in a room with her,
        # finds her in the user directory by that name.
        alice = await self.client(self.b).register("alice")
        await alice.ok(
            "PUT", f"/profile/{q(alice.user_id)}/displayname", {"displayname": "Zebedee"}
        )
        room_id = await alice.create_room(preset="public_chat")
        carol = await self.client(self.a).register("carol")
        await carol.ok("POST", f"/join/{q(room_id)}?server_name=b.test", {})
        found = await carol.ok("POST", "/user_directory/search", {"search_term": "zebedee"})
        self.assertEqual(found["results"], [{"user_id": alice.user_id, "display_name": "Zebedee"}])

    async def test_hostile_invites_are_refused(self) -> None:
        bob = await self.client(self.a).register("bob")
        b_key = load_or_create_signing_key(self.b["main"].config.data_dir, create=False)
        other_key = SigningKey.generate()  # not b.test's
        version = KNOWN_ROOM_VERSIONS["10"]
        room_id = "!somewhere:b.test"
        invite = {
            "room_id": room_id,
            "type": "m.room.member",
            "state_key": bob.user_id,
            "sender": "@mallory:b.test",
            "content": {"membership": "invite"},
            "origin": "b.test",
            "origin_server_ts": 1,
            "depth": 5,
            "prev_events": ["$p"],
            "auth_events": [],
        }

        async def send(event: dict[str, Any], key: SigningKey, **body: Any) -> tuple[int, Any]:
            path = f"/_matrix/federation/v2/invite/{q(room_id)}/{q(event_id_of(version, event))}"
            content = {"room_version": "10", "event": event, **body}
            return await self.signed_request(b_key, "b.test", "a.test", "PUT", path, content)

        # Signed by a key b.test does not have: 403, nothing stored.
        code, body = await send(sign_event(version, invite, "b.test", other_key), other_key)
        self.assertEqual(code, 403, body)
        # A user a.test does not have: 404.
        other = sign_event(version, {**invite, "state_key": "@nobody:a.test"}, "b.test", b_key)
        code, body = await send(other, b_key)
        self.assertEqual(code, 404, body)
        # Not an invite; stripped state that is not a list of events: 400.
        join = sign_event(version, {**invite, "content": {"membership": "join"}}, "b.test", b_key)
        self.assertEqual((await send(join, b_key))[0], 400)
        good = sign_event(version, invite, "b.test", b_key)
        self.assertEqual((await send(good, b_key, invite_room_state=[1]))[0], 400)
        self.assertEqual((await bob.sync())["rooms"]["invite"], {})
        # The same invite, well formed: shown to bob.
        code, body = await send(good, b_key)
        self.assertEqual(code, 200, body)
        self.assertIn(room_id, (await bob.sync())["rooms"]["invite"])

    async def test_join_from_a_worker_persisted_by_the_writer(self) -> None:
        # c.test: main (the events writer) and w1, a worker serving the client
        # API and federation: the join is made on w1, stored by main.
        c = self.make_server("c.test", ["w1"])
        self.connect(self.a, self.b, c)
        alice, room_id = await self.b_room()
        url = c["w1"].config.instance_map["w1"].base_url
        dave = await ClientApi(self, url).register("dave")
        await dave.ok("POST", f"/join/{q(room_id)}?via=b.test", {})
        self.assertEqual(await self.members(alice, room_id), {alice.user_id, dave.user_id})
        room = (await dave.sync())["rooms"]["join"][room_id]
        names = [e for e in room["state"]["events"] if e["type"] == "m.room.name"]
        self.assertEqual(names[0]["content"]["name"], "The Lobby")
        on_main = ClientApi(self, self.client(c).base_url).as_user(dave.token)
        name = await on_main.ok("GET", f"/rooms/{q(room_id)}/state/m.room.name")
        self.assertEqual(name["name"], "The Lobby")
