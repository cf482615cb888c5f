"""State resolution from the database, with the stored auth chain index
against walking the auth events, in one run: ``python -m bench.stored_auth_chains``.

    python -m bench.stored_auth_chains [--engine postgres] [--members 10000]
                                       [--side 1000] [--rounds 3]

The room of ``bench.state_resolution`` (``--members`` joined users, two
branches of ``--side`` state events each, version 10) is written to a
throwaway database as the writer stores it: event rows, auth edges, and
the index's positions and links (``auth_chains.index_auth_chains_txn``,
in batches of 100 events: its build rate is printed). Then, each in a
fresh transaction (nothing cached between rounds), timed ``--rounds``
times (medians printed): the auth difference of the two branches' states
by walking (``TxnEvents`` loads each event the walk reaches) and from the
index (``auth_difference_txn``), checked equal; and the whole resolution
as the persist path runs it (``state_groups.resolve_states_txn``) with and
without the index, checked equal. Prints each and walked / indexed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from bench.state_resolution import build
from synapse_lite.api.room_versions import SPEC_ROOM_VERSIONS, RoomVersion
from synapse_lite.event_graph.pdu import Pdu, StateKey
from synapse_lite.event_graph.state_resolution import auth_difference
from synapse_lite.storage._base import json_encoder
from synapse_lite.storage.database import (
    LoggingDatabaseConnection,
    LoggingTransaction,
    insert_rows_txn,
    make_startup_connection,
)
from synapse_lite.storage.databases.main.auth_chains import (
    ChainedEvent,
    auth_difference_txn,
    index_auth_chains_txn,
)
from synapse_lite.storage.databases.main.state_groups import TxnEvents, resolve_states_txn
from tests.harness.databases import create_test_database


def fill(conn: LoggingDatabaseConnection, events: Mapping[str, Pdu]) -> float:
    """Store ``events`` (ids in creation order); returns the index's build
    rate (events/s)."""
    ordered = [events[e] for e in sorted(events)]
    indexing = 0.0
    with conn.transaction("bench_fill") as txn:
        for start in range(0, len(ordered), 100):
            batch = ordered[start : start + 100]
            insert_rows_txn(
                txn,
                "events (stream_ordering, topological_ordering, event_id, room_id, type,"
                " state_key, sender, origin_server_ts, content, instance_name)",
                [
                    (start + n, e.depth, e.event_id, e.room_id, e.type, e.state_key,
                     e.sender, e.origin_server_ts, json_encoder(e.content), "master")
                    for n, e in enumerate(batch, start=1)
                ],
            )  # fmt: skip
            insert_rows_txn(
                txn,
                "event_auth_edges (event_id, auth_id)",
                [(e.event_id, a) for e in batch for a in e.auth_event_ids],
            )
            began = time.perf_counter()
            index_auth_chains_txn(
                txn,
                [
                    ChainedEvent(e.event_id, e.room_id, e.state_pair, e.auth_event_ids, start + n)
                    for n, e in enumerate(batch, start=1)
                ],
            )
            indexing += time.perf_counter() - began
    return len(ordered) / indexing


def timed(
    conn: LoggingDatabaseConnection, rounds: int, action: Callable[[LoggingTransaction], object]
) -> tuple[float, object]:
    """The median seconds of ``action`` in a fresh read transaction, and
    its last result."""
    times, result = [], None
    for _ in range(rounds):
        with conn.transaction("bench", read_only=True) as txn:
            started = time.perf_counter()
            result = action(txn)
            times.append(time.perf_counter() - started)
    return statistics.median(times), result


def _walked_difference(
    states: Sequence[Mapping[StateKey, str]], txn: LoggingTransaction
) -> set[str]:
    return auth_difference(states, TxnEvents(txn))


def _indexed_difference(
    states: Sequence[Mapping[StateKey, str]], txn: LoggingTransaction
) -> set[str] | None:
    return auth_difference_txn(txn, states)


def _resolve(
    version: RoomVersion,
    states: Sequence[Mapping[StateKey, str]],
    txn: LoggingTransaction,
    use_index: bool = True,
) -> dict[StateKey, str]:
    return resolve_states_txn(txn, version, states, use_index)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--side", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    version = SPEC_ROOM_VERSIONS["10"]
    print(
        f"engine {args.engine}, version 10, {args.side} state events per branch;"
        " medians of fresh transactions"
    )
    print(
        "members  events  index build ev/s  difference walked ms  indexed ms  walked/indexed"
        "  resolve walked ms  indexed ms  walked/indexed"
    )
    for members in (args.members // 10, args.members):
        events, sides = build(version, members, args.side, seed=members)
        test_db = create_test_database(args.engine, with_schema=True)
        try:
            conn = make_startup_connection(test_db.make_engine())
            try:
                build_rate = fill(conn, events)
                walk_s, walked = timed(conn, args.rounds, partial(_walked_difference, sides))
                index_s, indexed = timed(conn, args.rounds, partial(_indexed_difference, sides))
                assert walked == indexed == auth_difference(sides, events)
                slow_s, slow = timed(
                    conn, args.rounds, partial(_resolve, version, sides, use_index=False)
                )
                fast_s, fast = timed(conn, args.rounds, partial(_resolve, version, sides))
                assert slow == fast
            finally:
                conn.close()
        finally:
            test_db.drop()
        print(
            f"{members:7d}  {len(events):6d}  {build_rate:16.0f}  {walk_s * 1000:20.1f}"
            f"  {index_s * 1000:10.1f}  {walk_s / index_s:14.2f}  {slow_s * 1000:17.1f}"
            f"  {fast_s * 1000:10.1f}  {slow_s / fast_s:14.2f}"
        )


if __name__ == "__main__":
    main()
