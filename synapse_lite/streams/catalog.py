"""Every stream of the homeserver: its row type and its definition, in one place.

The order of :data:`BUILTIN_STREAMS` is the order of positions in /sync tokens
(``docs/workers.md`` has the table of streams; a test checks it against this
file). To add a stream: declare its rows and definition here, write its store
queries (the ``rows_from_store`` update function, reads and writes) and its
handler; the rest of the process follows the definition.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import attr

from synapse_lite.codec.kinds import Nullable, OfType, Strings, wire
from synapse_lite.codec.rows import RowCodec, TaggedRowCodec
from synapse_lite.streams.definition import (
    IdSpace,
    Reader,
    ShardKey,
    StableHash,
    StreamCatalog,
    StreamDefinition,
    StreamTable,
    Wake,
    WriterRule,
    wake_everyone,
    wake_rooms,
    wake_users,
)

# The kinds of the rows' fields: plain JSON types (``codec/kinds.py``).
_str = OfType(str)
_opt_str = Nullable(OfType(str))
_int = OfType(int)
_bool = OfType(bool)
_dict = OfType(dict)
_str_list = Strings()
_opt_list = Nullable(OfType(list))


#: Who reads a stream (``StreamDefinition.read_by``; the main process reads
#: every one): the client API's processes, and the parts named beside them.
#: The media worker and the router read the caches stream alone.
_CLIENT = frozenset({Reader.CLIENT})


# events: new events and the current-state changes they make


@attr.s(slots=True, frozen=True, auto_attribs=True)
class EventsStreamEventRow:
    """An event was persisted."""

    TypeId: ClassVar[str] = "ev"

    event_id: str = attr.ib(metadata=wire(_str))
    room_id: str = attr.ib(metadata=wire(_str))
    type: str = attr.ib(metadata=wire(_str))
    state_key: str | None = attr.ib(metadata=wire(_opt_str))
    redacts: str | None = attr.ib(metadata=wire(_opt_str))
    relates_to: str | None = attr.ib(metadata=wire(_opt_str))
    membership: str | None = attr.ib(metadata=wire(_opt_str))
    rejected: bool = attr.ib(metadata=wire(_bool))
    outlier: bool = attr.ib(metadata=wire(_bool))
    #: Made by this server (its sender is one of our users): nobody can have
    #: redacted it before it existed (``UnredactedEvents``).
    local: bool = attr.ib(metadata=wire(_bool))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class EventsStreamCurrentStateRow:
    """A room's current state changed (``event_id`` None: the key was removed)."""

    TypeId: ClassVar[str] = "state"

    room_id: str = attr.ib(metadata=wire(_str))
    type: str = attr.ib(metadata=wire(_str))
    state_key: str = attr.ib(metadata=wire(_str))
    event_id: str | None = attr.ib(metadata=wire(_opt_str))


def _wake_for_events(rows: Sequence[Any]) -> Wake:
    """The rooms of the rows, and the targets of membership events (an invite
    wakes someone not yet in the room)."""
    # One pass, no generators: a follower computes this for every batch.
    rooms: set[str] = set()
    users: set[str] = set()
    for row in rows:
        rooms.add(row.room_id)
        if isinstance(row, EventsStreamEventRow) and row.type == "m.room.member" and row.state_key:
            users.add(row.state_key)
    return Wake(users=frozenset(users), rooms=frozenset(rooms))


#: Why rows of a stream table disappear after their write (``StreamTable.rows_removed``).
_UPSERTED = "upserted: a later update of the same key replaces the row and its id"
_DELIVERED = "deleted once the device has received the message"
_SENT = "deleted once the message was sent to the other server"


#: The events writers (of the events and backfill streams): each room's is
#: chosen when it is created and stored with it; writers are added and
#: retired at run time (docs/workers.md, "Adding and removing events writers").
EVENTS_WRITERS = WriterRule(
    "events", several=True, shard=StableHash(ShardKey.ROOM), follows_instances=True
)


