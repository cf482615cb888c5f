"""The internal call layer: in process when served here, over authenticated
HTTP otherwise, with its retries, its error mapping and its read-your-writes
wait, all in one place."""

from __future__ import annotations

from typing import Any, cast

import attr
from twisted.internet import defer, protocol, reactor
from twisted.trial import unittest

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.clock import Clock
from synapse_lite.config.homeserver import InstanceLocation, read_homeserver_config
from synapse_lite.http.fields import get_int, get_str
from synapse_lite.http.server import make_site
from synapse_lite.replication.http import calls as calls_module
from synapse_lite.replication.http.calls import InternalCall, InternalCalls
from synapse_lite.streams.writers import writer_of

_reactor = cast(Any, reactor)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Echo:
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text}

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> Echo:
        return cls(get_str(body, "text", max_length=20))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Written:
    stream_id: int

    def to_json(self) -> dict[str, Any]:
        return {"stream_id": self.stream_id}

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> Written:
        return cls(get_int(body, "stream_id"))


ECHO = InternalCall("test_echo", Echo, Echo, served_by=writer_of("typing"))
ECHO_IDEMPOTENT = InternalCall("test_echo_again", Echo, Echo, idempotent=True)
WRITE = InternalCall(
    "test_write", Echo, Written, answer_position=lambda a: ("receipts", a.stream_id)
)


class _Locations:
    """Where processes are: a dict the test fills, counting refreshes."""

    def __init__(self) -> None:
        self.places: dict[str, list[InstanceLocation]] = {}
        self.refreshes = 0

    def locations_of(self, instance_name: str) -> list[InstanceLocation]:
        return self.places[instance_name]

    async def refresh(self) -> None:
        self.refreshes += 1


class _Waiter:
    def __init__(self) -> None:
        self.waits: list[tuple[str, str, int]] = []

    async def wait_for_stream_position(
        self, instance_name: str, stream_name: str, position: int, timeout: float
    ) -> None:
        self.waits.append((instance_name, stream_name, position))


def _config() -> Any:
    data = {
        "server_name": "test.local",
        "worker_replication_secret": "secret",
        "listeners": [{"port": 1, "resources": ["replication"]}],
        "workers": {"writer": {"listeners": [{"port": 2, "resources": ["replication"]}]}},
        "stream_writers": {"typing": "writer"},
    }
    return read_homeserver_config(data, "/tmp/calls-test.yaml")


class InternalCallsTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.config = _config()
        self.locations = _Locations()
        self.waiter = _Waiter()
        self.caller = self.calls("main")
        self.writer = self.calls("writer")

    def calls(self, name: str) -> InternalCalls:
        calls = InternalCalls(
            config=self.config,
            instance_name=name,
            clock=Clock(reactor),
            reactor=reactor,
            locations=self.locations,
            waiter=self.waiter,
        )
        self.addCleanup(calls.close)
        return calls

    def serve_over_http(self, calls: InternalCalls, name: str) -> None:
        port = _reactor.listenTCP(0, make_site(calls.resource(), 65536), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.locations.places[name] = [InstanceLocation("127.0.0.1", port.getHost().port)]

    async def test_a_call_served_here_runs_in_process(self) -> None:
        seen: list[Echo] = []

        async def echo(request: Echo) -> Echo:
            seen.append(request)
            return Echo(request.text.upper())

        self.writer.serve(ECHO, echo)
        self.assertEqual(await self.writer.call(ECHO, Echo("hi")), Echo("HI"))
        self.assertEqual(seen, [Echo("hi")])  # the object itself: no JSON on the way
        self.assertEqual(self.locations.refreshes, 0)

    async def test_a_call_this_process_should_serve_but_does_not_is_an_error(self) -> None:
        with self.assertRaises(SynapseError) as cm:
            await self.writer.call(ECHO, Echo("hi"))
        self.assertEqual(cm.exception.code, 500)

    async def test_over_http_with_the_request_checked_by_its_codec(self) -> None:
        async def echo(request: Echo) -> Echo:
            return Echo(request.text + "!")

        self.writer.serve(ECHO, echo)
        self.serve_over_http(self.writer, "writer")
        self.assertEqual(await self.caller.call(ECHO, Echo("hi")), Echo("hi!"))
        # Too long for Echo's codec: the serving side refuses it as a client
        # request would be, and the caller gets the same error.
        with self.assertRaises(SynapseError) as cm:
            await self.caller.call(ECHO, Echo("x" * 50))
        self.assertEqual((cm.exception.code, cm.exception.errcode), (400, Codes.INVALID_PARAM))

    async def test_a_refusal_over_there_is_the_same_error_here(self) -> None:
        async def refuse(request: Echo) -> Echo:
            raise SynapseError(403, "not yours", Codes.FORBIDDEN, {"extra": 1})

        self.writer.serve(ECHO, refuse)
        self.serve_over_http(self.writer, "writer")
        with self.assertRaises(SynapseError) as cm:
            await self.caller.call(ECHO, Echo("hi"))
        self.assertEqual((cm.exception.code, cm.exception.msg), (403, "not yours"))
        self.assertEqual(cm.exception.additional, {"extra": 1})

    async def test_an_unreachable_process_is_tried_again_then_a_503(self) -> None:
        # A port nothing listens on: every connection is refused.
        port = _reactor.listenTCP(0, protocol.ServerFactory(), interface="127.0.0.1")
        number = port.getHost().port
        await port.stopListening()
        self.locations.places["writer"] = [InstanceLocation("127.0.0.1", number)]
        with self.assertRaises(SynapseError) as cm:
            await self.caller.call(ECHO, Echo("hi"))
        self.assertEqual((cm.exception.code, cm.exception.errcode), (503, Codes.UNKNOWN))
        self.assertIn("(writer) is unavailable; try again", cm.exception.msg)
        # Between attempts it looked where the process may have moved to.
        self.assertEqual(self.locations.refreshes, calls_module.CONNECT_ATTEMPTS - 1)

    async def test_only_idempotent_calls_are_sent_again_after_a_broken_connection(self) -> None:
        accepted: list[int] = []

        class HangUp(protocol.Protocol):
            def connectionMade(self) -> None:
                accepted.append(1)
                assert self.transport is not None
                self.transport.loseConnection()

        port = _reactor.listenTCP(
            0, protocol.ServerFactory.forProtocol(HangUp), interface="127.0.0.1"
        )
        self.addCleanup(port.stopListening)
        self.locations.places["writer"] = [InstanceLocation("127.0.0.1", port.getHost().port)]
        with self.assertRaises(SynapseError):
            await self.caller.call(ECHO, Echo("hi"), instance="writer")
        self.assertEqual(len(accepted), 1)  # it may have been done: not sent again
        with self.assertRaises(SynapseError):
            await self.caller.call(ECHO_IDEMPOTENT, Echo("hi"), instance="writer")
        self.assertEqual(len(accepted), 1 + calls_module.CONNECT_ATTEMPTS)

    async def test_a_bad_answer_is_a_502(self) -> None:
        async def wrong(request: Echo) -> Any:
            return Written(5)  # not what ECHO answers

        self.writer.serve(ECHO, wrong)
        self.serve_over_http(self.writer, "writer")
        with self.assertRaises(SynapseError) as cm:
            await self.caller.call(ECHO, Echo("hi"))
        self.assertEqual(cm.exception.code, 502)

    async def test_a_write_elsewhere_waits_for_its_position_here(self) -> None:
        async def write(request: Echo) -> Written:
            return Written(42)

        self.writer.serve(WRITE, write)
        self.serve_over_http(self.writer, "writer")
        self.assertEqual(await self.caller.call(WRITE, Echo("x"), instance="writer"), Written(42))
        self.assertEqual(self.waiter.waits, [("writer", "receipts", 42)])
        # In process there is nothing to wait for.
        self.assertEqual(await self.writer.call(WRITE, Echo("x"), instance="writer"), Written(42))
        self.assertEqual(len(self.waiter.waits), 1)

    async def test_a_call_is_served_once(self) -> None:
        async def echo(request: Echo) -> Echo:
            return request

        self.writer.serve(ECHO, echo)
        with self.assertRaises(ValueError):
            self.writer.serve(ECHO, echo)

    async def test_a_slow_wait_still_answers(self) -> None:
        """The write happened: a replication timeout is logged, not raised."""

        class SlowWaiter:
            async def wait_for_stream_position(self, *args: Any) -> None:
                raise defer.TimeoutError()

        calls = InternalCalls(
            config=self.config,
            instance_name="main",
            clock=Clock(reactor),
            reactor=reactor,
            locations=self.locations,
            waiter=SlowWaiter(),
        )
        self.addCleanup(calls.close)

        async def write(request: Echo) -> Written:
            return Written(7)

        self.writer.serve(WRITE, write)
        self.serve_over_http(self.writer, "writer")
        with self.assertLogs("synapse_lite.replication.http.calls", "WARNING") as logs:
            self.assertEqual(await calls.call(WRITE, Echo("x"), instance="writer"), Written(7))
        self.assertIn("answering anyway", "\n".join(logs.output))
