"""Where each stream's ids live: its sequence and the tables whose rows carry them.

One table of facts used by the stores (to build their ID generators) and by the
Spark audit (to reproduce positions offline), so the two can never disagree.
Streams kept only in memory (typing, federation) have no entry.
"""

from __future__ import annotations

import attr

from synapse_lite.config.homeserver import MAIN_PROCESS, StreamWriters


@attr.s(slots=True, frozen=True, auto_attribs=True)
class StreamTable:
    """One table holding rows of a stream.

    ``shares_ids``: its rows reuse the id of the write they belong to, so one id
    may appear on several of its rows and on a row of another table of the
    stream (written in the same transaction). Otherwise every row has an id of
    its own, used by no other row of the stream; the audit reports a reuse.
    """

    table: str
    instance_column: str
    id_column: str
    shares_ids: bool = False


@attr.s(slots=True, frozen=True, auto_attribs=True)
class StreamIdSpace:
    """A stream's ids: where they come from and where they are stored.

    ``writers_key`` names the ``stream_writers`` entry giving its writers;
    ``None`` with ``any_writer`` means every process may write and nothing is
    kept in ``stream_positions``; ``None`` without it means the main process.
    """

    stream_name: str
    sequence_name: str
    tables: tuple[StreamTable, ...]
    positive: bool = True
    writers_key: str | None = None
    any_writer: bool = False

    def id_generator_tables(self) -> list[tuple[str, str, str]]:
        return [(t.table, t.instance_column, t.id_column) for t in self.tables]

    def writers(self, stream_writers: StreamWriters) -> list[str]:
        """The configured writers (empty: anyone may write)."""
        if self.any_writer:
            return []
        if self.writers_key is None:
            return [MAIN_PROCESS]
        return list(stream_writers.writers_of(self.writers_key))


def _t(table: str, id_column: str = "stream_id", shares_ids: bool = False) -> StreamTable:
    return StreamTable(table, "instance_name", id_column, shares_ids)


EVENTS = StreamIdSpace(
    "events",
    "events_stream_seq",
    # A state change carries the id of the event that made it; one event may
    # change several keys.
    (_t("events", "stream_ordering"), _t("current_state_delta_stream", shares_ids=True)),
    writers_key="events",
)
BACKFILL = StreamIdSpace(
    "backfill",
    "events_backfill_stream_seq",
    (_t("events", "stream_ordering"),),
    positive=False,
    writers_key="events",
)
CACHES = StreamIdSpace(
    "caches",
    "cache_invalidation_stream_seq",
    (_t("cache_invalidation_stream_by_instance"),),
    any_writer=True,
)
RECEIPTS = StreamIdSpace(
    "receipts", "receipts_sequence", (_t("receipts_linearized"),), writers_key="receipts"
)
ACCOUNT_DATA = StreamIdSpace(
    "account_data",
    "account_data_sequence",
    (_t("account_data"), _t("room_account_data"), _t("room_tags_revisions")),
    writers_key="account_data",
)
TO_DEVICE = StreamIdSpace(
    "to_device",
    "device_inbox_sequence",
    # One id per send: every local device's inbox row and the outbox row share it.
    (_t("device_inbox", shares_ids=True), _t("device_federation_outbox", shares_ids=True)),
    writers_key="to_device",
)
PRESENCE = StreamIdSpace(
    "presence", "presence_stream_sequence", (_t("presence_stream"),), writers_key="presence"
)
# One id per user's change, on a row for each device it touches.
DEVICE_LISTS = StreamIdSpace(
    "device_lists", "device_lists_sequence", (_t("device_lists_stream", shares_ids=True),)
)

#: Every stream whose rows are in the database, by name.
STREAM_ID_SPACES: dict[str, StreamIdSpace] = {
    s.stream_name: s
    for s in (EVENTS, BACKFILL, CACHES, RECEIPTS, ACCOUNT_DATA, TO_DEVICE, PRESENCE, DEVICE_LISTS)
}
