"""A writer process for test_id_allocation_processes: allocates ids and prints them.

Run as ``python -m tests.storage.allocate_ids_worker CONFIG_JSON``, where the
JSON holds ``database`` (``{"engine", "args"}``), ``instance``, ``writers`` and
``count``. The process builds a ``MultiWriterIdGenerator`` for the ``foobar``
stream of ``IdGeneratorTestCase`` as a startup connection would, prints
``ready``, then allocates ``count`` ids in ``rounds`` rounds: each round
waits for a line on stdin (so that both processes allocate together, however
slow the machine), allocates its share from a few concurrent lanes, half with
``get_next`` and half with ``get_next_txn``, inserting one ``foobar`` row per
id, and prints ``round done``. It flushes its ``stream_positions`` write and
prints one JSON line: ``{"instance", "ids", "token"}``.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from twisted.internet import defer, task, threads
from twisted.internet.interfaces import IReactorCore

from synapse_lite.replication.notifier import ReplicationNotifier
from synapse_lite.storage.database import (
    DatabasePool,
    LoggingTransaction,
    make_startup_connection,
)
from synapse_lite.storage.engines import create_engine
from synapse_lite.storage.id_generators import MultiWriterIdGenerator
from synapse_lite.streams.definition import IdSpace, StreamTable

#: Concurrent allocation loops in the process (and database threads).
LANES = 4


def _insert_txn(txn: LoggingTransaction, stream_id: int, instance: str) -> None:
    txn.execute(
        "INSERT INTO foobar (stream_id, instance_name, data) VALUES (?, ?, 'x')",
        (stream_id, instance),
    )


async def _lane(
    lane: int, count: int, id_gen: MultiWriterIdGenerator, db: DatabasePool, instance: str
) -> list[int]:
    ids: list[int] = []
    for i in range(count):
        if (lane + i) % 2:
            async with id_gen.get_next() as stream_id:
                await db.runInteraction("insert", _insert_txn, stream_id, instance)
        else:

            def in_txn(txn: LoggingTransaction) -> int:
                stream_id = id_gen.get_next_txn(txn)
                _insert_txn(txn, stream_id, instance)
                return stream_id

            stream_id = await db.runInteraction("insert_txn", in_txn)
        ids.append(stream_id)
    return ids


async def run(reactor: IReactorCore, config: dict[str, Any]) -> None:
    instance = config["instance"]
    engine = create_engine(config["database"]["engine"], config["database"]["args"])
    db = DatabasePool(reactor, engine, name=instance, max_connections=LANES)
    conn = make_startup_connection(engine)
    try:
        id_gen = MultiWriterIdGenerator(
            db_conn=conn,
            db=db,
            notifier=ReplicationNotifier(),
            stream_name="test_stream",
            instance_name=instance,
            ids=IdSpace("foobar_seq", (StreamTable("foobar"),)),
            writers=config["writers"],
        )
    finally:
        conn.close()

    try:
        print("ready", flush=True)
        count: int = config["count"]
        rounds: int = config.get("rounds", 1)
        results: list[list[int]] = []
        for round_number in range(rounds):
            # Blocking read off the reactor thread: the go signal from the test.
            await threads.deferToThread(sys.stdin.readline)
            in_round = count // rounds + (1 if round_number < count % rounds else 0)
            shares = [
                in_round // LANES + (1 if lane < in_round % LANES else 0) for lane in range(LANES)
            ]
            results += await defer.gatherResults(
                [
                    defer.ensureDeferred(_lane(lane, share, id_gen, db, instance))
                    for lane, share in enumerate(shares)
                ],
                consumeErrors=True,
            )
            print("round done", flush=True)
        await id_gen.flush_stream_positions()
    finally:
        # The pool's threads would keep a failed process alive.
        db.close()
    ids = sorted(i for lane_ids in results for i in lane_ids)
    token = id_gen.writer_position(instance)
    print(json.dumps({"instance": instance, "ids": ids, "token": token}), flush=True)


def main(reactor: IReactorCore, config_json: str) -> defer.Deferred[None]:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return defer.ensureDeferred(run(reactor, json.loads(config_json)))


if __name__ == "__main__":
    task.react(main, sys.argv[1:])
