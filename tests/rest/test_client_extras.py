"""What clients call at start-up and in daily use besides rooms and /sync:
honest discovery, the small start-up endpoints, room tags, profiles, single
events and their context, redactions, forgetting, and the room directory.
Every answer of the happy paths is validated against the Matrix spec's
OpenAPI response schemas."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import urllib.parse
import uuid
from typing import Any

from synapse_lite.http.server import JsonResource
from synapse_lite.rest.client.versions import VERSION_MODULES, supported_versions
from tests.harness.client_api import ThreeUsersTestCase, q, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase
from tests.harness.spec import assert_spec_response


class DiscoveryTestCase(ThreeUsersTestCase):
    async def test_versions_claim_only_what_is_routed(self) -> None:
        body = await self.alice.ok("GET", "/_matrix/client/versions")
        assert_spec_response(self, "versions.yaml", "/versions", "GET", 200, body)
        # Sliding sync's unstable flag, claimed because its route is served.
        self.assertEqual(body["unstable_features"], {"org.matrix.simplified_msc3575": True})

        async def servlet(request: Any) -> tuple[int, Any]:
            return 200, {}

        resource = JsonResource()
        self.assertEqual(supported_versions(resource), [])
        required = [m for _, added in VERSION_MODULES for m in added]
        for method, path in required[:-1]:
            resource.register_paths(method, re.escape(path), servlet, "x")
        # Everything but threads: up to the version before threads came in.
        self.assertEqual(supported_versions(resource), ["r0.6.1", "v1.1", "v1.2", "v1.3"])
        method, path = required[-1]
        resource.register_paths(method, re.escape(path), servlet, "x")
        self.assertEqual(supported_versions(resource)[-1], "v1.6")
        # Whatever this server claims, it routes; with push rules, keys and
        # threads served, that is every version up to v1.6.
        routes = await self.alice.ok("GET", "/_matrix/client/versions")
        self.assertEqual(routes["versions"][-1], "v1.6")
        for version, added in VERSION_MODULES:
            if version in routes["versions"]:
                for method, path in added:
                    _, answer = await self.alice.request(method, path, {})
                    self.assertNotEqual(answer.get("errcode"), "M_UNRECOGNIZED", path)

    async def test_capabilities(self) -> None:
        body = await self.alice.ok("GET", "/capabilities")
        assert_spec_response(self, "capabilities.yaml", "/capabilities", "GET", 200, body)
        caps = body["capabilities"]
        self.assertEqual(caps["m.set_displayname"], {"enabled": True})
        self.assertEqual(caps["m.set_avatar_url"], {"enabled": True})
        self.assertEqual(caps["m.3pid_changes"], {"enabled": False})
        self.assertEqual(caps["m.room_versions"]["default"], "10")

    async def test_start_up_endpoints(self) -> None:
        threepids = await self.alice.ok("GET", "/account/3pid")
        self.assertEqual(threepids, {"threepids": []})
        assert_spec_response(
            self, "administrative_contact.yaml", "/account/3pid", "GET", 200, threepids
        )
        self.assertEqual(await self.alice.ok("GET", "/thirdparty/protocols"), {})
        self.assertEqual(await self.alice.ok("GET", "/voip/turnServer"), {})
        # Public reads need no token.
        code, _ = await self.alice.request("GET", f"/profile/{q(self.bob.user_id)}", token=None)
        self.assertEqual(code, 200)
        code, _ = await self.alice.request("GET", "/publicRooms", token=None)
        self.assertEqual(code, 200)
        for path in ("/account/3pid", "/thirdparty/protocols", "/voip/turnServer"):
            code, body = await self.alice.request("GET", path, token=None)
            self.assertEqual((code, body["errcode"]), (401, "M_MISSING_TOKEN"))


class TurnTestCase(DatabaseTestCase):
    async def test_turn_credentials_as_coturn_checks_them(self) -> None:
        _, clients, _ = start_cluster(
            self,
            self.test_db,
            turn={"uris": ["turn:turn.test:3478?transport=udp"], "shared_secret": "s3cret"},
        )
        alice = await clients["main"].register("alice")
        body = await alice.ok("GET", "/voip/turnServer")
        assert_spec_response(self, "voip.yaml", "/voip/turnServer", "GET", 200, body)
        self.assertEqual(body["uris"], ["turn:turn.test:3478?transport=udp"])
        self.assertEqual(body["ttl"], 86400)
        expiry, _, user = body["username"].partition(":")
        self.assertEqual(user, alice.user_id)
        self.assertTrue(expiry.isdigit())
        expected = hmac.new(b"s3cret", body["username"].encode(), hashlib.sha1).digest()
        self.assertEqual(base64.b64decode(body["password"]), expected)


class TagsTestCase(ThreeUsersTestCase):
    async def test_put_get_delete_and_sync(self) -> None:
        room = await self.alice.create_room()
        base = f"/user/{self.alice.user_id}/rooms/{room}/tags"
        empty = await self.alice.ok("GET", base)
        self.assertEqual(empty, {"tags": {}})
        before = await self.alice.sync()
        await self.alice.ok("PUT", f"{base}/m.favourite", {"order": 0.5})
        await self.alice.ok("PUT", f"{base}/u.work", {})
        tags = await self.alice.ok("GET", base)
        assert_spec_response(
            self, "tags.yaml", "/user/{userId}/rooms/{roomId}/tags", "GET", 200, tags
        )
        self.assertEqual(tags, {"tags": {"m.favourite": {"order": 0.5}, "u.work": {}}})
        after = await self.alice.sync(since=before["next_batch"])
        data = after["rooms"]["join"][room]["account_data"]["events"]
        self.assertIn({"type": "m.tag", "content": tags}, data)
        await self.alice.ok("DELETE", f"{base}/u.work")
        self.assertEqual(
            await self.alice.ok("GET", base), {"tags": {"m.favourite": {"order": 0.5}}}
        )
        await self.alice.ok("DELETE", f"{base}/m.favourite")
        emptied = await self.alice.sync(since=after["next_batch"])
        data = emptied["rooms"]["join"][room]["account_data"]["events"]
        self.assertIn({"type": "m.tag", "content": {"tags": {}}}, data)

    async def test_bad_input(self) -> None:
        room = await self.alice.create_room()
        base = f"/user/{self.alice.user_id}/rooms/{room}/tags"
        code, body = await self.bob.request("GET", base)
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        code, body = await self.bob.request("PUT", f"{base}/x", {})
        self.assertEqual(code, 403)
        for bad in ({"order": 2}, {"order": "first"}, {"order": True}):
            code, body = await self.alice.request("PUT", f"{base}/x", bad)
            self.assertEqual((code, body["errcode"]), (400, "M_BAD_JSON"), bad)
        code, body = await self.alice.request("PUT", f"{base}/x", [1])
        self.assertEqual(code, 400)
        code, body = await self.alice.request(
            "PUT", f"/user/{self.alice.user_id}/rooms/not-a-room/tags/x", {}
        )
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"))
        self.assertEqual(await self.alice.ok("GET", base), {"tags": {}})


class TagsOnWriterTestCase(DatabaseTestCase):
    async def test_tag_written_by_the_account_data_writer(self) -> None:
        servers, clients, _ = start_cluster(
            self, self.test_db, workers=["worker1"], stream_writers={"account_data": "worker1"}
        )
        alice = await clients["main"].register("alice")
        room = await alice.create_room()
        await alice.ok("PUT", f"/user/{alice.user_id}/rooms/{room}/tags/m.lowpriority", {})
        on_worker = clients["worker1"].as_user(alice.token)
        tags = await on_worker.ok("GET", f"/user/{alice.user_id}/rooms/{room}/tags")
        self.assertEqual(tags, {"tags": {"m.lowpriority": {}}})
        [writer] = await servers["main"].store.db_pool.select(
            "t", "SELECT instance_name FROM room_tags_revisions"
        )
        self.assertEqual(writer[0], "worker1")


async def profile_updates_done(servers: dict[str, Any]) -> None:
    """Wait for every process's background member-event updates."""
    for hs in servers.values():
        handler = hs.handlers.profiles
        while handler.updates_in_flight:
            await next(iter(handler.updates_in_flight))