EVENTS = StreamDefinition(
    name="events",
    description="new events and the current-state changes they make",
    codec=TaggedRowCodec([EventsStreamEventRow, EventsStreamCurrentStateRow]),
    writers=EVENTS_WRITERS,
    ids=IdSpace(
        "events_stream_seq",
        # A state change carries the id of the event that made it; one event
        # may change several keys.
        (
            StreamTable("events", id_column="stream_ordering"),
            StreamTable("current_state_delta_stream", shares_ids=True),
        ),
    ),
    in_sync_token=True,
    wake=_wake_for_events,
    rows_from_store=lambda store: store.get_events_stream_updates,
    invalidate=lambda store, writer, token, rows: store.invalidate_for_events_rows(
        writer, token, rows
    ),
    read_by=_CLIENT | {Reader.FEDERATION_SENDER, Reader.PUSHER},
)


# presence


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PresenceStreamRow:
    user_id: str = attr.ib(metadata=wire(_str))
    state: str = attr.ib(metadata=wire(_str))
    last_active_ts: int = attr.ib(metadata=wire(_int))
    last_federation_update_ts: int = attr.ib(metadata=wire(_int))
    last_user_sync_ts: int = attr.ib(metadata=wire(_int))
    status_msg: str | None = attr.ib(metadata=wire(_opt_str))
    currently_active: bool = attr.ib(metadata=wire(_bool))


PRESENCE = StreamDefinition(
    name="presence",
    description="users' presence states",
    codec=RowCodec(PresenceStreamRow),
    writers=WriterRule("presence"),
    ids=IdSpace(
        "presence_stream_sequence", (StreamTable("presence_stream", rows_removed=_UPSERTED),)
    ),
    in_sync_token=True,
    wake=wake_everyone,
    rows_from_store=lambda store: store.get_all_presence_updates,
    changed_entity=lambda row: row.user_id,
    read_by=_CLIENT | {Reader.FEDERATION_SENDER},
)


# typing: kept in the typing writer's memory


@attr.s(slots=True, frozen=True, auto_attribs=True)
class TypingStreamRow:
    """Everyone typing in a room now; replaces the previous list."""

    room_id: str = attr.ib(metadata=wire(_str))
    user_ids: list[str] = attr.ib(metadata=wire(_str_list))


TYPING = StreamDefinition(
    name="typing",
    description="who is typing in which room (the writer's memory; a new run at each start)",
    codec=RowCodec(TypingStreamRow),
    writers=WriterRule("typing"),
    in_sync_token=True,
    wake=wake_rooms,
    read_by=_CLIENT | {Reader.FEDERATION_SENDER},
)


# receipts


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ReceiptsStreamRow:
    room_id: str = attr.ib(metadata=wire(_str))
    receipt_type: str = attr.ib(metadata=wire(_str))
    user_id: str = attr.ib(metadata=wire(_str))
    event_id: str = attr.ib(metadata=wire(_str))
    thread_id: str | None = attr.ib(metadata=wire(_opt_str))
    data: dict[str, Any] = attr.ib(metadata=wire(_dict))


RECEIPTS = StreamDefinition(
    name="receipts",
    description="read receipts",
    codec=RowCodec(ReceiptsStreamRow),
    writers=WriterRule("receipts"),
    ids=IdSpace("receipts_sequence", (StreamTable("receipts_linearized", rows_removed=_UPSERTED),)),
    in_sync_token=True,
    wake=wake_rooms,
    rows_from_store=lambda store: store.get_all_updated_receipts,
    changed_entity=lambda row: row.room_id,
    read_by=_CLIENT | {Reader.FEDERATION_SENDER, Reader.PUSHER},
)


# account data


@attr.s(slots=True, frozen=True, auto_attribs=True)
class AccountDataStreamRow:
    """Account data changed: global when ``room_id`` is null; tags are ``m.tag``."""

    user_id: str = attr.ib(metadata=wire(_str))
    room_id: str | None = attr.ib(metadata=wire(_opt_str))
    data_type: str = attr.ib(metadata=wire(_str))


