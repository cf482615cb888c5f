"""Group commit (``storage/group_commit.py``): writes queued while a
transaction of the group runs, or waits to begin, share a transaction, in
queue order,
each answered with its own result; a group that fails rolls back and runs
its writes one by one, so only the failing write's caller fails. Then the
events writer's persists (SQLite groups them; the test installs a group on
PostgreSQL too): sends to several rooms queued behind a transaction persist
in one, each with its own stream position, and a send whose client
transaction id was taken fails alone (answered with the first event). On
SQLite and PostgreSQL (``SYNAPSE_LITE_TEST_DB``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from twisted.internet import defer, reactor, threads

from synapse_lite.metrics import GROUP_COMMIT_FALLBACKS
from synapse_lite.storage.database import DatabasePool, LoggingTransaction, make_startup_connection
from synapse_lite.storage.group_commit import GroupCommit
from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase


def fallbacks(desc: str) -> float:
    return GROUP_COMMIT_FALLBACKS.labels(desc)._value.get()


class Blocker:
    """A write that holds its group's transaction until released: the
    writes queued meanwhile form the next group."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, txn: LoggingTransaction) -> Any:
        self.started.set()
        self.release.wait(10)
        return None

    async def hold(self, group: GroupCommit[Any]) -> defer.Deferred[Any]:
        """Start holding ``group``'s transaction; the run's Deferred."""
        running = defer.ensureDeferred(group.run(self))
        await threads.deferToThread(self.started.wait, 10)
        return running


class GroupCommitTestCase(DatabaseTestCase):
    with_schema = False

    def setUp(self) -> None:
        super().setUp()
        self.engine = self.test_db.make_engine()
        startup = make_startup_connection(self.engine)
        with startup.transaction() as txn:
            txn.execute("CREATE TABLE things (id INTEGER NOT NULL PRIMARY KEY, body TEXT)")
        startup.close()
        self.pool = DatabasePool(reactor, self.engine)
        self.addCleanup(self.pool.close)
        self.group: GroupCommit[tuple[str, int]] = GroupCommit(self.pool, "test_things")
        # Each run's transaction name (unique per transaction).
        self.ran: list[tuple[int, str]] = []

    def insert(self, n: int, fail: bool = False) -> Callable[[LoggingTransaction], Any]:
        def txn_func(txn: LoggingTransaction) -> tuple[str, int]:
            self.ran.append((n, txn.name))
            # Sees what the writes before it in the group wrote.
            txn.execute("SELECT COUNT(*) FROM things")
            before = int(txn.fetchone()[0])
            txn.execute("INSERT INTO things (id, body) VALUES (?, ?)", (n, "x"))
            if fail:
                raise ValueError(f"write {n} fails")
            return txn.name, before

        return txn_func

    async def rows(self) -> list[int]:
        found = await self.pool.select("rows", "SELECT id FROM things ORDER BY id")
        return [int(r[0]) for r in found]

    async def test_writes_queued_meanwhile_share_one_transaction_in_order(self) -> None:
        blocker = Blocker()
        held = await blocker.hold(self.group)
        queued = [defer.ensureDeferred(self.group.run(self.insert(n))) for n in (1, 2, 3)]
        blocker.release.set()
        await held
        results = await defer.gatherResults(queued)
        names = {name for name, _ in results}
        self.assertEqual(len(names), 1)
        # In queue order, each seeing the writes before it.
        self.assertEqual([before for _, before in results], [0, 1, 2])
        self.assertEqual([n for n, _ in self.ran], [1, 2, 3])
        self.assertEqual(await self.rows(), [1, 2, 3])
        # Alone, a write has a transaction of its own.
        name, before = await self.group.run(self.insert(4))
        self.assertNotIn(name, names)
        self.assertEqual(before, 3)

    async def test_writes_queued_while_it_waits_to_begin_join_the_transaction(self) -> None:
        # One connection, held by a transaction outside the group (as
        # another process holding SQLite's write lock would hold the
        # group's BEGIN): the group's first write is asked for, then two
        # more queue before the transaction can begin.
        pool = DatabasePool(reactor, self.engine, max_connections=1)
        self.addCleanup(pool.close)
        group: GroupCommit[tuple[str, int]] = GroupCommit(pool, "test_things_waiting")
        blocker = Blocker()
        held = defer.ensureDeferred(pool.runInteraction("hold", blocker))
        await threads.deferToThread(blocker.started.wait, 10)
        first = defer.ensureDeferred(group.run(self.insert(1)))
        queued = [defer.ensureDeferred(group.run(self.insert(n))) for n in (2, 3)]
        blocker.release.set()
        await held
        results = [await first, *(await defer.gatherResults(queued))]
        self.assertEqual(len({name for name, _ in results}), 1)
        self.assertEqual([before for _, before in results], [0, 1, 2])
        self.assertEqual([n for n, _ in self.ran], [1, 2, 3])

    async def test_a_lone_failing_write_runs_once(self) -> None:
        fell_back = fallbacks("test_things")
        with self.assertRaisesRegex(ValueError, "write 1 fails"):
            await self.group.run(self.insert(1, fail=True))
        self.assertEqual([n for n, _ in self.ran], [1])
        self.assertEqual(fallbacks("test_things"), fell_back)
        self.assertEqual(await self.rows(), [])

    async def test_a_failing_write_fails_alone_and_the_others_commit(self) -> None:
        fell_back = fallbacks("test_things")
        blocker = Blocker()
        held = await blocker.hold(self.group)
        queued = [
            defer.ensureDeferred(self.group.run(self.insert(n, fail=n == 2))) for n in (1, 2, 3)
        ]
        blocker.release.set()
        await held
        first = await queued[0]
        with self.assertRaisesRegex(ValueError, "write 2 fails"):
            await queued[1]
        third = await queued[2]
        self.assertEqual(fallbacks("test_things"), fell_back + 1)
        # The group ran up to the failure (then rolled back), then each alone.
        self.assertEqual([n for n, _ in self.ran], [1, 2, 1, 2, 3])
        self.assertEqual(len({name for _, name in self.ran[:2]}), 1)
        self.assertEqual(len({name for _, name in self.ran[2:]}), 3)
        self.assertEqual((first[1], third[1]), (0, 1))
        self.assertEqual(await self.rows(), [1, 3])

    async def test_a_caller_that_gave_up_leaves_the_others_answered(self) -> None:
        blocker = Blocker()
        held = await blocker.hold(self.group)
        gone = defer.ensureDeferred(self.group.run(self.insert(1)))
        kept = defer.ensureDeferred(self.group.run(self.insert(2)))
        gone.cancel()
        blocker.release.set()
        await held
        self.assertEqual((await kept)[1], 1)
        self.assertEqual(await self.rows(), [1, 2])
        self.failureResultOf(gone, defer.CancelledError)