class ProfileTestCase(ThreeUsersTestCase):
    async def test_defaults_set_and_get(self) -> None:
        me = q(self.alice.user_id)
        profile = await self.bob.ok("GET", f"/profile/{me}")
        self.assertEqual(profile, {"displayname": "alice"})
        assert_spec_response(self, "profile.yaml", "/profile/{userId}", "GET", 200, profile)
        code, body = await self.alice.request("GET", f"/profile/{me}/avatar_url")
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))
        await self.alice.ok("PUT", f"/profile/{me}/displayname", {"displayname": "Alice A."})
        await self.alice.ok(
            "PUT", f"/profile/{me}/avatar_url", {"avatar_url": "mxc://test.local/x"}
        )
        name = await self.bob.ok("GET", f"/profile/{me}/displayname")
        self.assertEqual(name, {"displayname": "Alice A."})
        assert_spec_response(self, "profile.yaml", "/profile/{userId}/{keyName}", "GET", 200, name)
        self.assertEqual(
            await self.bob.ok("GET", f"/profile/{me}"),
            {"displayname": "Alice A.", "avatar_url": "mxc://test.local/x"},
        )

    async def test_bad_input(self) -> None:
        me = q(self.alice.user_id)
        code, body = await self.bob.request(
            "PUT", f"/profile/{me}/displayname", {"displayname": "x"}
        )
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        for field, value in [
            ("displayname", 5),
            ("displayname", "x" * 300),
            ("avatar_url", "not a uri"),
            ("avatar_url", "/relative/a.png"),
        ]:
            code, body = await self.alice.request("PUT", f"/profile/{me}/{field}", {field: value})
            self.assertEqual((code, body["errcode"]), (400, "M_BAD_JSON"), (field, value))
        # Any URI (the spec's format), not only mxc: clients choose what to show.
        await self.alice.ok(
            "PUT", f"/profile/{me}/avatar_url", {"avatar_url": "https://example.com/a.png"}
        )
        await self.alice.ok("PUT", f"/profile/{me}/avatar_url", {"avatar_url": None})
        code, body = await self.alice.request("PUT", f"/profile/{me}/displayname", {})
        self.assertEqual((code, body["errcode"]), (400, "M_MISSING_PARAM"))
        code, body = await self.alice.request("PUT", f"/profile/{me}/status", {"status": "x"})
        self.assertEqual(code, 400)
        code, body = await self.alice.request("GET", f"/profile/{q('@nobody:test.local')}")
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))
        # Another server's user is asked of that server (here: reached by
        # nobody, a 404 saying so; docs/federation.md).
        self.servers["main"].config.federation.destinations["elsewhere.example"] = (
            "http://127.0.0.1:1"
        )
        code, body = await self.alice.request("GET", f"/profile/{q('@someone:elsewhere.example')}")
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))
        self.assertIn("no answer could be had from elsewhere.example", body["error"])
        code, body = await self.alice.request("GET", "/profile/not-a-user")
        self.assertEqual(code, 400)
        self.assertEqual(await self.bob.ok("GET", f"/profile/{me}"), {"displayname": "alice"})

    async def test_joins_carry_the_profile_and_joined_members_shows_it(self) -> None:
        me = q(self.bob.user_id)
        await self.bob.ok("PUT", f"/profile/{me}/displayname", {"displayname": "Bobby"})
        room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room}", {})
        members = await self.alice.ok("GET", f"/rooms/{room}/joined_members")
        self.assertEqual(
            members["joined"],
            {
                self.alice.user_id: {"display_name": "alice", "avatar_url": None},
                self.bob.user_id: {"display_name": "Bobby", "avatar_url": None},
            },
        )
        # Unset fields are null (docs/client-api.md), which the spec's schema
        # does not describe: the rest of the answer is checked against it.
        for member in members["joined"].values():
            del member["avatar_url"]
        assert_spec_response(
            self, "rooms.yaml", "/rooms/{roomId}/joined_members", "GET", 200, members
        )


