"""Every internal call's request and response bodies through the one codec.

The calls are found by importing every module of the package and collecting
the ``InternalCall`` declarations, so a call added anywhere is covered
without touching this file. For each body type: every field declares its
kind; an instance built from the kinds' examples goes through JSON and back
unchanged; a body with a field missing, or of any other JSON type, is
either taken (an optional field, or a value of another type its kind
accepts) or refused with a 4xx naming the field, never another exception;
keys a type does not know are ignored, as they were before the codec. Then
every call goes over real HTTP between two ``InternalCalls``, and a
malformed body is refused there with a 400 naming the field."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from typing import Any, cast

import attr
import treq
from twisted.internet import reactor
from twisted.trial import unittest
from twisted.web.client import HTTPConnectionPool

import synapse_lite
from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.clock import Clock
from synapse_lite.codec.kinds import ABSENT, DecodeContext, FieldKind
from synapse_lite.codec.objects import (
    Nested,
    decode_object,
    encode_object,
    example_of,
    object_codec,
)
from synapse_lite.config.homeserver import InstanceLocation, read_homeserver_config
from synapse_lite.events import EventSpec
from synapse_lite.http.server import make_site
from synapse_lite.replication.http.calls import PREFIX, InternalCall, InternalCalls

_reactor = cast(Any, reactor)

SERVER_NAME = "test.local"
CONTEXT = DecodeContext(SERVER_NAME)

#: Values of every JSON type (and nesting) a malformed body may hold instead.
OTHER_VALUES: list[Any] = [None, True, 12345, -1, 1.5, "text", "", [], ["x"], [[1]], {}, {"k": 1}]


def declared_calls() -> dict[str, InternalCall[Any, Any]]:
    """Every ``InternalCall`` declared at module level anywhere in the package."""
    calls: dict[str, InternalCall[Any, Any]] = {}
    for info in pkgutil.walk_packages(synapse_lite.__path__, "synapse_lite."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, InternalCall):
                other = calls.setdefault(value.name, value)
                assert other is value, f"two calls are named {value.name!r}"
    return calls


CALLS = declared_calls()


def _nested_types(kind: FieldKind) -> list[type[Any]]:
    """The wire types a kind holds (an event of a ``send_events`` request)."""
    if isinstance(kind, Nested):
        return [kind.cls]
    inner = getattr(kind, "kind", None)
    return _nested_types(inner) if isinstance(inner, FieldKind) else []


def body_types() -> dict[type[Any], list[str]]:
    """Each request and response type, and each type nested in one, with
    the calls using it."""
    types: dict[type[Any], list[str]] = {}
    for call in CALLS.values():
        types.setdefault(call.request, []).append(f"{call.name} request")
        types.setdefault(call.response, []).append(f"{call.name} response")
    for cls, uses in list(types.items()):
        for _, _, kind in object_codec(cls).fields:
            for nested in _nested_types(kind):
                types.setdefault(nested, []).extend(uses)
    return types


def names(message: str, key: str) -> bool:
    """Whether an error message names the field ``key`` (or a key inside it,
    as in ``'data.url'``)."""
    return re.search(f"'{re.escape(key)}['.]", message) is not None


def through_json(body: dict[str, Any]) -> Any:
    return json.loads(json.dumps(body))


class CallBodiesTestCase(unittest.TestCase):
    def test_the_calls_are_found(self) -> None:
        # The calls of every module that declares some, at the time of writing.
        for name in ("send_events", "add_account_data", "register_device", "upload_signatures"):
            self.assertIn(name, CALLS)
        self.assertGreaterEqual(len(CALLS), 19)
        # The events a send_events request carries are checked field by field too.
        self.assertIn(EventSpec, body_types())

    def test_every_body_round_trips_through_json(self) -> None:
        for cls, uses in body_types().items():
            with self.subTest(body=cls.__name__, uses=uses):
                example = example_of(cls, CONTEXT)
                body = through_json(encode_object(example))
                self.assertIsInstance(body, dict)
                self.assertEqual(decode_object(cls, body, CONTEXT), example)
                # And again: the decoded instance encodes to the same body.
                self.assertEqual(through_json(encode_object(example)), body)
                # A key the type does not know is ignored (a newer process
                # may send more).
                self.assertEqual(
                    decode_object(cls, {**body, "added_by_a_later_version": 1}, CONTEXT), example
                )

    def test_malformed_fields_are_refused_naming_the_field(self) -> None:
        refusals = 0
        for cls in body_types():
            body = through_json(encode_object(example_of(cls, CONTEXT)))
            for name, key, kind in object_codec(cls).fields:
                with self.subTest(body=cls.__name__, field=key):
                    refused = 0
                    for value in [ABSENT, *OTHER_VALUES]:
                        malformed = dict(body)
                        if value is ABSENT:
                            del malformed[key]
                        else:
                            malformed[key] = value
                        try:
                            decoded = decode_object(cls, malformed, CONTEXT)
                        except SynapseError as e:
                            self.assertIn(e.code, (400, 413), (key, value, e.msg))
                            self.assertTrue(names(e.msg, key), (value, e.msg))
                            refused += 1
                        else:
                            # Taken: the value is what the kind made of it.
                            expected = kind.decode(value, key, CONTEXT)
                            self.assertEqual(getattr(decoded, name), expected, value)
                    # Every field refuses something: there is no unchecked field.
                    self.assertGreater(refused, 0, f"{cls.__name__}.{key} takes anything")
                    refusals += refused
        self.assertGreater(refusals, 100)

    def test_required_fields_are_missing_when_absent(self) -> None:
        """A required field's absence is a 400 whose message names it; the
        optional ones say so by decoding an absent key."""
        for cls in body_types():
            body = through_json(encode_object(example_of(cls, CONTEXT)))
            for _, key, kind in object_codec(cls).fields:
                try:
                    kind.decode(ABSENT, key, CONTEXT)
                except SynapseError:
                    pass
                else:
                    continue  # optional: covered above
                with self.subTest(body=cls.__name__, field=key):
                    with self.assertRaises(SynapseError) as cm:
                        decode_object(cls, {k: v for k, v in body.items() if k != key}, CONTEXT)
                    self.assertEqual(cm.exception.code, 400)
                    self.assertIn(f"'{key}'", cm.exception.msg)

    def test_a_remote_user_is_not_a_local_one(self) -> None:
        """The kinds that need the server name get it from the context."""
        for cls in body_types():
            body = through_json(encode_object(example_of(cls, CONTEXT)))
            local = [k for k, v in body.items() if v == f"@alice:{SERVER_NAME}"]
            for key in local:
                with self.subTest(body=cls.__name__, field=key):
                    with self.assertRaises(SynapseError) as cm:
                        decode_object(cls, {**body, key: "@alice:elsewhere.example"}, CONTEXT)
                    self.assertIn(f"'{key}'", cm.exception.msg)


class _Locations:
    def __init__(self) -> None:
        self.places: dict[str, list[InstanceLocation]] = {}

    def locations_of(self, instance_name: str) -> list[InstanceLocation]:
        return self.places[instance_name]

    async def refresh(self) -> None:
        pass


class _Waiter:
    async def wait_for_stream_position(
        self, instance_name: str, stream_name: str, position: int, timeout: float
    ) -> None:
        pass


class CallsOverHttpTestCase(unittest.TestCase):
    """Every call served by one process and made by another, over HTTP."""

    def setUp(self) -> None:
        config = read_homeserver_config(
            {
                "server_name": SERVER_NAME,
                "worker_replication_secret": "secret",
                "listeners": [{"port": 1, "resources": ["replication"]}],
                "workers": {"writer": {"listeners": [{"port": 2, "resources": ["replication"]}]}},
            },
            "/tmp/call-bodies-test.yaml",
        )
        self.locations = _Locations()
        self.caller = self.calls(config, "main")
        self.writer = self.calls(config, "writer")
        self.received: dict[str, Any] = {}
        for call in CALLS.values():
            self.writer.serve(call, self.answer(call))
        port = _reactor.listenTCP(
            0, make_site(self.writer.resource(), 1 << 20), interface="127.0.0.1"
        )
        self.addCleanup(port.stopListening)
        self.url = f"http://127.0.0.1:{port.getHost().port}"
        self.locations.places["writer"] = [InstanceLocation("127.0.0.1", port.getHost().port)]

    def calls(self, config: Any, name: str) -> InternalCalls:
        calls = InternalCalls(
            config=config,
            instance_name=name,
            clock=Clock(reactor),
            reactor=reactor,
            locations=self.locations,
            waiter=_Waiter(),
        )
        self.addCleanup(calls.close)
        return calls

    async def post(self, call: InternalCall[Any, Any], data: bytes) -> tuple[int, Any]:
        """POST ``data`` as the body of ``call``, with the secret."""
        headers: dict[bytes | str, list[bytes | str]] = {"Authorization": ["Bearer secret"]}
        response = await treq.post(
            f"{self.url}{PREFIX}/{call.name}",
            data=data,
            headers=headers,
            reactor=_reactor,
            pool=HTTPConnectionPool(_reactor, persistent=False),
        )
        return response.code, json.loads(await treq.content(response))

    def answer(self, call: InternalCall[Any, Any]) -> Any:
        async def handler(request: Any) -> Any:
            self.received[call.name] = request
            return example_of(call.response, CONTEXT)

        return handler

    async def test_every_call_round_trips(self) -> None:
        for call in CALLS.values():
            request = example_of(call.request, CONTEXT)
            answer = await self.caller.call(call, request, instance="writer")
            self.assertEqual(self.received.pop(call.name), request, call.name)
            self.assertEqual(answer, example_of(call.response, CONTEXT), call.name)

    async def test_a_malformed_request_is_a_400_naming_the_field(self) -> None:
        for call in CALLS.values():
            body = encode_object(example_of(call.request, CONTEXT))
            fields = object_codec(call.request).fields
            if not fields:
                continue  # nothing to get wrong
            _, key, _ = fields[0]
            for wrong in ([[1]], {"k": 1}):
                code, answer = await self.post(call, json.dumps({**body, key: wrong}).encode())
                self.assertEqual(code, 400, (call.name, answer))
                self.assertIn(f"'{key}'", answer["error"], call.name)
            self.assertNotIn(call.name, self.received)

    async def test_a_body_that_is_not_an_object_is_a_400(self) -> None:
        for call in CALLS.values():
            code, answer = await self.post(call, b"[]")
            self.assertEqual((code, answer["errcode"]), (400, Codes.BAD_JSON), call.name)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class _Kindless:
    declared: str


class DeclarationsTestCase(unittest.TestCase):
    def test_a_field_without_a_kind_is_refused_at_once(self) -> None:
        with self.assertRaises(TypeError) as cm:
            object_codec(_Kindless)
        self.assertIn("declared", str(cm.exception))
