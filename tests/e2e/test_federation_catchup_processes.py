"""End to end: catch-up across a wide gap between two homeservers of ours as
real processes (issue 32: "a peer down for ... traffic then back (current
within seconds)"), ``a.test`` (main process and a federation sender worker)
and ``b.test`` (main process), each on its own database.

bob of b.test joins two rooms of alice's on a.test. b is stopped; alice
sends 30 messages in the first room and 60 in the second (more than one
transaction's worth, so a's queue for b falls behind and catches up; the
first gap is narrower than what ``get_missing_events`` walks back for one
PDU, 5 requests of 10 events, the second wider). b is started again and
announces itself (REMOTE_SERVER_UP). Then:

* a sends b the newest event of each room (catch-up), and b becomes
  current within seconds: bob's /sync shows each room's newest message;
* b walked the first room's gap back with ``get_missing_events`` to its
  end: bob reads its 30 messages in order;
* b fetched the 50 events before the second room's newest and filled the
  rest of its gap with ``/state_ids`` (docs/federation.md, "Catch-up");
  bob paging back with /messages reads every one of its 60 messages once:
  the 51 received are in place, the 9 before them are backfilled from
  a.test (``handlers/federation_backfill.py``) and read after the rest
  (before bob's join), in order among themselves (docs/federation.md,
  "Limits").

PostgreSQL with Redis replication (a production layout; the scenario runs on
one engine: docs/testing.md, "Decisions").
"""

from __future__ import annotations

import re
import time
import urllib.parse
from typing import Any

from twisted.internet import reactor, task
from twisted.trial import unittest

from synapse_lite.handlers.inbound_pdus import (
    MISSING_EVENTS_LIMIT,
    MISSING_EVENTS_REQUESTS_PER_PDU,
)
from tests.e2e import test_federation_pdus_processes as pdus
from tests.e2e.test_federation_processes import SENDER, Server
from tests.harness.client_api import ClientApi
from tests.harness.databases import END_TO_END, one_engine_only
from tests.harness.processes import free_port
from tests.harness.services import require_redis

#: Far longer than the test: only REMOTE_SERVER_UP can end a backoff in time.
BACKOFF_SECONDS = 120
#: Messages per room while b is down: one gap get_missing_events closes
#: (at most 5 requests of 10 events before a PDU), one it does not.
GAPS = (30, 60)
#: The messages of the wider gap b holds in place: the 50 fetched and the newest.
RECEIVED = MISSING_EVENTS_REQUESTS_PER_PDU * MISSING_EVENTS_LIMIT + 1
#: "Current within seconds": from b's announcement to bob seeing both rooms' newest.
CURRENT_WITHIN_SECONDS = 15.0
DEADLINE_SECONDS = 60.0


