"""``m.ignored_user_list``: an ignored user's messages and invites are hidden
in /sync and /messages, their state events are not; on one process and
with the room on an events-writer worker and the readers elsewhere."""

from __future__ import annotations

from typing import Any

from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.server import DatabaseTestCase

IGNORED = "m.ignored_user_list"


def timeline(sync: dict[str, Any], room_id: str) -> list[dict[str, Any]]:
    return sync["rooms"]["join"].get(room_id, {}).get("timeline", {}).get("events", [])


def bodies(events: list[dict[str, Any]]) -> list[str]:
    return [e["content"]["body"] for e in events if "body" in e["content"]]


class IgnoredUsersTestCase(DatabaseTestCase):
    workers: list[str] = []
    stream_writers: dict[str, Any] | None = None
    entry = "main"

    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(
            self, self.test_db, workers=self.workers, stream_writers=self.stream_writers
        )
        base = clients[self.entry].base_url
        self.alice = await ClientApi(self, base).register("alice")
        self.bob = await ClientApi(self, base).register("bob")
        self.carol = await ClientApi(self, base).register("carol")

    async def ignore(self, *users: str) -> None:
        await self.alice.ok(
            "PUT",
            f"/user/{self.alice.user_id}/account_data/{IGNORED}",
            {"ignored_users": {u: {} for u in users}},
        )

    async def shared_room(self) -> str:
        room = await self.alice.create_room(preset="public_chat")
        for user in (self.bob, self.carol):
            await user.ok("POST", f"/join/{room}", {})
        return room

    async def test_messages_hidden_in_sync_and_messages(self) -> None:
        room = await self.shared_room()
        await self.bob.send(room, "from bob")
        await self.carol.send(room, "from carol")
        before = await self.alice.sync()
        self.assertEqual(bodies(timeline(before, room)), ["from bob", "from carol"])

        await self.ignore(self.bob.user_id or "")
        initial = await self.alice.sync()
        events = timeline(initial, room)
        self.assertEqual(bodies(events), ["from carol"])
        # Bob's membership (state) stays.
        self.assertIn(
            self.bob.user_id,
            [e["state_key"] for e in events if e["type"] == "m.room.member"],
        )
        self.assertIn(IGNORED, [e["type"] for e in initial["account_data"]["events"]])

        await self.bob.send(room, "bob again")
        later = await self.alice.sync(since=initial["next_batch"])
        self.assertNotIn(room, later["rooms"]["join"])
        await self.carol.send(room, "carol again")
        last = await self.alice.sync(since=later["next_batch"])
        self.assertEqual(bodies(timeline(last, room)), ["carol again"])

        page = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=b&limit=50")
        self.assertEqual(bodies(page["chunk"]), ["carol again", "from carol"])
        # Bob's own view is unchanged.
        page = await self.bob.ok("GET", f"/rooms/{room}/messages?dir=b&limit=50")
        self.assertEqual(
            bodies(page["chunk"]), ["carol again", "bob again", "from carol", "from bob"]
        )

        # Unignoring shows them again.
        await self.ignore()
        page = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=b&limit=50")
        self.assertEqual(len(bodies(page["chunk"])), 4)

    async def test_invites_hidden(self) -> None:
        await self.ignore(self.bob.user_id or "")
        first = await self.alice.sync()
        from_bob = await self.bob.create_room()
        await self.bob.ok("POST", f"/rooms/{from_bob}/invite", {"user_id": self.alice.user_id})
        from_carol = await self.carol.create_room()
        await self.carol.ok("POST", f"/rooms/{from_carol}/invite", {"user_id": self.alice.user_id})
        incremental = await self.alice.sync(since=first["next_batch"])
        self.assertEqual(list(incremental["rooms"]["invite"]), [from_carol])
        full = await self.alice.sync()
        self.assertEqual(list(full["rooms"]["invite"]), [from_carol])

    async def test_bad_lists_are_refused(self) -> None:
        path = f"/user/{self.alice.user_id}/account_data/{IGNORED}"
        for content, errcode in [
            ({}, "M_BAD_JSON"),
            ({"ignored_users": ["@bob:test.local"]}, "M_BAD_JSON"),
            ({"ignored_users": {"bob": {}}}, "M_INVALID_PARAM"),
            ({"ignored_users": {self.alice.user_id: {}}}, "M_INVALID_PARAM"),
        ]:
            code, body = await self.alice.request("PUT", path, content)
            self.assertEqual((code, body["errcode"]), (400, errcode), content)
        # Room account data of that type is not the list: no check.
        room = await self.alice.create_room()
        await self.alice.ok(
            "PUT", f"/user/{self.alice.user_id}/rooms/{room}/account_data/{IGNORED}", {}
        )


class IgnoredUsersThroughWorkersTestCase(IgnoredUsersTestCase):
    workers = ["writer1", "reader1"]
    stream_writers = {"events": ["writer1"], "account_data": ["writer1"]}
    entry = "reader1"


class IgnoredListReadsTestCase(DatabaseTestCase):
    """/sync reads a user's list from the database again only once it
    changed (issue 35: a woken /sync usually reads nothing for it; the
    store keeps it until the account_data stream brings a change of it)."""

    async def test_read_once_until_account_data_changes(self) -> None:
        servers, clients, _ = start_cluster(self, self.test_db)
        store = servers["main"].store
        reads: list[str] = []
        select = store.db_pool.select

        async def counting(desc: str, sql: str, *args: Any) -> Any:
            if desc == "get_global_account_data_of_type" and args[1] == IGNORED:
                reads.append(args[0])
            return await select(desc, sql, *args)

        self.patch(store.db_pool, "select", counting)
        base = clients["main"].base_url
        alice = await ClientApi(self, base).register("alice")
        bob = await ClientApi(self, base).register("bob")
        room = await alice.create_room(preset="public_chat")
        await bob.ok("POST", f"/join/{room}", {})
        first = await alice.sync()
        await bob.send(room, "one")
        # Someone else's change of their list is not alice's.
        await bob.ok("PUT", f"/user/{bob.user_id}/account_data/{IGNORED}", {"ignored_users": {}})
        second = await alice.sync(since=first["next_batch"])
        self.assertEqual(bodies(timeline(second, room)), ["one"])
        self.assertEqual(reads, [alice.user_id])
        await alice.ok(
            "PUT",
            f"/user/{alice.user_id}/account_data/{IGNORED}",
            {"ignored_users": {bob.user_id: {}}},
        )
        await bob.send(room, "two")
        third = await alice.sync(since=second["next_batch"])
        self.assertEqual(bodies(timeline(third, room)), [])
        self.assertEqual(reads, [alice.user_id, alice.user_id])
