"""Migration speed of the state at every event: ``python -m bench.state_migration``.

    python -m bench.state_migration [--engine postgres] [--events 100000] [--rooms 20]

A database of the schema before the event graph (version 79) is filled
with ``--events`` events of linear rooms (a tenth of them state events:
joins, leaves, topics; the rest messages), then upgraded in two timed
steps: to version 80 (the edges and extremities, plain SQL: the baseline)
and on to the current version (the state groups derived by replaying each
room, ``state_groups.derive_state_groups_txn``). Prints events/s of each
step and the state step's over the baseline's, measured in the same run.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time

from synapse_lite.storage.database import make_startup_connection
from synapse_lite.storage.prepare_database import SCHEMA_DIR, code_schema_version, prepare_database
from tests.harness.databases import TestDatabase, create_test_database


def schema_before(version: int) -> str:
    """A copy of the schema without ``version``'s delta and later ones."""
    directory = tempfile.mkdtemp(prefix="bench_schema_")
    shutil.copytree(SCHEMA_DIR, directory, dirs_exist_ok=True)
    deltas = os.path.join(directory, "deltas")
    for name in os.listdir(deltas):
        if name[:4].isdigit() and int(name[:4]) >= version:
            os.unlink(os.path.join(deltas, name))
    return directory


def fill(test_db: TestDatabase, events: int, rooms: int) -> None:
    """``events`` events over ``rooms`` linear rooms, interleaved."""
    engine = test_db.make_engine()
    conn = make_startup_connection(engine)
    rows = []
    members = 200
    for stream in range(1, events + 1):
        room = stream % rooms
        index = stream // rooms
        if index == 0:
            type_, key = "m.room.create", ""
        elif stream % 10 == 0:
            type_, key = ("m.room.topic", "") if stream % 30 == 0 else (
                "m.room.member", f"@u{stream % members}:bench"
            )  # fmt: skip
        else:
            type_, key = "m.room.message", None
        rows.append(
            (stream, index + 1, f"$e{stream}", f"!r{room}:bench", type_, key, "@u0:bench", 0,
             "{}", "master")
        )  # fmt: skip
    try:
        with conn.transaction("bench_fill") as txn:
            txn.execute_batch(
                "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id,"
                " type, state_key, sender, origin_server_ts, content, instance_name)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
    finally:
        conn.close()


def upgrade(test_db: TestDatabase, schema_dir: str) -> float:
    engine = test_db.make_engine()
    conn = make_startup_connection(engine)
    try:
        start = time.perf_counter()
        prepare_database(conn, is_main=True, schema_dir=schema_dir)
        return time.perf_counter() - start
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rooms", type=int, default=20)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    test_db = create_test_database(args.engine)
    before_graph, before_state = schema_before(80), schema_before(81)
    try:
        upgrade(test_db, before_graph)
        fill(test_db, args.events, args.rooms)
        edges = upgrade(test_db, before_state)
        state = upgrade(test_db, SCHEMA_DIR)
    finally:
        test_db.drop()
        shutil.rmtree(before_graph)
        shutil.rmtree(before_state)
    print(
        f"{args.engine}, {args.events:,} events in {args.rooms} rooms, to schema"
        f" {code_schema_version()}:"
    )
    print(f"  edges (delta 0080, baseline): {edges:.2f} s, {args.events / edges:,.0f} events/s")
    print(f"  state groups (0081-0082):     {state:.2f} s, {args.events / state:,.0f} events/s")
    print(f"  state / edges events/s: {edges / state:.2f}")


if __name__ == "__main__":
    main()
