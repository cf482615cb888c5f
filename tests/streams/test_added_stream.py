"""A stream declared only in this file, to prove what adding a stream takes.

``notes`` (a user's notes, written by a configured writer) is its definition,
its store queries (:class:`NoteQueries`) and its handler (:class:`NotesSection`,
what /sync shows of it), nothing else: the framework takes it through writing
on its writer, replication to every process, catch-up after a restart, waking
/sync, the position metrics and the offline audit.
"""

from __future__ import annotations

from typing import Any

import attr
from prometheus_client import REGISTRY
from twisted.internet import defer

from synapse_lite.codec.kinds import OfType, wire
from synapse_lite.codec.rows import RowCodec
from synapse_lite.storage.database import DatabasePool, LoggingTransaction
from synapse_lite.storage.id_generators import MultiWriterIdGenerator
from synapse_lite.streams.catalog import BUILTIN_STREAMS
from synapse_lite.streams.definition import (
    IdSpace,
    StreamDefinition,
    StreamTable,
    Updates,
    WriterRule,
    wake_users,
)
from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase, make_homeserver

# The definition.


@attr.s(slots=True, frozen=True, auto_attribs=True)
class NoteRow:
    """A note was written for ``user_id``."""

    user_id: str = attr.ib(metadata=wire(OfType(str)))
    text: str = attr.ib(metadata=wire(OfType(str)))


class NoteQueries:
    """The stream's store queries."""

    def __init__(self, pool: DatabasePool) -> None:
        self._pool = pool

    async def add(
        self, id_gen: MultiWriterIdGenerator, writer: str, user_id: str, text: str
    ) -> int:
        def txn_func(txn: LoggingTransaction) -> int:
            stream_id = id_gen.get_next_txn(txn)
            txn.execute(
                "INSERT INTO test_notes (stream_id, instance_name, user_id, text)"
                " VALUES (?, ?, ?, ?)",
                (stream_id, writer, user_id, text),
            )
            return stream_id

        return await self._pool.runInteraction("add_note", txn_func)

    async def rows_between(
        self, writer: str, from_id: int, upto_id: int, limit: int
    ) -> tuple[Updates, int, bool]:
        rows = await self._pool.select(
            "note_rows",
            "SELECT stream_id, user_id, text FROM test_notes WHERE instance_name = ?"
            " AND stream_id > ? AND stream_id <= ? ORDER BY stream_id LIMIT ?",
            writer,
            from_id,
            upto_id,
            limit,
        )
        updates: Updates = [(int(r[0]), NoteRow(r[1], r[2])) for r in rows]
        if len(updates) >= limit:
            return updates, updates[-1][0], True
        return updates, upto_id, False

    async def texts_for(self, user_id: str, after: int, upto: int) -> list[str]:
        rows = await self._pool.select(
            "notes_for",
            "SELECT text FROM test_notes WHERE user_id = ? AND stream_id > ? AND stream_id <= ?"
            " ORDER BY stream_id",
            user_id,
            after,
            upto,
        )
        return [r[0] for r in rows]


class NotesSection:
    """The stream's handler: what /sync shows of it."""

    key = "org.example.notes"

    def __init__(self, queries: NoteQueries) -> None:
        self._queries = queries

    async def changes(self, user_id: str, since: int | None, upto: int) -> Any:
        texts = await self._queries.texts_for(user_id, since or 0, upto)
        return {"notes": texts} if texts else None


NOTES = StreamDefinition(
    name="notes",
    description="a user's notes (a stream of the tests only)",
    codec=RowCodec(NoteRow),
    writers=WriterRule("notes"),
    ids=IdSpace("test_notes_seq", (StreamTable("test_notes"),)),
    in_sync_token=True,
    wake=wake_users,
    rows_from_store=lambda store: NoteQueries(store.db_pool).rows_between,
    sync_section=lambda store: NotesSection(NoteQueries(store.db_pool)),
)


# The test.


