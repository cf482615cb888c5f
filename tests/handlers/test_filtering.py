"""Filter definitions: what each part of the spec's ``Filter`` matches, and
``event_fields`` paths."""

from __future__ import annotations

import json
from typing import Any

from twisted.trial import unittest

from synapse_lite.api.errors import SynapseError
from synapse_lite.handlers.filtering import (
    CLIENT_FORMAT,
    DEFAULT_TIMELINE_LIMIT,
    MAX_TIMELINE_LIMIT,
    EventFilter,
    EventFormat,
    FilteringHandler,
    SyncFilter,
    field_path,
    only_fields,
    parse_filter,
    parse_room_event_filter,
)


class EventFilterTestCase(unittest.TestCase):
    def test_types_senders_rooms_and_urls(self) -> None:
        f = EventFilter.parse(
            {
                "types": ["m.room.*"],
                "not_types": ["m.room.member"],
                "not_senders": ["@spam:x"],
                "rooms": ["!a:x", "!b:x"],
                "not_rooms": ["!b:x"],
                "contains_url": True,
            },
            "room.timeline",
        )
        url = {"url": "mxc://x/y"}
        self.assertTrue(f.matches("m.room.message", "@u:x", "!a:x", url))
        self.assertFalse(f.matches("m.room.message", "@u:x", "!a:x", {"body": "no url"}))
        self.assertFalse(f.matches("m.room.message", "@u:x", "!a:x", {"url": 5}))
        self.assertFalse(f.matches("m.room.member", "@u:x", "!a:x", url))
        self.assertFalse(f.matches("org.other", "@u:x", "!a:x", url))
        self.assertFalse(f.matches("m.room.message", "@spam:x", "!a:x", url))
        self.assertFalse(f.matches("m.room.message", "@u:x", "!b:x", url))
        self.assertFalse(f.matches("m.room.message", "@u:x", "!c:x", url))
        self.assertFalse(f.allows_all)
        self.assertTrue(EventFilter().allows_all)
        # An empty list allows nothing, an absent one everything.
        self.assertFalse(EventFilter.parse({"types": []}, "t").matches("a", "@u:x"))
        self.assertTrue(EventFilter.parse({}, "t").matches("a", "@u:x"))

    def test_limits(self) -> None:
        self.assertEqual(parse_filter({}).timeline_limit, DEFAULT_TIMELINE_LIMIT)
        self.assertEqual(parse_filter({"room": {"timeline": {"limit": 0}}}).timeline_limit, 0)
        huge = parse_filter({"room": {"timeline": {"limit": 10**6}}})
        self.assertEqual(huge.timeline_limit, MAX_TIMELINE_LIMIT)

    def test_bad_values_name_the_key(self) -> None:
        cases = {
            "'room.state.lazy_load_members' must be true or false": {
                "room": {"state": {"lazy_load_members": 1}}
            },
            "'room.timeline.limit' must not be negative": {"room": {"timeline": {"limit": -1}}},
            "'room.timeline.limit' must be an integer": {"room": {"timeline": {"limit": True}}},
            "'room.rooms' must be a list of strings": {"room": {"rooms": [1]}},
            "'account_data.types' must be a list of strings": {"account_data": {"types": "x"}},
            "'room.timeline.rooms' holds 'not_a_room_id', not a room id": {
                "room": {"timeline": {"rooms": ["not_a_room_id"]}}
            },
            "'presence.not_senders' holds 'bob', not a user id": {
                "presence": {"not_senders": ["bob"]}
            },
            "'room.timeline' must be an object": {"room": {"timeline": "not_an_object"}},
        }
        for message, definition in cases.items():
            with self.assertRaises(SynapseError) as caught:
                parse_filter(definition)
            self.assertEqual(caught.exception.msg, message)
            self.assertEqual(caught.exception.code, 400)

    def test_room_lists_and_flags(self) -> None:
        f = parse_filter(
            {
                "room": {"not_rooms": ["!gone:x"], "include_leave": True},
                "event_format": "federation",
                "event_fields": ["content.body"],
            }
        )
        self.assertFalse(f.allows_room("!gone:x"))
        self.assertTrue(f.allows_room("!here:x"))
        self.assertTrue(f.include_leave)
        self.assertEqual(f.event_format, EventFormat(federation=True, fields=("content.body",)))
        self.assertEqual(parse_filter({}).event_format, CLIENT_FORMAT)

    def test_room_event_filter_carries_the_format(self) -> None:
        event_filter, event_format = parse_room_event_filter(
            '{"types": ["m.room.message"], "event_format": "federation", "event_fields": ["type"]}'
        )
        assert event_filter is not None
        self.assertEqual(event_filter.types, ("m.room.message",))
        self.assertEqual(event_format, EventFormat(federation=True, fields=("type",)))
        self.assertEqual(parse_room_event_filter(None), (None, CLIENT_FORMAT))
        for bad in ('{"event_format": "xml"}', '{"event_fields": [1]}'):
            with self.assertRaises(SynapseError) as caught:
                parse_room_event_filter(bad)
            self.assertEqual((caught.exception.code, caught.exception.errcode), (400, "M_BAD_JSON"))


