"""Two OS processes allocating ids of one stream from one database at once.

Each process runs ``tests.storage.allocate_ids_worker`` as a writer of the
``foobar`` stream (both are in the writers list) on the database of this run's
engine (``SYNAPSE_LITE_TEST_DB``): the same SQLite file, or the same PostgreSQL
database. Both build their generator, say ``ready``, and are released together;
each then allocates its ids with ``get_next`` and ``get_next_txn`` from several
concurrent loops, writing a row per id, in rounds that the test releases only
when both processes finished the previous one: ids of one round all come after
the ids of the round before, so each round's block holds ids of both processes
and the two interleave on any machine, however loaded. Afterwards the test checks that no id
was handed out twice or lost, that the table holds exactly the rows each
process reported, that ``stream_positions`` holds each writer's largest id, and
that a generator built from the database afterwards agrees.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from twisted.internet import defer, protocol, reactor
from twisted.python.failure import Failure

from tests.storage.test_id_generators import IdGeneratorTestCase

#: Ids each process allocates.
IDS_PER_PROCESS = 300
WRITERS = ["alpha", "beta"]
#: Rounds both processes allocate in together (each one switch of owner at least).
ROUNDS = 3
#: The checkout root, so the child can import ``tests`` (trial runs in _trial_temp).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _WorkerProtocol(protocol.ProcessProtocol):
    """Collects a worker's output; ``ready`` fires when it is waiting to start,
    ``ended`` with (stdout lines, stderr, exit code) when it exits."""

    def __init__(self) -> None:
        self.ready: defer.Deferred[None] = defer.Deferred()
        #: Fired, one per round in order, when the worker prints ``round done``.
        self._rounds_done = 0
        self._round_waiters: list[defer.Deferred[None]] = []
        self.ended: defer.Deferred[tuple[list[str], str, int | None]] = defer.Deferred()
        #: The process transport, set by the spawner.
        self.process: Any = None
        self._out = b""
        self._err = b""

    def outReceived(self, data: bytes) -> None:
        self._out += data
        if not self.ready.called and b"ready\n" in self._out:
            self.ready.callback(None)
        done = self._out.count(b"round done\n")
        while self._rounds_done < done:
            self._rounds_done += 1
            if self._round_waiters:
                self._round_waiters.pop(0).callback(None)

    def round_done(self, round_number: int) -> defer.Deferred[None]:
        """Fires once the worker has printed ``round done`` ``round_number + 1`` times."""
        if self._rounds_done > round_number:
            return defer.succeed(None)
        waiter: defer.Deferred[None] = defer.Deferred()
        self._round_waiters.append(waiter)
        return waiter

    def errReceived(self, data: bytes) -> None:
        self._err += data

    def processEnded(self, reason: Failure) -> None:
        code = getattr(reason.value, "exitCode", None)
        stderr = self._err.decode(errors="replace")
        if not self.ready.called:
            self.ready.errback(RuntimeError(f"worker exited before it was ready:\n{stderr}"))
        while self._round_waiters:
            self._round_waiters.pop(0).errback(
                RuntimeError(f"worker exited before its round ended:\n{stderr}")
            )
        self.ended.callback((self._out.decode().splitlines(), stderr, code))


class TwoProcessAllocationTestCase(IdGeneratorTestCase):
    timeout = 60

    def spawn(self, instance: str) -> _WorkerProtocol:
        config = {
            "database": self.test_db.config(),
            "instance": instance,
            "writers": WRITERS,
            "count": IDS_PER_PROCESS,
            "rounds": ROUNDS,
        }
        worker = _WorkerProtocol()
        env = dict(os.environ, PYTHONPATH=ROOT)
        # Any: the zope interfaces confuse mypy without a plugin.
        process_reactor: Any = reactor
        worker.process = process_reactor.spawnProcess(
            worker,
            sys.executable,
            [sys.executable, "-m", "tests.storage.allocate_ids_worker", json.dumps(config)],
            env=env,
            path=ROOT,
        )
        self.addCleanup(self.stop, worker)
        return worker

    def stop(self, worker: _WorkerProtocol) -> defer.Deferred[Any]:
        """Kill a worker still running when the test ends (it failed)."""
        if worker.ended.called:
            return defer.succeed(None)
        worker.process.signalProcess("KILL")
        return worker.ended

    async def test_two_writer_processes(self) -> None:
        workers = {name: self.spawn(name) for name in WRITERS}
        await defer.gatherResults([w.ready for w in workers.values()], consumeErrors=True)
        for round_number in range(ROUNDS):
            for worker in workers.values():
                worker.process.write(b"go\n")
            await defer.gatherResults(
                [w.round_done(round_number) for w in workers.values()], consumeErrors=True
            )
        reports: dict[str, dict[str, Any]] = {}
        for name, worker in workers.items():
            lines, stderr, code = await worker.ended
            self.assertEqual(code, 0, f"{name} failed:\n{stderr}")
            reports[name] = json.loads(lines[-1])
        ids = {name: reports[name]["ids"] for name in WRITERS}

        # No id twice, within or across processes, and none lost.
        for name in WRITERS:
            self.assertEqual(len(ids[name]), IDS_PER_PROCESS)
            self.assertEqual(len(set(ids[name])), IDS_PER_PROCESS, f"{name} got an id twice")
        self.assertEqual(set(ids["alpha"]) & set(ids["beta"]), set())
        everything = set(ids["alpha"]) | set(ids["beta"])
        self.assertEqual(everything, set(range(1, 2 * IDS_PER_PROCESS + 1)))
        # The processes really ran side by side: their ids interleave.
        owner = {i: name for name in WRITERS for i in ids[name]}
        switches = sum(1 for i in range(2, len(owner) + 1) if owner[i] != owner[i - 1])
        self.assertGreaterEqual(switches, ROUNDS, "the two processes did not overlap")

        # The table holds exactly the rows the processes reported.
        rows = await self.db.execute("rows", "SELECT stream_id, instance_name FROM foobar")
        self.assertEqual(sorted((int(i), n) for i, n in rows), sorted(owner.items()))

        # Each writer recorded its largest id, as its token says.
        expected = {name: max(ids[name]) for name in WRITERS}
        self.assertEqual(await self.stored_positions(), expected)
        self.assertEqual({name: reports[name]["token"] for name in WRITERS}, expected)

        # A process starting now agrees.
        observer = self.make_id_gen("observer", writers=WRITERS)
        self.assertEqual(observer.known_writer_positions(), expected)
        self.assertEqual(observer.persisted_upto_position(), 2 * IDS_PER_PROCESS)
