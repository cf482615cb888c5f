"""History visibility applied per event, with the setting in force at each
event, to every read of room events (/messages, /sync, /context, /event,
/members and /state, the deprecated /events and initial syncs): for
members, former members, non-members and guests. Through an events writer
and a reader (each user on their own process); on SQLite and PostgreSQL
(``SYNAPSE_LITE_TEST_DB``)."""

from __future__ import annotations

import urllib.parse
from typing import Any

from tests.harness.client_api import ClientApi, caught_up, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase


def q(value: str | None) -> str:
    assert value is not None
    return urllib.parse.quote(value, safe="")


def bodies(events: list[dict[str, Any]]) -> list[str]:
    return [e["content"]["body"] for e in events if e["type"] == "m.room.message"]


#: For each setting, which of the messages sent before Bob was invited,
#: while invited and once joined he sees after joining.
EXPECTED = {
    "world_readable": ["before", "invited", "joined"],
    "shared": ["before", "invited", "joined"],
    "invited": ["invited", "joined"],
    "joined": ["joined"],
}


class HistoryVisibilityTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(
            self,
            self.test_db,
            workers=["reader", "writer"],
            stream_writers={"events": ["writer"]},
            allow_guest_access=True,
        )
        await eventually(lambda: all(hs.replication.connected for hs in self.servers.values()))
        self.alice = await ClientApi(self, clients["writer"].base_url).register("alice")
        self.bob = await ClientApi(self, clients["reader"].base_url).register("bob")
        self.eve = await ClientApi(self, clients["main"].base_url).register("eve")
        guest = await ClientApi(self, clients["reader"].base_url).ok(
            "POST", "/register?kind=guest", {}
        )
        self.guest = ClientApi(self, clients["reader"].base_url).as_user(guest["access_token"])

    async def caught_up(self) -> None:
        await caught_up(self.servers, "writer")

    async def room(self, setting: str) -> str:
        room = await self.alice.create_room(preset="public_chat")
        await self.alice.ok(
            "PUT", f"/rooms/{room}/state/m.room.guest_access", {"guest_access": "can_join"}
        )
        await self.alice.ok(
            "PUT",
            f"/rooms/{room}/state/m.room.history_visibility",
            {"history_visibility": setting},
        )
        return room

    async def messages(self, client: ClientApi, room: str) -> list[str]:
        await self.caught_up()
        return bodies((await client.ok("GET", f"/rooms/{room}/messages?dir=b&limit=50"))["chunk"])

    async def test_each_setting_for_a_member_on_every_read(self) -> None:
        for setting, expected in EXPECTED.items():
            room = await self.room(setting)
            sent = {"before": await self.alice.send(room, "before")}
            await self.alice.ok("POST", f"/rooms/{room}/invite", {"user_id": self.bob.user_id})
            sent["invited"] = await self.alice.send(room, "invited")
            await self.caught_up()
            await self.bob.ok("POST", f"/join/{room}", {})
            sent["joined"] = await self.alice.send(room, "joined")
            # /messages, oldest first.
            self.assertEqual(list(reversed(await self.messages(self.bob, room))), expected, setting)
            # /sync
            flt = q('{"room": {"timeline": {"limit": 50}}}')
            sync = await self.bob.sync(filter=flt)
            timeline = sync["rooms"]["join"][room]["timeline"]["events"]
            self.assertEqual(bodies(timeline), expected, setting)
            # /event and /context
            for name, event_id in sent.items():
                code, _ = await self.bob.request("GET", f"/rooms/{room}/event/{q(event_id)}")
                self.assertEqual(code, 200 if name in expected else 404, (setting, name))
            context = await self.bob.ok("GET", f"/rooms/{room}/context/{q(sent['joined'])}")
            self.assertEqual(bodies(context["events_before"]), expected[:-1][::-1], setting)
            # The deprecated room initial sync.
            snapshot = await self.bob.ok("GET", f"/rooms/{room}/initialSync?limit=50")
            self.assertEqual(bodies(snapshot["messages"]["chunk"]), expected, setting)
            self.assertEqual(snapshot["membership"], "join")

    async def test_settings_change_on_their_own_boundaries(self) -> None:
        """joined, then invited, then shared: Bob, joining last, sees the
        messages of the shared period and the setting events whose before
        or after lets him."""
        room = await self.room("joined")
        await self.alice.send(room, "1")
        await self.alice.ok(
            "PUT",
            f"/rooms/{room}/state/m.room.history_visibility",
            {"history_visibility": "invited"},
        )
        await self.alice.send(room, "2")
        await self.alice.ok(
            "PUT",
            f"/rooms/{room}/state/m.room.history_visibility",
            {"history_visibility": "shared"},
        )
        await self.alice.send(room, "3")
        await self.caught_up()
        await self.bob.ok("POST", f"/join/{room}", {})
        sync = await self.bob.sync(filter=q('{"room": {"timeline": {"limit": 50}}}'))
        timeline = sync["rooms"]["join"][room]["timeline"]["events"]
        last = [
            (e["type"], e["content"].get("history_visibility", e["content"].get("body")))
            for e in timeline[-4:]
        ]
        self.assertEqual(
            last,
            [
                ("m.room.history_visibility", "joined"),
                ("m.room.history_visibility", "shared"),
                ("m.room.message", "3"),
                ("m.room.member", None),
            ],
        )
        self.assertEqual(await self.messages(self.bob, room), ["3"])

    async def test_former_member_reads_up_to_the_leave(self) -> None:
        room = await self.room("joined")
        await self.bob.ok("POST", f"/join/{room}", {})
        await self.alice.send(room, "with bob")
        await self.caught_up()
        await self.bob.ok("POST", f"/rooms/{room}/leave", {})
        after = await self.alice.send(room, "after bob")
        await self.alice.ok("PUT", f"/rooms/{room}/state/m.room.topic", {"topic": "later"})
        self.assertEqual(await self.messages(self.bob, room), ["with bob"])
        code, _ = await self.bob.request("GET", f"/rooms/{room}/event/{q(after)}")
        self.assertEqual(code, 404)
        members = await self.bob.ok("GET", f"/rooms/{room}/members")
        mine = [e for e in members["chunk"] if e["state_key"] == self.bob.user_id]
        self.assertEqual(mine[0]["content"]["membership"], "leave")
        state = await self.bob.ok("GET", f"/rooms/{room}/state")
        self.assertNotIn("m.room.topic", {e["type"] for e in state})
        snapshot = await self.bob.ok("GET", f"/rooms/{room}/initialSync")
        self.assertEqual(snapshot["membership"], "leave")
        self.assertEqual(bodies(snapshot["messages"]["chunk"]), ["with bob"])
        self.assertEqual((snapshot["presence"], snapshot["receipts"]), ([], []))
        self.assertNotIn("m.room.topic", {e["type"] for e in snapshot["state"]})

    async def test_non_members_and_guests_read_only_world_readable_periods(self) -> None:
        room = await self.room("shared")
        await self.alice.send(room, "private")
        for reader in (self.eve, self.guest):
            for path in ("messages", "state", "members", "initialSync"):
                code, body = await reader.request("GET", f"/rooms/{room}/{path}")
                self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"), path)
            code, _ = await reader.request("GET", f"/events?room_id={q(room)}&timeout=0")
            self.assertEqual(code, 403)
        await self.alice.ok(
            "PUT",
            f"/rooms/{room}/state/m.room.history_visibility",
            {"history_visibility": "world_readable"},
        )
        await self.alice.send(room, "public")
        for reader in (self.eve, self.guest):
            self.assertEqual(await self.messages(reader, room), ["public"])
            snapshot = await reader.ok("GET", f"/rooms/{room}/initialSync")
            self.assertNotIn("membership", snapshot)
            self.assertEqual(
                [e["type"] for e in snapshot["messages"]["chunk"]],
                ["m.room.history_visibility", "m.room.message"],
            )
            self.assertIn(
                self.alice.user_id, {e["state_key"] for e in snapshot["state"] if e["state_key"]}
            )
            members = await reader.ok("GET", f"/rooms/{room}/members")
            self.assertEqual({e["state_key"] for e in members["chunk"]}, {self.alice.user_id})
        # A guest cannot send without joining; joined (guest access), it
        # sees what a member sees.
        code, body = await self.guest.request(
            "PUT", f"/rooms/{room}/send/m.room.message/t1", {"msgtype": "m.text", "body": "x"}
        )
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        await self.guest.ok("POST", f"/rooms/{room}/join", {})
        await self.guest.ok(
            "PUT", f"/rooms/{room}/send/m.room.message/t2", {"msgtype": "m.text", "body": "hi"}
        )
        self.assertEqual(
            list(reversed(await self.messages(self.alice, room))), ["private", "public", "hi"]
        )
        # Joining reveals the shared period before it too.
        self.assertEqual(
            list(reversed(await self.messages(self.guest, room))), ["private", "public", "hi"]
        )
