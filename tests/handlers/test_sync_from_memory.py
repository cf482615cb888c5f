"""/sync from memory (issue 35): the change trackers answer what the
database would, and spare its reads.

* Differential: random traffic (messages, state, receipts, typing, account
  data, to-device messages, joins and leaves, presence, device renames,
  redactions) in a
  cluster of the main
  process and a worker; after each step every user's incremental /sync is
  computed twice on each process, with the trackers and with every tracker
  answering "may have changed" (the database path), and the two must be
  exactly the same (SQLite and PostgreSQL: ``SYNAPSE_LITE_TEST_DB``).
* Reads: an incremental /sync with nothing new for the user reads nothing,
  even when every other stream moved for other users and rooms; one new
  event in one room costs at most two reads, started together, and none on
  the room's writer.
"""

from __future__ import annotations

import random
import traceback
from typing import Any

from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.filtering import SyncFilter
from synapse_lite.server import HomeServer
from synapse_lite.storage.change_tracker import PositionChangeTracker, StreamChangeTracker
from synapse_lite.tokens import StreamToken
from tests.harness.client_api import ClientApi, caught_up_on_every_stream, q, start_cluster
from tests.harness.server import DatabaseTestCase

#: Random steps of traffic in the differential test.
STEPS = 60


def database_path(test: Any, hs: HomeServer) -> None:
    """Make every change tracker of ``hs`` know nothing from now on (until
    the test's patches are undone): each /sync then reads the database."""
    store = hs.store
    trackers: list[Any] = [store.room_changes, store.membership_changes]
    trackers.append(store.room_membership_changes)
    trackers.extend(store.stream_changes.values())
    test.patch(store.recent_room_events, "between", lambda *args: None)
    for tracker in trackers:
        test.patch(tracker, "may_have_changed", lambda *args: True)
        if isinstance(tracker, StreamChangeTracker):
            test.patch(tracker, "changed_among", lambda since_of: set(since_of))
        else:
            assert isinstance(tracker, PositionChangeTracker)
            test.patch(tracker, "changed_among", lambda entities, since: list(entities))


def count_reads(test: DatabaseTestCase, hs: HomeServer) -> tuple[list[str], list[int]]:
    """The names of the interactions ``hs``'s store runs from now on for a
    /sync (started from the sync handler's code: not the background work of
    other parts, such as the pusher loop reading receipts), and the most
    that were running at once."""
    names: list[str] = []
    most = [0]
    running = [0]
    pool = hs.store.db_pool
    run = pool.runInteraction

    async def counting(desc: str, *args: Any, **kwargs: Any) -> Any:
        if not any("handlers/sync" in f.filename for f in traceback.extract_stack()):
            return await run(desc, *args, **kwargs)
        names.append(desc)
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            return await run(desc, *args, **kwargs)
        finally:
            running[0] -= 1

    test.patch(pool, "runInteraction", counting)
    return names, most


class SyncFromMemoryTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(self, self.test_db, workers=["worker1"])
        base = clients["main"].base_url
        self.users = [await ClientApi(self, base).register(n) for n in ("alice", "bob", "carol")]
        self.rooms = [await self.users[0].create_room(preset="public_chat") for _ in range(3)]
        await self.users[1].ok("POST", f"/join/{q(self.rooms[0])}", {})
        await self.users[2].ok("POST", f"/join/{q(self.rooms[1])}", {})

    def requester(self, user: ClientApi) -> Requester:
        return Requester(str(user.user_id), str(user.device_id), "x")

    async def compute(
        self, hs: HomeServer, user: ClientApi, since: StreamToken | None
    ) -> tuple[dict[str, Any], StreamToken]:
        body, token, _ = await hs.handlers.sync._compute(
            self.requester(user), since, False, SyncFilter()
        )
        return body, token

    async def settled(self) -> None:
        """Every process has every stream's rows the main process has."""
        await caught_up_on_every_stream(self.servers)

    async def step(self, rng: random.Random, events: dict[str, list[str]]) -> str:
        """One random action of a random user; returns what it was ("...
        refused" when not answered 200, as a leave of a room left)."""
        user = rng.choice(self.users)
        uid = q(str(user.user_id))
        room = rng.choice(self.rooms)
        r = q(room)
        action = rng.choice(
            ["message", "message", "state", "receipt", "typing", "account_data",
             "room_account_data", "to_device", "join", "leave", "presence", "device",
             "redact"]
        )  # fmt: skip
        n = rng.randrange(1_000_000)
        code = 0
        if action == "message":
            code, body = await user.request(
                "PUT", f"/rooms/{r}/send/m.room.message/t{n}", {"msgtype": "m.text", "body": "x"}
            )
            if code == 200:
                events.setdefault(room, []).append(body["event_id"])
        elif action == "state":
            code, _ = await user.request(
                "PUT", f"/rooms/{r}/state/m.room.topic/", {"topic": f"t{n}"}
            )
        elif action == "receipt" and events.get(room):
            event_id = q(rng.choice(events[room]))
            code, _ = await user.request("POST", f"/rooms/{r}/receipt/m.read/{event_id}", {})
        elif action == "typing":
            code, _ = await user.request(
                "PUT", f"/rooms/{r}/typing/{uid}", {"typing": rng.random() < 0.7, "timeout": 30_000}
            )
        elif action == "account_data":
            code, _ = await user.request("PUT", f"/user/{uid}/account_data/m.x{n % 3}", {"n": n})
        elif action == "room_account_data":
            code, _ = await user.request("PUT", f"/user/{uid}/rooms/{r}/account_data/m.y", {"n": n})
        elif action == "to_device":
            other = rng.choice(self.users)
            messages = {str(other.user_id): {str(other.device_id): {"n": n}}}
            code, _ = await user.request(
                "PUT", f"/sendToDevice/m.test/t{n}", {"messages": messages}
            )
        elif action == "join":
            code, _ = await user.request("POST", f"/join/{r}", {})
        elif action == "leave" and user is not self.users[0]:
            code, _ = await user.request("POST", f"/rooms/{r}/leave", {})
        elif action == "presence":
            state = rng.choice(["online", "unavailable", "offline"])
            code, _ = await user.request("PUT", f"/presence/{uid}/status", {"presence": state})
        elif action == "redact" and events.get(room):
            event_id = q(rng.choice(events[room]))
            code, _ = await user.request(
                "PUT", f"/rooms/{r}/redact/{event_id}/t{n}", {"reason": "random"}
            )
        elif action == "device":
            device = q(str(user.device_id))
            code, _ = await user.request("PUT", f"/devices/{device}", {"display_name": f"d{n}"})
        return action if code == 200 else f"{action} refused"

    async def test_memory_and_database_paths_agree(self) -> None:
        rng = random.Random(35)
        events: dict[str, list[str]] = {}
        since: dict[tuple[str, str], StreamToken] = {}
        history: dict[tuple[str, str], list[StreamToken]] = {}
        await self.settled()
        for name, hs in self.servers.items():
            for user in self.users:
                _, since[(name, str(user.user_id))] = await self.compute(hs, user, None)
        done: set[str] = set()
        for i in range(STEPS):
            for _ in range(rng.randrange(1, 4)):
                done.add(await self.step(rng, events))
            await self.settled()
            for name, hs in self.servers.items():
                for user in self.users:
                    key = (name, str(user.user_id))
                    patched = _Patches()
                    # Both at the same time: presence shows how long ago.
                    now_ms = hs.clock.time_msec()
                    patched.patch(hs.handlers.sync._clock, "time_msec", lambda at=now_ms: at)
                    # From the last token, and from one a few steps back
                    # (several new events in a room, in order, limited).
                    older = history.setdefault(key, [since[key]])
                    try:
                        memory = await self.compute(hs, user, since[key])
                        memory_older = await self.compute(hs, user, older[0])
                        database_path(patched, hs)
                        database = await self.compute(hs, user, since[key])
                        database_older = await self.compute(hs, user, older[0])
                    finally:
                        patched.undo()
                    self.assertEqual(memory, database, f"step {i} on {name} for {key[1]}")
                    self.assertEqual(
                        memory_older, database_older, f"step {i} on {name} for {key[1]}, older"
                    )
                    since[key] = memory[1]
                    older.append(memory[1])
                    del older[: len(older) - 6]
        # Not a test of nothing: every kind of traffic happened.
        kinds = ("message", "state", "receipt", "typing", "account_data", "room_account_data",
                 "to_device", "join", "leave", "presence", "device", "redact")  # fmt: skip
        self.assertEqual(sorted(k for k in kinds if k not in done), [])

    async def test_reads_of_an_incremental_sync(self) -> None:
        alice, bob, carol = self.users
        room, carols, _ = self.rooms
        await alice.send(room, "hello")
        await self.settled()
        tokens = {}
        for name, hs in self.servers.items():
            _, tokens[name] = await self.compute(hs, bob, None)
        # Every stream moves, for others: Carol's room, receipts and typing
        # there, Alice's account data, a to-device message for Carol.
        event_id = await carol.send(carols, "elsewhere")
        await carol.ok("POST", f"/rooms/{q(carols)}/receipt/m.read/{q(event_id)}", {})
        await carol.ok(
            "PUT", f"/rooms/{q(carols)}/typing/{q(str(carol.user_id))}", {"typing": True}
        )
        await alice.ok("PUT", f"/user/{q(str(alice.user_id))}/account_data/m.x", {"a": 1})
        await alice.ok(
            "PUT",
            "/sendToDevice/m.test/t1",
            {"messages": {str(carol.user_id): {str(carol.device_id): {"n": 1}}}},
        )
        await self.settled()
        for name, hs in self.servers.items():
            names, _ = count_reads(self, hs)
            body, tokens[name] = await self.compute(hs, bob, tokens[name])
            self.assertEqual(body["rooms"]["join"], {}, name)
            self.assertEqual(names, [], f"nothing new for Bob read on {name}")
        # One new event in Bob's room: at most two reads, running together.
        await alice.send(room, "news")
        await self.settled()
        for name, hs in self.servers.items():
            names, most = count_reads(self, hs)
            body, _ = await self.compute(hs, bob, tokens[name])
            events = body["rooms"]["join"][room]["timeline"]["events"]
            self.assertEqual([e["content"].get("body") for e in events], ["news"])
            self.assertLessEqual(len(names), 2, f"{name}: {names}")
            self.assertEqual(most[0], len(names), f"{name}: {names} not all at once")
            if name == "main":
                # The room's writer made the event: which events are new is
                # known here (RecentRoomEvents), the event in its cache.
                self.assertEqual(names, [], "the writer reads nothing")


class _Patches:
    """``TestCase.patch`` that can be undone before the test ends (the
    database path for one computation, then the trackers again)."""

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []

    def patch(self, obj: Any, name: str, value: Any) -> None:
        self._undo.append((obj, name, obj.__dict__.get(name, _MISSING)))
        setattr(obj, name, value)

    def undo(self) -> None:
        for obj, name, old in reversed(self._undo):
            if old is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)
        self._undo.clear()


_MISSING = object()
