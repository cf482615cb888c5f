"""Unread counts in /sync and GET /notifications, on every process layout:
counts rise with messages from others, never with one's own, highlight on a
mention, and reset on a read receipt sent through a worker."""

from __future__ import annotations

from typing import Any

from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.server import DatabaseTestCase
from tests.harness.spec import assert_spec_response

#: Layout name -> (workers, stream_writers); clients talk to "reader" when
#: there is one (a process that writes nothing), otherwise to main.
LAYOUTS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "monolith": ([], {}),
    "default": (["reader", "persister1", "persister2"], {"events": ["persister1", "persister2"]}),
    "sharded": (
        ["reader", "persister1", "persister2", "stream_writer1"],
        {
            "events": ["persister1", "persister2"],
            "receipts": "stream_writer1",
            "push_rules": "stream_writer1",
            "account_data": "stream_writer1",
        },
    ),
}


def _counts(sync: dict[str, Any], room_id: str) -> dict[str, int] | None:
    room = sync["rooms"]["join"].get(room_id)
    return None if room is None else room["unread_notifications"]


class UnreadCountsTestCase(DatabaseTestCase):
    async def _scenario(self, layout: str) -> None:
        workers, writers = LAYOUTS[layout]
        _, clients, _ = start_cluster(self, self.test_db, workers=workers, stream_writers=writers)
        base = clients["reader" if "reader" in clients else "main"].base_url
        alice = await ClientApi(self, base).register("alice")
        bob = await ClientApi(self, base).register("bob")
        carol = await ClientApi(self, base).register("carol")
        room_id = await alice.create_room(preset="public_chat")
        await bob.ok("POST", f"/join/{room_id}")
        await carol.ok("POST", f"/join/{room_id}")
        first = await alice.sync()
        self.assertEqual(_counts(first, room_id), {"notification_count": 0, "highlight_count": 0})

        await bob.send(room_id, "hello everyone")
        await carol.ok(
            "PUT",
            f"/rooms/{room_id}/send/m.room.message/mention1",
            {"msgtype": "m.text", "body": "alice?", "m.mentions": {"user_ids": [alice.user_id]}},
        )
        last = await bob.send(room_id, "and another")
        await alice.send(room_id, "my own words")  # never counted for alice
        synced = await alice.sync(since=first["next_batch"])
        self.assertEqual(_counts(synced, room_id), {"notification_count": 3, "highlight_count": 1})
        # Bob's count has alice's and carol's messages, not his own.
        bob_sync = await bob.sync()
        self.assertEqual(
            _counts(bob_sync, room_id), {"notification_count": 2, "highlight_count": 0}
        )

        notifications = await alice.ok("GET", "/notifications")
        assert_spec_response(
            self, "notifications.yaml", "/notifications", "GET", 200, notifications
        )
        bodies = [n["event"]["content"]["body"] for n in notifications["notifications"]]
        self.assertEqual(bodies, ["and another", "alice?", "hello everyone"])
        self.assertFalse(any(n["read"] for n in notifications["notifications"]))
        highlights = await alice.ok("GET", "/notifications?only=highlight")
        self.assertEqual(
            [n["event"]["content"]["body"] for n in highlights["notifications"]], ["alice?"]
        )
        page = await alice.ok("GET", "/notifications?limit=2")
        self.assertEqual(len(page["notifications"]), 2)
        rest = await alice.ok("GET", f"/notifications?from={page['next_token']}")
        self.assertEqual(
            [n["event"]["content"]["body"] for n in rest["notifications"]], ["hello everyone"]
        )

        # The receipt goes through the reader to the receipts writer.
        await alice.ok("POST", f"/rooms/{room_id}/receipt/m.read/{last}", {})
        after = await alice.sync(since=synced["next_batch"])
        self.assertEqual(_counts(after, room_id), {"notification_count": 0, "highlight_count": 0})
        read = await alice.ok("GET", "/notifications")
        self.assertTrue(all(n["read"] for n in read["notifications"]))
        # Counting starts again after the receipt.
        await bob.send(room_id, "one more")
        again = await alice.sync(since=after["next_batch"])
        self.assertEqual(_counts(again, room_id), {"notification_count": 1, "highlight_count": 0})

    async def test_monolith(self) -> None:
        await self._scenario("monolith")

    async def test_default_layout(self) -> None:
        await self._scenario("default")

    async def test_sharded_layout(self) -> None:
        await self._scenario("sharded")

    async def test_bad_notifications_queries(self) -> None:
        _, clients, _ = start_cluster(self, self.test_db)
        alice = await ClientApi(self, clients["main"].base_url).register("alice")
        for query in ("from=abc", "from=-1", "limit=0", "limit=x", "only=all"):
            code, body = await alice.request("GET", "/notifications?" + query)
            self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"), query)
        empty = await alice.ok("GET", "/notifications")
        self.assertEqual(empty, {"notifications": []})
