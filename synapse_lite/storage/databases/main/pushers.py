"""Pushers, on the pushers stream: one row per (app_id, pushkey, user_id),
rewritten under a new stream id by each change; a removed pusher keeps its
row with ``deleted`` set, so the stream carries the removal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.push.pushers import PusherSet
from synapse_lite.storage._base import SQLBaseStore, db_to_json, json_encoder, page_of_updates
from synapse_lite.storage.database import (
    DatabasePool,
    LoggingDatabaseConnection,
    LoggingTransaction,
)
from synapse_lite.streams.catalog import PushersStreamRow

if TYPE_CHECKING:
    from synapse_lite.storage._base import StoreContext


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Pusher:
    """A pusher as its delivery sees it."""

    user_id: str
    app_id: str
    pushkey: str
    data: dict[str, Any]
    last_stream_ordering: int
    #: When the pushkey was last set, in ms (gateways get it as ``pushkey_ts``).
    pushkey_ts: int = 0

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.app_id, self.pushkey, self.user_id)


class PushersWorkerStore(SQLBaseStore):
    """Pushers: reads anywhere, writes on the pushers writer."""

    def __init__(
        self, database: DatabasePool, db_conn: LoggingDatabaseConnection, hs: StoreContext
    ):
        super().__init__(database, db_conn, hs)
        self._pushers_id_gen = hs.id_generators.of("pushers")

    async def set_pusher(self, pusher: PusherSet) -> int:
        """Add, replace or (kind None) remove a pusher, in one transaction;
        without ``append``, other users' pushers with the same app_id and
        pushkey are removed too. Returns the last stream id written (the
        current one when nothing changed)."""

        def txn_func(txn: LoggingTransaction) -> int:
            last = self._pushers_id_gen.persisted_upto_position()
            if pusher.kind is None:
                return max(
                    last, self._delete_txn(txn, pusher.app_id, pusher.pushkey, pusher.user_id)
                )
            if not pusher.append:
                txn.execute(
                    "SELECT user_id FROM pushers WHERE app_id = ? AND pushkey = ?"
                    " AND user_id != ? AND deleted = ?",
                    (pusher.app_id, pusher.pushkey, pusher.user_id, False),
                )
                for (other,) in txn.fetchall():
                    last = max(last, self._delete_txn(txn, pusher.app_id, pusher.pushkey, other))
            # A new pusher delivers what comes after now, not old notifications.
            txn.execute("SELECT COALESCE(MAX(stream_ordering), 0) FROM events")
            now = int(txn.fetchone()[0])
            stream_id = self._pushers_id_gen.get_next_txn(txn)
            txn.execute(
                "INSERT INTO pushers (user_id, app_id, pushkey, kind, app_display_name,"
                " device_display_name, profile_tag, lang, data, deleted, stream_id,"
                " instance_name, last_stream_ordering, device_id, pushkey_ts)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (app_id, pushkey, user_id) DO UPDATE SET kind = EXCLUDED.kind,"
                " app_display_name = EXCLUDED.app_display_name,"
                " device_display_name = EXCLUDED.device_display_name,"
                " profile_tag = EXCLUDED.profile_tag, lang = EXCLUDED.lang,"
                " data = EXCLUDED.data, deleted = EXCLUDED.deleted,"
                " stream_id = EXCLUDED.stream_id, instance_name = EXCLUDED.instance_name,"
                " device_id = EXCLUDED.device_id, pushkey_ts = EXCLUDED.pushkey_ts,"
                " last_stream_ordering = CASE WHEN pushers.deleted"
                " THEN EXCLUDED.last_stream_ordering ELSE pushers.last_stream_ordering END",
                (
                    pusher.user_id,
                    pusher.app_id,
                    pusher.pushkey,
                    pusher.kind,
                    pusher.app_display_name,
                    pusher.device_display_name,
                    pusher.profile_tag,
                    pusher.lang,
                    json_encoder(pusher.data),
                    False,
                    stream_id,
                    self._instance_name,
                    now,
                    pusher.device_id,
                    self.clock.time_msec(),
                ),
            )
            return stream_id

        return await self.db_pool.runInteraction("set_pusher", txn_func)

    async def delete_pushers_of_devices(self, user_id: str, device_ids: list[str] | None) -> int:
        """Remove the pushers set with the access tokens of ``device_ids``
        (every pusher of the user when None); returns the last stream id
        written (the current one when there were none)."""

        def txn_func(txn: LoggingTransaction) -> int:
            last = self._pushers_id_gen.persisted_upto_position()
            sql = "SELECT app_id, pushkey FROM pushers WHERE user_id = ? AND deleted = ?"
            args: list[Any] = [user_id, False]
            if device_ids is not None:
                if not device_ids:
                    return last
                sql += f" AND device_id IN ({', '.join('?' for _ in device_ids)})"
                args += device_ids
            txn.execute(sql, args)
            for app_id, pushkey in txn.fetchall():
                last = max(last, self._delete_txn(txn, app_id, pushkey, user_id))
            return last

        return await self.db_pool.runInteraction("delete_pushers_of_devices", txn_func)

    def _delete_txn(self, txn: LoggingTransaction, app_id: str, pushkey: str, user_id: str) -> int:
        """Mark one pusher removed under a new stream id (0: there was none)."""
        txn.execute(
            "SELECT 1 FROM pushers WHERE app_id = ? AND pushkey = ? AND user_id = ?"
            " AND deleted = ?",
            (app_id, pushkey, user_id, False),
        )
        if txn.fetchone() is None:
            return 0
        stream_id = self._pushers_id_gen.get_next_txn(txn)
        txn.execute(
            "UPDATE pushers SET deleted = ?, stream_id = ?, instance_name = ?"
            " WHERE app_id = ? AND pushkey = ? AND user_id = ?",
            (True, stream_id, self._instance_name, app_id, pushkey, user_id),
        )
        return stream_id

    async def get_pushers_for_user(self, user_id: str) -> list[dict[str, Any]]:
        """The user's pushers, in the spec's ``Pusher`` form."""
        rows = await self.db_pool.select(
            "get_pushers_for_user",
            "SELECT app_id, pushkey, kind, app_display_name, device_display_name,"
            " profile_tag, lang, data FROM pushers WHERE user_id = ? AND deleted = ?"
            " ORDER BY stream_id",
            user_id,
            False,
        )
        pushers = []
        for app_id, pushkey, kind, app_name, device_name, profile_tag, lang, data in rows:
            pusher: dict[str, Any] = {
                "app_id": app_id,
                "pushkey": pushkey,
                "kind": kind,
                "app_display_name": app_name,
                "device_display_name": device_name,
                "lang": lang,
                "data": db_to_json(data),
            }
            if profile_tag is not None:
                pusher["profile_tag"] = profile_tag
            pushers.append(pusher)
        return pushers

    def get_pushers_position(self) -> int:
        """Where every pusher change is stored up to (this process's view):
        any pusher added or removed moves it."""
        return self._pushers_id_gen.persisted_upto_position()

    async def get_all_pushers(self) -> list[Pusher]:
        """Every pusher not removed (what the pusher instances deliver for)."""
        rows = await self.db_pool.select(
            "get_all_pushers",
            "SELECT user_id, app_id, pushkey, data, last_stream_ordering, pushkey_ts"
            " FROM pushers WHERE deleted = ? ORDER BY stream_id",
            False,
        )
        return [Pusher(r[0], r[1], r[2], db_to_json(r[3]), int(r[4]), int(r[5])) for r in rows]

    async def set_pusher_position(self, pusher: Pusher, position: int) -> None:
        """Record that ``pusher`` has delivered up to ``position`` (not a
        stream write: the position belongs to the pusher instance)."""
        await self.db_pool.execute(
            "set_pusher_position",
            "UPDATE pushers SET last_stream_ordering = ? WHERE app_id = ? AND pushkey = ?"
            " AND user_id = ? AND last_stream_ordering < ?",
            position,
            pusher.app_id,
            pusher.pushkey,
            pusher.user_id,
            position,
        )

    async def get_pushers_stream_updates(
        self, instance_name: str, last_id: int, current_id: int, limit: int
    ) -> tuple[list[tuple[int, PushersStreamRow]], int, bool]:
        """The pushers stream's update function."""
        rows = await self.db_pool.select(
            "get_pushers_stream_updates",
            "SELECT stream_id, user_id, app_id, pushkey, deleted FROM pushers"
            " WHERE ? < stream_id AND stream_id <= ? AND instance_name = ?"
            " ORDER BY stream_id ASC LIMIT ?",
            last_id,
            current_id,
            instance_name,
            limit,
        )
        updates = [(int(r[0]), PushersStreamRow(r[1], r[2], r[3], bool(r[4]))) for r in rows]
        return page_of_updates(updates, limit, current_id)
