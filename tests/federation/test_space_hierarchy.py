"""Spaces across servers (docs/federation.md, "Spaces"): the client API's
``GET /_matrix/client/v1/rooms/{roomId}/hierarchy`` walks a space whose
children live on two servers, asking ``GET /_matrix/federation/v1/hierarchy``
of the server in a child's ``via`` for the rooms it is not in; that endpoint
as served. Two servers of ours on loopback: ``a.test`` (main) and ``b.test``
(main and ``fed1``, which serves federation).

The space ``S`` (on b.test, public) has, in order: ``R1`` (a public space
on b.test, itself with the public child ``R4``), ``R3`` (invite-only, on
b.test) and ``R2`` (public, on a.test, suggested)."""

from __future__ import annotations

import urllib.parse
from typing import Any

from tests.harness.client_api import ClientApi
from tests.harness.federation import TwoServers
from tests.harness.spec import assert_spec_response

CLIENT_SPEC = ("space_hierarchy.yaml", "/rooms/{roomId}/hierarchy")
FEDERATION_SPEC = ("../server-server/space_hierarchy.yaml", "/hierarchy/{roomId}")


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


class SpaceHierarchyTestCase(TwoServers):
    async def spaces(self) -> tuple[ClientApi, ClientApi, dict[str, str]]:
        alice = await self.client(self.b).register("alice")
        carol = await self.client(self.a).register("carol")
        space = {"creation_content": {"type": "m.space"}}
        rooms = {
            "S": await alice.create_room(preset="public_chat", name="Garden", **space),
            "R1": await alice.create_room(preset="public_chat", name="Roses", **space),
            "R3": await alice.create_room(preset="private_chat", name="Secret"),
            "R4": await alice.create_room(preset="public_chat", name="Thorns"),
            "R2": await carol.create_room(preset="public_chat", name="Tulips"),
        }
        for parent, name, via, extra in (
            ("S", "R1", "b.test", {"order": "a"}),
            ("S", "R3", "b.test", {"order": "b"}),
            ("S", "R2", "a.test", {"order": "c", "suggested": True}),
            ("R1", "R4", "b.test", {}),
        ):
            await alice.ok(
                "PUT",
                f"/rooms/{q(rooms[parent])}/state/m.space.child/{q(rooms[name])}",
                {"via": [via], **extra},
            )
        await carol.ok("POST", f"/join/{q(rooms['S'])}?server_name=b.test", {})
        return alice, carol, rooms

    async def walk(self, user: ClientApi, room_id: str, query: str = "") -> Any:
        page = await user.ok("GET", f"/_matrix/client/v1/rooms/{q(room_id)}/hierarchy{query}")
        assert_spec_response(self, *CLIENT_SPEC, "GET", 200, page)
        return page

    def names(self, rooms: dict[str, str], page: Any) -> list[str]:
        by_id = {v: k for k, v in rooms.items()}
        return [by_id[r["room_id"]] for r in page["rooms"]]

    async def test_walks_across_servers(self) -> None:
        alice, carol, rooms = await self.spaces()
        # carol (a.test): S and R2 are a.test's; R1 and R4 are asked of
        # b.test; R3 is invite-only, and b.test does not describe it to a.test.
        page = await self.walk(carol, rooms["S"])
        self.assertEqual(self.names(rooms, page), ["S", "R1", "R2", "R4"])
        self.assertNotIn("next_batch", page)
        by_name = dict(zip(self.names(rooms, page), page["rooms"], strict=True))
        self.assertEqual(by_name["R1"]["name"], "Roses")
        self.assertEqual(by_name["R1"]["room_type"], "m.space")
        self.assertEqual(by_name["R4"]["name"], "Thorns")
        self.assertEqual(by_name["R4"]["children_state"], [])
        self.assertEqual(
            [c["state_key"] for c in by_name["S"]["children_state"]],
            sorted([rooms["R1"], rooms["R3"], rooms["R2"]]),
        )
        self.assertTrue(all("origin_server_ts" in c for c in by_name["S"]["children_state"]))
        # alice (b.test) is in R3; R2 is asked of a.test.
        page = await self.walk(alice, rooms["S"])
        self.assertEqual(self.names(rooms, page), ["S", "R1", "R3", "R2", "R4"])

        self.assertEqual(
            self.names(rooms, await self.walk(carol, rooms["S"], "?suggested_only=true")),
            ["S", "R2"],
        )
        self.assertEqual(
            self.names(rooms, await self.walk(carol, rooms["S"], "?max_depth=1")),
            ["S", "R1", "R2"],
        )
        self.assertEqual(
            self.names(rooms, await self.walk(carol, rooms["S"], "?max_depth=0")), ["S"]
        )

    async def test_pages(self) -> None:
        _alice, carol, rooms = await self.spaces()
        seen: list[str] = []
        query = "?limit=1&max_depth=3"
        for _ in range(10):
            page = await self.walk(carol, rooms["S"], query)
            self.assertEqual(len(page["rooms"]), 1)
            seen += self.names(rooms, page)
            if "next_batch" not in page:
                break
            query = f"?limit=1&max_depth=3&from={q(page['next_batch'])}"
        self.assertEqual(seen, ["S", "R1", "R2", "R4"])

        first = await self.walk(carol, rooms["S"], "?limit=2")
        token = q(first["next_batch"])
        path = f"/_matrix/client/v1/rooms/{q(rooms['S'])}/hierarchy"
        for query in (
            f"?from={token}&max_depth=2",
            f"?from={token}&suggested_only=true",
            "?from=garbage",
            "?limit=0",
            "?max_depth=-1",
            "?suggested_only=yes",
        ):
            code, answer = await carol.request("GET", path + query)
            self.assertEqual((code, answer["errcode"]), (400, "M_INVALID_PARAM"), query)

    async def test_rooms_the_user_may_not_see(self) -> None:
        _alice, carol, rooms = await self.spaces()
        for room_id in (rooms["R3"], "!nowhere:b.test", "!nowhere:a.test"):
            code, answer = await carol.request(
                "GET", f"/_matrix/client/v1/rooms/{q(room_id)}/hierarchy"
            )
            self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"), room_id)
        code, answer = await carol.request("GET", "/_matrix/client/v1/rooms/not-a-room/hierarchy")
        self.assertEqual(code, 400, answer)
        code, answer = await carol.as_user(None).request(
            "GET", f"/_matrix/client/v1/rooms/{q(rooms['S'])}/hierarchy"
        )
        self.assertEqual(code, 401, answer)

    async def test_served_over_federation(self) -> None:
        _alice, _carol, rooms = await self.spaces()

        async def ask(room_id: str, query: str = "") -> tuple[int, Any]:
            path = f"/_matrix/federation/v1/hierarchy/{q(room_id)}{query}"
            return await self.signed_request(self.a_key, "a.test", "b.test", "GET", path)

        code, answer = await ask(rooms["S"])
        self.assertEqual(code, 200, answer)
        assert_spec_response(self, *FEDERATION_SPEC, "GET", 200, answer)
        self.assertEqual(answer["room"]["room_id"], rooms["S"])
        self.assertEqual(answer["room"]["room_type"], "m.space")
        self.assertEqual(len(answer["room"]["children_state"]), 3)
        # R2 is not b.test's to describe; R3 is invite-only.
        self.assertEqual([c["room_id"] for c in answer["children"]], [rooms["R1"]])
        self.assertEqual(answer["inaccessible_children"], [rooms["R3"]])
        self.assertEqual(answer["children"][0]["room_version"], answer["room"]["room_version"])

        code, answer = await ask(rooms["S"], "?suggested_only=true")
        self.assertEqual((code, answer["children"], answer["inaccessible_children"]), (200, [], []))
        for room_id in (rooms["R3"], "!nowhere:b.test"):
            code, answer = await ask(room_id)
            self.assertEqual((code, answer["errcode"]), (404, "M_NOT_FOUND"), room_id)
        code, answer = await ask(rooms["S"], "?suggested_only=maybe")
        self.assertEqual(code, 400, answer)
