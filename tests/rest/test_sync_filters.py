"""/sync as the spec's filter and state rules say: the room event filters
(timeline, state, ephemeral, account data; rooms), the state block of a gapped
sync, ``include_leave``, ``event_fields`` and ``unsigned.transaction_id``.
On SQLite and PostgreSQL (``SYNAPSE_LITE_TEST_DB``)."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase


def as_param(definition: dict[str, Any]) -> str:
    return urllib.parse.quote(json.dumps(definition))


def room_entry(sync: dict[str, Any], room_id: str, section: str = "join") -> dict[str, Any]:
    entry: dict[str, Any] = sync["rooms"][section][room_id]
    return entry


def types_of(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


class SyncFilterTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(self, self.test_db)
        self.base = clients["main"].base_url
        self.alice = await ClientApi(self, self.base).register("alice")
        self.bob = await ClientApi(self, self.base).register("bob")

    async def shared_room(self) -> str:
        room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room}", {})
        return room

    async def put_state(self, room: str, event_type: str, key: str, content: Any) -> str:
        result = await self.alice.ok("PUT", f"/rooms/{room}/state/{event_type}/{key}", content)
        return str(result["event_id"])

    async def test_transaction_id_only_for_the_sending_device(self) -> None:
        room = await self.shared_room()
        event_id = await self.alice.send(room, "hello", txn_id="my-txn")
        mine = room_entry(await self.alice.sync(), room)["timeline"]["events"]
        sent = next(e for e in mine if e["event_id"] == event_id)
        self.assertEqual(sent["unsigned"]["transaction_id"], "my-txn")
        theirs = room_entry(await self.bob.sync(), room)["timeline"]["events"]
        self.assertNotIn(
            "transaction_id", next(e for e in theirs if e["event_id"] == event_id)["unsigned"]
        )
        # Another device of the sender does not see it either.
        login = await ClientApi(self, self.base).ok(
            "POST",
            "/login",
            {
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": "alice"},
                "password": "secret-pw",
            },
        )
        other = ClientApi(self, self.base).as_user(login["access_token"])
        elsewhere = room_entry(await other.sync(), room)["timeline"]["events"]
        self.assertNotIn(
            "transaction_id", next(e for e in elsewhere if e["event_id"] == event_id)["unsigned"]
        )
        page = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=b&limit=1")
        self.assertEqual(page["chunk"][0]["unsigned"]["transaction_id"], "my-txn")

    async def test_timeline_types_fill_the_limit(self) -> None:
        room = await self.shared_room()
        await self.put_state(room, "org.example.state", "", {"n": 1})
        for i in range(30):
            await self.alice.send(room, f"m{i}")
        only_state = as_param(
            {"room": {"timeline": {"types": ["org.example.*"], "limit": 1}, "state": {"types": []}}}
        )
        entry = room_entry(await self.bob.sync(filter=only_state), room)
        self.assertEqual(types_of(entry["timeline"]["events"]), ["org.example.state"])
        self.assertFalse(entry["timeline"]["limited"])
        self.assertEqual(entry["state"]["events"], [])
        no_messages = as_param({"room": {"timeline": {"not_types": ["m.room.message"]}}})
        entry = room_entry(await self.bob.sync(filter=no_messages), room)
        self.assertNotIn("m.room.message", types_of(entry["timeline"]["events"]))
        self.assertIn("m.room.create", types_of(entry["timeline"]["events"]))

    async def test_senders_rooms_and_contains_url(self) -> None:
        room = await self.shared_room()
        other_room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{other_room}", {})
        await self.bob.send(room, "from bob")
        await self.alice.ok(
            "PUT",
            f"/rooms/{room}/send/m.room.message/img",
            {"msgtype": "m.image", "body": "pic", "url": "mxc://example.org/abc"},
        )
        by_bob = as_param({"room": {"timeline": {"senders": [self.bob.user_id]}}})
        entry = room_entry(await self.bob.sync(filter=by_bob), room)
        self.assertEqual({e["sender"] for e in entry["timeline"]["events"]}, {self.bob.user_id})
        not_bob = as_param({"room": {"timeline": {"not_senders": [self.bob.user_id]}}})
        entry = room_entry(await self.bob.sync(filter=not_bob), room)
        self.assertNotIn(self.bob.user_id, {e["sender"] for e in entry["timeline"]["events"]})
        with_url = as_param({"room": {"timeline": {"contains_url": True}}})
        entry = room_entry(await self.bob.sync(filter=with_url), room)
        self.assertEqual([e["content"]["body"] for e in entry["timeline"]["events"]], ["pic"])
        without_url = as_param({"room": {"timeline": {"contains_url": False}}})
        entry = room_entry(await self.bob.sync(filter=without_url), room)
        self.assertNotIn("pic", [e["content"].get("body") for e in entry["timeline"]["events"]])
        only_other = as_param({"room": {"rooms": [other_room]}})
        self.assertEqual(
            set((await self.bob.sync(filter=only_other))["rooms"]["join"]), {other_room}
        )
        not_other = as_param({"room": {"not_rooms": [other_room]}})
        self.assertEqual(set((await self.bob.sync(filter=not_other))["rooms"]["join"]), {room})
        timeline_rooms = as_param({"room": {"timeline": {"not_rooms": [other_room]}}})
        joined = (await self.bob.sync(filter=timeline_rooms))["rooms"]["join"]
        self.assertEqual(joined[other_room]["timeline"]["events"], [])
        self.assertNotEqual(joined[room]["timeline"]["events"], [])

    async def test_state_filter_and_full_state(self) -> None:
        room = await self.shared_room()
        await self.put_state(room, "org.example.state", "a", {"n": 1})
        await self.put_state(room, "org.example.state", "b", {"n": 1})
        for i in range(3):
            await self.alice.send(room, f"m{i}")
        members_only = as_param(
            {"room": {"state": {"types": ["m.room.member"]}, "timeline": {"limit": 0}}}
        )
        entry = room_entry(await self.bob.sync(filter=members_only), room)
        self.assertEqual(entry["timeline"]["events"], [])
        self.assertTrue(entry["timeline"]["limited"])
        self.assertEqual(set(types_of(entry["state"]["events"])), {"m.room.member"})
        self.assertEqual(len(entry["state"]["events"]), 2)

    async def test_gapped_sync_state_holds_the_changes_before_the_timeline(self) -> None:
        room = await self.shared_room()
        flt = as_param(
            {
                "room": {
                    "timeline": {"limit": 2},
                    "state": {"types": ["org.example.state"]},
                }
            }
        )
        await self.put_state(room, "org.example.state", "changes", {"n": 1})
        await self.put_state(room, "org.example.state", "stays", {"n": 1})
        first = await self.bob.sync(filter=flt)
        self.assertEqual(room_entry(first, room)["state"]["events"], [])
        changed = await self.put_state(room, "org.example.state", "changes", {"n": 2})
        for i in range(5):
            await self.alice.send(room, f"m{i}")
        gapped = room_entry(await self.bob.sync(since=first["next_batch"], filter=flt), room)
        self.assertTrue(gapped["timeline"]["limited"])
        self.assertEqual([e["event_id"] for e in gapped["state"]["events"]], [changed])
        # Not gapped: the change is in the timeline and not repeated in state.
        again = await self.put_state(room, "org.example.state", "changes", {"n": 3})
        latest = await self.bob.sync(since=first["next_batch"], filter=as_param({}))
        entry = room_entry(latest, room)
        self.assertIn(again, [e["event_id"] for e in entry["timeline"]["events"]])
        self.assertNotIn(again, [e["event_id"] for e in entry["state"]["events"]])

    async def test_include_leave(self) -> None:
        room = await self.shared_room()
        for i in range(10):
            await self.alice.send(room, f"filler {i}")
        await self.alice.send(room, "before")
        await self.bob.ok(
            "PUT", f"/user/{self.bob.user_id}/rooms/{room}/account_data/org.mine", {"k": 1}
        )
        since = (await self.bob.sync())["next_batch"]
        await self.bob.ok("POST", f"/rooms/{room}/leave", {})
        await self.alice.send(room, "after")
        # Left since the token: the room's account data is for it (none
        # changed since).
        left = await self.bob.sync(since=since)
        self.assertEqual(room_entry(left, room, "leave")["account_data"], {"events": []})
        plain = await self.bob.sync()
        self.assertEqual(plain["rooms"]["leave"], {})
        with_leave = await self.bob.sync(filter=as_param({"room": {"include_leave": True}}))
        entry = room_entry(with_leave, room, "leave")
        bodies = [e["content"].get("body") for e in entry["timeline"]["events"]]
        self.assertIn("before", bodies)
        self.assertNotIn("after", bodies)
        self.assertEqual(entry["timeline"]["events"][-1]["content"]["membership"], "leave")
        state_types = set(types_of(entry["state"]["events"]))
        self.assertIn("m.room.create", state_types)
        self.assertEqual(
            entry["account_data"]["events"], [{"type": "org.mine", "content": {"k": 1}}]
        )
        incremental = await self.bob.sync(
            since=plain["next_batch"], filter=as_param({"room": {"include_leave": True}})
        )
        self.assertEqual(incremental["rooms"]["leave"], {})

    async def test_event_fields_and_account_data_filters(self) -> None:
        room = await self.shared_room()
        await self.alice.send(room, "x")
        await self.bob.ok("PUT", f"/user/{self.bob.user_id}/account_data/org.keep", {"k": 1})
        await self.bob.ok("PUT", f"/user/{self.bob.user_id}/account_data/org.drop", {"d": 1})
        flt = as_param(
            {
                "event_fields": ["type", "content.body"],
                "account_data": {"not_types": ["org.drop", "m.push_rules"]},
                "room": {"timeline": {"types": ["m.room.message"]}},
            }
        )
        result = await self.bob.sync(filter=flt)
        self.assertEqual(
            room_entry(result, room)["timeline"]["events"],
            [{"type": "m.room.message", "content": {"body": "x"}}],
        )
        self.assertEqual(types_of(result["account_data"]["events"]), ["org.keep"])

    async def test_current_state_shows_through_joined_history(self) -> None:
        carol = await ClientApi(self, self.base).register("carol")
        room = await self.shared_room()
        await self.put_state(
            room, "m.room.history_visibility", "", {"history_visibility": "joined"}
        )
        await self.bob.ok("POST", f"/rooms/{room}/leave", {})
        await carol.ok("POST", f"/join/{room}", {})
        for i in range(15):
            await self.alice.send(room, f"while away {i}")
        await self.bob.ok("POST", f"/join/{room}", {})
        timeline = room_entry(await self.bob.sync(), room)["timeline"]["events"]
        # Carol's join is current state: shown although Bob was away then;
        # the messages of that time are not, and do not use up the limit.
        self.assertIn(
            (carol.user_id, "join"),
            [(e.get("state_key"), e["content"].get("membership")) for e in timeline],
        )
        self.assertFalse([e for e in timeline if "away" in e["content"].get("body", "")])
        # Every event Bob may see, within the limit of 10: the creation and
        # the first state (history was shared then), his joins and leave, the
        # visibility change, Carol's join.
        self.assertEqual(len(timeline), 10)

    async def test_ephemeral_and_room_account_data_filters(self) -> None:
        room = await self.shared_room()
        event_id = await self.alice.send(room, "read me")
        await self.bob.ok("POST", f"/rooms/{room}/receipt/m.read/{event_id}", {})
        await self.bob.ok(
            "PUT", f"/user/{self.bob.user_id}/rooms/{room}/account_data/org.keep", {"k": 1}
        )
        await self.bob.ok(
            "PUT", f"/user/{self.bob.user_id}/rooms/{room}/account_data/org.drop", {"d": 1}
        )
        everything = room_entry(await self.bob.sync(), room)
        self.assertIn("m.receipt", types_of(everything["ephemeral"]["events"]))
        flt = as_param(
            {
                "room": {
                    "ephemeral": {"types": []},
                    "account_data": {"not_types": ["org.drop"]},
                }
            }
        )
        entry = room_entry(await self.bob.sync(filter=flt), room)
        self.assertEqual(entry["ephemeral"]["events"], [])
        self.assertEqual(types_of(entry["account_data"]["events"]), ["org.keep"])

    async def test_invalid_filters_refused(self) -> None:
        for definition in (
            {"room": {"state": {"lazy_load_members": "true"}}},
            {"room": {"include_leave": 1}},
            {"room": {"timeline": {"limit": "10"}}},
            {"room": {"timeline": {"contains_url": "yes"}}},
            {"room": {"rooms": "!a:b"}},
            {"event_fields": "type"},
            {"event_format": "xml"},
        ):
            code, body = await self.bob.request(
                "POST", f"/user/{self.bob.user_id}/filter", definition
            )
            self.assertEqual((code, body["errcode"]), (400, "M_BAD_JSON"), definition)
            code, body = await self.bob.request("GET", f"/sync?filter={as_param(definition)}")
            self.assertEqual((code, body["errcode"]), (400, "M_BAD_JSON"), definition)

    async def test_newly_joined_room_brings_presence_and_a_gap(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        for i in range(3):
            await self.alice.send(room, f"m{i}")
        initial = await self.bob.sync(set_presence="offline")
        await self.bob.ok("POST", f"/join/{room}", {})
        messages_only = as_param({"room": {"timeline": {"types": ["m.room.message"]}}})
        later = await self.bob.sync(
            since=initial["next_batch"], filter=messages_only, set_presence="offline"
        )
        timeline = room_entry(later, room)["timeline"]
        self.assertEqual(len(timeline["events"]), 3)
        # The room's earlier events (its creation) are not in it: a gap.
        self.assertTrue(timeline["limited"])
        senders = {e["sender"] for e in later["presence"]["events"]}
        self.assertIn(self.alice.user_id, senders)
        again = await self.bob.sync(since=later["next_batch"], set_presence="offline")
        self.assertNotIn(self.alice.user_id, {e["sender"] for e in again["presence"]["events"]})

    async def test_a_stored_filter_is_read_once(self) -> None:
        """Incremental /syncs naming a stored filter, as Element sends them,
        do not read the filter again: with nothing new for the user, none of
        the database interactions a /sync makes is the filter's (issue 35's
        /sync from memory). Only the filter's read is asserted: whatever
        else runs meanwhile (a periodic flush, a range the first token had
        not settled) is not this test's."""
        await self.shared_room()
        filter_id = (await self.bob.ok("POST", "/user/@bob:test.local/filter", {}))["filter_id"]
        since = (await self.bob.sync(filter=filter_id))["next_batch"]
        pool = self.servers["main"].store.db_pool
        interactions: list[str] = []
        run_interaction = pool.runInteraction

        def counted(desc: str, *args: Any, **kwargs: Any) -> Any:
            interactions.append(desc)
            return run_interaction(desc, *args, **kwargs)

        self.patch(pool, "runInteraction", counted)
        for _ in range(3):
            since = (await self.bob.sync(since=since, filter=filter_id))["next_batch"]
        self.assertNotIn("get_user_filter", interactions)


