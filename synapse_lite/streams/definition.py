"""What a stream is, declared once.

A :class:`StreamDefinition` says everything about one replication stream that
does not depend on which process is running: its name, its row type and how a
row travels on the wire, where its ids come from and which tables hold them,
who may write it, how a follower catches up, what a receiving process does
with a row (which caches to forget, which /sync waiters to wake) and whether
it has a position in /sync tokens. The streamer, the receiver, the catch-up
endpoint, the notifier, /sync, the ID generators, the config's
``stream_writers``, metrics and the offline audit all read definitions; none
of them names a stream except where a stream has genuinely special meaning
(the events stream is the room timeline).

A process's *runtime* view of a stream (its positions, how it reads rows) is
built from the definition by the composition root (``app/composition.py``).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attr

from synapse_lite.codec.rows import RowCodec

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main import GenericWorkerStore

#: ``[(token, row), ...]`` in token order; rows sharing a token were written
#: under one id and are processed together.
Updates = list[tuple[int, Any]]
#: ``(writer, from_token, upto_token, limit) -> (updates, upto, limited)``:
#: the rows ``writer`` wrote in ``(from_token, upto_token]``, at most about
#: ``limit``. When ``limited``, ``upto`` is how far the returned rows reach and
#: the caller asks again from there.
UpdateFunction = Callable[[str, int, int, int], Awaitable[tuple[Updates, int, bool]]]


class CatchUp(enum.Enum):
    """Where a follower reads rows it missed."""

    #: From the database: the rows are in the stream's tables.
    DATABASE = "database"
    #: From the writer's memory, over internal HTTP (typing, federation).
    WRITER_MEMORY = "writer memory"


@attr.s(slots=True, frozen=True, auto_attribs=True)
class StreamTable:
    """One table holding rows of a stream.

    ``shares_ids``: its rows reuse the id of the write they belong to, so one id
    may appear on several of its rows and on a row of another table of the
    stream (written in the same transaction). Otherwise every row has an id of
    its own, used by no other row of the stream; the audit reports a reuse.

    ``rows_removed``: why a row of this table may disappear after its write
    committed (an upsert giving the row a later id, a delete once delivered),
    or ``""`` when rows are never removed. The audit explains a missing id of
    such a table by this; in a table whose rows stay, a committed id without a
    row is a fault.
    """

    table: str
    instance_column: str = "instance_name"
    id_column: str = "stream_id"
    shares_ids: bool = False
    rows_removed: str = ""


#: A comparison of positions, as the same comparison of stored ids of a
#: stream that counts down.
_MIRRORED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "="}


@attr.s(slots=True, frozen=True, auto_attribs=True)
class IdSpace:
    """Where a stream's ids come from and where they are stored.

    **Stored ids and positions.** A *position* counts up from 1 on every
    stream: the sequence hands out positions, and positions are what the ID
    generator, its position model, the stream views, replication (RDATA and
    POSITION tokens), /sync tokens, metrics, stall reports and the audit
    speak. A *stored id* is what the database holds: the id columns of the
    stream's tables, ``stream_positions.stream_id``, and the ids the generator
    hands a writer to put in its rows. They are equal, except on a stream
    that counts down (``positive`` False: backfill, whose events sort before
    the room's known history), whose stored ids are the negated positions
    (-1, -2, ...). The methods below are the only place that sign is
    flipped; everything crossing between the database and memory goes
    through them.
    """

    sequence_name: str
    tables: tuple[StreamTable, ...]
    #: False for a stream whose stored ids count down from -1 (backfill).
    positive: bool = True

    def position(self, stored_id: int) -> int:
        """The position of a stored id (or of a stored position)."""
        return stored_id if self.positive else -stored_id

    def stored_id(self, position: int) -> int:
        """What the database holds for ``position``."""
        return position if self.positive else -position

    def position_sql(self, column: str) -> str:
        """SQL for the position of ``column``'s stored id."""
        return column if self.positive else f"-{column}"

    def newest_position_sql(self, column: str) -> str:
        """SQL for the largest position among ``column``'s stored ids, as an
        aggregate the column's index answers (not ``MAX(-column)``)."""
        return f"MAX({column})" if self.positive else f"-MIN({column})"

    def position_condition(self, column: str, comparison: str, other: str = "?") -> str:
        """SQL comparing the position of ``column`` with that of ``other``
        (``comparison``: ``<``, ``<=``, ``>``, ``>=`` or ``=``, on positions).
        ``other`` is a stored id: pass ``stored_id(position)`` for a ``?``."""
        return f"{column} {comparison if self.positive else _MIRRORED[comparison]} {other}"

    def position_order_sql(self, column: str) -> str:
        """SQL ordering by ``column``'s position, smallest first."""
        return column if self.positive else f"{column} DESC"


class Reader(enum.Enum):
    """A part a process plays that reads streams (``StreamDefinition.read_by``).

    A process subscribes to the streams its parts read and receives nothing
    of the others (``docs/workers.md``, "Subscriptions by role"). The main
    process is not among them: it reads every stream (it relays them over
    TCP, and its duties touch all of them).
    """

    #: Serves the client API beyond media (reads, /sync, sends): every
    #: worker but one that only serves media.
    CLIENT = "client API"
    #: The federation sender (``federation_sender``) when it is a worker.
    FEDERATION_SENDER = "federation sender"
    #: Delivers notifications to push gateways (``pusher_instances``).
    PUSHER = "pusher"
    #: The media instance (``media_instance``) when it plays no other part.
    MEDIA = "media"
    #: The router: it only learns which events writer holds each room.
    ROUTER = "router"


#: Which processes play each part, in the words of ``docs/workers.md``.
PLAYED_BY: dict[Reader, str] = {
    Reader.CLIENT: "every worker but a media-only one (readers, events writers, stream writers)",
    Reader.FEDERATION_SENDER: "`federation_sender`, when it is a worker",
    Reader.PUSHER: "each of `pusher_instances` that is a worker",
    Reader.MEDIA: "`media_instance`, when it writes no stream and sends nothing",
    Reader.ROUTER: "the router",
}


class ShardKey(enum.Enum):
    """What a stream with several writers is divided by: each key is written
    by one writer, always the same one, so one key's writes keep their order."""

    #: A room's events: the writer chosen when the room is created is stored
    #: with the room (``rooms.event_writer``) and read back, never recomputed.
    ROOM = "room"
    #: A user's changes (device lists).
    USER = "user"
    #: What is sent to one other server (federation senders).
    DESTINATION = "destination"
    #: What is sent to one application service.
    SERVICE = "service"
    #: A pusher's notifications (``pusher_instances``).
    PUSHER = "pusher"


@attr.s(slots=True, frozen=True, auto_attribs=True)
class StableHash:
    """Which one of several instances handles a key: the first 8 bytes of the
    key's SHA-256, big-endian, modulo the number of instances.

    The same for every process and across restarts (unlike Python's
    ``hash``), so whoever computes it over the same instances agrees.
    ``sorted_instances``: count over the instances sorted by name, so the
    order they are listed in does not matter (new shardings do this); False
    counts in the order configured (device lists and pushers were sharded so
    first, and keep it: changing it would move users and pushers to another
    instance on upgrade).

    ``rendezvous``: instead of the modulo, the instance whose name hashed
    with the key (the first 8 bytes of SHA-256 of ``instance NUL key``,
    big-endian) is highest, ties to the smaller name: adding an instance
    moves only the keys it now wins, removing one moves only its own keys
    (the federation senders by destination, so that a reload hands over as
    few destinations as it can). The order instances are listed in never
    matters for it.
    """

    key: ShardKey
    sorted_instances: bool = True
    rendezvous: bool = False

    def pick(self, key: str, instances: Sequence[str]) -> str:
        """The instance of ``instances`` handling ``key``."""
        if not instances:
            raise ValueError(f"no instances to choose from for {self.key.value} {key!r}")
        if self.rendezvous:
            encoded = key.encode("utf-8")
            return min(
                instances,
                key=lambda instance: (-_rendezvous_weight(instance, encoded), instance),
            )
        digest = hashlib.sha256(key.encode("utf-8")).digest()
        ordered = sorted(instances) if self.sorted_instances else instances
        return ordered[int.from_bytes(digest[:8], "big") % len(instances)]


def _rendezvous_weight(instance: str, key: bytes) -> int:
    digest = hashlib.sha256(instance.encode("utf-8") + b"\0" + key).digest()
    return int.from_bytes(digest[:8], "big")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class WriterRule:
    """Who may write a stream.

    ``config_key``: the ``stream_writers`` entry naming its writers (the main
    process when not configured); ``None``: always the main process.
    ``several``: the entry may list more than one writer; ``shard`` then
    says which of them writes a given key.
    ``any_process``: every process may write, and no position is kept in
    ``stream_positions`` (after a restart there is nothing to recover).
    ``follows_instances``: writers are added and retired while processes
    run, through the ``instances`` table (``replication/instance_directory.py``);
    the config names the writers at startup.
    """

    config_key: str | None = None
    several: bool = False
    any_process: bool = False
    shard: StableHash | None = None
    follows_instances: bool = False

    def __attrs_post_init__(self) -> None:
        if self.several and self.shard is None:
            raise ValueError(f"stream_writers.{self.config_key}: several writers need a shard")

    def describe(self) -> str:
        """Who writes, in the words of ``docs/workers.md``'s table."""
        if self.any_process:
            return "any process"
        if self.config_key is None:
            return "main"
        if not self.several:
            return f"`stream_writers.{self.config_key}`: one"
        assert self.shard is not None
        return f"`stream_writers.{self.config_key}`: one or more, one per {self.shard.key.value}"


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Wake:
    """Which waiting /sync requests a batch of rows concerns."""

    users: frozenset[str] = frozenset()
    rooms: frozenset[str] = frozenset()
    everyone: bool = False

    @property
    def anyone(self) -> bool:
        return self.everyone or bool(self.users or self.rooms)


NOBODY = Wake()


def wake_nobody(rows: Sequence[Any]) -> Wake:
    """For streams no /sync shows (caches, federation, backfill)."""
    return NOBODY


def wake_rooms(rows: Sequence[Any]) -> Wake:
    """Rows with a ``room_id``: wake the users in those rooms."""
    return Wake(rooms=frozenset(row.room_id for row in rows))


def wake_users(rows: Sequence[Any]) -> Wake:
    """Rows with a ``user_id``: wake those users."""
    return Wake(users=frozenset(row.user_id for row in rows))


def wake_everyone(rows: Sequence[Any]) -> Wake:
    """Rows whose readers we cannot cheaply name (presence, device lists)."""
    return Wake(everyone=True)


class StreamSyncPart(Protocol):
    """A top-level part of the /sync response that a stream added later
    feeds (the built-in parts are the sections of
    ``handlers/sync_sections/``; the sync handler runs each such part as a
    section, :class:`~synapse_lite.handlers.sync_sections.stream_parts.StreamPartSection`)."""

    #: The key of the part in the /sync response.
    key: str

    async def changes(self, user_id: str, since: int | None, upto: int) -> Any | None:
        """What the part holds for ``user_id`` between the client's position
        of the stream (None: an initial sync) and ``upto``; None or empty
        when there is nothing to show."""


#: Forgets, on a receiving process, what rows written elsewhere make stale.
#: Called with ``(store, writer, token, rows)`` before the position advances.
Invalidation = Callable[["GenericWorkerStore", str, int, Sequence[Any]], None]


@attr.s(slots=True, frozen=True, auto_attribs=True)
class StreamDefinition:
    """One stream, declared once (see the module docstring)."""

    name: str
    #: What the stream carries, for ``docs/workers.md``.
    description: str
    codec: RowCodec[Any]
    writers: WriterRule
    #: Where its ids live; ``None``: only the writer's memory holds the rows,
    #: and its position is the writer's own counter (typing, federation).
    ids: IdSpace | None = None
    #: Whether /sync tokens carry a position of this stream.
    in_sync_token: bool = False
    #: Which /sync waiters a batch of rows (one token) wakes.
    wake: Callable[[Sequence[Any]], Wake] = wake_nobody
    #: The store query reading the stream's rows (database streams).
    rows_from_store: Callable[[GenericWorkerStore], UpdateFunction] | None = None
    #: What a receiving process forgets when rows arrive.
    invalidate: Invalidation | None = None
    #: The entity a row changes (a user, a room), for the stream's change
    #: tracker (``store.stream_changes``; storage/change_tracker.py), which
    #: lets /sync skip the stream's query for entities it knows unchanged.
    #: None: the stream has no tracker.
    changed_entity: Callable[[Any], str] | None = None
    #: The part of /sync this stream feeds, when it is not one of the
    #: built-in parts (needs ``in_sync_token``).
    sync_section: Callable[[GenericWorkerStore], StreamSyncPart] | None = None
    #: The parts of a process that read the stream: a process subscribes to
    #: it only if it plays one of them (the main process reads every stream).
    read_by: frozenset[Reader] = frozenset({Reader.CLIENT})

    @property
    def catch_up(self) -> CatchUp:
        return CatchUp.DATABASE if self.ids is not None else CatchUp.WRITER_MEMORY

    @property
    def keeps_positions(self) -> bool:
        """Whether writers record their positions in ``stream_positions``."""
        return self.ids is not None and not self.writers.any_process

    def parse_row(self, wire: Any) -> Any:
        return self.codec.decode(wire, self.name)

    def encode_row(self, row: Any) -> list[Any]:
        return self.codec.encode(row)


class StreamCatalog:
    """The streams a deployment runs, in a fixed order: the order of the
    positions in /sync tokens (new streams are appended, so tokens handed out
    before a stream existed stay valid)."""

    def __init__(self, definitions: Iterable[StreamDefinition]) -> None:
        self._by_name: dict[str, StreamDefinition] = {}
        for definition in definitions:
            if definition.name in self._by_name:
                raise ValueError(f"two streams are called {definition.name!r}")
            self._by_name[definition.name] = definition

    def __iter__(self) -> Any:
        return iter(self._by_name.values())

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> StreamDefinition:
        return self._by_name[name]

    def get(self, name: str) -> StreamDefinition | None:
        return self._by_name.get(name)

    def names(self) -> list[str]:
        return list(self._by_name)

    def with_streams(self, *extra: StreamDefinition) -> StreamCatalog:
        """This catalog and more streams after it."""
        return StreamCatalog([*self, *extra])

    def sync_token_streams(self) -> list[str]:
        """The streams with a position in /sync tokens, in token order."""
        return [d.name for d in self if d.in_sync_token]

    def with_ids(self) -> list[StreamDefinition]:
        """The streams whose rows are in the database (what the audit reads)."""
        return [d for d in self if d.ids is not None]

    def read_by(self, readers: Iterable[Reader]) -> list[str]:
        """The streams a process playing ``readers`` subscribes to, in
        catalog order."""
        playing = frozenset(readers)
        return [d.name for d in self if d.read_by & playing]

    def subscriptions_table(self) -> list[str]:
        """The table of ``docs/workers.md``'s "Subscriptions by role": each
        part, who plays it and the streams it reads (a test checks the page
        against it)."""
        lines = ["| Part | Played by | Streams it receives |", "| --- | --- | --- |"]
        lines.append("| main | the main process | every stream |")
        for reader in Reader:
            streams = ", ".join(f"`{name}`" for name in self.read_by([reader]))
            lines.append(f"| {reader.value} | {PLAYED_BY[reader]} | {streams} |")
        return lines

    def single_writer_keys(self) -> list[str]:
        """``stream_writers`` entries that take exactly one writer."""
        return [key for key, several in self.writer_keys().items() if not several]

    def writer_keys(self) -> dict[str, bool]:
        """``stream_writers`` entries the config accepts -> whether several
        writers are allowed."""
        keys: dict[str, bool] = {}
        for definition in self:
            key = definition.writers.config_key
            if key is not None:
                keys[key] = keys.get(key, False) or definition.writers.several
        return keys