class ProfileAcrossProcessesTestCase(DatabaseTestCase):
    async def test_name_change_reaches_every_room_on_its_writer(self) -> None:
        servers, clients, _ = start_cluster(
            self,
            self.test_db,
            workers=["writer1", "writer2", "reader"],
            stream_writers={"events": ["writer1", "writer2"]},
        )
        alice = await clients["reader"].register("alice")
        bob = await clients["reader"].register("bob")
        # A room's writer is a hash of its random id: create rooms until
        # both writers have some (at least 4 rooms; 16 all on one writer
        # would happen once in 30,000 runs).
        rooms: list[str] = []
        writers: set[str] = set()
        while len(rooms) < 4 or (len(writers) < 2 and len(rooms) < 16):
            room = await alice.create_room(preset="public_chat")
            await bob.ok("POST", f"/join/{room}", {})
            rooms.append(room)
            writers.add((await servers["main"].store.get_room(room) or {})["event_writer"])
        self.assertEqual(writers, {"writer1", "writer2"})
        since = (await bob.sync())["next_batch"]
        await alice.ok(
            "PUT", f"/profile/{q(alice.user_id)}/displayname", {"displayname": "Queen Alice"}
        )
        await profile_updates_done(servers)
        on_main = clients["main"].as_user(bob.token)

        async def renamed_everywhere() -> bool:
            sync = await on_main.sync(since=since)
            seen = set()
            for room, entry in sync["rooms"]["join"].items():
                for event in entry["timeline"]["events"]:
                    if event["type"] == "m.room.member" and event["state_key"] == alice.user_id:
                        if event["content"].get("displayname") == "Queen Alice":
                            seen.add(room)
            return seen == set(rooms)

        await eventually(renamed_everywhere)
        for room in rooms:
            members = await on_main.ok("GET", f"/rooms/{room}/joined_members")
            self.assertEqual(members["joined"][alice.user_id]["display_name"], "Queen Alice")