class LazyMembersTestCase(DatabaseTestCase):
    """``lazy_load_members`` and the room summary."""

    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(self, self.test_db)
        base = clients["main"].base_url
        self.alice = await ClientApi(self, base).register("alice")
        self.bob = await ClientApi(self, base).register("bob")
        self.carol = await ClientApi(self, base).register("carol")
        self.room = await self.alice.create_room(preset="public_chat")
        for user in (self.bob, self.carol):
            await user.ok("POST", f"/join/{self.room}", {})

    def members(self, sync: dict[str, Any]) -> set[str]:
        state = room_entry(sync, self.room)["state"]["events"]
        return {e["state_key"] for e in state if e["type"] == "m.room.member"}

    async def test_only_the_senders_members(self) -> None:
        lazy = as_param({"room": {"state": {"lazy_load_members": True}, "timeline": {"limit": 3}}})
        for i in range(3):
            await self.bob.send(self.room, f"b{i}")
        first = await self.alice.sync(filter=lazy)
        self.assertEqual(self.members(first), {self.alice.user_id, self.bob.user_id})
        self.assertEqual(
            room_entry(first, self.room)["summary"],
            {
                "m.joined_member_count": 3,
                "m.invited_member_count": 0,
                "m.heroes": sorted([self.bob.user_id, self.carol.user_id]),
            },
        )
        # Bob's member was sent already: only Carol's, who speaks now.
        await self.bob.send(self.room, "again")
        await self.carol.send(self.room, "hello")
        later = await self.alice.sync(since=first["next_batch"], filter=lazy)
        self.assertEqual(self.members(later), {self.carol.user_id})
        redundant = as_param(
            {"room": {"state": {"lazy_load_members": True, "include_redundant_members": True}}}
        )
        await self.bob.send(self.room, "once more")
        again = await self.alice.sync(since=later["next_batch"], filter=redundant)
        self.assertEqual(self.members(again), {self.bob.user_id})

    async def test_a_gapped_sync_has_the_gaps_member_changes(self) -> None:
        lazy = as_param({"room": {"state": {"lazy_load_members": True}, "timeline": {"limit": 3}}})
        for i in range(3):
            await self.bob.send(self.room, f"b{i}")
        first = await self.alice.sync(filter=lazy)
        self.assertEqual(self.members(first), {self.alice.user_id, self.bob.user_id})
        dave = await ClientApi(self, self.bob.base_url).register("dave")
        await dave.ok("POST", f"/join/{self.room}", {})
        for i in range(2):
            await dave.send(self.room, f"d{i}")
        for i in range(5):
            await self.carol.send(self.room, f"c{i}")
        # Dave joined and spoke before the timeline's start: his join is a
        # change in the gap, sent (the client keeps its member list with
        # it); Carol is the sender of what is shown.
        later = await self.alice.sync(since=first["next_batch"], filter=lazy)
        self.assertTrue(room_entry(later, self.room)["timeline"]["limited"])
        self.assertEqual(self.members(later), {self.carol.user_id, dave.user_id})
        # Without lazy loading, the gap's state holds Dave's join only.
        plain = await self.alice.sync(
            since=first["next_batch"], filter=as_param({"room": {"timeline": {"limit": 3}}})
        )
        self.assertEqual(self.members(plain), {dave.user_id})
        # Dave leaves in a gap: his leave is sent, Bob's unchanged member not.
        await dave.ok("POST", f"/rooms/{self.room}/leave", {})
        for i in range(5):
            await self.carol.send(self.room, f"again {i}")
        last = await self.alice.sync(since=later["next_batch"], filter=lazy)
        state = room_entry(last, self.room)["state"]["events"]
        self.assertEqual(
            [(e["state_key"], e["content"]["membership"]) for e in state],
            [(dave.user_id, "leave")],
        )

    async def test_without_lazy_loading_all_members_and_no_summary(self) -> None:
        await self.bob.send(self.room, "b")
        result = await self.alice.sync(filter=as_param({"room": {"timeline": {"limit": 1}}}))
        self.assertEqual(
            self.members(result), {self.alice.user_id, self.bob.user_id, self.carol.user_id}
        )
        self.assertEqual(room_entry(result, self.room)["summary"], {})

    async def test_named_room_summary_has_no_heroes(self) -> None:
        await self.alice.ok("PUT", f"/rooms/{self.room}/state/m.room.name", {"name": "Named"})
        lazy = as_param({"room": {"state": {"lazy_load_members": True}}})
        result = await self.alice.sync(filter=lazy)
        self.assertEqual(
            room_entry(result, self.room)["summary"],
            {"m.joined_member_count": 3, "m.invited_member_count": 0},
        )


