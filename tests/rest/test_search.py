"""Server-side search (``POST /search``): what is found (words, stems,
prefixes, keys), only what the searcher may see (rooms left, history
visibility, redactions, ignored users), ordering and pages, counts and
highlights, filters, context with profiles, groups, state, bad input; and the
index written by two events writers read on a reader. Both engines (the
engine-specific index: FTS5 on SQLite, tsvector on PostgreSQL)."""

from __future__ import annotations

from typing import Any

from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase
from tests.harness.spec import assert_spec_response


def room_events(term: str, **criteria: Any) -> dict[str, Any]:
    return {"search_categories": {"room_events": {"search_term": term, **criteria}}}


async def search(
    client: ClientApi, term: str, next_batch: str | None = None, **criteria: Any
) -> dict[str, Any]:
    path = "/search" + (f"?next_batch={next_batch}" if next_batch else "")
    answer = await client.ok("POST", path, room_events(term, **criteria))
    return answer["search_categories"]["room_events"]


def bodies(found: dict[str, Any]) -> list[str]:
    return [r["result"]["content"].get("body") for r in found["results"]]


class SearchTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        _, clients, _ = start_cluster(self, self.test_db)
        base = clients["main"].base_url
        self.alice = await ClientApi(self, base).register("alice")
        self.bob = await ClientApi(self, base).register("bob")
        self.eve = await ClientApi(self, base).register("eve")
        self.room = await self.alice.create_room(preset="public_chat", name="Gardening club")
        await self.bob.ok("POST", f"/join/{self.room}")

    async def test_words_stems_prefixes_rank_and_spec_shape(self) -> None:
        await self.alice.send(self.room, "The tomatoes are growing well")
        await self.bob.send(self.room, "Growing tomatoes needs sun; tomatoes love it")
        await self.alice.send(self.room, "nothing to see here")
        answer = await self.alice.ok("POST", "/search", room_events("tomato grow"))
        assert_spec_response(self, "search.yaml", "/search", "POST", 200, answer)
        found = answer["search_categories"]["room_events"]
        # Both words needed; stems and prefixes match ("tomato" finds "tomatoes").
        self.assertEqual(found["count"], 2)
        self.assertEqual(
            sorted(bodies(found)),
            ["Growing tomatoes needs sun; tomatoes love it", "The tomatoes are growing well"],
        )
        ranks = [r["rank"] for r in found["results"]]
        self.assertEqual(ranks, sorted(ranks, reverse=True))  # best first
        self.assertEqual(found["results"][0]["result"]["room_id"], self.room)
        # The words as they matched in the results.
        self.assertIn("tomatoes", [w.lower() for w in found["highlights"]])
        self.assertIn("growing", [w.lower() for w in found["highlights"]])
        self.assertNotIn("next_batch", found)
        # Nothing found: an empty answer, not an error.
        empty = await search(self.alice, "zzzqqq")
        self.assertEqual((empty["count"], empty["results"], empty["highlights"]), (0, [], []))
        self.assertEqual((await search(self.alice, "  ...  "))["results"], [])

    async def test_keys_name_and_topic(self) -> None:
        await self.alice.ok("PUT", f"/rooms/{self.room}/state/m.room.topic", {"topic": "Compost"})
        await self.alice.send(self.room, "compost heaps")
        everything = await search(self.alice, "compost")
        self.assertEqual(everything["count"], 2)
        only_topic = await search(self.alice, "compost", keys=["content.topic"])
        self.assertEqual([r["result"]["type"] for r in only_topic["results"]], ["m.room.topic"])
        named = await search(self.alice, "gardening", keys=["content.name"])
        self.assertEqual([r["result"]["type"] for r in named["results"]], ["m.room.name"])

    async def test_only_what_the_searcher_may_see(self) -> None:
        await self.alice.send(self.room, "secret before eve")
        # Eve was never in the room: nothing.
        self.assertEqual((await search(self.eve, "secret"))["count"], 0)
        await self.eve.ok("POST", f"/join/{self.room}")
        await self.alice.send(self.room, "secret while eve is here")
        await self.eve.ok("POST", f"/rooms/{self.room}/leave", {})
        await self.alice.send(self.room, "secret after eve left")
        # Shared history: before her join too, up to her leave, not after.
        self.assertEqual(
            sorted(bodies(await search(self.eve, "secret"))),
            ["secret before eve", "secret while eve is here"],
        )
        # Joined-only history: from her join.
        private = await self.alice.create_room(preset="private_chat")
        await self.alice.ok(
            "PUT",
            f"/rooms/{private}/state/m.room.history_visibility",
            {"history_visibility": "joined"},
        )
        await self.alice.send(private, "hidden words before")
        await self.alice.ok("POST", f"/rooms/{private}/invite", {"user_id": self.eve.user_id})
        await self.eve.ok("POST", f"/join/{private}")
        await self.alice.send(private, "hidden words after")
        found = await search(self.eve, "hidden words", filter={"rooms": [private]})
        self.assertEqual(bodies(found), ["hidden words after"])
        self.assertEqual(found["count"], 1)

    async def test_redacted_and_ignored_are_not_found(self) -> None:
        gone = await self.bob.send(self.room, "embarrassing typo")
        await self.bob.send(self.room, "embarrassing but kept")
        await self.bob.ok("PUT", f"/rooms/{self.room}/redact/{gone}/r1", {})
        self.assertEqual(
            bodies(await search(self.alice, "embarrassing")), ["embarrassing but kept"]
        )
        await self.alice.ok(
            "PUT",
            f"/user/{self.alice.user_id}/account_data/m.ignored_user_list",
            {"ignored_users": {self.bob.user_id: {}}},
        )
        self.assertEqual((await search(self.alice, "embarrassing"))["count"], 0)

    async def test_recent_order_and_pages(self) -> None:
        for i in range(7):
            await self.alice.send(self.room, f"page item {i}")
        seen: list[str] = []
        next_batch = None
        pages = 0
        while True:
            found = await search(
                self.alice, "item", next_batch, order_by="recent", filter={"limit": 3}
            )
            self.assertEqual(found["count"], 7)
            seen += bodies(found)
            pages += 1
            next_batch = found.get("next_batch")
            if next_batch is None:
                break
        self.assertEqual(seen, [f"page item {i}" for i in reversed(range(7))])
        self.assertEqual(pages, 3)
        # Rank pages: every result once, with no newer event slipping in.
        first = await search(self.alice, "item", filter={"limit": 4})
        await self.alice.send(self.room, "page item late")
        rest = await search(self.alice, "item", first["next_batch"], filter={"limit": 4})
        ranked = bodies(first) + bodies(rest)
        self.assertEqual(sorted(ranked), sorted(f"page item {i}" for i in range(7)))
        self.assertNotIn("next_batch", rest)

    async def test_filters(self) -> None:
        other = await self.bob.create_room(preset="public_chat")
        await self.alice.ok("POST", f"/join/{other}")
        await self.bob.send(self.room, "apples from bob")
        await self.alice.send(self.room, "apples from alice")
        await self.bob.send(other, "apples elsewhere")
        await self.alice.ok(
            "PUT",
            f"/rooms/{self.room}/send/m.room.message/f1",
            {"msgtype": "m.file", "body": "apples.png", "url": "mxc://test.local/x"},
        )

        async def found(**event_filter: Any) -> list[str]:
            return sorted(bodies(await search(self.alice, "apples", filter=event_filter)))

        self.assertEqual(await found(rooms=[other]), ["apples elsewhere"])
        self.assertEqual(len(await found(not_rooms=[other])), 3)
        self.assertEqual(
            await found(senders=[self.bob.user_id]), ["apples elsewhere", "apples from bob"]
        )
        self.assertNotIn("apples from bob", await found(not_senders=[self.bob.user_id]))
        self.assertEqual(await found(contains_url=True), ["apples.png"])
        self.assertEqual(await found(types=["m.room.topic"]), [])
        self.assertEqual(len(await found(not_types=["m.room.name"])), 4)

    async def test_context_profiles_groups_and_state(self) -> None:
        await self.alice.send(self.room, "one")
        await self.bob.send(self.room, "the needle")
        await self.bob.ok(
            "PUT", f"/profile/{self.bob.user_id}/displayname", {"displayname": "Robert"}
        )
        await self.alice.send(self.room, "three")
        answer = await self.alice.ok(
            "POST",
            "/search",
            room_events(
                "needle",
                event_context={"before_limit": 1, "after_limit": 5, "include_profile": True},
                groupings={"group_by": [{"key": "room_id"}, {"key": "sender"}]},
                include_state=True,
            ),
        )
        assert_spec_response(self, "search.yaml", "/search", "POST", 200, answer)
        found = answer["search_categories"]["room_events"]
        [result] = found["results"]
        context = result["context"]
        self.assertEqual([e["content"].get("body") for e in context["events_before"]], ["one"])
        self.assertIn("three", [e["content"].get("body") for e in context["events_after"]])
        # The profile as it was when the message was sent.
        self.assertEqual(context["profile_info"][self.bob.user_id]["displayname"], "bob")
        # The context's tokens page /messages from there.
        page = await self.alice.ok(
            "GET", f"/rooms/{self.room}/messages?dir=b&limit=1&from={context['start']}"
        )
        self.assertEqual(len(page["chunk"]), 1)
        event_id = result["result"]["event_id"]
        self.assertEqual(found["groups"]["room_id"][self.room]["results"], [event_id])
        self.assertEqual(found["groups"]["sender"][self.bob.user_id]["order"], 1)
        state_types = {e["type"] for e in found["state"][self.room]}
        self.assertIn("m.room.create", state_types)

    async def test_group_pages_continue_within_the_group(self) -> None:
        other = await self.alice.create_room(preset="public_chat")
        for i in range(3):
            await self.alice.send(self.room, f"fruit here {i}")
            await self.alice.send(other, f"fruit there {i}")
        for order_by in ("recent", "rank"):
            found = await search(
                self.alice,
                "fruit",
                order_by=order_by,
                filter={"limit": 2},
                groupings={"group_by": [{"key": "room_id"}]},
            )
            groups = found["groups"]["room_id"]
            for room_id, group in groups.items():
                shown = list(group["results"])
                next_batch = group.get("next_batch")
                while next_batch is not None:
                    more = await search(
                        self.alice, "fruit", next_batch, order_by=order_by, filter={"limit": 2}
                    )
                    self.assertEqual(
                        {r["result"]["room_id"] for r in more["results"]} - {room_id}, set()
                    )
                    shown += [r["result"]["event_id"] for r in more["results"]]
                    next_batch = more.get("next_batch")
                self.assertEqual(len(shown), 3, (order_by, room_id))
                self.assertEqual(len(set(shown)), 3)

    async def test_bad_requests(self) -> None:
        cases: list[tuple[Any, str | None, str]] = [
            ({}, None, "M_MISSING_PARAM"),
            ({"search_categories": []}, None, "M_MISSING_PARAM"),
            ({"search_categories": {"room_events": {}}}, None, "M_MISSING_PARAM"),
            (room_events(5), None, "M_BAD_JSON"),  # type: ignore[arg-type]
            (room_events("x", keys=["content.msgtype"]), None, "M_BAD_JSON"),
            (room_events("x", keys="content.body"), None, "M_BAD_JSON"),
            (room_events("x", order_by="newest"), None, "M_BAD_JSON"),
            (room_events("x", event_context={"before_limit": -1}), None, "M_BAD_JSON"),
            (room_events("x", event_context={"after_limit": 10_000}), None, "M_BAD_JSON"),
            (room_events("x", event_context={"include_profile": "yes"}), None, "M_BAD_JSON"),
            (room_events("x", groupings={"group_by": [{"key": "type"}]}), None, "M_BAD_JSON"),
            (room_events("x", include_state="yes"), None, "M_BAD_JSON"),
            (room_events("x", filter={"rooms": "!r:test.local"}), None, "M_BAD_JSON"),
            (room_events("x" * 1001), None, "M_BAD_JSON"),
            (room_events("x"), "not-a-token", "M_INVALID_PARAM"),
            (room_events("x"), "eyJvcmRlcl9ieSI6Inh5eiIsInVwdG8iOjF9", "M_INVALID_PARAM"),
        ]
        for body, next_batch, errcode in cases:
            path = "/search" + (f"?next_batch={next_batch}" if next_batch else "")
            code, answer = await self.alice.request("POST", path, body)
            self.assertEqual((code, answer.get("errcode")), (400, errcode), body)
        # A rank token for a search by recent.
        for i in range(3):
            await self.alice.send(self.room, f"token {i}")
        found = await search(self.alice, "token", filter={"limit": 1})
        code, answer = await self.alice.request(
            "POST",
            f"/search?next_batch={found['next_batch']}",
            room_events("token", order_by="recent"),
        )
        self.assertEqual((code, answer["errcode"]), (400, "M_INVALID_PARAM"))
        code, _ = await self.alice.request("POST", "/search", room_events("x"), token=None)
        self.assertEqual(code, 401)
        # No other category: an empty answer.
        self.assertEqual(
            await self.alice.ok("POST", "/search", {"search_categories": {}}),
            {"search_categories": {}},
        )