class RoomEventsTestCase(ThreeUsersTestCase):
    async def test_event_and_context(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room}", {})
        ids = [await self.alice.send(room, f"m{i}") for i in range(7)]
        event = await self.bob.ok("GET", f"/rooms/{room}/event/{q(ids[3])}")
        assert_spec_response(
            self, "rooms.yaml", "/rooms/{roomId}/event/{eventId}", "GET", 200, event
        )
        self.assertEqual((event["event_id"], event["content"]["body"]), (ids[3], "m3"))
        context = await self.bob.ok("GET", f"/rooms/{room}/context/{q(ids[3])}?limit=4")
        assert_spec_response(
            self, "event_context.yaml", "/rooms/{roomId}/context/{eventId}", "GET", 200, context
        )
        self.assertEqual(context["event"]["event_id"], ids[3])
        before = [e["content"].get("body") for e in context["events_before"]]
        after = [e["content"].get("body") for e in context["events_after"]]
        self.assertEqual((before, after), (["m2", "m1"], ["m4", "m5"]))
        self.assertIn("m.room.create", {e["type"] for e in context["state"]})
        # The tokens page on from the edges of the context.
        page = await self.bob.ok(
            "GET", f"/rooms/{room}/messages?dir=b&limit=1&from={context['start']}"
        )
        self.assertEqual(page["chunk"][0]["content"]["body"], "m0")
        page = await self.bob.ok(
            "GET", f"/rooms/{room}/messages?dir=f&limit=1&from={context['end']}"
        )
        self.assertEqual(page["chunk"][0]["content"]["body"], "m6")
        only_members = q('{"types": ["m.room.member"]}')
        filtered = await self.bob.ok(
            "GET", f"/rooms/{room}/context/{q(ids[0])}?limit=20&filter={only_members}"
        )
        self.assertEqual(filtered["events_after"], [])
        self.assertTrue(filtered["events_before"])
        self.assertEqual({e["type"] for e in filtered["events_before"]}, {"m.room.member"})

    async def test_history_visibility_and_bad_input(self) -> None:
        room = await self.alice.create_room(preset="private_chat")
        await self.alice.ok(
            "PUT",
            f"/rooms/{room}/state/m.room.history_visibility",
            {"history_visibility": "joined"},
        )
        early = await self.alice.send(room, "before bob")
        await self.alice.ok("POST", f"/rooms/{room}/invite", {"user_id": self.bob.user_id})
        await self.bob.ok("POST", f"/join/{room}", {})
        later = await self.alice.send(room, "with bob")
        await self.bob.ok("GET", f"/rooms/{room}/event/{q(later)}")
        for path in (f"/rooms/{room}/event/{q(early)}", f"/rooms/{room}/context/{q(early)}"):
            code, body = await self.bob.request("GET", path)
            self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"), path)
        context = await self.bob.ok("GET", f"/rooms/{room}/context/{q(later)}")
        self.assertNotIn("before bob", [e["content"].get("body") for e in context["events_before"]])
        # Eve was never in the room; an unknown room answers the same (the
        # spec's 404 for an event one may not read).
        for path in (
            f"/rooms/{room}/event/{q(later)}",
            f"/rooms/!nope:test.local/event/{q(later)}",
        ):
            code, body = await self.eve.request("GET", path)
            self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"), path)
        code, body = await self.eve.request("GET", f"/rooms/{room}/context/{q(later)}")
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        other = await self.alice.create_room()
        elsewhere = await self.alice.send(other, "other room")
        code, body = await self.bob.request("GET", f"/rooms/{room}/event/{q(elsewhere)}")
        self.assertEqual(code, 404)
        for query in ("limit=x", "limit=-1", "filter=notjson", "filter=%5B%5D"):
            code, body = await self.bob.request("GET", f"/rooms/{room}/context/{q(later)}?{query}")
            self.assertEqual(code, 400, query)
        code, _ = await self.bob.request("GET", f"/rooms/not-a-room/event/{q(later)}")
        self.assertEqual(code, 400)

    async def test_forget(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room}", {})
        code, body = await self.bob.request("POST", f"/rooms/{room}/forget", {})
        self.assertEqual(code, 400)
        code, body = await self.eve.request("POST", f"/rooms/{room}/forget", {})
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))
        await self.bob.ok("POST", f"/rooms/{room}/leave", {})
        self.assertEqual(await self.bob.ok("POST", f"/rooms/{room}/forget", {}), {})
        store, bob = self.servers["main"].store, self.bob.user_id
        assert bob is not None
        self.assertEqual(await store.get_forgotten_rooms(bob), {room})
        await self.bob.ok("POST", f"/join/{room}", {})
        self.assertEqual(await store.get_forgotten_rooms(bob), set())