class PersistGroupCommitTestCase(DatabaseTestCase):
    async def test_sends_to_several_rooms_persist_together(self) -> None:
        servers, clients, _ = start_cluster(self, self.test_db)
        store = servers["main"].store
        if store._persist_group is None:
            # PostgreSQL does not group by default (its writes run side by
            # side); the mechanism must hold there as well.
            store._persist_group = GroupCommit(store.db_pool, "persist_events", idempotent=True)
        group = store._persist_group
        alice = await ClientApi(self, clients["main"].base_url).register("alice")
        rooms = [await alice.create_room(preset="public_chat") for _ in range(4)]
        first = await alice.send(rooms[3], "first", txn_id="first-txn")
        # The client transaction id of the last room's send is taken (as
        # by a retry the handler no longer remembers): its persist fails.
        await store.db_pool.execute(
            "plant_txn",
            "INSERT INTO event_txn_ids (user_id, device_id, txn_id, room_id, event_id,"
            " inserted_ts) VALUES (?, ?, ?, ?, ?, ?)",
            alice.user_id,
            alice.device_id,
            "taken",
            rooms[3],
            first,
            0,
        )
        persists: list[str] = []
        run_interaction = store.db_pool.runInteraction

        async def counting(desc: str, *args: Any, **kwargs: Any) -> Any:
            if desc == "persist_events":
                persists.append(desc)
            return await run_interaction(desc, *args, **kwargs)

        self.patch(store.db_pool, "runInteraction", counting)

        async def send_all(txn_ids: list[str | None]) -> list[str]:
            blocker = Blocker()
            held = await blocker.hold(group)
            sends = [
                defer.ensureDeferred(alice.send(room, f"in {room}", txn_id=txn_id))
                for room, txn_id in zip(rooms, txn_ids, strict=True)
            ]
            await eventually(lambda: len(group._queue) == len(rooms), what="the sends queued")
            blocker.release.set()
            await held
            return list(await defer.gatherResults(sends))

        fell_back = fallbacks("persist_events")
        persists.clear()
        sent = await send_all([None, None, None, None])
        # The blocker's transaction, then the four sends in one.
        self.assertEqual(len(persists), 2)
        self.assertEqual(fallbacks("persist_events"), fell_back)
        events = await store.get_events(sent)
        orderings = [events[e].stream_ordering for e in sent]
        self.assertEqual(len(set(orderings)), 4)
        for room, event_id in zip(rooms, sent, strict=True):
            self.assertEqual(events[event_id].room_id, room)
            self.assertEqual(list(await store.get_forward_extremities(room)), [event_id])

        persists.clear()
        again = await send_all([None, None, None, "taken"])
        # The group failed on the taken id: rolled back, then one by one.
        self.assertEqual(fallbacks("persist_events"), fell_back + 1)
        self.assertEqual(len(persists), 2 + 4)
        self.assertEqual(again[3], first)
        self.assertEqual(list(await store.get_forward_extremities(rooms[3])), [sent[3]])
        stored = await store.get_events(again[:3])
        for room, event_id in zip(rooms[:3], again[:3], strict=True):
            self.assertEqual(stored[event_id].room_id, room)
            self.assertGreater(stored[event_id].stream_ordering, max(orderings))
            self.assertEqual(list(await store.get_forward_extremities(room)), [event_id])
        # The rooms read on: each one's messages in order.
        for room, older, newer in zip(rooms[:3], sent, again, strict=False):
            messages = await alice.ok("GET", f"/rooms/{room}/messages?dir=b&limit=2")
            self.assertEqual([e["event_id"] for e in messages["chunk"]], [newer, older])
