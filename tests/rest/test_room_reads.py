"""``GET /rooms/{roomId}/state/{eventType}/{stateKey}``: the content by
default, the whole event with ``?format=event``; member and power-level
events read like any other. Setting the same state twice is idempotent;
inviting yourself is refused."""

from __future__ import annotations

import json
import urllib.parse

from tests.harness.client_api import ClientApi, ThreeUsersTestCase, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase


class StateEventReadTestCase(ThreeUsersTestCase):
    async def test_member_and_power_levels_as_content_or_event(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        member_path = f"/rooms/{room}/state/m.room.member/{self.alice.user_id}"
        self.assertEqual((await self.alice.ok("GET", member_path))["membership"], "join")
        event = await self.alice.ok("GET", member_path + "?format=event")
        self.assertEqual(
            (event["type"], event["state_key"], event["sender"], event["room_id"]),
            ("m.room.member", self.alice.user_id, self.alice.user_id, room),
        )
        self.assertEqual(event["content"]["membership"], "join")
        self.assertTrue(event["event_id"].startswith("$"))
        levels = await self.alice.ok("GET", f"/rooms/{room}/state/m.room.power_levels/")
        self.assertEqual(levels["users"][self.alice.user_id], 100)
        code, body = await self.alice.request("GET", member_path + "?format=xml")
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"))
        code, body = await self.alice.request(
            "GET", f"/rooms/{room}/state/m.room.member/{self.bob.user_id}"
        )
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))


