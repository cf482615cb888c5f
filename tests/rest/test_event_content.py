"""What an event may hold: canonical JSON (integers within +-(2**53 - 1), no
floats, no NaN or Infinity: 400 ``M_BAD_JSON``) and at most 65,536 bytes in
all (413 ``M_TOO_LARGE``), for every way an event is sent, and for the
internal request that carries events to their writer."""

from __future__ import annotations

import json
from typing import Any

from synapse_lite.api.errors import SynapseError
from synapse_lite.codec.kinds import DecodeContext
from synapse_lite.codec.objects import decode_object
from synapse_lite.replication.http.send_events import EventsToPersist
from tests.harness.client_api import ClientApi, ThreeUsersTestCase, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase

LIMIT = 65_536


class EventContentTestCase(ThreeUsersTestCase):
    async def test_canonical_json_only(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        send = f"/rooms/{room}/send/org.example.dummy"
        for value in (2**53, -(2**53), 1.1, 1.0, 1e3, [1, {"deep": 2**64}]):
            code, body = await self.alice.request("POST", send, {"body": value})
            self.assertEqual((code, body["errcode"]), (400, "M_BAD_JSON"), value)
        for raw in (b'{"body": NaN}', b'{"body": Infinity}', b'{"body": -Infinity}'):
            code, _ = await self.alice.request("POST", send, raw=raw)
            self.assertEqual(code, 400, raw)
        for kept in (2**53 - 1, -(2**53) + 1, 0, True, None):
            await self.alice.ok("POST", send, {"body": kept})
        code, body = await self.alice.request(
            "PUT", f"/rooms/{room}/state/org.example.state/k", {"n": 0.5}
        )
        self.assertEqual((code, body["errcode"]), (400, "M_BAD_JSON"))
        code, body = await self.alice.request(
            "POST", "/createRoom", {"initial_state": [{"type": "x.y", "content": {"f": 2.5}}]}
        )
        self.assertEqual((code, body["errcode"]), (400, "M_BAD_JSON"))
        page = await self.alice.ok("GET", f"/rooms/{room}/messages?dir=b&limit=20")
        sent = [e["content"]["body"] for e in page["chunk"] if e["type"] == "org.example.dummy"]
        self.assertEqual(sent, [None, True, 0, -(2**53) + 1, 2**53 - 1])

    async def test_size_limit_is_the_whole_events(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        send = f"/rooms/{room}/send/m.room.message"
        code, body = await self.alice.request(
            "POST", send, {"msgtype": "m.text", "body": "A" * 70_000}
        )
        self.assertEqual((code, body["errcode"]), (413, "M_TOO_LARGE"))
        code, body = await self.alice.request(
            "PUT", f"/rooms/{room}/state/oooooooh", {"key": "O" * 70_000}
        )
        self.assertEqual((code, body["errcode"]), (413, "M_TOO_LARGE"))
        # Content just under the limit is too large once the event around
        # it is counted.
        code, body = await self.alice.request("POST", send, {"body": "A" * (LIMIT - 20)})
        self.assertEqual((code, body["errcode"]), (413, "M_TOO_LARGE"))
        event_id = (await self.alice.ok("POST", send, {"body": "A" * (LIMIT - 1000)}))["event_id"]
        served = await self.alice.ok("GET", f"/rooms/{room}/event/{event_id}")
        self.assertLessEqual(len(json.dumps(served).encode()), LIMIT)

    def test_the_internal_request_is_checked_too(self) -> None:
        # The size, when the request is parsed; canonical JSON depends on the
        # room's version, which the writer's auth rules check.
        event = {
            "type": "m.room.message",
            "state_key": None,
            "sender": "@alice:test.local",
            "content": {"body": "A" * LIMIT},
            "origin_server_ts": 1,
        }
        with self.assertRaises(SynapseError) as caught:
            decode_object(
                EventsToPersist,
                {"room_id": "!r:test.local", "events": [event]},
                DecodeContext("test.local"),
            )
        self.assertEqual(caught.exception.code, 413)


class EventContentThroughWorkersTestCase(DatabaseTestCase):
    async def test_refused_on_the_receiving_process(self) -> None:
        servers, clients, _ = start_cluster(
            self, self.test_db, workers=["writer", "reader"], stream_writers={"events": ["writer"]}
        )
        await eventually(lambda: all(hs.replication.connected for hs in servers.values()))
        alice = await ClientApi(self, clients["reader"].base_url).register("alice")
        room = await alice.create_room(preset="public_chat")
        answers: list[Any] = []
        for body in ({"n": 2**53}, {"body": "A" * 70_000}):
            answers.append(
                await alice.request(
                    "PUT", f"/rooms/{room}/send/m.room.message/{len(answers)}", body
                )
            )
        self.assertEqual(
            [(code, body["errcode"]) for code, body in answers],
            [(400, "M_BAD_JSON"), (413, "M_TOO_LARGE")],
        )