class DirectoryTestCase(ThreeUsersTestCase):
    async def test_aliases(self) -> None:
        room = await self.alice.create_room(preset="public_chat", room_alias_name="lobby")
        alias = "#lobby:test.local"
        found = await self.bob.ok("GET", f"/directory/room/{q(alias)}")
        assert_spec_response(
            self, "directory.yaml", "/directory/room/{roomAlias}", "GET", 200, found
        )
        self.assertEqual(found, {"room_id": room, "servers": ["test.local"]})
        state = await self.alice.ok("GET", f"/rooms/{room}/state/m.room.canonical_alias")
        self.assertEqual(state, {"alias": alias})
        code, body = await self.bob.request("POST", "/createRoom", {"room_alias_name": "lobby"})
        self.assertEqual((code, body["errcode"]), (400, "M_ROOM_IN_USE"))

        second = "#hall:test.local"
        code, body = await self.bob.request(
            "PUT", f"/directory/room/{q(second)}", {"room_id": room}
        )
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))  # not in the room
        await self.bob.ok("POST", f"/join/{room}", {})
        await self.bob.ok("PUT", f"/directory/room/{q(second)}", {"room_id": room})
        code, body = await self.alice.request(
            "PUT", f"/directory/room/{q(second)}", {"room_id": room}
        )
        self.assertEqual(code, 409)
        aliases = await self.bob.ok("GET", f"/rooms/{room}/aliases")
        assert_spec_response(self, "directory.yaml", "/rooms/{roomId}/aliases", "GET", 200, aliases)
        self.assertEqual(aliases, {"aliases": [second, alias]})
        code, body = await self.eve.request("GET", f"/rooms/{room}/aliases")
        self.assertEqual(code, 403)
        # Bob made #hall, so he may delete it; #lobby needs power he lacks.
        code, body = await self.bob.request("DELETE", f"/directory/room/{q(alias)}")
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        await self.bob.ok("DELETE", f"/directory/room/{q(second)}")
        code, body = await self.bob.request("GET", f"/directory/room/{q(second)}")
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))

        # m.room.canonical_alias may only name aliases of this room.
        other = await self.alice.create_room(room_alias_name="elsewhere")
        for content in (
            {"alias": "#elsewhere:test.local"},
            {"alias": "#missing:test.local"},
            {"alias": alias, "alt_aliases": ["#elsewhere:test.local"]},
            {"alias": "no-hash"},
        ):
            code, body = await self.alice.request(
                "PUT", f"/rooms/{room}/state/m.room.canonical_alias", content
            )
            self.assertEqual(code, 400, content)
        await self.alice.ok("PUT", f"/rooms/{room}/state/m.room.canonical_alias", {"alias": alias})
        del other
        # Deleting the alias takes it out of the canonical alias.
        await self.alice.ok("DELETE", f"/directory/room/{q(alias)}")
        state = await self.alice.ok("GET", f"/rooms/{room}/state/m.room.canonical_alias")
        self.assertEqual(state, {})

    async def test_alias_bad_input_and_squatting(self) -> None:
        room = await self.alice.create_room()
        for bad in ("#squat:other.example", "lobby", "#:test.local", "#a b:test.local"):
            code, body = await self.alice.request(
                "PUT", f"/directory/room/{q(bad)}", {"room_id": room}
            )
            self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"), bad)
        for body_ in ({}, {"room_id": 5}, {"room_id": "nope"}):
            code, _ = await self.alice.request(
                "PUT", f"/directory/room/{q('#ok:test.local')}", body_
            )
            self.assertEqual(code, 400, body_)
        code, body = await self.alice.request(
            "PUT", f"/directory/room/{q('#ok:test.local')}", {"room_id": "!nope:test.local"}
        )
        self.assertEqual(code, 404)
        code, body = await self.alice.request("POST", "/createRoom", {"room_alias_name": "a:b"})
        self.assertEqual(code, 400)
        self.assertEqual(await self.servers["main"].store.get_aliases_for_room(room), [])

    async def test_public_rooms_and_listing(self) -> None:
        listed = await self.alice.create_room(visibility="public", name="Gardening", topic="Roses")
        unlisted = await self.alice.create_room(preset="public_chat", name="Hidden")
        vis = await self.bob.ok("GET", f"/directory/list/room/{listed}")
        assert_spec_response(
            self, "list_public_rooms.yaml", "/directory/list/room/{roomId}", "GET", 200, vis
        )
        self.assertEqual(vis, {"visibility": "public"})
        self.assertEqual(
            await self.alice.ok("GET", f"/directory/list/room/{unlisted}"),
            {"visibility": "private"},
        )
        # An unlisted room is not disclosed to those who cannot read it.
        code, _ = await self.bob.request("GET", f"/directory/list/room/{unlisted}")
        self.assertEqual(code, 404)
        code, body = await self.bob.request(
            "PUT", f"/directory/list/room/{unlisted}", {"visibility": "public"}
        )
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        code, body = await self.alice.request(
            "PUT", f"/directory/list/room/{unlisted}", {"visibility": "everyone"}
        )
        self.assertEqual(code, 400)
        await self.alice.ok("PUT", f"/directory/list/room/{unlisted}", {"visibility": "public"})
        page = await self.bob.ok("GET", "/publicRooms?limit=1")
        assert_spec_response(self, "list_public_rooms.yaml", "/publicRooms", "GET", 200, page)
        self.assertEqual(page["total_room_count_estimate"], 2)
        self.assertEqual([r["room_id"] for r in page["chunk"]], [listed])
        self.assertEqual(page["chunk"][0]["name"], "Gardening")
        self.assertEqual(page["chunk"][0]["num_joined_members"], 1)
        nxt = await self.bob.ok("GET", f"/publicRooms?limit=1&since={page['next_batch']}")
        self.assertEqual([r["room_id"] for r in nxt["chunk"]], [unlisted])
        self.assertNotIn("next_batch", nxt)
        searched = await self.bob.ok(
            "POST", "/publicRooms", {"filter": {"generic_search_term": "roses"}}
        )
        assert_spec_response(self, "list_public_rooms.yaml", "/publicRooms", "POST", 200, searched)
        self.assertEqual([r["room_id"] for r in searched["chunk"]], [listed])
        for bad in (
            "/publicRooms?since=zzz",
            "/publicRooms?limit=x",
            # Not a server name (another server's list is asked of it:
            # tests/federation/test_public_rooms.py).
            "/publicRooms?server=bad%20name",
            "/publicRooms?server=",
        ):
            code, _ = await self.bob.request("GET", bad)
            self.assertEqual(code, 400, bad)
        code, _ = await self.bob.request("POST", "/publicRooms", {"filter": "roses"})
        self.assertEqual(code, 400)
        code, _ = await self.bob.request("GET", "/directory/list/room/!nope:test.local")
        self.assertEqual(code, 404)

    async def test_user_directory(self) -> None:
        await self.alice.ok(
            "PUT", f"/profile/{q(self.alice.user_id)}/displayname", {"displayname": "Wonderland"}
        )
        room = await self.alice.create_room(preset="private_chat")
        await self.alice.ok("POST", f"/rooms/{room}/invite", {"user_id": self.bob.user_id})
        await self.bob.ok("POST", f"/join/{room}", {})
        found = await self.bob.ok("POST", "/user_directory/search", {"search_term": "wonder"})
        assert_spec_response(self, "users.yaml", "/user_directory/search", "POST", 200, found)
        self.assertEqual(
            found,
            {
                "results": [{"user_id": self.alice.user_id, "display_name": "Wonderland"}],
                "limited": False,
            },
        )
        # Nobody finds themselves through a private room.
        alone = await self.bob.ok("POST", "/user_directory/search", {"search_term": "bob"})
        self.assertEqual(alone["results"], [])
        # Eve shares no room with Alice, who is in no public room.
        nothing = await self.eve.ok("POST", "/user_directory/search", {"search_term": "alice"})
        self.assertEqual(nothing["results"], [])
        public = await self.eve.create_room(preset="public_chat")
        await self.alice.ok("POST", f"/join/{public}", {})
        limited = await self.bob.ok(
            "POST", "/user_directory/search", {"search_term": "test.local", "limit": 1}
        )
        # A world-readable room counts as public too.
        await self.alice.ok(
            "PUT",
            f"/rooms/{room}/state/m.room.history_visibility",
            {"history_visibility": "world_readable"},
        )
        readable = await self.eve.ok("POST", "/user_directory/search", {"search_term": "bob"})
        self.assertEqual([r["user_id"] for r in readable["results"]], [self.bob.user_id])
        self.assertEqual((len(limited["results"]), limited["limited"]), (1, True))
        for bad in ({}, {"search_term": 5}, {"search_term": "a", "limit": "x"}):
            code, _ = await self.bob.request("POST", "/user_directory/search", bad)
            self.assertEqual(code, 400, bad)