class SyncFiltersThroughWorkersTestCase(DatabaseTestCase):
    """The same answers from the main process and a reader, with the room's
    events written by an events writer."""

    async def test_same_answers_on_main_and_a_reader(self) -> None:
        servers, clients, _ = start_cluster(
            self, self.test_db, workers=["reader", "writer"], stream_writers={"events": ["writer"]}
        )
        await eventually(lambda: all(hs.replication.connected for hs in servers.values()))
        alice = await ClientApi(self, clients["reader"].base_url).register("alice")
        on_main = clients["main"].as_user(alice.token)
        room = await alice.create_room(preset="public_chat")
        await alice.ok("PUT", f"/rooms/{room}/state/org.example.state/k", {"n": 1})
        first = await alice.sync()
        await alice.ok("PUT", f"/rooms/{room}/state/org.example.state/k", {"n": 2})
        event_id = await alice.send(room, "hi", txn_id="t1")
        for i in range(4):
            await alice.send(room, f"m{i}")
        flt = as_param(
            {
                "room": {
                    "timeline": {"limit": 2, "types": ["m.room.message"]},
                    "state": {"types": ["org.example.state"], "lazy_load_members": True},
                }
            }
        )
        answers = []
        for client in (alice, on_main):
            await eventually(
                lambda: all(
                    hs.store.get_room_max_token() == servers["writer"].store.get_room_max_token()
                    for hs in servers.values()
                ),
                what="every process caught up with the writer",
            )
            result = await client.sync(since=first["next_batch"], filter=flt)
            entry = room_entry(result, room)
            answers.append(
                (
                    [e["event_id"] for e in entry["timeline"]["events"]],
                    entry["timeline"]["limited"],
                    [(e["type"], e["content"]) for e in entry["state"]["events"]],
                )
            )
        self.assertEqual(answers[0], answers[1])
        self.assertEqual(answers[0][2], [("org.example.state", {"n": 2})])
        full = await alice.sync(filter=as_param({"room": {"timeline": {"limit": 5}}}))
        sent = [
            e for e in room_entry(full, room)["timeline"]["events"] if e["event_id"] == event_id
        ]
        self.assertEqual(sent[0]["unsigned"]["transaction_id"], "t1")
