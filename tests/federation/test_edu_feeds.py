"""The EDU feeds and inbound EDU parsing, in memory (docs/federation.md,
"EDUs"): which EDUs our users' changes make and where they go, what an
inbound EDU must look like, and a destination queue carrying ephemeral
EDUs beside PDUs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.internet import task
from twisted.trial import unittest

from synapse_lite.clock import Clock
from synapse_lite.federation.inbound_edus import (
    DroppedEdu,
    parse_presence,
    parse_receipts,
    parse_typing,
)
from synapse_lite.federation.sender.edus import (
    ReceiptsFeed,
    TypingFeed,
    other_servers,
    presence_item,
    receipt_content,
    typing_changes,
)
from synapse_lite.handlers.remote_devices import parse_device, parse_user_devices
from synapse_lite.replication.notifier import ReplicationNotifier
from synapse_lite.storage.databases.main.presence import UserPresenceState

ROOM = "!r:b.test"


class FakeTyping:
    """The typing handler's view: rooms -> typing users, with a serial."""

    def __init__(self) -> None:
        self.token = 0
        self.rooms: dict[str, list[str]] = {}
        self.changed_at: dict[str, int] = {}

    def set(self, room_id: str, users: list[str]) -> None:
        self.token += 1
        self.rooms[room_id] = users
        self.changed_at[room_id] = self.token

    def get_current_token(self) -> int:
        return self.token

    def rooms_seen(self) -> list[str]:
        return list(self.rooms)

    def get_typing_for_rooms(
        self, room_ids: list[str], since: int | None
    ) -> tuple[dict[str, list[str]], int]:
        return {
            r: self.rooms[r] for r in room_ids if since is None or self.changed_at[r] > since
        }, self.token


class FakeAcl:
    def __init__(self, content: dict[str, Any]) -> None:
        self.content = content


class FakeStore:
    def __init__(self) -> None:
        self.joined = {ROOM: frozenset({"@alice:b.test", "@carol:a.test", "@dan:c.test"})}
        self.receipts: list[tuple[int, str, str, str, str | None, dict[str, Any]]] = []
        #: room -> its current ``m.room.server_acl`` content.
        self.acls: dict[str, dict[str, Any]] = {}

    async def get_current_state_ids(self, room_id: str) -> dict[tuple[str, str], str]:
        return {("m.room.server_acl", ""): "$acl:" + room_id} if room_id in self.acls else {}

    async def get_event(self, event_id: str) -> FakeAcl:
        return FakeAcl(self.acls[event_id.removeprefix("$acl:")])

    async def get_users_in_room(self, room_id: str) -> frozenset[str]:
        return self.joined.get(room_id, frozenset())

    def get_receipts_position(self) -> int:
        return self.receipts[-1][0] if self.receipts else 0

    async def get_public_receipts_between(
        self, from_id: int, to_id: int, limit: int
    ) -> list[tuple[int, str, str, str, str | None, dict[str, Any]]]:
        return [r for r in self.receipts if from_id < r[0] <= to_id][:limit]


class Sent:
    def __init__(self) -> None:
        self.edus: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, destination: str, edus: Sequence[dict[str, Any]]) -> None:
        self.edus += [(destination, e) for e in edus]