class OnlyFieldsTestCase(unittest.TestCase):
    def test_paths(self) -> None:
        event = {
            "type": "m.room.message",
            "content": {"body": "hi", "m.relates_to": {"rel_type": "m.thread"}, "n": 1},
            "unsigned": {"age": 3},
        }
        self.assertEqual(
            only_fields(event, ("type", "content.body", "content.m\\.relates_to", "nope.x")),
            {
                "type": "m.room.message",
                "content": {"body": "hi", "m.relates_to": {"rel_type": "m.thread"}},
            },
        )
        self.assertEqual(only_fields(event, ("type.sub",)), {})
        self.assertEqual(only_fields(event, ()), {})

    def test_escapes(self) -> None:
        # The spec's appendix: ``\.`` a literal dot, ``\\`` a literal
        # backslash, a backslash before anything else is itself.
        self.assertEqual(field_path("content.m\\.relates_to"), ["content", "m.relates_to"])
        self.assertEqual(field_path("a\\\\.b"), ["a\\", "b"])
        self.assertEqual(field_path("a\\\\\\.b"), ["a\\.b"])
        self.assertEqual(field_path("a\\xb"), ["a\\xb"])
        self.assertEqual(field_path("a."), ["a", ""])
        event = {"content": {"a\\": {"b": 1}, "a.b": 2}}
        self.assertEqual(only_fields(event, ("content.a\\\\.b",)), {"content": {"a\\": {"b": 1}}})
        self.assertEqual(only_fields(event, ("content.a\\.b",)), {"content": {"a.b": 2}})


class _CountingFilterStore:
    """Stored filters in memory, counting the reads."""

    def __init__(self) -> None:
        self.filters: dict[tuple[str, int], dict[str, Any]] = {}
        self.reads = 0

    async def add_user_filter(self, user_id: str, filter_json: dict[str, Any]) -> int:
        filter_id = 1 + max((i for u, i in self.filters if u == user_id), default=-1)
        self.filters[(user_id, filter_id)] = filter_json
        return filter_id

    async def get_user_filter(self, user_id: str, filter_id: int) -> dict[str, Any] | None:
        self.reads += 1
        return self.filters.get((user_id, filter_id))


class SyncFilterOfParameterTestCase(unittest.TestCase):
    """``get_sync_filter``: a client's filter is read and parsed once."""

    async def test_a_stored_filter_is_read_once_per_user(self) -> None:
        store = _CountingFilterStore()
        handler = FilteringHandler(store)
        limited = {"room": {"timeline": {"limit": 7}}}
        filter_id = str(await handler.add_filter("@a:x", limited))
        first = await handler.get_sync_filter("@a:x", filter_id)
        self.assertEqual(first.timeline.limit, 7)
        self.assertIs(await handler.get_sync_filter("@a:x", filter_id), first)
        self.assertEqual(store.reads, 1)
        # Another user's filter of the same id is theirs, not @a:x's.
        with self.assertRaises(SynapseError) as e:
            await handler.get_sync_filter("@b:x", filter_id)
        self.assertEqual(e.exception.code, 404)
        # An unknown id is read again each time: it may be stored later.
        for _ in range(2):
            with self.assertRaises(SynapseError):
                await handler.get_sync_filter("@a:x", "5")
        self.assertEqual(store.reads, 4)
        store.filters[("@a:x", 5)] = {"room": {"timeline": {"limit": 3}}}
        self.assertEqual((await handler.get_sync_filter("@a:x", "5")).timeline.limit, 3)

    async def test_an_inline_filter_is_parsed_once_and_refusals_are_not_kept(self) -> None:
        handler = FilteringHandler(_CountingFilterStore())
        inline = '{"room": {"timeline": {"limit": 2}}}'
        parsed = await handler.get_sync_filter("@a:x", inline)
        self.assertEqual(parsed.timeline.limit, 2)
        self.assertIs(await handler.get_sync_filter("@a:x", inline), parsed)
        for _ in range(2):
            with self.assertRaises(SynapseError) as e:
                await handler.get_sync_filter("@a:x", '{"room": 5}')
            self.assertEqual(e.exception.code, 400)
        self.assertEqual(await handler.get_sync_filter("@a:x", None), SyncFilter())
        # A long inline filter is parsed every time, not kept.
        long_filter = json.dumps({"room": {"timeline": {"types": ["t" * 3000]}}})
        self.assertIsNot(
            await handler.get_sync_filter("@a:x", long_filter),
            await handler.get_sync_filter("@a:x", long_filter),
        )
