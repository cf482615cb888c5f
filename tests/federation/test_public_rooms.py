"""Public room directories across servers (docs/federation.md, "Queries:
public rooms"): ``b.test`` serves ``GET``/``POST
/_matrix/federation/v1/publicRooms``; ``a.test``'s clients read it with
``/publicRooms?server=b.test``. Two servers of ours on loopback."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.trial import unittest

from synapse_lite.federation.crypto import load_or_create_signing_key
from synapse_lite.federation.queries import (
    FederationQueries,
    RemoteUnavailable,
    check_public_rooms_answer,
)
from synapse_lite.handlers.directory import PublicRoomsQuery
from tests.harness.federation import TwoServers
from tests.harness.spec import assert_spec_response

FED = "/_matrix/federation/v1/publicRooms"


def room(room_id: str = "!r:b.test", **extra: Any) -> dict[str, Any]:
    return {
        "room_id": room_id,
        "num_joined_members": 1,
        "world_readable": False,
        "guest_can_join": False,
        **extra,
    }


class PublicRoomsAnswerTestCase(unittest.TestCase):
    """Another server's answer is checked before our client sees it."""

    def test_malformed_rooms_are_left_out(self) -> None:
        answer = {
            "chunk": [
                room(name="ok", extra_key=1),
                room("not a room id"),
                room(num_joined_members=True),
                room(world_readable="yes"),
                "x",
                room("!s:b.test", topic=5),
            ],
            "next_batch": "n",
            "prev_batch": 3,
            "total_room_count_estimate": -1,
        }
        checked = check_public_rooms_answer("b.test", answer, None)
        self.assertEqual(checked["chunk"], [room(name="ok"), room("!s:b.test")])
        self.assertEqual(checked["next_batch"], "n")
        self.assertNotIn("prev_batch", checked)
        self.assertNotIn("total_room_count_estimate", checked)
        limited = check_public_rooms_answer("b.test", {"chunk": [room()] * 5}, 2)
        self.assertEqual(len(limited["chunk"]), 2)
        bad_answers: list[Any] = [{}, [], {"chunk": {}}]
        for bad in bad_answers:
            with self.assertRaises(RemoteUnavailable):
                check_public_rooms_answer("b.test", bad, None)

    def test_get_for_a_page_post_for_a_search(self) -> None:
        asked: list[tuple[str, str, Any]] = []

        class Client:
            async def get_json(self, destination: str, path: str) -> Any:
                asked.append(("GET", path, None))
                return {"chunk": []}

            async def post_json(self, destination: str, path: str, body: Any) -> Any:
                asked.append(("POST", path, body))
                return {"chunk": []}

        queries = FederationQueries(lambda: Client())  # type: ignore[arg-type, return-value]
        for query in (
            PublicRoomsQuery(limit=5, since="o5", all_networks=True),
            PublicRoomsQuery(search_term="roses", room_types=(None, "m.space"), instance_id="i"),
        ):
            self.successResultOf(defer.ensureDeferred(queries.public_rooms("b.test", query)))
        self.assertEqual(
            asked,
            [
                ("GET", FED + "?limit=5&since=o5&include_all_networks=true", None),
                (
                    "POST",
                    FED,
                    {
                        "filter": {"generic_search_term": "roses", "room_types": [None, "m.space"]},
                        "third_party_instance_id": "i",
                    },
                ),
            ],
        )


