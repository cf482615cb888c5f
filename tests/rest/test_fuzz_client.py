"""A seeded fuzzer against every client endpoint the server routes.

The endpoints are not listed by hand: they are read from the routes that
``synapse_lite.rest.client.register_servlets`` installs, so a servlet added
later is fuzzed without touching this file. Each endpoint gets requests of
several kinds: no token, bad and revoked tokens, another user's token (on the
paths naming a room or user), bodies over ``limits.max_request_body_bytes``,
bodies that are not JSON, bad room/user/event ids, and JSON objects whose
known keys hold values of the wrong type.

For every answer: no 500; no Python text (traceback, ``File "``, exception
names) in the body; an error is a JSON object with an ``M_`` errcode; and a
request that was refused changed nothing in the database (every table is
hashed around it). Kinds that must always be refused (no or bad token, another
user, too large, not JSON, bad ids) are also asserted to be refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from typing import Any, cast

import attr
import treq
from twisted.internet import reactor
from twisted.web.client import HTTPConnectionPool

from synapse_lite.http.server import JsonResource
from synapse_lite.rest.client import register_servlets
from synapse_lite.server import HomeServer
from synapse_lite.streams.catalog import BUILTIN_STREAMS
from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.databases import test_engine_name
from tests.harness.server import DatabaseTestCase
from tests.rest.test_malformed import KNOWN_KEYS, random_value

_reactor = cast(Any, reactor)


def request_share() -> int:
    """Which of the generated requests are sent, as a divisor: all of them on
    SQLite; every fourth on PostgreSQL, where the servlets meet the same
    requests (what differs is the storage under the few that are accepted,
    and the digest that shows a refusal changed nothing), and the whole run
    would cost two minutes of CI."""
    return 1 if test_engine_name() == "sqlite" else 4


#: Small, so that "too large" bodies are cheap to send; the real default
#: (1 MiB) is covered by tests/rest/test_limits.py.
BODY_LIMIT = 4096

#: Servlets that answer without an access token.
UNAUTHENTICATED = {
    "versions",
    "register",
    "register_available",
    "login",
    "admin_register",
    "admin_server_version",
    "profile",
    "public_rooms",
}
#: Servlets that would end the fuzzing users' sessions if they succeeded:
#: fuzzed only with tokens that must be refused.
ENDS_SESSION = {"logout", "logout_all"}
#: Servlets whose room or user in the path may be anybody's: the spec lets
#: any user report any room or user.
ANYBODYS = {"report_room", "report_user"}

#: Markers of Python leaking into an answer.
PYTHON_TEXT = [b"Traceback", b'File "', b"Error:", b"Exception", b"<built-in", b"object at 0x"]

#: Tables that change whether or not a request is refused, by design:
#: ``user_ips`` records that a valid token was used (also by a request the
#: servlet then refuses), and ``stream_positions``/``instances`` are the
#: writers' periodic bookkeeping.
#: Tables that change on their own schedule: presence_stream, because the
#: presence writer marks users offline a grace period after their last sync;
#: destinations and device_federation_outbox, because the federation sender
#: keeps trying (and backing off from) the servers accepted to-device
#: messages were addressed to, and drops what they refuse.
VOLATILE_TABLES = {
    "user_ips",
    "stream_positions",
    "instances",
    "presence_stream",
    "destinations",
    "device_federation_outbox",
}
#: The sequences of streams all of whose tables are volatile.
#: What counts writes to the hashed tables (see ``database_digest``).
CHANGE_COUNTER = "fuzz_changes"

#: Not hashed: the volatile tables and the counter itself.
UNHASHED_TABLES = VOLATILE_TABLES | {CHANGE_COUNTER}

VOLATILE_SEQUENCES = {
    d.ids.sequence_name
    for d in BUILTIN_STREAMS
    if d.ids is not None and all(t.table in VOLATILE_TABLES for t in d.ids.tables)
}

BAD_ROOM_IDS = [
    "x", "!", "!a", "#alias:test.local", "@u:test.local", "!" + "a" * 300, "!a:b c", "%00",
    "!%20:test.local", " ", "!a:", "!:test.local", "!a:b/c",
]  # fmt: skip
#: Well-formed ids of rooms that do not exist: refused wherever the room must
#: exist (room account data may name any room, as in the spec).
UNKNOWN_ROOM_IDS = ["!nope:test.local", "!é:test.local", "!nope:other.example"]
ANY_ROOM_SERVLETS = {"room_account_data", "room_tags"}
#: Servlets whose GET shows anyone what it shows its owner (a user's public
#: profile): another user reading it is not refused.
READABLE_BY_OTHERS = {"profile"}
BAD_USER_IDS = [
    "x", "@", "@nobody:test.local", "@ALICE:test.local", "@alice:other.example", "!r:test.local",
    "@" + "a" * 300 + ":test.local", "@é:test.local", "%00", "@alice", "@:test.local",
]  # fmt: skip
BAD_EVENT_IDS = ["x", "$", "$nope:test.local", "!r:test.local", "$" + "a" * 300, "%00", "$é"]
ODD_SEGMENTS = ["x", "%ff%fe", "%F0%9F%98%80" * 20, "a" * 300, "%00", "..", "%2F", "-1", "é"]
BAD_TOKENS = ["nonsense", "syl_" + "A" * 43, "x" * 3000, "ünïcode", "", "Bearer", "syl_%00"]
ODD_QUERY = ["", "x", "-1", "99999999999999999999", "%ff", "true", "b", "f", "{}", "s0_0"]
#: Query parameters the servlets read, so odd values reach real parsing.
QUERY_KEYS = [
    "since", "timeout", "filter", "full_state", "set_presence", "from", "to", "dir", "limit",
    "membership", "not_membership", "username", "kind", "access_token",
]  # fmt: skip
ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 2**70, 1.5, "", "x" * 600, "ünï©ødé \u202e", "\x00", "@", "!",
    "@a:b", "!a:b", [], [None], {}, {"type": "m.login.dummy"}, {"a": [1, {"b": []}]},
    ["@x:test.local"], {"@u:test.local": {"*": {"a": 1}}}, {"@u:test.local": "x"}, -(2**63),
]  # fmt: skip


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Route:
    """One servlet route: its method, its path regex, and a path template
    with ``{group}`` where the regex has a named group."""

    method: str
    pattern: re.Pattern[str]
    servlet: str
    template: str

    @property
    def groups(self) -> list[str]:
        return re.findall(r"\{(\w+)\}", self.template)

    @property
    def authenticated(self) -> bool:
        return self.servlet not in UNAUTHENTICATED

    @property
    def reads_body(self) -> bool:
        return self.method in ("POST", "PUT")


def client_routes(hs: HomeServer) -> list[Route]:
    """Every route the client API serves, as installed by register_servlets."""
    resource = JsonResource("fuzz")
    register_servlets(hs.handlers, resource)
    routes = []
    for method, pattern, _, servlet in resource._routes:
        template = pattern.pattern.replace("(?:r0|v3)", "v3")
        template = re.sub(r"\(\?P<(\w+)>\[\^/\][+*]\)", r"{\1}", template)
        # Anything regex-like left would mean a route this file cannot render.
        assert not re.search(r"[()\[\]?*+\\]", template), template
        routes.append(Route(method.decode("ascii"), pattern, servlet, template))
    return routes


@attr.s(slots=True, auto_attribs=True)
class FuzzRequest:
    """One request to send, and whether it must be refused."""

    kind: str
    method: str
    path: str
    body: bytes
    token: str | None
    must_refuse: bool


@attr.s(slots=True, auto_attribs=True)
class Tally:
    """What the fuzzer sent and got."""

    sent: int = 0
    accepted: int = 0
    by_kind: Counter[str] = attr.Factory(Counter)
    by_code: Counter[int] = attr.Factory(Counter)
    by_servlet: Counter[str] = attr.Factory(Counter)


class _ErrorRecords(logging.Handler):
    """Collects ERROR records logged anywhere in synapse_lite."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class ClientFuzzTestCase(DatabaseTestCase):
    """Fuzzes every client route of one process on the real HTTP stack."""

    # About a minute alone on a quiet machine; several under the whole suite
    # on two loaded cores (a database digest follows every refused request).
    timeout = 400

    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        servers, clients, _ = start_cluster(
            self,
            self.test_db,
            registration_shared_secret="fuzz-secret",
            limits={"max_sync_timeout_ms": 0, "max_request_body_bytes": BODY_LIMIT},
        )
        self.hs = servers["main"]
        #: The last digest, with the change count it was taken at.
        self._digest: tuple[int, dict[str, str]] | None = None
        base = clients["main"].base_url
        self.alice = await ClientApi(self, base).register("alice")
        self.bob = await ClientApi(self, base).register("bob")
        # A token that was valid once: alice logs in on another device, out again.
        spare = await ClientApi(self, base).register("spare")
        await spare.ok("POST", "/logout")
        self.revoked = spare.token or ""
        self.private_room = await self.alice.create_room(preset="private_chat")
        self.public_room = await self.alice.create_room(preset="public_chat")
        self.event_id = await self.alice.send(self.private_room, "hello")
        self.base_url = base
        # One connection reused for every request: the point is the servlets,
        # not connection setup.
        self.pool = HTTPConnectionPool(_reactor, persistent=True)
        self.pool.maxPersistentPerHost = 1
        self.addCleanup(self.pool.closeCachedConnections)
        self.errors = _ErrorRecords()
        logging.getLogger("synapse_lite").addHandler(self.errors)
        self.addCleanup(logging.getLogger("synapse_lite").removeHandler, self.errors)

    # What to send

    def valid_value(self, group: str, rng: random.Random) -> str:
        """A path value the servlet accepts for ``alice``."""
        return {
            "room_id": rng.choice([self.private_room, self.public_room]),
            "user_id": self.alice.user_id or "",
            "event_id": self.event_id,
            "receipt_type": "m.read",
            "event_type": rng.choice(["m.room.message", "org.example.fuzz"]),
            "data_type": "org.example.fuzz",
            "state_key": rng.choice(["", "k"]),
            "txn_id": f"t{rng.getrandbits(40)}",
            "filter_id": "0",
            "device_id": self.alice.device_id or "",
        }.get(group, "x")

    def bad_value(self, group: str, route: Route, rng: random.Random) -> str | None:
        """An id the servlet must refuse, or None when ``group`` is not an id."""
        rooms = BAD_ROOM_IDS
        if route.servlet not in ANY_ROOM_SERVLETS:
            rooms = rooms + UNKNOWN_ROOM_IDS
        choices = {"room_id": rooms, "user_id": BAD_USER_IDS, "event_id": BAD_EVENT_IDS}
        if group not in choices:
            return None
        return rng.choice(choices[group])

    def path(self, route: Route, values: dict[str, str], rng: random.Random) -> str:
        path = route.template
        for group in route.groups:
            path = path.replace("{" + group + "}", _quote(values[group]), 1)
        if route.method == "GET" or rng.random() < 0.2:
            params = rng.sample(QUERY_KEYS, rng.randint(0, 3))
            query = "&".join(f"{k}={rng.choice(ODD_QUERY)}" for k in params if k != "timeout")
            # Never a long-poll: the cap is 0 here, and a timeout is fuzzed as a
            # value the parser must refuse or clamp.
            path += "?timeout=" + rng.choice(["0", "-1", "soon", "99999999"]) + "&" + query
        return path

    def wrong_types_body(self, rng: random.Random) -> bytes:
        body = {k: random_value(rng, ODD_VALUES) for k in rng.sample(KNOWN_KEYS, rng.randint(1, 5))}
        return json.dumps(body).encode()

    def not_json_body(self, rng: random.Random) -> bytes:
        return rng.choice(
            [
                b"not json", b"{", b"\xff\xfe\x00", b"NaN", b"[1, 2]", b'"string"', b"null",
                b"{'single': 'quotes'}", b'{"a": Infinity}', b"[" * 100 + b"]" * 100, b"12",
                b'{"a": 1,}', b"\x00\x00", "{\"ü\": 1}".encode("latin-1"), b'{"a": -}',
            ]
        )  # fmt: skip

    def requests_for(self, route: Route, seed: int) -> Iterator[FuzzRequest]:
        rng = random.Random(seed)
        alice, bob = self.alice.token, self.bob.token

        def valid_values() -> dict[str, str]:
            return {g: self.valid_value(g, rng) for g in route.groups}

        def make(kind: str, token: str | None, must_refuse: bool, **kw: Any) -> FuzzRequest:
            values = kw.get("values") or valid_values()
            body = kw.get("body", b"{}" if route.reads_body else b"")
            return FuzzRequest(
                kind, route.method, self.path(route, values, rng), body, token, must_refuse
            )

        auth = route.authenticated
        for _ in range(30):
            yield make("no_token", None, auth, body=self.wrong_types_body(rng))
        for _ in range(35):
            token = rng.choice([*BAD_TOKENS, self.revoked])
            yield make("bad_token", token, auth, body=self.wrong_types_body(rng))
        for _ in range(25):
            # More than the limit, in one or many chunks; never dispatched.
            size = rng.randint(BODY_LIMIT + 1, BODY_LIMIT * 8)
            body = (b'{"body": "' + b"x" * size + b'"}') if rng.random() < 0.5 else b"[" * size
            yield make("too_large", rng.choice([alice, bob, None]), True, body=body)
        if route.servlet in ENDS_SESSION:
            return
        if route.servlet not in ANYBODYS and any(g in ("room_id", "user_id") for g in route.groups):
            for _ in range(30):
                # Bob is in none of alice's rooms and may not act as alice.
                values = valid_values()
                if "room_id" in values:
                    values["room_id"] = self.private_room
                public = route.servlet in READABLE_BY_OTHERS and route.method == "GET"
                yield make(
                    "other_user", bob, not public, values=values, body=self.wrong_types_body(rng)
                )
        bad_groups = [g for g in route.groups if self.bad_value(g, route, rng) is not None]
        if bad_groups:
            for _ in range(50):
                values = valid_values()
                for group in rng.sample(bad_groups, rng.randint(1, len(bad_groups))):
                    values[group] = self.bad_value(group, route, rng) or ""
                yield make("bad_id", alice, True, values=values, body=self.wrong_types_body(rng))
        if route.reads_body:
            for _ in range(40):
                yield make("not_json", alice, True, body=self.not_json_body(rng))
        for _ in range(90):
            values = valid_values()
            for group in route.groups:
                if rng.random() < 0.2:
                    values[group] = rng.choice(ODD_SEGMENTS)
            yield make("wrong_types", rng.choice([alice, bob]), False, values=values,
                       body=self.wrong_types_body(rng))  # fmt: skip

    # Sending and checking

    async def send(self, request: FuzzRequest) -> tuple[int, bytes, list[bytes]]:
        headers: dict[bytes | str, list[bytes | str]] = {b"Content-Type": [b"application/json"]}
        if request.token is not None:
            headers[b"Authorization"] = [b"Bearer " + request.token.encode("utf-8")]
        response = await treq.request(
            request.method,
            self.base_url + request.path,
            data=request.body or None,
            headers=headers,
            pool=self.pool,
            reactor=_reactor,
        )
        content = await treq.content(response)
        types = response.headers.getRawHeaders(b"Content-Type") or []
        return response.code, content, types

    def check_answer(
        self, request: FuzzRequest, code: int, content: bytes, types: list[bytes]
    ) -> None:
        what = (
            f"{request.kind}: {request.method} {request.path[:150]} {request.body[:80]!r}"
            f" -> {code} {content[:300]!r}"
        )
        self.assertNotEqual(code, 500, what)
        self.assertLess(code, 500, what)
        for marker in PYTHON_TEXT:
            self.assertNotIn(marker, content, what)
        self.assertEqual(types, [b"application/json"], what)
        body = json.loads(content)
        if _refused(code, body):
            self.assertIsInstance(body, dict, what)
            self.assertRegex(str(body.get("errcode")), r"^M_[A-Z_]+$", what)
            self.assertIsInstance(body.get("error"), str, what)
        elif request.must_refuse:
            self.fail(f"accepted: {what}")

    async def database_digest(self) -> dict[str, str]:
        """A hash of every table's rows, but the volatile tables'.

        Hashing every table costs ~10 ms and runs ~14,000 times, so it is
        done again only when the database may have changed since the last
        one: triggers on every hashed table count row changes (a PostgreSQL
        sequence, which takes no lock and so cannot deadlock the server's
        transactions; a row on SQLite, which has one writer at a time). A
        count that moved means "maybe" (a rolled-back write counts too): the
        tables are hashed and compared as before; a count that did not move
        means nothing was written to them."""
        pool = self.hs.store.db_pool
        sqlite = pool.engine.name == "sqlite"

        def tables(txn: Any) -> list[str]:
            if sqlite:
                txn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            else:
                txn.execute(
                    "SELECT table_name FROM information_schema.tables"
                    " WHERE table_schema = current_schema()"
                )
            return [t for (t,) in sorted(txn.fetchall()) if t not in UNHASHED_TABLES]

        def install_change_counter(txn: Any) -> None:
            if sqlite:
                txn.execute(f"CREATE TABLE {CHANGE_COUNTER} (n INTEGER NOT NULL)")
                txn.execute(f"INSERT INTO {CHANGE_COUNTER} VALUES (0)")
                # A full-text index is a virtual table, which takes no
                # trigger, kept in shadow tables (``<name>_...``), where a
                # trigger crashes SQLite 3.40 on the index's next write. It is
                # still hashed whenever the counter moves, and it is written
                # only beside the events it indexes, which do count.
                txn.execute("SELECT name FROM sqlite_master WHERE sql LIKE 'CREATE VIRTUAL%'")
                virtual = [name for (name,) in txn.fetchall()]
                for table in tables(txn):
                    if any(table == v or table.startswith(v + "_") for v in virtual):
                        continue
                    for action in ("INSERT", "UPDATE", "DELETE"):
                        txn.execute(
                            f"CREATE TRIGGER {CHANGE_COUNTER}_{table}_{action} AFTER {action}"
                            f" ON {table} BEGIN UPDATE {CHANGE_COUNTER} SET n = n + 1; END"
                        )
                return
            txn.execute(f"CREATE SEQUENCE {CHANGE_COUNTER}")
            txn.execute(
                f"CREATE FUNCTION {CHANGE_COUNTER}() RETURNS trigger AS"
                f" $$ BEGIN PERFORM nextval('{CHANGE_COUNTER}'); RETURN NULL; END $$"
                " LANGUAGE plpgsql"
            )
            for table in tables(txn):
                txn.execute(
                    f"CREATE TRIGGER {CHANGE_COUNTER}_rows AFTER INSERT OR UPDATE OR DELETE"
                    f" ON {table} FOR EACH ROW EXECUTE FUNCTION {CHANGE_COUNTER}()"
                )
                txn.execute(
                    f"CREATE TRIGGER {CHANGE_COUNTER}_truncate AFTER TRUNCATE ON {table}"
                    f" FOR EACH STATEMENT EXECUTE FUNCTION {CHANGE_COUNTER}()"
                )

        def changes(txn: Any) -> int:
            if sqlite:
                txn.execute(f"SELECT n FROM {CHANGE_COUNTER}")
            else:
                # last_value with is_called: a sequence not yet used reads 1.
                txn.execute(f"SELECT last_value, is_called FROM {CHANGE_COUNTER}")
            row = txn.fetchone()
            return int(row[0]) if sqlite or row[1] else 0

        def digest(txn: Any) -> dict[str, str]:
            result: dict[str, str] = {}
            for table in tables(txn):
                txn.execute(f"SELECT * FROM {table}")
                found = txn.fetchall()
                if table == "sequences":
                    # SQLite's sequences are rows: those of volatile streams
                    # (presence, written in the background) move on their own.
                    found = [r for r in found if r[0] not in VOLATILE_SEQUENCES]
                rows = repr(sorted(map(repr, found))).encode()
                result[table] = hashlib.sha256(rows).hexdigest()
            return result

        if self._digest is None:
            await pool.runInteraction("fuzz_change_counter", install_change_counter)
        count = await pool.runInteraction("fuzz_changes", changes)
        if self._digest is None or count != self._digest[0]:
            self._digest = (count, await pool.runInteraction("fuzz_digest", digest))
        return self._digest[1]

    async def test_the_digest_sees_every_write(self) -> None:
        """The change counter the digest relies on moves with a write to any
        hashed table, so a refused request that wrote would still be seen."""
        before = await self.database_digest()
        self.assertIs(await self.database_digest(), before)
        await self.alice.ok(
            "PUT", f"/user/{self.alice.user_id}/account_data/org.example.fuzz", {"a": 1}
        )
        after = await self.database_digest()
        self.assertIn("account_data", [t for t in after if before.get(t) != after[t]])
        # A write straight to a table, past every code path of the server.
        await self.hs.store.db_pool.execute(
            "fuzz_direct_write", "DELETE FROM account_data WHERE user_id = ?", self.alice.user_id
        )
        self.assertNotEqual(await self.database_digest(), after)

    async def test_every_route_is_fuzzed(self) -> None:
        """The routes read from the servlets are the client API we document,
        so the fuzzer below really covers every endpoint."""
        routes = client_routes(self.hs)
        self.assertGreaterEqual(len(routes), 40)
        servlets = {r.servlet for r in routes}
        for name in ("sync", "send", "state", "messages", "members", "typing", "receipt",
                     "send_to_device", "account_data", "admin_register", "logout_all"):  # fmt: skip
            self.assertIn(name, servlets)
        # Every rendered template routes back to its own pattern.
        for route in routes:
            sample = route.template
            for group in route.groups:
                sample = sample.replace("{" + group + "}", "v")
            self.assertTrue(route.pattern.fullmatch(sample), route)

    async def test_fuzz_every_client_endpoint(self) -> None:
        routes = client_routes(self.hs)
        tally = Tally()
        started = time.monotonic()
        # The state every refused request must leave alone; re-read after any
        # request that was accepted (it may legitimately change things).
        before = await self.database_digest()
        share = request_share()
        for seed, route in enumerate(routes):
            for number, request in enumerate(self.requests_for(route, seed)):
                if number % share:
                    continue
                code, content, types = await self.send(request)
                tally.sent += 1
                tally.by_kind[request.kind] += 1
                tally.by_code[code] += 1
                tally.by_servlet[route.servlet] += 1
                self.check_answer(request, code, content, types)
                if _refused(code, json.loads(content)):
                    if not request.must_refuse:
                        # Refusals that might have followed an accepted request
                        # are checked one by one.
                        after = await self.database_digest()
                        changed = sorted(t for t in after if before.get(t) != after[t])
                        self.assertEqual(changed, [], f"refused but changed: {request}")
                else:
                    tally.accepted += 1
                    before = await self.database_digest()
            # Requests that must be refused are checked per route, in bulk.
            after = await self.database_digest()
            self.assertEqual(before, after, f"refused requests to {route.template} changed data")
        elapsed = time.monotonic() - started
        print(
            f"\nclient fuzz: {tally.sent} requests to {len(routes)} routes in {elapsed:.1f} s, "
            f"{tally.accepted} accepted; kinds {dict(tally.by_kind)}; "
            f"codes {dict(sorted(tally.by_code.items()))}"
        )
        self.assertEqual(self.errors.records, [], "errors were logged while fuzzing")
        self.assertGreaterEqual(tally.sent, 10_000 // share)
        # Every route got requests, and every kind was exercised.
        self.assertEqual(set(tally.by_servlet), {r.servlet for r in routes})
        self.assertGreater(tally.by_kind["too_large"], 500 // share)
        self.assertGreater(tally.by_kind["other_user"], 500 // share)
        # Accepted requests still happen (the fuzzer is not only hitting auth).
        self.assertGreater(tally.accepted, 50 // share)
        # The server still works for the fuzzed user afterwards.
        whoami = await self.alice.ok("GET", "/account/whoami")
        self.assertEqual(whoami["user_id"], self.alice.user_id)


def _quote(value: str) -> str:
    """Percent-encode a path segment, keeping pre-encoded odd segments as they are."""

    if "%" in value and re.fullmatch(r"(%[0-9A-Fa-f]{2}|[^%])*", value):
        return value
    return urllib.parse.quote(value, safe="!@:$")


def _refused(code: int, body: Any) -> bool:
    """Whether the server refused the request. The first step of interactive
    auth (401 with ``flows``) is a protocol step, not a refusal: it stores a
    session by design."""
    if code == 401 and isinstance(body, dict) and "flows" in body:
        return False
    return code >= 400
