"""The stored auth chain index answers as walking the auth events does:
random rooms indexed batch by batch into the database, and the events a
room's writer persists. On SQLite and PostgreSQL (``SYNAPSE_LITE_TEST_DB``)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from synapse_lite.event_graph.pdu import Pdu
from synapse_lite.event_graph.state_resolution import auth_chain, auth_difference, resolve_state
from synapse_lite.storage.database import (
    LoggingDatabaseConnection,
    LoggingTransaction,
    insert_rows_txn,
    make_startup_connection,
)
from synapse_lite.storage.databases.main.auth_chains import (
    ChainedEvent,
    auth_chain_ids_txn,
    auth_difference_txn,
    index_auth_chains_txn,
)
from tests.event_graph.rooms import ALICE, BOB
from tests.event_graph.test_state_resolution import STEPS, V2_VERSIONS, random_room
from tests.harness.server import DatabaseTestCase


def store_events_txn(txn: LoggingTransaction, events: list[Pdu], batches: list[int]) -> None:
    """``events`` (in creation order) as the writer stores them: their rows
    and auth edges, indexed in batches of the given sizes."""
    insert_rows_txn(
        txn,
        "events (stream_ordering, topological_ordering, event_id, room_id, type, state_key,"
        " sender, origin_server_ts, content, instance_name)",
        [
            (n, e.depth, e.event_id, e.room_id, e.type, e.state_key, e.sender, 0, "{}", "master")
            for n, e in enumerate(events, start=1)
        ],
    )
    insert_rows_txn(
        txn,
        "event_auth_edges (event_id, auth_id)",
        [(e.event_id, a) for e in events for a in e.auth_event_ids],
    )
    chained = [
        ChainedEvent(e.event_id, e.room_id, e.state_pair, e.auth_event_ids, n)
        for n, e in enumerate(events, start=1)
    ]
    start = 0
    for size in batches:
        index_auth_chains_txn(txn, chained[start : start + size])
        start += size
    index_auth_chains_txn(txn, chained[start:])


class StoredIndexTestCase(DatabaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.conn: LoggingDatabaseConnection = make_startup_connection(self.test_db.make_engine())
        self.addCleanup(self.conn.close)

    @settings(max_examples=25, deadline=None)
    @given(
        version=st.sampled_from(V2_VERSIONS),
        steps=STEPS,
        seed=st.integers(0, 2**16),
    )
    def test_agrees_with_walking(self, version: str, steps: list, seed: int) -> None:
        """Auth chains, auth differences and resolutions of random
        three-branch rooms, indexed in random batches."""
        room, tips = random_room(version, steps)
        events = sorted(room.events.values(), key=lambda e: e.event_id)  # creation order
        rng = random.Random(seed)
        batches = [rng.randint(1, 4) for _ in range(len(events))]
        sets = [room.state_after[t.event_id] for t in tips]
        with self.conn.transaction() as txn:
            for table in ("events", "event_auth_edges", "event_auth_chains",
                          "event_auth_chain_links"):  # fmt: skip
                txn.execute(f"DELETE FROM {table}")
            store_events_txn(txn, events, batches)
            for event in events:
                self.assertEqual(
                    auth_chain_ids_txn(txn, [event.event_id]),
                    auth_chain([event.event_id], room.events),
                )
            for chosen in (sets, sets[:2]):
                difference = auth_difference_txn(txn, chosen)
                self.assertEqual(difference, auth_difference(chosen, room.events))
                self.assertEqual(
                    resolve_state(
                        room.version, chosen, room.events, indexed_auth_difference=difference
                    ),
                    resolve_state(room.version, chosen, room.events),
                )

    def test_one_key_runs_share_a_chain_and_messages_have_no_position(self) -> None:
        room, _tips = random_room("10", [(0, "levels", BOB, 10), (0, "levels", BOB, 20)])
        events = sorted(room.events.values(), key=lambda e: e.event_id)
        message = room.add("m.room.message", ALICE, {"body": "hi"})
        with self.conn.transaction() as txn:
            store_events_txn(txn, [*events, message], [])
            txn.execute(
                "SELECT c.chain_id, c.sequence_number FROM event_auth_chains AS c"
                " JOIN events AS e ON e.event_id = c.event_id"
                " WHERE e.type = 'm.room.power_levels' ORDER BY e.stream_ordering"
            )
            levels = [tuple(row) for row in txn.fetchall()]
            txn.execute("SELECT COUNT(*) FROM event_auth_chains WHERE event_id = ?",
                        (message.event_id,))  # fmt: skip
            message_rows = txn.fetchone()[0]
            # A message's auth chain comes from its auth events' positions.
            self.assertEqual(
                auth_chain_ids_txn(txn, [message.event_id]),
                auth_chain([message.event_id], room.events),
            )
        self.assertGreaterEqual(len(levels), 2)
        self.assertEqual(len({chain for chain, _ in levels}), 1)
        self.assertEqual([s for _, s in levels], list(range(1, len(levels) + 1)))
        self.assertEqual(message_rows, 0)

    def test_an_event_without_a_position_falls_back_to_walking(self) -> None:
        room, tips = random_room("10", [(0, "topic", ALICE, 0), (1, "topic", BOB, 0)])
        events = sorted(room.events.values(), key=lambda e: e.event_id)
        sets = [room.state_after[t.event_id] for t in tips]
        with self.conn.transaction() as txn:
            store_events_txn(txn, events, [])
            txn.execute("DELETE FROM event_auth_chains WHERE event_id = ?", (tips[0].event_id,))
            self.assertIsNone(auth_difference_txn(txn, sets))