class FederationCatchUpProcessesTestCase(unittest.TestCase):
    timeout = 300

    # The two-server helpers of the PDU processes test (borrowed:
    # subclassing it would run its test here too).
    make_server: Any = pdus.FederationPdusProcessesTestCase.make_server
    wait_for: Any = pdus.FederationPdusProcessesTestCase.wait_for

    a: Server
    b: Server
    since: str

    async def test_a_peer_down_for_a_wide_gap_is_current_within_seconds(self) -> None:
        one_engine_only("postgres", END_TO_END)
        transport = "redis"
        require_redis()
        ports = {"a.test": free_port(), "b.test": free_port()}
        self.a = self.make_server("a.test", ports, transport, sender=True)
        self.b = self.make_server("b.test", ports, transport, sender=False)
        await self.a.processes.start()
        await self.b.processes.start()
        alice = await ClientApi(self, self.a.url()).register("alice")
        self.bob = await ClientApi(self, self.b.url()).register("bob")
        rooms = [await alice.create_room(preset="public_chat") for _ in range(2)]
        for room_id in rooms:
            quoted = urllib.parse.quote(room_id)
            await self.bob.ok("POST", f"/join/{quoted}?server_name=a.test", {})
            await alice.send(room_id, "before")
        await self.newest_seen(rooms, "before", None)
        since = self.since

        await self.b.processes.stop("main")
        for i in range(max(GAPS)):
            for n, room_id in enumerate(rooms):
                if i < GAPS[n]:
                    await alice.send(room_id, f"room {n} while down {i}")
        await self.wait_for(
            lambda: (
                self.a.query("SELECT retry_interval FROM destinations WHERE destination = 'b.test'")
                == [(BACKOFF_SECONDS * 1000,)]
            ),
            "a to back off from b",
        )
        await self.b.processes.start()
        started = time.monotonic()
        # b's first request to a announces it is up (REMOTE_SERVER_UP).
        await self.bob.ok(
            "PUT",
            "/sendToDevice/m.test/up1",
            {"messages": {"@alice:a.test": {"*": {"hello": "from b"}}}},
        )
        timeline = await self.newest_seen(rooms, None, since)
        took = time.monotonic() - started
        self.assertLess(took, CURRENT_WITHIN_SECONDS, f"current after {took:.1f} s")
        for n, room_id in enumerate(rooms):
            # The newest message of the room is the last /sync showed.
            self.assertEqual(timeline[room_id][-1], self.newest(n))

        # a caught b up (newest event per room), not replaying 60 PDUs.
        self.assertIn("b.test falls behind", self.a.log(SENDER))
        # Logged once b's answer reached a, which may be after bob saw the
        # newest (b persists before it answers).
        await self.wait_for(
            lambda: "b.test has caught up" in self.a.log(SENDER), "a to log b caught up"
        )
        # b filled the wider gap beyond get_missing_events with /state_ids
        # (once: the narrower one closed).
        b_log = self.b.log("main")
        self.assertEqual(
            len(re.findall(r"GET /_matrix/federation/v1/state_ids/", self.a.log("main"))),
            1,
            b_log[-3000:],
        )

        # What bob reads: every message once. The first room's in order;
        # the second's received ones in place, the backfilled ones after
        # them (before his join), in order among themselves.
        narrow, wide = [
            ["before"] + [f"room {n} while down {i}" for i in range(GAPS[n])]
            for n in range(len(rooms))
        ]
        self.assertEqual(await self.paged_back(rooms[0]), narrow)
        bodies = await self.paged_back(rooms[1])
        self.assertEqual(sorted(bodies), sorted(wide))
        received = wide[-RECEIVED:]
        backfilled = wide[1:-RECEIVED]
        self.assertEqual(bodies[-RECEIVED:], received, bodies)
        self.assertEqual([b for b in bodies if b in backfilled], backfilled, bodies)

    async def newest_seen(
        self, rooms: list[str], body: str | None, since: str | None
    ) -> dict[str, list[str]]:
        """Sync until each room's timeline (since ``since``) ends with
        ``body`` (None: with the room's newest message, read on a); the
        messages each showed, in order; the token reached is kept as
        ``self.since``."""
        deadline = time.monotonic() + DEADLINE_SECONDS
        seen: dict[str, list[str]] = {r: [] for r in rooms}
        while True:
            if time.monotonic() > deadline:
                raise AssertionError(f"bob's /sync showed {seen}")
            response = await self.bob.sync(since=since, timeout=1000)
            since = response["next_batch"]
            for room_id in rooms:
                room = response.get("rooms", {}).get("join", {}).get(room_id, {})
                for event in room.get("timeline", {}).get("events", []):
                    if event["type"] == "m.room.message":
                        seen[room_id].append(event["content"]["body"])
            wanted = [body] * len(rooms) if body else [self.newest(n) for n in range(len(rooms))]
            if all(seen[r] and seen[r][-1] == w for r, w in zip(rooms, wanted, strict=True)):
                self.since = since
                return seen
            await task.deferLater(reactor, 0.1, lambda: None)

    def newest(self, n: int) -> str:
        return f"room {n} while down {GAPS[n] - 1}"

    async def paged_back(self, room_id: str) -> list[str]:
        """Every message bob reads paging back from now to the room's
        start, oldest first."""
        bodies: list[str] = []
        token = ""
        for _ in range(50):
            path = f"/rooms/{urllib.parse.quote(room_id)}/messages?dir=b&limit=10{token}"
            answer = await self.bob.ok("GET", path)
            bodies.extend(
                e["content"]["body"] for e in answer["chunk"] if e["type"] == "m.room.message"
            )
            if "end" not in answer or not answer["chunk"]:
                break
            token = f"&from={urllib.parse.quote(answer['end'])}"
        return list(reversed(bodies))
