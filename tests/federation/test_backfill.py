"""Backfill (docs/federation.md, "Backfill"): our user joins a room of
another server of ours and pages back past the join; the history before
it is fetched with ``/backfill``, checked, stored on the backfill stream
and read in order, on the process that asked and on the writer. Hostile
answers (forged signatures, events of another room) store nothing of what
they forged. SQLite and PostgreSQL (``SYNAPSE_LITE_TEST_DB``)."""

from __future__ import annotations

import copy
import urllib.parse
from typing import Any

from synapse_lite.event_graph.pdu import stored_as_pdu
from synapse_lite.federation.client import FederationClient
from synapse_lite.handlers.received_events import pdu_as_content
from tests.harness.client_api import ClientApi
from tests.harness.federation import TwoServers


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


async def page_back(user: ClientApi, room_id: str, limit: int = 7) -> list[dict[str, Any]]:
    """Every event ``/messages`` gives backwards from now, page by page."""
    events: list[dict[str, Any]] = []
    token = None
    for _ in range(50):
        path = f"/rooms/{q(room_id)}/messages?dir=b&limit={limit}"
        if token is not None:
            path += f"&from={q(token)}"
        page = await user.ok("GET", path)
        events.extend(page["chunk"])
        token = page.get("end")
        if token is None:
            return events
    raise AssertionError("pagination did not end")


def bodies(events: list[dict[str, Any]]) -> list[str]:
    return [e["content"]["body"] for e in events if e["type"] == "m.room.message"]