class RedactionTestCase(ThreeUsersTestCase):
    async def test_redaction_everywhere_it_is_served(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room}", {})
        target = await self.bob.send(room, "oops")
        since = (await self.alice.sync())["next_batch"]
        # Bob lacks the power to redact Alice's event; his own he may.
        mine = await self.alice.send(room, "alice's")
        code, body = await self.bob.request("PUT", f"/rooms/{room}/redact/{q(mine)}/r0", {})
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        answer = await self.bob.ok(
            "PUT", f"/rooms/{room}/redact/{q(target)}/r1", {"reason": "typo"}
        )
        assert_spec_response(
            self, "redaction.yaml", "/rooms/{roomId}/redact/{eventId}/{txnId}", "PUT", 200, answer
        )
        again = await self.bob.ok("PUT", f"/rooms/{room}/redact/{q(target)}/r1", {"reason": "typo"})
        self.assertEqual(again, answer)  # idempotent per transaction id
        event = await self.alice.ok("GET", f"/rooms/{room}/event/{q(target)}")
        assert_spec_response(
            self, "rooms.yaml", "/rooms/{roomId}/event/{eventId}", "GET", 200, event
        )
        self.assertEqual(event["content"], {})
        because = event["unsigned"]["redacted_because"]
        self.assertEqual(
            (because["event_id"], because["redacts"], because["content"]),
            (answer["event_id"], target, {"reason": "typo", "redacts": target}),
        )
        page = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=b&limit=10")
        [shown] = [e for e in page["chunk"] if e["event_id"] == target]
        self.assertEqual(shown["content"], {})
        self.assertIn("redacted_because", shown["unsigned"])
        full = await self.alice.sync()
        [synced] = [
            e for e in full["rooms"]["join"][room]["timeline"]["events"] if e["event_id"] == target
        ]
        self.assertEqual(synced["content"], {})
        later = await self.alice.sync(since=since)
        types = [e["type"] for e in later["rooms"]["join"][room]["timeline"]["events"]]
        self.assertIn("m.room.redaction", types)
        # Alice (power 100) may redact Bob's events; a member event keeps its membership.
        bob_join = await self.alice.ok("GET", f"/rooms/{room}/state")
        [join] = [e for e in bob_join if e.get("state_key") == self.bob.user_id]
        await self.alice.ok("PUT", f"/rooms/{room}/redact/{q(join['event_id'])}/r2", {})
        redacted_join = await self.alice.ok("GET", f"/rooms/{room}/event/{q(join['event_id'])}")
        self.assertEqual(redacted_join["content"], {"membership": "join"})

    async def test_a_txn_id_is_scoped_to_its_endpoint(self) -> None:
        """The same txnId on /send and on /redact: two requests (the spec
        scopes a transaction id to its endpoint); each event carries the id
        its client sent in ``unsigned.transaction_id``."""
        room = await self.alice.create_room()
        message = await self.alice.send(room, "hello", txn_id="t1")
        redaction = (await self.alice.ok("PUT", f"/rooms/{room}/redact/{q(message)}/t1", {}))[
            "event_id"
        ]
        self.assertNotEqual(redaction, message)
        again = await self.alice.ok("PUT", f"/rooms/{room}/redact/{q(message)}/t1", {})
        self.assertEqual(again["event_id"], redaction)
        resent = await self.alice.send(room, "hello", txn_id="t1")
        self.assertEqual(resent, message)
        timeline = (await self.alice.sync())["rooms"]["join"][room]["timeline"]["events"]
        by_id = {e["event_id"]: e for e in timeline}
        self.assertEqual(by_id[redaction]["unsigned"].get("transaction_id"), "t1")
        self.assertEqual(by_id[message]["unsigned"].get("transaction_id"), "t1")
        self.assertEqual(by_id[message]["content"], {})

    async def test_bad_redactions(self) -> None:
        room = await self.alice.create_room()
        other = await self.alice.create_room()
        elsewhere = await self.alice.send(other, "x")
        code, body = await self.alice.request("PUT", f"/rooms/{room}/redact/{q('$nope')}/t1", {})
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))
        code, body = await self.alice.request("PUT", f"/rooms/{room}/redact/{q(elsewhere)}/t2", {})
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"))
        mine = await self.alice.send(room, "keep")
        code, body = await self.eve.request("PUT", f"/rooms/{room}/redact/{q(mine)}/t", {})
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        code, body = await self.alice.request(
            "PUT", f"/rooms/{room}/redact/{q(mine)}/t9", {"reason": 5}
        )
        self.assertEqual(code, 400)
        code, body = await self.alice.request(
            "PUT", f"/rooms/{room}/send/m.room.redaction/t3", {"redacts": mine}
        )
        self.assertEqual(code, 400)
        kept = await self.alice.ok("GET", f"/rooms/{room}/event/{q(mine)}")
        self.assertEqual(kept["content"]["body"], "keep")

    async def test_r0_redact_without_a_transaction_id(self) -> None:
        # r0's POST form (SyTest's 32room-versions uses it): no txnId, so
        # each POST is a new redaction; the same checks as the PUT form.
        room = await self.alice.create_room()
        mine = await self.alice.send(room, "gone")
        first = await self.alice.ok("POST", f"/rooms/{room}/redact/{q(mine)}", {"reason": "r"})
        second = await self.alice.ok("POST", f"/rooms/{room}/redact/{q(mine)}", {})
        self.assertNotEqual(first["event_id"], second["event_id"])
        redaction = await self.alice.ok("GET", f"/rooms/{room}/event/{q(first['event_id'])}")
        self.assertEqual((redaction["redacts"], redaction["content"]["reason"]), (mine, "r"))
        self.assertEqual(
            (await self.alice.ok("GET", f"/rooms/{room}/event/{q(mine)}"))["content"], {}
        )
        code, body = await self.eve.request("POST", f"/rooms/{room}/redact/{q(mine)}", {})
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))