class AddedStreamTestCase(DatabaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        engine = self.test_db.make_engine()
        conn = engine.connect()
        try:
            cur = conn.cursor()
            cur.execute(
                "CREATE TABLE test_notes (stream_id BIGINT NOT NULL, instance_name TEXT NOT NULL,"
                " user_id TEXT NOT NULL, text TEXT NOT NULL)"
            )
            for statement in engine.create_sequence_sql("test_notes_seq"):
                cur.execute(statement)
            conn.commit()
        finally:
            conn.close()

    async def test_written_replicated_caught_up_synced_measured_and_audited(self) -> None:
        streams = BUILTIN_STREAMS.with_streams(NOTES)
        servers, clients, bus = start_cluster(
            self,
            self.test_db,
            workers=["writer1", "reader"],
            stream_writers={"notes": "writer1"},
            streams=streams,
        )
        writer, reader = servers["writer1"], servers["reader"]
        self.assertIn("notes", writer.streamer.sourced_stream_names)
        self.assertNotIn("notes", reader.streamer.sourced_stream_names)
        queries = NoteQueries(writer.store.db_pool)
        id_gen = writer.id_generators.of(NOTES)

        # Written on its writer, replicated, and a waiting /sync on another
        # process is woken with it.
        alice = await ClientApi(self, clients["reader"].base_url).register("alice")
        assert alice.user_id is not None
        since = (await alice.sync())["next_batch"]
        # Let alice's own presence (online since her first sync) go by.
        while True:
            settled = await alice.sync(since=since, timeout=0)
            if settled["next_batch"] == since:
                break
            since = settled["next_batch"]
        self.assertNotIn(NotesSection.key, settled)
        # A long-poll that is really waiting on the reader; on a loaded machine
        # a late presence change can still answer one early: poll again.
        while True:
            waiting = defer.ensureDeferred(alice.sync(since=since, timeout=30_000))

            def parked_or_answered(poll: defer.Deferred[Any] = waiting) -> bool:
                return bool(reader.notifier._users) or poll.called

            await eventually(parked_or_answered, what="the /sync to wait")
            if not waiting.called:
                break
            answered = await waiting
            self.assertNotIn(NotesSection.key, answered)
            since = answered["next_batch"]
        first = await queries.add(id_gen, "writer1", alice.user_id, "first note")
        woken = await waiting
        while NotesSection.key not in woken:  # woken first by something else
            woken = await alice.sync(since=woken["next_batch"], timeout=30_000)
        self.assertEqual(woken[NotesSection.key], {"notes": ["first note"]})

        # Metrics: the writer's position is a gauge like every stream's.
        position = REGISTRY.get_sample_value(
            "synapse_lite_stream_position", {"stream": "notes", "writer": "writer1"}
        )
        self.assertEqual(position, first)

        # A restarted reader catches up from the database what it missed.
        bus.leave(next(e for e in bus.endpoints if e.hs is reader))
        await reader.service.stopService()
        missed = [await queries.add(id_gen, "writer1", alice.user_id, f"n{i}") for i in range(3)]
        reader = make_homeserver(self, reader.config, "reader")
        bus.join(reader)
        await reader.waiters.wait_for_stream_position("writer1", "notes", missed[-1], timeout=5)
        self.assertEqual(reader.streams["notes"].positions.received_position("writer1"), missed[-1])
        texts = await NoteQueries(reader.store.db_pool).texts_for(alice.user_id, first, missed[-1])
        self.assertEqual(texts, ["n0", "n1", "n2"])

        # The audit reads the stream's table like any other, and finds nothing wrong.
        from spark.progress import Progress
        from spark.runner import AuditOptions, run_audit
        from tests.spark.session import shared_spark

        await writer.id_generators.flush_stream_positions()
        report = run_audit(
            AuditOptions(writer.config.config_files[0], partitions=1, streams=streams),
            Progress(None),
            spark=shared_spark(),
        )
        self.assertIn("notes", [s.stream for s in report.streams])
        self.assertEqual([f for f in report.findings], [])