class BackfillTestCase(TwoServers):
    async def b_room_with_history(self, messages: int) -> tuple[ClientApi, str, list[str]]:
        alice = await self.client(self.b).register("alice")
        room_id = await alice.create_room(preset="public_chat", name="History")
        sent = [f"message {i}" for i in range(messages)]
        for body in sent:
            await alice.send(room_id, body)
        return alice, room_id, sent

    async def test_history_before_the_join_is_backfilled_in_order(self) -> None:
        _alice, room_id, sent = await self.b_room_with_history(25)
        carol = await self.client(self.a).register("carol")
        await carol.ok("POST", f"/join/{q(room_id)}?server_name=b.test", {})
        events = await page_back(carol, room_id)
        # Newest first: carol's join, then every message once, newest first.
        self.assertEqual(events[0]["type"], "m.room.member")
        self.assertEqual(events[0]["state_key"], carol.user_id)
        self.assertEqual(bodies(events), list(reversed(sent)))
        # Stored: a second reading asks nobody and reads the same.
        self.assertEqual(bodies(await page_back(carol, room_id, limit=100)), list(reversed(sent)))
        # Forwards from where a backward page ended: oldest first.
        page = await carol.ok("GET", f"/rooms/{q(room_id)}/messages?dir=b&limit=1000")
        forward = await carol.ok(
            "GET", f"/rooms/{q(room_id)}/messages?dir=f&limit=1000&from={q(page['end'])}"
        )
        self.assertEqual(bodies(forward["chunk"]), sent)
        self.assertEqual(forward["chunk"][-1]["state_key"], carol.user_id)
        # On the backfill stream: negative stream orderings, deepest nearest 0.
        store = self.a["main"].store
        stored = [await store.get_event(e["event_id"]) for e in events[1:]]
        orderings = [e.stream_ordering for e in stored if e is not None]
        self.assertTrue(all(o < 0 for o in orderings), orderings)
        self.assertEqual(orderings, sorted(orderings, reverse=True))
        # A backfilled event is read by id and in context like any other.
        middle = events[10]
        path = f"/rooms/{q(room_id)}/event/{q(middle['event_id'])}"
        self.assertEqual((await carol.ok("GET", path))["content"], middle["content"])
        context = await carol.ok(
            "GET", f"/rooms/{q(room_id)}/context/{q(middle['event_id'])}?limit=4"
        )
        self.assertEqual(bodies(context["events_before"]), bodies(events[11:13]))
        self.assertEqual(bodies(context["events_after"]), list(reversed(bodies(events[8:10]))))

    async def test_events_stored_meanwhile_are_left_out(self) -> None:
        """The writer checks which backfilled events are new before its
        transaction; the room's inbound PDUs may store some of them in
        between (seen end to end: a message sent just before the join
        reaches the joiner's server, whose get_missing_events stores the
        history its backfill is about to). Persisting events already held
        stores and returns nothing, and fails nothing."""
        _alice, room_id, _sent = await self.b_room_with_history(3)
        carol = await self.client(self.a).register("carol")
        await carol.ok("POST", f"/join/{q(room_id)}?server_name=b.test", {})
        events = await page_back(carol, room_id)
        store = self.a["main"].store
        held = [await store.get_event(e["event_id"]) for e in events[1:]]
        contents: list[tuple[Any, dict[str, Any]]] = [
            (pdu_as_content(stored_as_pdu(e)), {}) for e in held if e is not None
        ]
        self.assertEqual(len(contents), 3)
        self.assertEqual(await store.persist_backfilled_events(room_id, "b.test", contents), [])

    async def test_backfill_asked_on_a_worker_is_read_on_the_writer(self) -> None:
        c = self.make_server("c.test", ["w1"])
        self.connect(self.a, self.b, c)
        _alice, room_id, sent = await self.b_room_with_history(12)
        dave = await self.client(c, "w1").register("dave")
        await dave.ok("POST", f"/join/{q(room_id)}?via=b.test", {})
        self.assertEqual(bodies(await page_back(dave, room_id)), list(reversed(sent)))
        on_main = self.client(c).as_user(dave.token)
        self.assertEqual(bodies(await page_back(on_main, room_id, 5)), list(reversed(sent)))

    async def hostile_backfill(self, tamper: Any) -> tuple[ClientApi, str, list[str]]:
        """carol@a.test pages back in a room of b.test while ``tamper``
        changes b.test's ``/backfill`` answers (their ``pdus``) in flight;
        ``tamper(pdus, get_json)`` may ask b.test more itself."""
        _alice, room_id, sent = await self.b_room_with_history(6)
        carol = await self.client(self.a).register("carol")
        await carol.ok("POST", f"/join/{q(room_id)}?server_name=b.test", {})
        original = FederationClient.get_json

        async def get_json(client: Any, destination: str, path: str, signed: bool = True) -> Any:
            answer = await original(client, destination, path, signed)
            if f"/backfill/{q(room_id)}" in path:
                answer = copy.deepcopy(answer)

                async def ask(path: str) -> Any:
                    return await original(client, destination, path, signed)

                await tamper(answer["pdus"], ask)
            return answer

        self.patch(FederationClient, "get_json", get_json)
        return carol, room_id, sent

    async def test_forged_events_are_refused(self) -> None:
        async def tamper(pdus: list[dict[str, Any]], ask: Any) -> None:
            for pdu in pdus:
                if pdu.get("content", {}).get("body") == "message 3":
                    pdu["signatures"] = {"b.test": {"ed25519:a_bad": "Zm9yZ2Vk" * 10}}

        carol, room_id, _sent = await self.hostile_backfill(tamper)
        got = bodies(await page_back(carol, room_id))
        # The forged one is not stored; what came after it in the room is.
        self.assertNotIn("message 3", got)
        self.assertEqual(got[:2], ["message 5", "message 4"])

    async def test_events_of_another_room_are_refused(self) -> None:
        alice = await self.client(self.b).register("alice2")
        other = await alice.create_room(
            preset="public_chat",
            initial_state=[
                {
                    "type": "m.room.history_visibility",
                    "state_key": "",
                    "content": {"history_visibility": "world_readable"},
                }
            ],
        )
        await alice.send(other, "elsewhere")
        store = self.b["main"].store
        extremities = sorted(await store.get_forward_extremities(other))

        async def tamper(pdus: list[dict[str, Any]], ask: Any) -> None:
            v = "&".join(f"v={q(e)}" for e in extremities)
            elsewhere = await ask(f"/_matrix/federation/v1/backfill/{q(other)}?{v}&limit=5")
            self.assertTrue(elsewhere["pdus"])
            pdus.extend(elsewhere["pdus"])

        carol, room_id, sent = await self.hostile_backfill(tamper)
        got = bodies(await page_back(carol, room_id))
        self.assertEqual(got, list(reversed(sent)))
        a_store = self.a["main"].store
        self.assertIsNone(await a_store.get_room(other))