class RedactionAcrossProcessesTestCase(DatabaseTestCase):
    async def test_cached_event_is_redacted_on_every_process(self) -> None:
        _, clients, _ = start_cluster(
            self, self.test_db, workers=["writer1"], stream_writers={"events": ["writer1"]}
        )
        alice = await clients["main"].register("alice")
        room = await alice.create_room()
        target = await alice.send(room, "secret")
        # Read (and so cached) on the main process first.
        first = await alice.ok("GET", f"/rooms/{room}/event/{q(target)}")
        self.assertEqual(first["content"]["body"], "secret")
        on_writer = clients["writer1"].as_user(alice.token)
        await on_writer.ok("PUT", f"/rooms/{room}/redact/{q(target)}/r", {})

        async def redacted_on_main() -> bool:
            event = await alice.ok("GET", f"/rooms/{room}/event/{q(target)}")
            return event["content"] == {}

        await eventually(redacted_on_main)


class RelationsTestCase(ThreeUsersTestCase):
    async def send_content(self, client: Any, room: str, content: dict[str, Any]) -> str:
        answer = await client.ok(
            "PUT", f"/rooms/{room}/send/m.room.message/{uuid.uuid4().hex}", content
        )
        return str(answer["event_id"])

    async def test_threads_edits_references(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room}", {})
        root = await self.alice.send(room, "root")
        replies = []
        for i, client in enumerate([self.bob, self.alice, self.bob]):
            replies.append(
                await self.send_content(
                    client,
                    room,
                    {
                        "msgtype": "m.text",
                        "body": f"reply {i}",
                        "m.relates_to": {"rel_type": "m.thread", "event_id": root},
                    },
                )
            )
        edit = await self.send_content(
            self.alice,
            room,
            {
                "msgtype": "m.text",
                "body": "* root!",
                "m.new_content": {"msgtype": "m.text", "body": "root!"},
                "m.relates_to": {"rel_type": "m.replace", "event_id": root},
            },
        )
        # Bob's "edit" of Alice's event is not an edit.
        await self.send_content(
            self.bob,
            room,
            {"body": "* hijack", "m.relates_to": {"rel_type": "m.replace", "event_id": root}},
        )
        ref = await self.send_content(
            self.bob,
            room,
            {"body": "see", "m.relates_to": {"rel_type": "m.reference", "event_id": root}},
        )

        base = f"/_matrix/client/v1/rooms/{room}/relations/{q(root)}"
        everything = await self.bob.ok("GET", base)
        assert_spec_response(
            self, "relations.yaml", "/rooms/{roomId}/relations/{eventId}", "GET", 200, everything
        )
        self.assertEqual(len(everything["chunk"]), 6)
        threaded = await self.bob.ok("GET", f"{base}/m.thread?dir=f")
        self.assertEqual([e["event_id"] for e in threaded["chunk"]], replies)
        typed = await self.bob.ok("GET", f"{base}/m.thread/m.room.message?limit=2")
        self.assertEqual([e["event_id"] for e in typed["chunk"]], replies[::-1][:2])
        rest = await self.bob.ok(
            "GET", f"{base}/m.thread/m.room.message?from={typed['next_batch']}"
        )
        self.assertEqual([e["event_id"] for e in rest["chunk"]], [replies[0]])
        self.assertNotIn("next_batch", rest)

        event = await self.bob.ok("GET", f"/rooms/{room}/event/{q(root)}")
        bundle = event["unsigned"]["m.relations"]
        self.assertEqual(bundle["m.thread"]["count"], 3)
        self.assertEqual(bundle["m.thread"]["latest_event"]["event_id"], replies[-1])
        self.assertTrue(bundle["m.thread"]["current_user_participated"])
        self.assertEqual(bundle["m.replace"]["event_id"], edit)
        self.assertEqual(bundle["m.reference"], {"chunk": [{"event_id": ref}]})
        eve_view = await self.eve.ok("POST", f"/join/{room}", {})
        del eve_view
        page = await self.eve.ok("GET", f"/rooms/{room}/messages?dir=b&limit=20")
        [root_seen] = [e for e in page["chunk"] if e["event_id"] == root]
        self.assertFalse(
            root_seen["unsigned"]["m.relations"]["m.thread"]["current_user_participated"]
        )

        synced = await self.bob.sync()
        [root_synced] = [
            e for e in synced["rooms"]["join"][room]["timeline"]["events"] if e["event_id"] == root
        ]
        self.assertEqual(root_synced["unsigned"]["m.relations"]["m.thread"]["count"], 3)
        self.assertEqual(root_synced["unsigned"]["m.relations"]["m.replace"]["event_id"], edit)
        threads = await self.bob.ok("GET", f"/_matrix/client/v1/rooms/{room}/threads")
        assert_spec_response(
            self, "threads_list.yaml", "/rooms/{roomId}/threads", "GET", 200, threads
        )
        self.assertEqual([e["event_id"] for e in threads["chunk"]], [root])
        self.assertEqual(threads["chunk"][0]["unsigned"]["m.relations"]["m.thread"]["count"], 3)
        mine = await self.eve.ok(
            "GET", f"/_matrix/client/v1/rooms/{room}/threads?include=participated"
        )
        self.assertEqual(mine["chunk"], [])

        # A redacted reply leaves the thread and the relations.
        await self.bob.ok("PUT", f"/rooms/{room}/redact/{q(replies[-1])}/rr", {})
        event = await self.bob.ok("GET", f"/rooms/{room}/event/{q(root)}")
        self.assertEqual(event["unsigned"]["m.relations"]["m.thread"]["count"], 2)
        threaded = await self.bob.ok("GET", f"{base}/m.thread")
        self.assertEqual([e["event_id"] for e in threaded["chunk"]], replies[:2][::-1])
        # Relations of the redacted event itself: none, and it is served redacted.
        redacted = await self.bob.ok("GET", f"/rooms/{room}/event/{q(replies[-1])}")
        self.assertEqual(redacted["content"], {})

    async def test_recurse_visibility_and_bad_input(self) -> None:
        room = await self.alice.create_room(preset="private_chat")
        root = await self.alice.send(room, "root")
        reply = await self.send_content(
            self.alice,
            room,
            {"body": "r", "m.relates_to": {"rel_type": "m.thread", "event_id": root}},
        )
        await self.send_content(
            self.alice,
            room,
            {"body": "* r", "m.relates_to": {"rel_type": "m.replace", "event_id": reply}},
        )
        base = f"/_matrix/client/v1/rooms/{room}/relations/{q(root)}"
        flat = await self.alice.ok("GET", base)
        self.assertEqual(len(flat["chunk"]), 1)
        deep = await self.alice.ok("GET", base + "?recurse=true")
        self.assertEqual(len(deep["chunk"]), 2)
        self.assertEqual(deep["recursion_depth"], 3)
        code, body = await self.eve.request("GET", base)
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))
        code, body = await self.eve.request("GET", f"/_matrix/client/v1/rooms/{room}/threads")
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        code, body = await self.alice.request(
            "GET", f"/_matrix/client/v1/rooms/{room}/relations/{q('$nope')}"
        )
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))
        for query in ("dir=x", "limit=no", "recurse=maybe", "from=zzz"):
            code, _ = await self.alice.request("GET", f"{base}?{query}")
            self.assertEqual(code, 400, query)
        for query in ("include=mine", "from=x1", "limit=-2"):
            code, _ = await self.alice.request(
                "GET", f"/_matrix/client/v1/rooms/{room}/threads?{query}"
            )
            self.assertEqual(code, 400, query)