class SearchWorkersTestCase(DatabaseTestCase):
    """Two events writers fill the index for their rooms; a reader (and the
    main process) searches both."""

    async def test_two_writers_and_a_reader(self) -> None:
        writers = ["persister1", "persister2"]
        servers, clients, _ = start_cluster(
            self, self.test_db, workers=[*writers, "reader"], stream_writers={"events": writers}
        )
        alice = await ClientApi(self, clients["main"].base_url).register("alice")
        rooms_by_writer: dict[str, str] = {}
        for _ in range(12):
            room_id = await alice.create_room(preset="public_chat")
            writer = await servers["main"].store.get_event_writer_for_room(room_id, writers)
            assert writer is not None
            rooms_by_writer.setdefault(writer, room_id)
            if len(rooms_by_writer) == 2:
                break
        self.assertEqual(set(rooms_by_writer), set(writers))
        for writer, room_id in rooms_by_writer.items():
            await alice.send(room_id, f"written by {writer} quasar")
        reader = alice.as_user(alice.token)
        reader.base_url = clients["reader"].base_url

        async def found_both() -> bool:
            return (await search(reader, "quasar"))["count"] == 2

        await eventually(found_both, what="the reader to find both writers' events")
        found = await search(reader, "quasar", order_by="recent")
        self.assertEqual(
            {r["result"]["room_id"] for r in found["results"]}, set(rooms_by_writer.values())
        )