class StateWriteTestCase(ThreeUsersTestCase):
    async def test_same_state_twice_is_one_event(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room}", {})
        path = f"/rooms/{room}/state/org.example.state/"
        first = (await self.alice.ok("PUT", path, {"k": "v"}))["event_id"]
        self.assertEqual((await self.alice.ok("PUT", path, {"k": "v"}))["event_id"], first)
        changed = (await self.alice.ok("PUT", path, {"k": "w"}))["event_id"]
        self.assertNotEqual(changed, first)
        # The same content from someone else is a new event (a new sender).
        code, body = await self.bob.request("PUT", path, {"k": "w"})
        if code == 200:
            self.assertNotEqual(body["event_id"], changed)
        else:
            self.assertEqual(code, 403)
        page = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=b&limit=3")
        ids = [e["event_id"] for e in page["chunk"]]
        self.assertEqual(ids.count(first), 1)

    async def test_inviting_yourself_is_forbidden(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        code, body = await self.alice.request(
            "POST", f"/rooms/{room}/invite", {"user_id": self.alice.user_id}
        )
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))

    async def test_post_send_without_transaction_id(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        path = f"/rooms/{room}/send/m.room.message"
        body = {"msgtype": "m.text", "body": "no txn"}
        first = (await self.alice.ok("POST", path, body))["event_id"]
        second = (await self.alice.ok("POST", path, body))["event_id"]
        self.assertNotEqual(first, second)
        page = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=b&limit=2")
        self.assertEqual([e["event_id"] for e in page["chunk"]], [second, first])
        self.assertNotIn("transaction_id", page["chunk"][0]["unsigned"])


class MessagesFilterTestCase(ThreeUsersTestCase):
    """``/messages`` with a ``filter``: the page is filled with events that
    pass it, ``end`` goes on from the last event read and is absent once the
    history is exhausted; ``lazy_load_members`` gives the members of the
    chunk's senders in ``state``. ``/context`` likewise."""

    async def room_with_talk(self) -> tuple[str, list[str]]:
        room = await self.alice.create_room(preset="public_chat")
        for user in (self.bob, self.eve):
            await user.ok("POST", f"/join/{room}", {})
        sent = []
        for i in range(6):
            sent.append(await self.bob.send(room, f"b{i}"))
            await self.alice.ok("PUT", f"/rooms/{room}/send/org.example.noise/n{i}", {"n": i})
        sent.append(await self.eve.send(room, "from eve"))
        return room, sent

    async def test_filter_fills_the_page_and_end_goes_on(self) -> None:
        room, sent = await self.room_with_talk()
        only_messages = urllib.parse.quote(json.dumps({"types": ["m.room.message"]}))
        page = await self.alice.ok(
            "GET", f"/rooms/{room}/messages?dir=b&limit=3&filter={only_messages}"
        )
        self.assertEqual([e["event_id"] for e in page["chunk"]], sent[-1:-4:-1])
        seen = [e["event_id"] for e in page["chunk"]]
        while "end" in page:
            page = await self.alice.ok(
                "GET",
                f"/rooms/{room}/messages?dir=b&limit=3&filter={only_messages}&from={page['end']}",
            )
            seen += [e["event_id"] for e in page["chunk"]]
        self.assertEqual(seen, sent[::-1])
        # Forwards, from the start, by sender.
        from_bob = urllib.parse.quote(json.dumps({"senders": [self.bob.user_id]}))
        page = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=f&limit=4&filter={from_bob}")
        types = {e["type"] for e in page["chunk"]}
        self.assertEqual({e["sender"] for e in page["chunk"]}, {self.bob.user_id})
        self.assertLessEqual(types, {"m.room.member", "m.room.message"})
        self.assertEqual(len(page["chunk"]), 4)
        for bad, errcode in (("%7Bnope", "M_NOT_JSON"), ("%7B%22types%22%3A1%7D", "M_BAD_JSON")):
            code, body = await self.alice.request(
                "GET", f"/rooms/{room}/messages?dir=b&filter={bad}"
            )
            self.assertEqual((code, body["errcode"]), (400, errcode))

    async def test_lazy_loading_members(self) -> None:
        room, sent = await self.room_with_talk()
        lazy = urllib.parse.quote(json.dumps({"lazy_load_members": True}))
        page = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=b&limit=2&filter={lazy}")
        senders = {e["sender"] for e in page["chunk"]}
        self.assertEqual(senders, {self.alice.user_id, self.eve.user_id})
        self.assertEqual(
            sorted(e["state_key"] for e in page["state"]),
            sorted([self.alice.user_id, self.eve.user_id]),
        )
        self.assertEqual({e["type"] for e in page["state"]}, {"m.room.member"})
        plain = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=b&limit=2")
        self.assertEqual(plain["state"], [])
        # /context: the members of the senders of what it shows.
        context = await self.alice.ok(
            "GET", f"/rooms/{room}/context/{urllib.parse.quote(sent[2])}?limit=2&filter={lazy}"
        )
        shown = [context["event"], *context["events_before"], *context["events_after"]]
        self.assertEqual(
            sorted(e["state_key"] for e in context["state"]),
            sorted({e["sender"] for e in shown}),
        )
        whole = await self.alice.ok(
            "GET", f"/rooms/{room}/context/{urllib.parse.quote(sent[2])}?limit=2"
        )
        members = {e["state_key"] for e in whole["state"] if e["type"] == "m.room.member"}
        self.assertEqual(members, {self.alice.user_id, self.bob.user_id, self.eve.user_id})

    async def test_a_whole_initial_timeline_pages_back_over_itself(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        event_id = await self.alice.send(room, "hello")
        sync = await self.alice.sync()
        timeline = sync["rooms"]["join"][room]["timeline"]
        self.assertFalse(timeline["limited"])
        self.assertEqual(timeline["events"][0]["type"], "m.room.create")
        page = await self.alice.ok(
            "GET", f"/rooms/{room}/messages?dir=b&from={timeline['prev_batch']}"
        )
        self.assertEqual(
            [e["event_id"] for e in page["chunk"]],
            [e["event_id"] for e in timeline["events"]][::-1],
        )
        self.assertEqual(page["chunk"][0]["event_id"], event_id)
        last = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=b&from={page['end']}")
        self.assertEqual(last["chunk"], [])
        self.assertNotIn("end", last)


class ReadsThroughWorkersTestCase(DatabaseTestCase):
    """``/messages`` with a filter and lazy-loaded members, and ``/context``,
    answer the same from the main process and a reader, the room's events
    written by an events writer."""

    async def test_same_answers_on_main_and_a_reader(self) -> None:
        servers, clients, _ = start_cluster(
            self, self.test_db, workers=["writer", "reader"], stream_writers={"events": ["writer"]}
        )
        await eventually(lambda: all(hs.replication.connected for hs in servers.values()))
        alice = await ClientApi(self, clients["reader"].base_url).register("alice")
        bob = await ClientApi(self, clients["main"].base_url).register("bob")
        room = await alice.create_room(preset="public_chat")
        await bob.ok("POST", f"/join/{room}", {})
        sent = []
        for i in range(4):
            sent.append(await alice.send(room, f"a{i}"))
            sent.append(await bob.send(room, f"b{i}"))
        await eventually(
            lambda: all(
                hs.store.get_room_max_token() == servers["writer"].store.get_room_max_token()
                for hs in servers.values()
            ),
            what="every process caught up with the writer",
        )
        flt = urllib.parse.quote(json.dumps({"senders": [bob.user_id], "lazy_load_members": True}))
        answers = []
        for client in (alice, clients["main"].as_user(alice.token)):
            page = await client.ok("GET", f"/rooms/{room}/messages?dir=b&limit=3&filter={flt}")
            context = await client.ok(
                "GET", f"/rooms/{room}/context/{urllib.parse.quote(sent[3])}?limit=2&filter={flt}"
            )
            answers.append(
                (
                    [e["event_id"] for e in page["chunk"]],
                    [e["state_key"] for e in page["state"]],
                    page["end"],
                    [e["state_key"] for e in context["state"]],
                )
            )
        self.assertEqual(answers[0], answers[1])
        self.assertEqual(answers[0][0], [sent[7], sent[5], sent[3]])
        self.assertEqual(answers[0][1], [bob.user_id])