#: A /sync filter asking for lazy-loaded members (and so the room summary).
LAZY_LOADING = urllib.parse.quote(json.dumps({"room": {"state": {"lazy_load_members": True}}}))


class SyncSummaryTestCase(ThreeUsersTestCase):
    """The room summary, sent with lazy-loading members (handlers/sync_sections/rooms.py)."""

    async def test_summary_counts_and_heroes(self) -> None:
        room = await self.alice.create_room(preset="private_chat", invite=[self.eve.user_id])
        await self.alice.ok("POST", f"/rooms/{room}/invite", {"user_id": self.bob.user_id})
        await self.bob.ok("POST", f"/join/{room}", {})
        initial = await self.alice.sync(filter=LAZY_LOADING)
        summary = initial["rooms"]["join"][room]["summary"]
        self.assertEqual(
            summary,
            {
                "m.heroes": sorted([self.bob.user_id, self.eve.user_id]),
                "m.joined_member_count": 2,
                "m.invited_member_count": 1,
            },
        )
        await self.alice.send(room, "no membership change")
        quiet = await self.alice.sync(filter=LAZY_LOADING, since=initial["next_batch"])
        self.assertEqual(quiet["rooms"]["join"][room]["summary"], {})
        await self.eve.ok("POST", f"/join/{room}", {})
        changed = await self.alice.sync(filter=LAZY_LOADING, since=quiet["next_batch"])
        self.assertEqual(changed["rooms"]["join"][room]["summary"]["m.joined_member_count"], 3)
        self.assertEqual(changed["rooms"]["join"][room]["summary"]["m.invited_member_count"], 0)
        await self.alice.ok("PUT", f"/rooms/{room}/state/m.room.name", {"name": "Named"})
        await self.bob.ok("POST", f"/rooms/{room}/leave", {})
        named = await self.alice.sync(filter=LAZY_LOADING, since=changed["next_batch"])
        self.assertEqual(
            named["rooms"]["join"][room]["summary"],
            {"m.joined_member_count": 2, "m.invited_member_count": 0},
        )
        assert_spec_response(self, "sync.yaml", "/sync", "GET", 200, changed)
