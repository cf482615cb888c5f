"""Malformed requests to every servlet: wrong JSON types, missing fields, huge
ids, unicode, bad tokens and bad room ids. None may produce a 500 or a
traceback; every error is a JSON Matrix error."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.server import DatabaseTestCase

#: Keys the servlets read, so random bodies hit real fields with wrong types.
KNOWN_KEYS = [
    "username", "password", "auth", "type", "session", "device_id", "inhibit_login",
    "initial_device_display_name", "identifier", "user", "preset", "name", "topic", "invite",
    "visibility", "initial_state", "power_level_content_override", "creation_content",
    "is_direct", "room_version", "user_id", "reason", "typing", "timeout", "messages",
    "presence", "status_msg", "thread_id", "m.fully_read", "m.read", "room", "nonce", "mac",
    "admin", "body", "msgtype", "membership", "users", "events", "join_rule",
    "history_visibility", "room_alias_name",
]  # fmt: skip

ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 2**70, 1.5, "", "x" * 70_000, "ünï©ødé \u202e", "\x00",
    "@", "!", "@a:b", "!a:b", [], [None], {}, {"type": "m.login.dummy"}, {"a": [1, {"b": []}]},
    ["@x:test.local"] * 3, {"@u:test.local": {"*": {"a": 1}}}, {"@u:test.local": "x"},
]  # fmt: skip


def random_value(rng: random.Random, odd_values: Sequence[Any] = ODD_VALUES, depth: int = 0) -> Any:
    """A JSON value: mostly one of ``odd_values``, sometimes a small list or
    object (keyed by the servlets' own keys) of more of them."""
    if depth < 3 and rng.random() < 0.3:
        if rng.random() < 0.5:
            return [random_value(rng, odd_values, depth + 1) for _ in range(rng.randint(0, 3))]
        return {
            rng.choice(KNOWN_KEYS): random_value(rng, odd_values, depth + 1)
            for _ in range(rng.randint(0, 3))
        }
    return rng.choice(odd_values)


def random_bodies(seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    bodies = [b"", b"not json", b"[1, 2]", b"{", b"\xff\xfe\x00", b"NaN", b'"string"', b"{}"]
    bodies.append(b"[" * 10_000 + b"]" * 10_000)
    for _ in range(count):
        body = {k: random_value(rng) for k in rng.sample(KNOWN_KEYS, rng.randint(1, 6))}
        bodies.append(json.dumps(body).encode())
    return bodies


ENDPOINTS = [
    ("POST", "/register"),
    ("GET", "/register/available?username={odd}"),
    ("POST", "/login"),
    ("POST", "/logout"),
    ("GET", "/account/whoami"),
    ("POST", "/createRoom"),
    ("POST", "/join/{room}"),
    ("POST", "/rooms/{room}/join"),
    ("POST", "/rooms/{room}/invite"),
    ("POST", "/rooms/{room}/leave"),
    ("POST", "/rooms/{room}/kick"),
    ("POST", "/rooms/{room}/ban"),
    ("PUT", "/rooms/{room}/send/{odd}/{odd}"),
    ("PUT", "/rooms/{room}/state/{odd}/{odd}"),
    ("PUT", "/rooms/{room}/state/m.room.power_levels"),
    ("PUT", "/rooms/{room}/state/m.room.member/{user}"),
    ("GET", "/rooms/{room}/state/{odd}/{odd}"),
    ("GET", "/rooms/{room}/state"),
    ("GET", "/rooms/{room}/messages?from={odd}&dir={odd}&limit={odd}"),
    ("GET", "/rooms/{room}/members?membership={odd}"),
    ("GET", "/rooms/{room}/joined_members"),
    ("PUT", "/rooms/{room}/typing/{user}"),
    ("POST", "/rooms/{room}/receipt/{odd}/{odd}"),
    ("POST", "/rooms/{room}/read_markers"),
    ("GET", "/sync?since={odd}&timeout={odd}&filter={odd}&full_state={odd}"),
    ("POST", "/user/{user}/filter"),
    ("GET", "/user/{user}/filter/{odd}"),
    ("PUT", "/user/{user}/account_data/{odd}"),
    ("GET", "/user/{user}/account_data/{odd}"),
    ("PUT", "/user/{user}/rooms/{room}/account_data/{odd}"),
    ("GET", "/presence/{user}/status"),
    ("PUT", "/presence/{user}/status"),
    ("GET", "/devices"),
    ("GET", "/devices/{odd}"),
    ("PUT", "/sendToDevice/{odd}/{odd}"),
    ("GET", "/capabilities"),
    ("GET", "/joined_rooms"),
    ("POST", "/_synapse/admin/v1/register"),
]

ODD_SEGMENTS = ["x", "%ff%fe", "%F0%9F%98%80" * 100, "a" * 2000, "%00", "..", "%2F%2F", "-1"]


class MalformedRequestsTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        _, clients, _ = start_cluster(
            self, self.test_db, registration_shared_secret="s", limits={"max_sync_timeout_ms": 0}
        )
        self.alice = await ClientApi(self, clients["main"].base_url).register("alice")
        self.room = await self.alice.create_room(preset="public_chat")

    def check(self, method: str, path: str, code: int, body: Any) -> None:
        what = f"{method} {path[:120]} -> {code} {str(body)[:200]}"
        self.assertNotEqual(code, 500, what)
        if code == 401 and isinstance(body, dict) and "flows" in body:
            return  # the interactive-auth round of /register
        if code >= 400:
            self.assertIsInstance(body, dict, what)
            self.assertTrue(str(body.get("errcode", "")).startswith("M_"), what)
            self.assertNotIn("Traceback", json.dumps(body), what)

    async def test_every_servlet_survives_bad_bodies(self) -> None:
        for seed, (method, template) in enumerate(ENDPOINTS):
            path = template.format(room=self.room, user=self.alice.user_id, odd="x")
            for raw in random_bodies(seed, 12):
                code, body = await self.alice.request(method, path, raw=raw)
                self.check(method, path, code, body)

    async def test_every_servlet_survives_bad_path_and_query_values(self) -> None:
        for method, template in ENDPOINTS:
            for odd in ODD_SEGMENTS:
                for room in (self.room, "!nope:test.local", odd, "%23alias%3Atest.local"):
                    path = template.format(room=room, user=odd, odd=odd)
                    code, body = await self.alice.request(method, path, raw=b"{}")
                    self.check(method, path, code, body)

    async def test_bad_tokens_everywhere(self) -> None:
        for method, template in ENDPOINTS:
            path = template.format(room=self.room, user=self.alice.user_id, odd="x")
            for token in ("nonsense", "x" * 5000, "ünïcode"):
                code, body = await self.alice.request(
                    method, path, raw=b"{}", headers={"Authorization": [f"Bearer {token}"]}
                )
                self.check(method, path, code, body)

    async def test_null_body_is_not_an_empty_object(self) -> None:
        """Servlets that accept an empty body as ``{}`` still refuse JSON
        ``null`` (it used to be taken for an empty body and create a room)."""
        for path in ("/createRoom", f"/rooms/{self.room}/leave", f"/join/{self.room}"):
            code, body = await self.alice.request("POST", path, raw=b"null")
            self.assertEqual((code, body["errcode"]), (400, "M_BAD_JSON"), path)
        code, _ = await self.alice.request("POST", "/createRoom", raw=b"")
        self.assertEqual(code, 200)
        rooms = await self.alice.ok("GET", "/joined_rooms")
        self.assertEqual(len(rooms["joined_rooms"]), 2)

    async def test_nul_characters_are_refused(self) -> None:
        """NUL cannot be stored in PostgreSQL text: it is refused (400) where it
        enters, in a path segment, a query parameter, an id or a string field,
        instead of failing in the database with a 500 (found by the fuzzer)."""
        user = self.alice.user_id
        cases: list[tuple[str, str, Any]] = [
            ("PUT", f"/user/{user}/account_data/a%00b", {"x": 1}),
            ("GET", f"/user/{user}/filter/1%00", None),
            ("GET", "/devices/D%00", None),
            ("GET", "/rooms/!a%00b:test.local/state", None),
            ("GET", f"/rooms/{self.room}/messages?from=s1%00", None),
            ("GET", "/sync?since=%00", None),
            ("PUT", f"/rooms/{self.room}/send/m.room.message/t%00", {"body": "x"}),
            ("POST", f"/rooms/{self.room}/invite", {"user_id": "@a\u0000b:test.local"}),
            ("PUT", f"/presence/{user}/status", {"presence": "online", "status_msg": "\u0000"}),
            ("PUT", "/sendToDevice/m.test/t1", {"messages": {user: {"D\u0000": {"a": 1}}}}),
            ("POST", "/login", {"type": "m.login.password", "user": "a\u0000", "password": "p"}),
        ]
        for method, path, body in cases:
            code, answer = await self.alice.request(method, path, body)
            self.assertEqual(code, 400, f"{method} {path}: {answer}")
            self.assertIn(answer["errcode"], ("M_INVALID_PARAM", "M_BAD_JSON"), path)