ACCOUNT_DATA = StreamDefinition(
    name="account_data",
    description="global and per-room account data, and room tags",
    codec=RowCodec(AccountDataStreamRow),
    writers=WriterRule("account_data"),
    ids=IdSpace(
        "account_data_sequence",
        (
            StreamTable("account_data", rows_removed=_UPSERTED),
            StreamTable("room_account_data", rows_removed=_UPSERTED),
            StreamTable("room_tags_revisions", rows_removed=_UPSERTED),
        ),
    ),
    in_sync_token=True,
    wake=wake_users,
    rows_from_store=lambda store: store.get_account_data_stream_updates,
    invalidate=lambda store, writer, token, rows: store.invalidate_for_account_data_rows(rows),
    changed_entity=lambda row: row.user_id,
)


# to-device messages


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ToDeviceStreamRow:
    """Messages were queued for a local user (``@...``), or for a remote server."""

    entity: str = attr.ib(metadata=wire(_str))


def _wake_for_to_device(rows: Sequence[Any]) -> Wake:
    return Wake(users=frozenset(row.entity for row in rows if row.entity.startswith("@")))


TO_DEVICE = StreamDefinition(
    name="to_device",
    description="to-device messages for local devices and remote servers",
    codec=RowCodec(ToDeviceStreamRow),
    writers=WriterRule("to_device"),
    ids=IdSpace(
        "device_inbox_sequence",
        # One id per send: every local device's inbox row and the outbox row share it.
        (
            StreamTable("device_inbox", shares_ids=True, rows_removed=_DELIVERED),
            StreamTable("device_federation_outbox", shares_ids=True, rows_removed=_SENT),
        ),
    ),
    in_sync_token=True,
    wake=_wake_for_to_device,
    rows_from_store=lambda store: store.get_all_new_device_messages,
    changed_entity=lambda row: row.entity,
    read_by=_CLIENT | {Reader.FEDERATION_SENDER},
)


# device lists


@attr.s(slots=True, frozen=True, auto_attribs=True)
class DeviceListsStreamRow:
    """A user's devices or keys changed: ``device_id`` is the device added,
    renamed, deleted or given new identity keys, or, for a change of the
    user's cross-signing keys, the key's type (``master``, ``self_signing``,
    ``user_signing``)."""

    user_id: str = attr.ib(metadata=wire(_str))
    device_id: str = attr.ib(metadata=wire(_str))


DEVICE_LISTS = StreamDefinition(
    name="device_lists",
    description="devices added, renamed or removed; device and cross-signing keys changed",
    codec=RowCodec(DeviceListsStreamRow),
    # Each user's changes on one of them (a hash of the user id).
    writers=WriterRule(
        "device_lists", several=True, shard=StableHash(ShardKey.USER, sorted_instances=False)
    ),
    ids=IdSpace(
        "device_lists_sequence",
        # One id per user's change, on a row for each device it touches; a
        # cross-signing upload's id is on each key it replaced, in a table of its own.
        (
            StreamTable("device_lists_stream", shares_ids=True),
            StreamTable("e2e_cross_signing_keys", shares_ids=True, rows_removed=_UPSERTED),
        ),
    ),
    in_sync_token=True,
    wake=wake_everyone,
    rows_from_store=lambda store: store.get_all_device_list_changes,
    changed_entity=lambda row: row.user_id,
    read_by=_CLIENT | {Reader.FEDERATION_SENDER},
)


# backfill: events from before a room's known history (ids count down)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class BackfillStreamRow:
    """A backfilled event (its token is a position: positive, like every stream's)."""

    event_id: str = attr.ib(metadata=wire(_str))
    room_id: str = attr.ib(metadata=wire(_str))
    type: str = attr.ib(metadata=wire(_str))
    state_key: str | None = attr.ib(metadata=wire(_opt_str))
    redacts: str | None = attr.ib(metadata=wire(_opt_str))
    relates_to: str | None = attr.ib(metadata=wire(_opt_str))