class PureTestCase(unittest.TestCase):
    def test_typing_changes(self) -> None:
        edus = typing_changes(ROOM, frozenset({"@a:b", "@b:b"}), frozenset({"@b:b", "@c:b"}))
        self.assertEqual(
            [(e["content"]["user_id"], e["content"]["typing"]) for e in edus],
            [("@c:b", True), ("@a:b", False)],
        )
        self.assertEqual(typing_changes(ROOM, frozenset(), frozenset()), [])

    def test_receipt_content_keeps_the_latest_per_user(self) -> None:
        content = receipt_content(
            [
                (ROOM, "@a:b", "$1", None, {"ts": 1}),
                (ROOM, "@a:b", "$2", "$t", {"ts": 2, "secret": "x"}),
            ]
        )
        self.assertEqual(
            content,
            {
                ROOM: {
                    "m.read": {"@a:b": {"event_ids": ["$2"], "data": {"ts": 2, "thread_id": "$t"}}}
                }
            },
        )

    def test_other_servers(self) -> None:
        self.assertEqual(
            other_servers(["@a:b.test", "@c:a.test", "@d:a.test"], "b.test"), ["a.test"]
        )

    def test_parse_typing(self) -> None:
        good = {"room_id": ROOM, "user_id": "@c:a.test", "typing": True}
        self.assertEqual(parse_typing("a.test", good), (ROOM, "@c:a.test", True))
        for bad in (
            {**good, "user_id": "@c:evil.test"},
            {**good, "user_id": "nobody"},
            {**good, "typing": 1},
            {**good, "room_id": "#alias:a.test"},
            {**good, "room_id": "!" + "x" * 300},
        ):
            with self.subTest(bad=bad):
                self.assertRaises(DroppedEdu, parse_typing, "a.test", bad)

    def test_parse_receipts_skips_bad_parts(self) -> None:
        ok = {"event_ids": ["$e"], "data": {"ts": 3, "thread_id": "main"}}
        content: dict[str, Any] = {
            ROOM: {
                "m.read": {
                    "@c:a.test": ok,
                    "@x:other.test": ok,
                    "@d:a.test": {"event_ids": []},
                    "@e:a.test": {"event_ids": ["$e"], "data": {"ts": -1}},
                    "@f:a.test": {"event_ids": ["$e"], "data": {"thread_id": 5}},
                },
                "m.read.private": {"@c:a.test": ok},
            },
            "not a room": {"m.read": {"@c:a.test": ok}},
            "!other:b.test": "nope",
        }
        receipts = parse_receipts("a.test", content)
        self.assertEqual(
            [(r.room_id, r.user_id, r.event_id, r.thread_id, r.data) for r in receipts],
            [(ROOM, "@c:a.test", "$e", "main", {"ts": 3, "thread_id": "main"})],
        )

    def test_presence_both_ways_of_the_wire(self) -> None:
        state = UserPresenceState("@a:b.test", "online", last_active_ts=900, status_msg="hi")
        item = presence_item(state, 1_000)
        self.assertEqual(
            item,
            {
                "user_id": "@a:b.test",
                "presence": "online",
                "currently_active": False,
                "last_active_ago": 100,
                "status_msg": "hi",
            },
        )
        (parsed,) = parse_presence(
            "b.test", {"push": [item, {**item, "user_id": "@x:c.test"}]}, 5_000
        )
        self.assertEqual(
            (parsed.user_id, parsed.presence, parsed.last_active_ts), ("@a:b.test", "online", 4_900)
        )
        self.assertEqual(
            parse_presence("b.test", {"push": [{**item, "last_active_ago": 10_000}]}, 5_000), []
        )
        self.assertRaises(DroppedEdu, parse_presence, "b.test", {"push": {}}, 5_000)

    def test_parse_user_devices(self) -> None:
        keys = {"user_id": "@u:a.test", "device_id": "D1", "keys": {"ed25519:D1": "k"}}
        answer = {
            "user_id": "@u:a.test",
            "stream_id": 7,
            "devices": [
                {"device_id": "D1", "device_display_name": "phone", "keys": keys},
                {"device_id": "D2", "keys": {**keys, "device_id": "OTHER"}},
                {"device_id": 5},
                "junk",
            ],
            "master_key": {"user_id": "@someone:else", "usage": ["master"], "keys": {}},
        }
        stream_id, devices, cross = parse_user_devices("@u:a.test", answer)
        self.assertEqual(stream_id, 7)
        self.assertEqual(
            [(d.device_id, d.display_name) for d in devices], [("D1", "phone"), ("D2", None)]
        )
        self.assertEqual(devices[0].keys, keys)
        self.assertIsNone(devices[1].keys)  # keys of another device are left out
        self.assertEqual(cross, {})  # a key of another user is left out
        bad: Any
        for bad in (
            {**answer, "user_id": "@v:a.test"},
            {**answer, "stream_id": "7"},
            {**answer, "devices": {}},
            [],
        ):
            with self.subTest(bad=bad):
                self.assertRaises(ValueError, parse_user_devices, "@u:a.test", bad)
        self.assertIsNone(parse_device("@u:a.test", {"device_id": ""}))


class FeedsTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.reactor = task.Clock()
        self.clock = Clock(self.reactor)
        self.local_writes = ReplicationNotifier()
        self.store = FakeStore()
        self.sent = Sent()

    def typing_feed(self, typing: FakeTyping) -> TypingFeed:
        return TypingFeed(
            typing=typing,  # type: ignore[arg-type]
            store=self.store,  # type: ignore[arg-type]
            clock=self.clock,
            server_name="b.test",
            send_edus=self.sent,
            local_writes=self.local_writes,
        )

    def receipts_feed(self) -> ReceiptsFeed:
        return ReceiptsFeed(
            store=self.store,  # type: ignore[arg-type]
            clock=self.clock,
            server_name="b.test",
            send_edus=self.sent,
            local_writes=self.local_writes,
        )

    def test_typing_feed_sends_our_users_starts_and_stops(self) -> None:
        typing = FakeTyping()
        feed = self.typing_feed(typing)
        feed.start()
        typing.set(ROOM, ["@alice:b.test", "@carol:a.test"])
        self.local_writes.notify_replication()
        self.assertEqual(
            self.sent.edus,
            [
                (
                    d,
                    {
                        "edu_type": "m.typing",
                        "content": {"room_id": ROOM, "user_id": "@alice:b.test", "typing": True},
                    },
                )
                for d in ("a.test", "c.test")
            ],
        )
        # A remote user's change sends nothing; our user stopping does.
        self.sent.edus.clear()
        typing.set(ROOM, ["@alice:b.test"])
        feed.on_rows("main", typing.token, [])
        self.reactor.advance(0)
        self.assertEqual(self.sent.edus, [])
        # Still typing: said again every 20 s.
        self.reactor.advance(20)
        self.assertEqual(
            [(d, e["content"]["user_id"], e["content"]["typing"]) for d, e in self.sent.edus],
            [("a.test", "@alice:b.test", True), ("c.test", "@alice:b.test", True)],
        )
        self.sent.edus.clear()
        typing.set(ROOM, [])
        self.local_writes.notify_replication()
        self.assertEqual(
            [(d, e["content"]["typing"]) for d, e in self.sent.edus],
            [("a.test", False), ("c.test", False)],
        )
        self.sent.edus.clear()
        self.reactor.advance(20)
        self.assertEqual(self.sent.edus, [])
        feed.stop()

    def test_receipts_feed_batches_per_destination(self) -> None:
        feed = self.receipts_feed()
        self.store.receipts.append((1, ROOM, "@alice:b.test", "$old", None, {"ts": 1}))
        feed.start()  # starts after what is stored
        self.store.receipts += [
            (2, ROOM, "@alice:b.test", "$a", None, {"ts": 2}),
            (3, ROOM, "@carol:a.test", "$c", None, {"ts": 3}),  # not ours
            (4, ROOM, "@bob:b.test", "$b", None, {"ts": 4}),
        ]
        self.local_writes.notify_replication()
        self.assertEqual([d for d, _ in self.sent.edus], ["a.test", "c.test"])
        content = self.sent.edus[0][1]["content"]
        self.assertEqual(set(content[ROOM]["m.read"]), {"@alice:b.test", "@bob:b.test"})
        self.assertEqual(content[ROOM]["m.read"]["@alice:b.test"]["event_ids"], ["$a"])
        feed.stop()
        self.store.receipts.append((5, ROOM, "@alice:b.test", "$z", None, {"ts": 5}))
        self.local_writes.notify_replication()
        self.assertEqual(len(self.sent.edus), 2)

    def test_a_write_to_another_stream_starts_no_look(self) -> None:
        """Every local write wakes every feed: one whose stream has not
        moved reads nothing and starts no look (a send would otherwise pay
        four looks, issue 35); once it moves, the next wake-up looks."""
        looks: list[str] = []
        typing = FakeTyping()
        receipts = self.receipts_feed()
        typing_feed = self.typing_feed(typing)
        for name, feed in (("receipts", receipts), ("typing", typing_feed)):
            take = feed._take_batch

            async def counted(take: Any = take, name: str = name) -> bool:
                looks.append(name)
                return bool(await take())

            feed._take_batch = counted  # type: ignore[method-assign]
            feed.start()
        for _ in range(5):
            self.local_writes.notify_replication()
        self.assertEqual(looks, [])
        self.store.receipts.append((1, ROOM, "@alice:b.test", "$a", None, {"ts": 1}))
        self.local_writes.notify_replication()
        self.assertEqual(looks, ["receipts"])
        self.assertEqual([d for d, _ in self.sent.edus], ["a.test", "c.test"])
        typing.set(ROOM, ["@alice:b.test"])
        self.local_writes.notify_replication()
        self.assertEqual(looks[1:], ["typing"])
        receipts.stop()
        typing_feed.stop()

    def test_room_edus_skip_servers_the_room_acl_denies(self) -> None:
        """c.test is denied by ROOM's ACL: neither typing (first and
        renewed) nor receipts about ROOM go there; once the ACL allows it
        again they do. A room without ACL sends to everyone."""
        other = "!o:b.test"
        self.store.joined[other] = frozenset({"@alice:b.test", "@dan:c.test"})
        self.store.acls[ROOM] = {"allow": ["*"], "deny": ["c.test"]}
        typing = FakeTyping()
        typing_feed = self.typing_feed(typing)
        receipts_feed = self.receipts_feed()
        typing_feed.start()
        receipts_feed.start()
        typing.set(ROOM, ["@alice:b.test"])
        typing.set(other, ["@alice:b.test"])
        self.store.receipts += [
            (1, ROOM, "@alice:b.test", "$a", None, {"ts": 1}),
            (2, other, "@alice:b.test", "$o", None, {"ts": 2}),
        ]
        self.local_writes.notify_replication()
        got = [
            (
                d,
                e["edu_type"],
                [e["content"]["room_id"]] if "room_id" in e["content"] else sorted(e["content"]),
            )
            for d, e in self.sent.edus
        ]
        self.assertCountEqual(
            got,
            [
                ("a.test", "m.typing", [ROOM]),
                ("c.test", "m.typing", [other]),
                ("a.test", "m.receipt", [ROOM]),
                ("c.test", "m.receipt", [other]),
            ],
        )
        self.sent.edus.clear()
        self.reactor.advance(20)  # renewals follow the ACL too
        self.assertCountEqual(
            [(d, e["content"]["room_id"]) for d, e in self.sent.edus],
            [("a.test", ROOM), ("c.test", other)],
        )
        self.sent.edus.clear()
        self.store.acls[ROOM] = {"allow": ["*"]}
        self.store.receipts.append((3, ROOM, "@alice:b.test", "$b", None, {"ts": 3}))
        self.local_writes.notify_replication()
        self.assertEqual(sorted(d for d, _ in self.sent.edus), ["a.test", "c.test"])
        typing_feed.stop()
        receipts_feed.stop()
