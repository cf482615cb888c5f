"""``m.room.server_acl`` enforced on every federation endpoint the spec
names, on room EDUs in ``/send``, and on what we send (docs/federation.md,
"Server ACLs"). ``b.test`` is under test (main and ``fed1``); the tests
speak for ``a.test`` (tests/federation/test_inbound_pdus.py's helpers)."""

from __future__ import annotations

from typing import Any, cast

from twisted.internet import reactor, task

from synapse_lite.event_graph.hashing import event_id_of
from tests.federation.test_inbound_pdus import InboundPdusBase
from tests.federation.test_rooms import CAROL, q
from tests.harness.polling import eventually

_reactor = cast(Any, reactor)


class ServerAclEndpointsTestCase(InboundPdusBase):
    async def test_a_denied_server_is_refused_everywhere_and_sent_nothing(self) -> None:
        alice, room_id, version = await self.joined_room()
        fake = await self.scripted_a()
        state = await alice.ok("GET", f"/rooms/{q(room_id)}/state")
        create_id = next(e["event_id"] for e in state if e["type"] == "m.room.create")
        message = await self.event(room_id)
        before = await alice.send(room_id, "before the ACL")

        def sent_ids() -> list[str]:
            return [event_id_of(version, p) for t in fake.transactions for p in t["pdus"]]

        async def arrived(event_id: str) -> bool:
            return event_id in sent_ids()

        await eventually(lambda: arrived(before), timeout=20)
        await alice.ok(
            "PUT",
            f"/rooms/{q(room_id)}/state/m.room.server_acl",
            {"allow": ["*"], "deny": ["a.test"]},
        )
        v1, v2 = "/_matrix/federation/v1", "/_matrix/federation/v2"
        room, event = q(room_id), q(create_id)
        for method, path, body in (
            ("GET", f"{v1}/event/{event}", None),
            ("GET", f"{v1}/state/{room}?event_id={event}", None),
            ("GET", f"{v1}/state_ids/{room}?event_id={event}", None),
            ("GET", f"{v1}/event_auth/{room}/{event}", None),
            ("GET", f"{v1}/backfill/{room}?v={event}", None),
            (
                "POST",
                f"{v1}/get_missing_events/{room}",
                {"earliest_events": [], "latest_events": [create_id]},
            ),
            ("GET", f"{v1}/make_join/{room}/{q(CAROL)}?ver={version.identifier}", None),
            ("GET", f"{v1}/make_leave/{room}/{q(CAROL)}", None),
            ("PUT", f"{v2}/send_join/{room}/{q('$x')}", {}),
            ("PUT", f"{v2}/send_leave/{room}/{q('$x')}", {}),
            ("PUT", f"{v1}/invite/{room}/{q('$x')}", {}),
            ("PUT", f"{v2}/invite/{room}/{q('$x')}", {"room_version": version.identifier}),
        ):
            code, answer = await self.federation(method, path, body)
            self.assertEqual((code, answer.get("errcode")), (403, "M_FORBIDDEN"), path)
            self.assertIn("server ACL", answer["error"], path)
        # The space hierarchy: as for a room the server cannot see.
        code, answer = await self.federation("GET", f"{v1}/hierarchy/{room}")
        self.assertEqual((code, answer["errcode"]), (404, "M_NOT_FOUND"))
        # A PDU in /send is answered with an error, and not stored.
        results = await self.send("acl1", [message])
        self.assertIn("server ACL", results[event_id_of(version, message)]["error"])
        self.assertNotIn("hi", [e["content"]["body"] for e in await self.timeline(alice, room_id)])

        # Outbound: nothing of the room goes to a.test while it is denied.
        hidden = await alice.send(room_id, "while denied")
        await task.deferLater(_reactor, 1.0, lambda: None)
        await alice.ok("PUT", f"/rooms/{q(room_id)}/state/m.room.server_acl", {"allow": ["*"]})
        after = await alice.send(room_id, "after the ACL is lifted")
        await eventually(lambda: arrived(after), timeout=20)
        self.assertNotIn(hidden, sent_ids())
        # Allowed again: the endpoints answer.
        code, _ = await self.federation("GET", f"{v1}/event/{event}")
        self.assertEqual(code, 200)

    async def test_a_denied_server_is_refused_by_an_allow_list_and_ip_literals(self) -> None:
        alice, room_id, _version = await self.joined_room()
        await alice.ok(
            "PUT",
            f"/rooms/{q(room_id)}/state/m.room.server_acl",
            {"allow": ["b.test", "*.example"], "allow_ip_literals": False},
        )
        code, answer = await self.make_join(room_id)
        self.assertEqual((code, answer["errcode"]), (403, "M_FORBIDDEN"), answer)