class PublicRoomsAcrossServersTestCase(TwoServers):
    async def listed_rooms(self) -> tuple[str, str]:
        alice = await self.client(self.b).register("alice")
        roses = await alice.create_room(
            preset="public_chat", name="Roses", topic="red", visibility="public"
        )
        space = await alice.create_room(
            preset="public_chat",
            name="Garden",
            visibility="public",
            creation_content={"type": "m.space"},
        )
        await alice.create_room(preset="public_chat", name="Unlisted")
        return roses, space

    async def test_a_client_reads_another_servers_directory(self) -> None:
        roses, space = await self.listed_rooms()
        carol = await self.client(self.a).register("carol")
        page = await carol.ok("GET", "/publicRooms?server=b.test")
        assert_spec_response(self, "list_public_rooms.yaml", "/publicRooms", "GET", 200, page)
        self.assertEqual({r["room_id"] for r in page["chunk"]}, {roses, space})
        by_id = {r["room_id"]: r for r in page["chunk"]}
        self.assertEqual(by_id[roses]["name"], "Roses")
        self.assertEqual(by_id[space]["room_type"], "m.space")

        first = await carol.ok("GET", "/publicRooms?server=b.test&limit=1")
        self.assertEqual(len(first["chunk"]), 1)
        second = await carol.ok(
            "GET", f"/publicRooms?server=b.test&limit=1&since={first['next_batch']}"
        )
        self.assertEqual(
            {first["chunk"][0]["room_id"], second["chunk"][0]["room_id"]}, {roses, space}
        )

        found = await carol.ok(
            "POST", "/publicRooms?server=b.test", {"filter": {"generic_search_term": "ROSES"}}
        )
        assert_spec_response(self, "list_public_rooms.yaml", "/publicRooms", "POST", 200, found)
        self.assertEqual([r["room_id"] for r in found["chunk"]], [roses])
        spaces = await carol.ok(
            "POST", "/publicRooms?server=b.test", {"filter": {"room_types": ["m.space"]}}
        )
        self.assertEqual([r["room_id"] for r in spaces["chunk"]], [space])
        plain = await carol.ok(
            "POST", "/publicRooms?server=b.test", {"filter": {"room_types": [None]}}
        )
        self.assertEqual([r["room_id"] for r in plain["chunk"]], [roses])

    async def test_bad_requests(self) -> None:
        await self.listed_rooms()
        carol = await self.client(self.a).register("carol")
        # Another server's list needs an access token (we would ask for it).
        code, answer = await carol.as_user(None).request("GET", "/publicRooms?server=b.test")
        self.assertEqual(code, 401, answer)
        # b.test refuses a bad token: carol gets its 400.
        code, answer = await carol.request("GET", "/publicRooms?server=b.test&since=zzz")
        self.assertEqual((code, answer["errcode"]), (400, "M_INVALID_PARAM"), answer)
        self.assertIn("b.test", answer["error"])
        for body in (
            {"filter": {"room_types": "m.space"}},
            {"filter": {"room_types": [5]}},
            {"limit": "ten"},
            {"include_all_networks": True, "third_party_instance_id": "x|y"},
        ):
            code, answer = await carol.request("POST", "/publicRooms?server=b.test", body)
            self.assertEqual(code, 400, (body, answer))
        # A server that cannot be reached.
        code, answer = await carol.request("GET", "/publicRooms?server=nowhere.invalid")
        self.assertEqual(code, 404, answer)

    async def test_served_over_federation(self) -> None:
        roses, space = await self.listed_rooms()

        async def ask(method: str, path: str, body: Any = None) -> tuple[int, Any]:
            return await self.signed_request(self.a_key, "a.test", "b.test", method, path, body)

        code, page = await ask("GET", FED + "?limit=1&include_all_networks=false")
        self.assertEqual(code, 200, page)
        assert_spec_response(
            self, "../server-server/public_rooms.yaml", "/publicRooms", "GET", 200, page
        )
        self.assertEqual(len(page["chunk"]), 1)
        self.assertEqual(page["total_room_count_estimate"], 2)
        code, found = await ask("POST", FED, {"filter": {"generic_search_term": "garden"}})
        self.assertEqual(code, 200, found)
        assert_spec_response(
            self, "../server-server/public_rooms.yaml", "/publicRooms", "POST", 200, found
        )
        self.assertEqual([r["room_id"] for r in found["chunk"]], [space])
        code, everything = await ask("POST", FED, {})
        self.assertEqual({r["room_id"] for r in everything["chunk"]}, {roses, space})

        for method, path, body in (
            ("GET", FED + "?since=zzz", None),
            ("GET", FED + "?limit=-1", None),
            ("GET", FED + "?include_all_networks=maybe", None),
            ("GET", FED + "?include_all_networks=true&third_party_instance_id=x%7Cy", None),
            ("GET", FED + "?third_party_instance_id=nobar", None),
            ("POST", FED, {"filter": "garden"}),
            ("POST", FED, {"since": 5}),
            ("POST", FED, {"filter": {"room_types": ["m.space"] * 51}}),
        ):
            code, answer = await ask(method, path, body)
            self.assertEqual(code, 400, (path, body, answer))
        # Unsigned: refused.
        code, answer = await self.signed_request(
            load_or_create_signing_key(self.b["main"].config.data_dir, create=False),
            "a.test",
            "b.test",
            "GET",
            FED,
        )
        self.assertEqual(code, 401, answer)
