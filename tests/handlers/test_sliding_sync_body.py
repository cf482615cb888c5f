"""The sliding sync request body (both shapes clients send), combining room
configs, state matching and the connection state's JSON (pure functions);
the per-room cache of room facts."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.trial import unittest

from synapse_lite.api.errors import SynapseError
from synapse_lite.handlers.sliding_sync.body import (
    MAX_TIMELINE_LIMIT,
    RequiredState,
    parse_body,
    parse_required_state,
)
from synapse_lite.handlers.sliding_sync.connection import (
    MAX_LAZY_MEMBERS,
    ConnectionState,
    RoomSent,
    state_matches,
    wanted_state_keys,
)
from synapse_lite.handlers.sliding_sync.handler import PerRoomCache
from synapse_lite.storage.change_tracker import StreamChangeTracker
from synapse_lite.tokens import RoomStreamToken

ME = "@me:x"


class BodyTestCase(unittest.TestCase):
    def test_element_x_shape(self) -> None:
        body = parse_body(
            {
                "conn_id": "room-list",
                "lists": {
                    "all": {
                        "ranges": [[0, 19], [40, 49]],
                        "timeline_limit": 1000,
                        "required_state": [["m.room.member", "$LAZY"], ["*", "*"]],
                        "filters": {"is_invite": False, "not_room_types": ["m.space", None]},
                    }
                },
                "extensions": {
                    "to_device": {"enabled": True, "since": "42"},
                    "typing": {"enabled": False},
                    "receipts": {"enabled": True, "lists": ["all"], "rooms": ["*"]},
                    "org.example": {"enabled": True},
                },
            },
            pos="abc",
            timeout_ms=30000,
        )
        self.assertEqual((body.conn_id, body.pos, body.timeout_ms), ("room-list", "abc", 30000))
        config = body.lists["all"]
        self.assertEqual(config.ranges, ((0, 19), (40, 49)))
        self.assertEqual(config.config.timeline_limit, MAX_TIMELINE_LIMIT)
        self.assertEqual(
            config.config.required_state,
            RequiredState(frozenset({(None, None)}), lazy_members=True),
        )
        self.assertEqual(config.filters.is_invite, False)
        self.assertEqual(config.filters.not_room_types, ("m.space", None))
        self.assertEqual(sorted(body.extensions), ["receipts", "to_device"])
        self.assertEqual(body.extensions["to_device"].since, 42)
        self.assertEqual(body.extensions["receipts"].lists, ("all",))
        self.assertIsNone(body.extensions["receipts"].rooms)

    def test_msc_shape(self) -> None:
        body = parse_body(
            {
                "pos": "p",
                "timeout": 5,
                "set_presence": "offline",
                "lists": {
                    "a": {
                        "range": [0, 9],
                        "timeline_limit": 3,
                        "required_state": {
                            "include": [{}, {"type": "m.room.member", "state_key": "$ME"}],
                            "exclude": [{"type": "m.room.create"}],
                            "lazy_members": True,
                        },
                        "filters": {"is_invited": True},
                    }
                },
            },
            pos="query-pos",
            timeout_ms=100,
        )
        self.assertEqual((body.pos, body.timeout_ms, body.set_presence), ("p", 5, "offline"))
        required = body.lists["a"].config.required_state
        self.assertEqual(required.include, {(None, None), ("m.room.member", "$ME")})
        self.assertEqual(required.exclude, {("m.room.create", None)})
        self.assertTrue(required.lazy_members)
        self.assertTrue(body.lists["a"].filters.is_invite)

    def test_bad_bodies_name_the_key(self) -> None:
        cases: dict[str, dict[str, Any]] = {
            "lists.a.range": {"lists": {"a": {"range": [1]}}},
            "lists.a.required_state.include[0]": {
                "lists": {"a": {"required_state": {"include": ["x"]}}}
            },
            "lists.a.filters.room_types": {"lists": {"a": {"filters": {"room_types": [1]}}}},
            "room_subscriptions.room": {"room_subscriptions": {"room": {}}},
            "extensions.e2ee.enabled": {"extensions": {"e2ee": {"enabled": 1}}},
            "timeout": {"timeout": -5},
        }
        for key, body in cases.items():
            with self.assertRaises(SynapseError) as raised:
                parse_body(body)
            self.assertEqual(raised.exception.code, 400)
            self.assertIn(f"'{key}'", raised.exception.msg)


class RequiredStateTestCase(unittest.TestCase):
    def test_matching(self) -> None:
        required = parse_required_state(
            [["m.room.member", "$ME"], ["m.room.name", "*"], ["*", "only"]], "rs"
        )
        self.assertTrue(state_matches(required, "m.room.member", ME, ME))
        self.assertFalse(state_matches(required, "m.room.member", "@other:x", ME))
        self.assertTrue(state_matches(required, "m.room.name", "any", ME))
        self.assertTrue(state_matches(required, "m.whatever", "only", ME))
        self.assertFalse(state_matches(required, "m.whatever", "", ME))
        keys = [("m.room.member", ME), ("m.room.topic", ""), ("m.room.name", "")]
        self.assertEqual(
            wanted_state_keys(required, keys, ME), [("m.room.member", ME), ("m.room.name", "")]
        )
        excluding = RequiredState(frozenset({(None, None)}), frozenset({("m.room.create", "")}))
        self.assertFalse(state_matches(excluding, "m.room.create", "", ME))
        self.assertTrue(state_matches(excluding, "m.room.topic", "", ME))

    def test_combining(self) -> None:
        lazy = RequiredState(frozenset({("m.room.name", "")}), lazy_members=True)
        members = RequiredState(frozenset({("m.room.member", None)}))
        self.assertTrue(lazy.combined(lazy).lazy_members)
        # Every member asked for by one config: lazy loading is off.
        both = lazy.combined(members)
        self.assertFalse(both.lazy_members)
        self.assertEqual(both.include, {("m.room.name", ""), ("m.room.member", None)})
        everything_but = RequiredState(frozenset({(None, None)}), frozenset({("a", "")}))
        self.assertEqual(everything_but.combined(lazy).exclude, frozenset())
        self.assertNotEqual(lazy.as_json(), both.as_json())
        self.assertEqual(both.as_json(), members.combined(lazy).as_json())


class ConnectionStateTestCase(unittest.TestCase):
    def test_round_trip_and_pruning(self) -> None:
        state = ConnectionState()
        first = state.add_token("s1")
        second = state.add_token("s2")
        state.rooms["!a:x"] = RoomSent(second, 5, [[], [], True], "join", True, ["@b:x"])
        state.list_counts["all"] = 3
        state.extensions = ["e2ee"]
        state.prune_tokens()
        self.assertNotIn(first, state.tokens)
        again = ConnectionState.from_json(state.to_json())
        self.assertEqual(again, state)
        for bad in ("", "[]", '{"t": {}}', '{"t":{},"n":0,"r":{"!a:x":[1]},"l":{},"e":[]}'):
            with self.assertRaises((ValueError, KeyError, TypeError, IndexError)):
                ConnectionState.from_json(bad)

    def test_lazy_members_are_capped(self) -> None:
        room = RoomSent(0, 1, [], "join", False)
        room.remember_lazy(f"@u{i}:x" for i in range(MAX_LAZY_MEMBERS + 10))
        room.remember_lazy(["@u15:x"])
        self.assertEqual(len(room.lazy), MAX_LAZY_MEMBERS)
        self.assertEqual(room.lazy[0], "@u10:x")


class PerRoomCacheTestCase(unittest.TestCase):
    def test_reads_only_rooms_not_cached_or_changed(self) -> None:
        cache: PerRoomCache[int] = PerRoomCache(-1)
        reads: list[list[str]] = []
        values = {"!a:x": 1, "!b:x": 2}

        async def read(rooms: list[str]) -> dict[str, int]:
            reads.append(rooms)
            return {r: values[r] for r in rooms if r in values}

        changes = StreamChangeTracker(lambda: RoomStreamToken(1))
        token = RoomStreamToken(5)

        def get(rooms: list[str]) -> dict[str, int]:
            got = defer.ensureDeferred(cache.get(rooms, token, changes, read))
            return self.successResultOf(got)

        self.assertEqual(get(["!a:x", "!b:x", "!c:x"]), {"!a:x": 1, "!b:x": 2, "!c:x": -1})
        self.assertEqual(get(["!a:x", "!c:x"]), {"!a:x": 1, "!c:x": -1})
        # A change at or before the token read at keeps the entry; after, not.
        changes.record("!a:x", "master", 5)
        changes.record("!b:x", "master", 6)
        values["!b:x"] = 3
        self.assertEqual(get(["!a:x", "!b:x"]), {"!a:x": 1, "!b:x": 3})
        self.assertEqual(reads, [["!a:x", "!b:x", "!c:x"], ["!b:x"]])
