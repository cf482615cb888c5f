"""A hypothesis fuzzer against every federation endpoint the server serves
(docs/federation.md, "Hostile input"), and the flood bounds.

The endpoints are not listed by hand: they are read from the routes the
federation, key and federation media servlets install, so an endpoint added
later is fuzzed without touching this file. ``a.test`` (whose key ``b.test``
trusts) signs the requests; a share of them is unsigned, signed with a key
nobody published, or claims another origin. Bodies are transactions of
mutated PDUs (re-signed or not) and EDUs, mutated membership events,
``get_missing_events`` and key queries with hostile fields, arbitrary JSON
and bytes that are not JSON; paths and query parameters get odd ids and text.

For every answer: no 5xx, within :data:`ANSWER_BOUND_SECONDS`; JSON; an
error is an object with an ``M_`` errcode; no Python text. Afterwards
b.test still works (a valid PDU is accepted, a client reads the room), no
ERROR was logged, and the room's current state is what it was, but for
the state keys a fuzzed PDU named (a PDU may be valid by chance).

hypothesis generates the requests (synchronously: the server runs in this
process's reactor, which a ``@given`` body cannot wait on), then they are
sent in order. ``SYNAPSE_LITE_FED_FUZZ_EXAMPLES`` sets how many (default
:data:`DEFAULT_EXAMPLES`, well under a minute; CI runs the default).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import urllib.parse
from collections import Counter
from typing import Any, cast

import attr
import treq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet import defer, reactor

from synapse_lite.api.room_versions import RoomVersion
from synapse_lite.event_graph.hashing import event_id_of, sign_event
from synapse_lite.federation.auth import sign_request
from synapse_lite.federation.client import MAX_RESPONSE_BYTES
from synapse_lite.federation.crypto import SigningKey
from synapse_lite.federation.inbound import MAX_EDUS, MAX_PDUS
from synapse_lite.federation.pdu_checks import MAX_AUTH_EVENTS, MAX_PREV_EVENTS
from synapse_lite.http.server import JsonResource
from tests.federation.test_inbound_pdus import InboundPdusBase, ScriptedServer
from tests.federation.test_rooms import CAROL, q
from tests.harness.processes import NO_KEEPALIVE

_reactor = cast(Any, reactor)

#: Requests sent by default: about 10 s on a quiet machine.
DEFAULT_EXAMPLES = 1000
EXAMPLES = int(os.environ.get("SYNAPSE_LITE_FED_FUZZ_EXAMPLES", DEFAULT_EXAMPLES))
#: Longest any fuzzed request may take to be answered.
ANSWER_BOUND_SECONDS = 30.0
#: Markers of Python leaking into an answer.
PYTHON_TEXT = [b"Traceback", b'File "', b"Error:", b"Exception", b"<built-in", b"object at 0x"]

ODD_STRINGS = [
    "", "x", "\x00", "ünï©ødé \u202e", "a" * 300, "%00", "..", "/", "@", "!", "$", "#",
    "@carol:a.test", "@alice1:b.test", "!nope:b.test", "$nope", "$nope:a.test", "#a:b.test",
    "a.test", "b.test", "ed25519:x", "m.room.member", "m.room.create", "-1", "1e999",
]  # fmt: skip
ODD_SEGMENTS = ["x", "%ff%fe", "%F0%9F%98%80" * 20, "a" * 300, "%00", "..", "%2F", "-1", "é"]
#: Query parameters the federation servlets read.
QUERY_KEYS = [
    "event_id", "v", "limit", "ver", "suggested_only", "minimum_valid_until_ts", "user_id",
    "field", "room_alias", "since", "include_all_networks", "third_party_instance_id",
    "access_token", "timeout_ms", "allow_redirect", "width", "height", "method",
]  # fmt: skip
EDU_TYPES = [
    "m.typing", "m.receipt", "m.direct_to_device", "m.presence", "m.device_list_update",
    "m.signing_key_update", "org.example.fuzz",
]  # fmt: skip
PUBLIC_ROOMS_KEYS = [
    "limit", "since", "filter", "include_all_networks", "third_party_instance_id",
]  # fmt: skip
PDU_KEYS = [
    "type", "state_key", "content", "sender", "room_id", "prev_events", "auth_events",
    "depth", "origin_server_ts", "hashes", "signatures", "unsigned", "redacts", "origin",
    "event_id",
]  # fmt: skip
STATE_TYPES = ["m.room.member", "m.room.power_levels", "m.room.join_rules", "m.room.name",
               "m.room.create", "m.room.server_acl", "m.room.history_visibility"]  # fmt: skip

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from(ODD_STRINGS),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.one_of(st.text(max_size=8), st.sampled_from(PDU_KEYS)), inner, max_size=4
        ),
    ),
    max_leaves=12,
)
not_json = st.sampled_from(
    [b"not json", b"{", b"\xff\xfe", b"NaN", b"[1, 2]", b"null", b'{"a": Infinity}',
     b"[" * 5000 + b"]" * 5000, b'{"a": 1,}', b"\x00", b"12", b'"s"']
)  # fmt: skip


@attr.s(slots=True, auto_attribs=True)
class Route:
    method: str
    servlet: str
    template: str

    @property
    def groups(self) -> list[str]:
        return re.findall(r"\{(\w+)\}", self.template)

    @property
    def public(self) -> bool:
        """Served to anyone, signed or not (as the spec says): the key
        endpoints, ``/version``, and openid userinfo (a token's check)."""
        return self.servlet.startswith("keys") or self.servlet in (
            "federation.version",
            "federation.openid_userinfo",
        )


@attr.s(slots=True, auto_attribs=True)
class Request:
    """One request to send: ``body`` is JSON (signed over) or raw bytes."""

    route: Route
    path: str
    body: Any = None
    raw: bytes | None = None
    #: "good" (a.test's key), "none", "wrong_key", "other_origin".
    auth: str = "good"
    #: Whether the request must be refused.
    must_refuse: bool = False


def federation_routes(hs: Any, media_hs: Any) -> list[Route]:
    """Every federation and key route ``hs`` serves, and the federation
    media routes of ``media_hs`` (the media instance)."""
    resource = JsonResource("fuzz")
    hs.listeners.resources.federation(resource, ("federation", "keys"))
    media_hs.listeners.resources.media.register_federation(resource)
    routes = []
    for method, pattern, _, servlet in resource._routes:
        template = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", pattern.pattern)
        template = template.replace(r"\.", ".")
        assert not re.search(r"[()\[\]?*+\\]", template), template
        routes.append(Route(method.decode("ascii"), servlet, template))
    return routes


class FederationFuzzTestCase(InboundPdusBase):
    """b.test (main and ``fed1``, which serves the requests) fuzzed as
    a.test, whose carol is in alice's room."""

    timeout = 600

    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.alice, self.room_id, self.version = await self.joined_room()
        self.message = await self.event(self.room_id)
        self.message_id = event_id_of(self.version, self.message)
        results = await self.send("setup", [self.message])
        self.assertEqual(results, {self.message_id: {}})
        self.errors = _ErrorRecords()
        logging.getLogger("synapse_lite").addHandler(self.errors)
        self.addCleanup(logging.getLogger("synapse_lite").removeHandler, self.errors)
        self.stranger = SigningKey.generate()

    # What to send

    def ids(self) -> st.SearchStrategy[str]:
        return st.one_of(
            st.sampled_from(
                [self.room_id, self.message_id, CAROL, self.alice.user_id or "", *ODD_STRINGS]
            ),
            st.text(max_size=30),
        )

    def segment(self, group: str) -> st.SearchStrategy[str]:
        valid = {
            "room_id": self.room_id,
            "event_id": self.message_id,
            "user_id": CAROL,
            "server": "a.test",
            "key_id": self.a_key.key_id,
            "txn_id": "t",
            "media_id": "nope",
        }.get(group, "x")
        return st.one_of(
            st.just(_quote(valid)),
            st.sampled_from(ODD_SEGMENTS),
            self.ids().filter(bool).map(_quote),
        )

    def pdu(self) -> st.SearchStrategy[Any]:
        """A mutated copy of a valid message of carol's, re-signed by a.test
        or not (a bad signature, a hash that does not match)."""

        @st.composite
        def mutated(draw: Any) -> Any:
            pdu = dict(self.message)
            for key in draw(st.lists(st.sampled_from(PDU_KEYS), max_size=3)):
                choice = draw(st.integers(0, 5))
                if choice == 0:
                    pdu.pop(key, None)
                elif choice == 1 and key in ("prev_events", "auth_events"):
                    # Floods of references: beyond the spec's limits.
                    count = draw(st.sampled_from([0, 11, 21, 500, 5000]))
                    pdu[key] = [f"$flood{i}" for i in range(count)]
                elif choice == 2 and key == "type":
                    pdu["type"] = draw(st.sampled_from(STATE_TYPES))
                    pdu["state_key"] = draw(st.sampled_from(["", CAROL, "@x:a.test"]))
                else:
                    pdu[key] = draw(json_value)
            if draw(st.booleans()):
                pdu.pop("signatures", None)
                pdu.pop("hashes", None)
                try:
                    pdu = sign_event(self.version, pdu, "a.test", self.a_key)
                except Exception:
                    pass  # not signable: sent as it is
            return pdu

        return st.one_of(mutated(), json_value)

    def edu(self) -> st.SearchStrategy[Any]:
        content = st.one_of(
            json_value,
            st.fixed_dictionaries(
                {
                    "room_id": st.sampled_from([self.room_id, "!nope:b.test"]),
                    "user_id": st.sampled_from([CAROL, "@x:b.test"]),
                    "typing": json_value,
                    "sender": st.sampled_from([CAROL, "@x:b.test", "x"]),
                    "type": st.text(max_size=10),
                    "message_id": st.text(max_size=10),
                    "messages": st.one_of(
                        json_value,
                        st.just({self.alice.user_id: {"*": {"a": 1}}}),
                    ),
                }
            ),
            st.dictionaries(st.sampled_from([self.room_id, "!x:b.test"]), json_value, max_size=2),
        )
        return st.one_of(
            st.fixed_dictionaries({"edu_type": st.sampled_from(EDU_TYPES), "content": content}),
            json_value,
        )

    def transaction(self) -> st.SearchStrategy[Any]:
        return st.fixed_dictionaries(
            {
                "origin": st.sampled_from(["a.test", "a.test", "a.test", "b.test", 5]),
                "origin_server_ts": st.one_of(st.integers(0, 2**53), json_value),
                "pdus": st.one_of(st.lists(self.pdu(), max_size=4), json_value),
                "edus": st.one_of(st.lists(self.edu(), max_size=4), json_value),
            }
        )

    def body(self, route: Route) -> st.SearchStrategy[Any]:
        """A JSON body for ``route``, shaped like what it reads or not."""
        id_lists = st.one_of(
            st.lists(self.ids(), max_size=5),
            st.sampled_from([[f"$x{i}" for i in range(n)] for n in (51, 1000)]),
            json_value,
        )
        shaped = {
            "send": self.transaction(),
            "send_join": self.pdu(),
            "send_join_v1": self.pdu(),
            "send_leave": self.pdu(),
            "send_leave_v1": self.pdu(),
            "invite_v1": self.pdu(),
            "invite": st.fixed_dictionaries(
                {
                    "event": self.pdu(),
                    "room_version": st.sampled_from(["10", "11", "1", "nope"]),
                    "invite_room_state": json_value,
                }
            ),
            "get_missing_events": st.fixed_dictionaries(
                {
                    "earliest_events": id_lists,
                    "latest_events": id_lists,
                    "limit": st.one_of(st.integers(-5, 10**6), json_value),
                    "min_depth": st.one_of(st.integers(-5, 10**6), json_value),
                }
            ),
            "query": st.fixed_dictionaries(
                {
                    "server_keys": st.one_of(
                        json_value,
                        st.dictionaries(
                            st.sampled_from(["a.test", "b.test", "", "x" * 300]),
                            st.dictionaries(st.text(max_size=12), json_value, max_size=3),
                            max_size=3,
                        ),
                    )
                }
            ),
            "public_rooms": st.dictionaries(
                st.sampled_from(PUBLIC_ROOMS_KEYS),
                json_value,
                max_size=4,
            ),
        }.get(route.servlet.split(".")[-1], json_value)
        return shaped

    def request(self, route: Route) -> st.SearchStrategy[Request]:
        @st.composite
        def make(draw: Any) -> Request:
            path = route.template
            for group in route.groups:
                path = path.replace("{" + group + "}", draw(self.segment(group)), 1)
            params = draw(st.lists(st.sampled_from(QUERY_KEYS), max_size=3))
            if params:
                values = st.one_of(self.ids(), st.sampled_from(["-1", "99999999999999999999"]))
                path += "?" + "&".join(f"{k}={_quote(draw(values))}" for k in params)
            auth = draw(st.sampled_from(["good"] * 7 + ["none", "wrong_key", "other_origin"]))
            request = Request(
                route, path, auth=auth, must_refuse=auth != "good" and not route.public
            )
            if route.method in ("PUT", "POST"):
                if draw(st.integers(0, 9)) == 0:
                    request.raw = draw(not_json)
                    request.must_refuse = True
                else:
                    request.body = draw(self.body(route))
            return request

        return make()

    def generate(self, routes: list[Route]) -> list[Request]:
        """:data:`EXAMPLES` requests, spread evenly over ``routes``."""
        collected: list[Request] = []
        for route in routes:

            @settings(
                max_examples=max(1, EXAMPLES // len(routes)),
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(request=self.request(route))
            def draw(request: Request) -> None:
                collected.append(request)

            draw()
        return collected

    # Sending and checking

    async def send_request(self, request: Request) -> tuple[int, bytes, list[bytes]]:
        method, path = request.route.method, request.path
        data = request.raw
        headers: dict[bytes | str, list[bytes | str]] = {"Content-Type": ["application/json"]}
        if data is None and request.body is not None:
            data = json.dumps(request.body).encode()
        signed_body = request.body if request.raw is None else None
        key, origin = self.a_key, "a.test"
        if request.auth == "wrong_key":
            key = self.stranger
        elif request.auth == "other_origin":
            origin = "c.invalid"
        if request.auth != "none":
            try:
                header = sign_request(key, origin, "b.test", method, path, signed_body)
            except Exception:
                # A body canonical JSON refuses (floats): signed as empty.
                header = sign_request(key, origin, "b.test", method, path, None)
                request.must_refuse = not request.route.public
            headers["Authorization"] = [header]
        # Federation media is served by the media instance (main).
        instance = "main" if request.route.servlet.startswith("federation.media") else "fed1"
        base = self.b[instance].config.instance_map[instance].base_url
        response = await treq.request(
            method, base + path, data=data, headers=headers, pool=NO_KEEPALIVE
        )
        content = await treq.content(response)
        return response.code, content, response.headers.getRawHeaders(b"Content-Type") or []

    def check_answer(self, request: Request, code: int, content: bytes, types: list[bytes]) -> None:
        shown = request.raw[:80] if request.raw is not None else json.dumps(request.body)[:300]
        what = (
            f"{request.route.servlet} ({request.auth}): {request.route.method}"
            f" {request.path[:200]} {shown!r} -> {code} {content[:300]!r}"
        )
        self.assertLess(code, 500, what)
        for marker in PYTHON_TEXT:
            self.assertNotIn(marker, content, what)
        if request.route.servlet.startswith("federation.media") and code == 200:
            return  # a multipart answer
        self.assertEqual(types, [b"application/json"], what)
        body = json.loads(content)
        if code >= 400:
            self.assertIsInstance(body, dict, what)
            self.assertRegex(str(body.get("errcode")), r"^M_[A-Z_]+$", what)
            self.assertIsInstance(body.get("error"), str, what)
        elif request.must_refuse:
            self.fail(f"accepted: {what}")

    async def test_every_route_is_fuzzed(self) -> None:
        """The routes read from the servlets are the federation API we
        document."""
        servlets = {r.servlet for r in federation_routes(self.b["fed1"], self.b["main"])}
        for name in ("send", "event", "state", "state_ids", "event_auth", "backfill",
                     "get_missing_events", "make_join", "send_join", "send_join_v1",
                     "make_leave", "send_leave", "send_leave_v1", "invite", "invite_v1",
                     "query_profile", "query_directory", "public_rooms", "hierarchy",
                     "media_download", "media_thumbnail"):  # fmt: skip
            self.assertIn(f"federation.{name}", servlets)
        self.assertIn("keys", servlets)
        self.assertIn("keys.query", servlets)

    async def test_fuzz_every_federation_endpoint(self) -> None:
        store = self.b["main"].store
        state_before = await store.get_current_state_ids(self.room_id)
        routes = federation_routes(self.b["fed1"], self.b["main"])
        requests = self.generate(routes)
        codes: Counter[int] = Counter()
        slowest = 0.0
        started = time.monotonic()
        #: State keys fuzzed PDUs named: a PDU may be valid by chance.
        touched: set[tuple[str, str]] = set()
        for request in requests:
            pdus = request.body.get("pdus") if isinstance(request.body, dict) else None
            if request.route.servlet.endswith("send") and isinstance(pdus, list):
                for pdu in pdus:
                    if isinstance(pdu, dict) and isinstance(pdu.get("state_key"), str):
                        touched.add((str(pdu.get("type")), pdu["state_key"]))
            begun = time.monotonic()
            answer = defer.ensureDeferred(self.send_request(request))
            answer.addTimeout(ANSWER_BOUND_SECONDS, _reactor)
            code, content, types = await answer
            slowest = max(slowest, time.monotonic() - begun)
            codes[code] += 1
            self.check_answer(request, code, content, types)
        elapsed = time.monotonic() - started
        print(
            f"\nfederation fuzz: {len(requests)} requests to {len(routes)} routes in"
            f" {elapsed:.1f} s (slowest {slowest:.2f} s); codes {dict(sorted(codes.items()))}"
        )
        self.assertEqual(
            [r.getMessage()[:300] for r in self.errors.records], [], "errors were logged"
        )
        # The room is intact: its state but for what fuzzed PDUs named, and
        # b.test still takes a valid PDU and serves the room to its client.
        state_after = await store.get_current_state_ids(self.room_id)
        for key, event_id in state_before.items():
            if key not in touched:
                self.assertEqual(state_after.get(key), event_id, key)
        later = await self.event(self.room_id, content={"msgtype": "m.text", "body": "after"})
        later_id = event_id_of(self.version, later)
        results = await self.send("after-fuzz", [later])
        self.assertEqual(results, {later_id: {}})
        bodies = [e["content"].get("body") for e in await self.timeline(self.alice, self.room_id)]
        self.assertIn("after", bodies)


class FloodBoundsTestCase(InboundPdusBase):
    """What a server flooding us gets: refusals before any work, and
    answers of its that are cut to what we asked for."""

    async def transaction(self, pdus: list[Any], edus: list[Any]) -> tuple[int, Any]:
        return await self.federation(
            "PUT",
            "/_matrix/federation/v1/send/flood",
            {"origin": "a.test", "origin_server_ts": 1, "pdus": pdus, "edus": edus},
        )

    async def carols(self, alice: Any, room_id: str) -> list[Any]:
        """The messages of carol's that alice sees."""
        return [e for e in await self.timeline(alice, room_id) if e["sender"] == CAROL]

    async def test_too_many_pdus_or_edus_are_refused(self) -> None:
        _, room_id, _ = await self.joined_room()
        message = await self.event(room_id)
        code, answer = await self.transaction([message] * (MAX_PDUS + 1), [])
        self.assertEqual((code, answer["errcode"]), (400, "M_BAD_JSON"))
        edu = {"edu_type": "m.typing", "content": {}}
        code, answer = await self.transaction([], [edu] * (MAX_EDUS + 1))
        self.assertEqual((code, answer["errcode"]), (400, "M_BAD_JSON"))
        # At the limits, accepted.
        code, answer = await self.transaction([], [edu] * MAX_EDUS)
        self.assertEqual(code, 200, answer)

    async def test_a_body_over_the_cap_is_refused_before_parsing(self) -> None:
        # Not even JSON: refused for its size, never read as JSON.
        body = b"[" * (1_048_576 + 1)
        path = "/_matrix/federation/v1/send/huge"
        headers: dict[bytes | str, list[bytes | str]] = {
            "Authorization": [sign_request(self.a_key, "a.test", "b.test", "PUT", path, None)],
            "Content-Type": ["application/json"],
        }
        response = await treq.request(
            "PUT", self.urls["b.test"] + path, data=body, headers=headers, pool=NO_KEEPALIVE
        )
        answer = json.loads(await treq.content(response))
        self.assertEqual((response.code, answer["errcode"]), (413, "M_TOO_LARGE"))

    async def test_pdus_naming_too_many_references_are_refused(self) -> None:
        alice, room_id, version = await self.joined_room()
        many_prev = await self.event(room_id, prev_events=[f"$p{i}" for i in range(5000)])
        too_many = await self.event(room_id, prev_events=[f"$p{i}" for i in range(21)])
        many_auth = await self.event(room_id)
        many_auth["auth_events"] = [f"$a{i}" for i in range(MAX_AUTH_EVENTS + 1)]
        many_auth = sign_event(version, {k: v for k, v in many_auth.items()
                                         if k not in ("hashes", "signatures")},
                               "a.test", self.a_key)  # fmt: skip
        # Refused by the format checks, before their ids are computed: each
        # is answered under the id it claims (test_inbound_pdus.py).
        pdus = [
            {**many_prev, "event_id": "$many-prev"},
            {**too_many, "event_id": "$too-many"},
            {**many_auth, "event_id": "$many-auth"},
        ]
        results = await self.send("refs", pdus)
        self.assertIn("prev_events", results["$many-prev"]["error"])
        self.assertIn(f"1 to {MAX_PREV_EVENTS} prev_events", results["$too-many"]["error"])
        self.assertIn(f"at most {MAX_AUTH_EVENTS} auth_events", results["$many-auth"]["error"])
        self.assertEqual(await self.carols(alice, room_id), [])

    async def test_a_join_whose_content_is_not_an_object_is_refused(self) -> None:
        """Found by the fuzzer: computing the id of an event whose content
        is not an object raised AttributeError (a 500 from send_join)."""
        _, room_id = await self.room()
        code, made = await self.make_join(room_id)
        self.assertEqual(code, 200, made)
        odd_contents: list[Any] = [3, "join", [], None]
        for i, content in enumerate(odd_contents):
            event = {**made["event"], "content": content, "origin": "a.test"}
            code, answer = await self.federation(
                "PUT", f"/_matrix/federation/v2/send_join/{q(room_id)}/{q('$x')}", event
            )
            self.assertEqual((code, answer["errcode"]), (400, "M_BAD_JSON"), answer)
            # And in a transaction: that PDU refused under its claimed id.
            results = await self.send(f"content-{i}", [{**event, "event_id": "$c"}])
            self.assertIn("malformed", results["$c"]["error"])

    async def chain(self, room_id: str, version: RoomVersion, length: int) -> list[Any]:
        """``length`` messages of carol's, each the parent of the next, the
        first on the room's extremities."""
        first = await self.event(room_id, content={"msgtype": "m.text", "body": "m0"})
        chain = [first]
        bare = {k: v for k, v in first.items() if k not in ("hashes", "signatures")}
        for i in range(1, length):
            bare = {
                **bare,
                "content": {"msgtype": "m.text", "body": f"m{i}"},
                "prev_events": [event_id_of(version, chain[-1])],
                "depth": bare["depth"] + 1,
            }
            chain.append(sign_event(version, bare, "a.test", self.a_key))
        return chain

    async def test_a_flood_of_missing_events_is_cut_to_what_we_asked(self) -> None:
        alice, room_id, version = await self.joined_room()
        fake = await self.scripted_a()
        # A chain of 2,000 events, the newest sent alone: a.test answers
        # get_missing_events with all the others.
        chain = await self.chain(room_id, version, 2000)
        fake.missing = chain[:-1]
        begun = time.monotonic()
        newest = event_id_of(version, chain[-1])
        results = await self.send("deep", [chain[-1]])
        self.assertLess(time.monotonic() - begun, ANSWER_BOUND_SECONDS)
        # Asked once, for 10; the 10 taken do not close the gap, so the
        # newest event is refused rather than chased further back.
        self.assertEqual(len(fake.asked), 1)
        self.assertEqual(fake.asked[0]["limit"], 10)
        self.assertIn("error", results[newest])
        self.assertEqual(await self.carols(alice, room_id), [])

    async def test_hostile_missing_events_answers_are_survived(self) -> None:
        """Answers a hostile server gives to our get_missing_events: nested
        too deep for the JSON parser, over the answer cap, not JSON. Each is
        a failed fetch (the PDU refused), never a 500."""
        _, room_id, version = await self.joined_room()
        fake = await self.scripted_a(RawAnswers())
        chain = await self.chain(room_id, version, 3)
        for i, answer in enumerate(
            [
                b'{"events": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                b'{"events": ["' + b"x" * (MAX_RESPONSE_BYTES + 1) + b'"]}',
                b"\xff not json",
                b'{"events": {"not": "a list"}}',
            ]
        ):
            cast(RawAnswers, fake).answer = answer
            code, result = await self.federation(
                "PUT",
                f"/_matrix/federation/v1/send/hostile{i}",
                {"origin": "a.test", "origin_server_ts": 1, "pdus": [chain[-1]], "edus": []},
            )
            self.assertEqual(code, 200, result)
            # Refused as a fetch that gave nothing, not as a PDU whose
            # checking broke (which is logged as an error).
            refusal = result["pdus"][event_id_of(version, chain[-1])]["error"]
            self.assertIn("did not give them", refusal)


class RawAnswers(ScriptedServer):
    """Answers every POST (get_missing_events) with ``answer``, as is."""

    answer = b"{}"

    def render_POST(self, request: Any) -> bytes:
        request.setHeader(b"Content-Type", b"application/json")
        self.asked.append(json.loads(request.content.read()))
        return self.answer


def _quote(value: str) -> str:
    """Percent-encode a path segment or query value, keeping pre-encoded
    odd segments as they are."""
    if "%" in value and re.fullmatch(r"(%[0-9A-Fa-f]{2}|[^%])*", value):
        return value
    return urllib.parse.quote(value, safe="!@:$")


class _ErrorRecords(logging.Handler):
    """Collects ERROR records logged anywhere in synapse_lite."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


__all__ = ["q"]