BACKFILL = StreamDefinition(
    name="backfill",
    description="backfilled events (stored ids count down from -1; positions count up)",
    codec=RowCodec(BackfillStreamRow),
    writers=EVENTS_WRITERS,
    ids=IdSpace(
        "events_backfill_stream_seq",
        (StreamTable("events", id_column="stream_ordering"),),
        positive=False,
    ),
    rows_from_store=lambda store: store.get_backfill_stream_updates,
    invalidate=lambda store, writer, token, rows: store.invalidate_for_backfill_rows(rows),
)


# caches: invalidations of in-memory caches


@attr.s(slots=True, frozen=True, auto_attribs=True)
class CachesStreamRow:
    """Invalidate ``keys`` (all of it when null) of the cache ``cache_func``."""

    cache_func: str = attr.ib(metadata=wire(_str))
    keys: list[Any] | None = attr.ib(metadata=wire(_opt_list))
    invalidation_ts: int = attr.ib(metadata=wire(_int))


CACHES = StreamDefinition(
    name="caches",
    description="invalidations of other processes' in-memory caches",
    codec=RowCodec(CachesStreamRow),
    writers=WriterRule(any_process=True),
    ids=IdSpace(
        "cache_invalidation_stream_seq", (StreamTable("cache_invalidation_stream_by_instance"),)
    ),
    rows_from_store=lambda store: store.get_all_updated_caches,
    invalidate=lambda store, writer, token, rows: store.apply_cache_invalidations(rows),
    read_by=frozenset(Reader),
)


# federation: EDUs queued by the main process for a federation sender worker


@attr.s(slots=True, frozen=True, auto_attribs=True)
class FederationStreamRow:
    """A queued item for the federation sender: its kind and its data."""

    type: str = attr.ib(metadata=wire(_str))
    data: dict[str, Any] = attr.ib(metadata=wire(_dict))


FEDERATION = StreamDefinition(
    name="federation",
    description="work queued by the main process for a federation sender worker",
    codec=RowCodec(FederationStreamRow),
    writers=WriterRule(),
    read_by=frozenset({Reader.FEDERATION_SENDER}),
)


# push rules: whose rules changed (the rules are in push_rules_user)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PushRulesStreamRow:
    """``user_id``'s push rules changed."""

    user_id: str = attr.ib(metadata=wire(_str))


PUSH_RULES = StreamDefinition(
    name="push_rules",
    description="users whose push rules changed (shown as `m.push_rules` account data)",
    codec=RowCodec(PushRulesStreamRow),
    writers=WriterRule("push_rules"),
    ids=IdSpace(
        "push_rules_stream_sequence", (StreamTable("push_rules_user", rows_removed=_UPSERTED),)
    ),
    in_sync_token=True,
    wake=wake_users,
    rows_from_store=lambda store: store.get_push_rules_stream_updates,
    invalidate=lambda store, writer, token, rows: store.invalidate_push_rules(
        [row.user_id for row in rows]
    ),
    changed_entity=lambda row: row.user_id,
    read_by=_CLIENT | {Reader.PUSHER},
)


# pushers: where users' notifications are delivered


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PushersStreamRow:
    """A pusher was added, changed or (``deleted``) removed."""

    user_id: str = attr.ib(metadata=wire(_str))
    app_id: str = attr.ib(metadata=wire(_str))
    pushkey: str = attr.ib(metadata=wire(_str))
    deleted: bool = attr.ib(metadata=wire(_bool))


PUSHERS = StreamDefinition(
    name="pushers",
    description="pushers added, changed or removed",
    codec=RowCodec(PushersStreamRow),
    writers=WriterRule("pushers"),
    ids=IdSpace("pushers_sequence", (StreamTable("pushers", rows_removed=_UPSERTED),)),
    rows_from_store=lambda store: store.get_pushers_stream_updates,
    read_by=frozenset({Reader.PUSHER}),
)


#: The streams, in /sync token order (events first: the room timeline).
BUILTIN_STREAMS = StreamCatalog(
    [
        EVENTS,
        PRESENCE,
        TYPING,
        RECEIPTS,
        ACCOUNT_DATA,
        TO_DEVICE,
        DEVICE_LISTS,
        BACKFILL,
        CACHES,
        FEDERATION,
        PUSH_RULES,
        PUSHERS,
    ]
)
