"""Server-side key backup: a user's backup versions and the room keys stored
in them. No stream: only the user's own clients read it, from the database,
each request in one transaction."""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.storage._base import SQLBaseStore, db_to_json, json_encoder
from synapse_lite.storage.database import LoggingTransaction


@attr.s(slots=True, frozen=True, auto_attribs=True)
class BackedUpKey:
    """One session's key, as the client encrypted it."""

    first_message_index: int
    forwarded_count: int
    is_verified: bool
    #: An object for the spec's algorithm; opaque (any JSON value) otherwise.
    session_data: Any

    def is_better_than(self, other: BackedUpKey) -> bool:
        """The spec's rule for replacing a stored key: a verified key beats an
        unverified one; then the lower first message index (it decrypts more
        of the session); then the lower forwarded count."""
        if self.is_verified != other.is_verified:
            return self.is_verified
        if self.first_message_index != other.first_message_index:
            return self.first_message_index < other.first_message_index
        return self.forwarded_count < other.forwarded_count

    def to_json(self) -> dict[str, Any]:
        return attr.asdict(self)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class BackupVersion:
    version: int
    algorithm: str
    #: Opaque but for the spec's algorithm (an object): any JSON value.
    auth_data: Any
    etag: int
    count: int

    def to_json(self) -> dict[str, Any]:
        return {
            "version": str(self.version),
            "algorithm": self.algorithm,
            "auth_data": self.auth_data,
            "etag": str(self.etag),
            "count": self.count,
        }


class RoomKeysStore(SQLBaseStore):
    """Backup versions and their keys (any process)."""

    async def create_backup_version(self, user_id: str, algorithm: str, auth_data: Any) -> int:
        """A new version, numbered one above the user's highest (deleted
        ones included: a number is never reused), which becomes current.

        Safe when creations race (two clients, or two processes): on
        PostgreSQL the transaction first takes a lock on the versions table
        that only another creation waits for (reads and key uploads do not;
        the table's writes only wait for a creation's few milliseconds). It
        is taken before the transaction's first query, so the REPEATABLE READ
        snapshot that reads the highest number is taken after the lock: it
        sees every version committed before. On SQLite every read-write
        transaction starts with ``BEGIN IMMEDIATE`` and so runs alone."""

        def txn_func(txn: LoggingTransaction) -> int:
            if self.db_pool.engine.name == "postgres":
                # LOCK is not a query: it does not fix the snapshot (see above).
                # SHARE ROW EXCLUSIVE conflicts with itself and not with reads.
                txn.execute("LOCK TABLE e2e_room_keys_versions IN SHARE ROW EXCLUSIVE MODE")
            txn.execute(
                "SELECT COALESCE(MAX(version), 0) FROM e2e_room_keys_versions WHERE user_id = ?",
                (user_id,),
            )
            version = int(txn.fetchone()[0]) + 1
            txn.execute(
                "INSERT INTO e2e_room_keys_versions"
                " (user_id, version, algorithm, auth_data, deleted, etag)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (user_id, version, algorithm, json_encoder(auth_data), False, 0),
            )
            return version

        return await self.db_pool.runInteraction("create_backup_version", txn_func)

    def _version_txn(
        self, txn: LoggingTransaction, user_id: str, version: int | None
    ) -> BackupVersion | None:
        """A live version (the newest when ``version`` is None)."""
        if version is None:
            txn.execute(
                "SELECT version, algorithm, auth_data, etag FROM e2e_room_keys_versions"
                " WHERE user_id = ? AND deleted = ? ORDER BY version DESC LIMIT 1",
                (user_id, False),
            )
        else:
            txn.execute(
                "SELECT version, algorithm, auth_data, etag FROM e2e_room_keys_versions"
                " WHERE user_id = ? AND deleted = ? AND version = ?",
                (user_id, False, version),
            )
        row = txn.fetchone()
        if row is None:
            return None
        txn.execute(
            "SELECT COUNT(*) FROM e2e_room_keys WHERE user_id = ? AND version = ?",
            (user_id, int(row[0])),
        )
        count = int(txn.fetchone()[0])
        return BackupVersion(int(row[0]), row[1], db_to_json(row[2]), int(row[3]), count)

    async def get_backup_version(self, user_id: str, version: int | None) -> BackupVersion | None:
        """A live version, or the current one (the newest live) for None."""
        return await self.db_pool.runInteraction(
            "get_backup_version", self._version_txn, user_id, version, read_only=True
        )

    async def update_backup_auth_data(self, user_id: str, version: int, auth_data: Any) -> bool:
        rows = await self.db_pool.execute(
            "update_backup_auth_data",
            "UPDATE e2e_room_keys_versions SET auth_data = ?"
            " WHERE user_id = ? AND version = ? AND deleted = ? RETURNING version",
            json_encoder(auth_data),
            user_id,
            version,
            False,
        )
        return bool(rows)

    async def delete_backup_version(self, user_id: str, version: int) -> bool:
        """Mark a version deleted (its number is never reused) and drop its keys."""

        def txn_func(txn: LoggingTransaction) -> bool:
            txn.execute(
                "UPDATE e2e_room_keys_versions SET deleted = ?"
                " WHERE user_id = ? AND version = ? AND deleted = ?",
                (True, user_id, version, False),
            )
            if txn.rowcount == 0:
                return False
            txn.execute(
                "DELETE FROM e2e_room_keys WHERE user_id = ? AND version = ?", (user_id, version)
            )
            return True

        return await self.db_pool.runInteraction("delete_backup_version", txn_func)

    async def put_room_keys(
        self, user_id: str, version: int, keys: list[tuple[str, str, BackedUpKey]]
    ) -> BackupVersion | None:
        """Store ``(room, session, key)``s in the current version, each only
        if better than the one stored (:meth:`BackedUpKey.is_better_than`).
        None when ``version`` is not the current version (nothing stored).
        Returns the version after (a change bumps its etag)."""

        def txn_func(txn: LoggingTransaction) -> BackupVersion | None:
            current = self._version_txn(txn, user_id, None)
            if current is None or current.version != version:
                return None
            changed = False
            for room_id, session_id, key in keys:
                txn.execute(
                    "SELECT first_message_index, forwarded_count, is_verified, session_data"
                    " FROM e2e_room_keys WHERE user_id = ? AND version = ? AND room_id = ?"
                    " AND session_id = ?",
                    (user_id, version, room_id, session_id),
                )
                row = txn.fetchone()
                if row is not None:
                    stored = BackedUpKey(int(row[0]), int(row[1]), bool(row[2]), {})
                    if not key.is_better_than(stored):
                        continue
                    txn.execute(
                        "DELETE FROM e2e_room_keys WHERE user_id = ? AND version = ?"
                        " AND room_id = ? AND session_id = ?",
                        (user_id, version, room_id, session_id),
                    )
                txn.execute(
                    "INSERT INTO e2e_room_keys (user_id, version, room_id, session_id,"
                    " first_message_index, forwarded_count, is_verified, session_data)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        user_id,
                        version,
                        room_id,
                        session_id,
                        key.first_message_index,
                        key.forwarded_count,
                        key.is_verified,
                        json_encoder(key.session_data),
                    ),
                )
                changed = True
            if changed:
                self._bump_etag_txn(txn, user_id, version)
            return self._version_txn(txn, user_id, version)

        return await self.db_pool.runInteraction("put_room_keys", txn_func)

    def _bump_etag_txn(self, txn: LoggingTransaction, user_id: str, version: int) -> None:
        txn.execute(
            "UPDATE e2e_room_keys_versions SET etag = etag + 1 WHERE user_id = ? AND version = ?",
            (user_id, version),
        )

    async def get_room_keys(
        self, user_id: str, version: int, room_id: str | None, session_id: str | None
    ) -> dict[str, dict[str, BackedUpKey]]:
        """``{room: {session: key}}`` of a version, all or one room's or one session's."""
        sql = (
            "SELECT room_id, session_id, first_message_index, forwarded_count, is_verified,"
            " session_data FROM e2e_room_keys WHERE user_id = ? AND version = ?"
        )
        args: list[Any] = [user_id, version]
        if room_id is not None:
            sql += " AND room_id = ?"
            args.append(room_id)
        if session_id is not None:
            sql += " AND session_id = ?"
            args.append(session_id)
        rows = await self.db_pool.select("get_room_keys", sql, *args)
        result: dict[str, dict[str, BackedUpKey]] = {}
        for r in rows:
            result.setdefault(r[0], {})[r[1]] = BackedUpKey(
                int(r[2]), int(r[3]), bool(r[4]), db_to_json(r[5])
            )
        return result

    async def delete_room_keys(
        self, user_id: str, version: int, room_id: str | None, session_id: str | None
    ) -> BackupVersion | None:
        """Delete keys of a live version; None when there is no such version."""

        def txn_func(txn: LoggingTransaction) -> BackupVersion | None:
            if self._version_txn(txn, user_id, version) is None:
                return None
            sql = "DELETE FROM e2e_room_keys WHERE user_id = ? AND version = ?"
            args: list[Any] = [user_id, version]
            if room_id is not None:
                sql += " AND room_id = ?"
                args.append(room_id)
            if session_id is not None:
                sql += " AND session_id = ?"
                args.append(session_id)
            txn.execute(sql, args)
            if txn.rowcount:
                self._bump_etag_txn(txn, user_id, version)
            return self._version_txn(txn, user_id, version)

        return await self.db_pool.runInteraction("delete_room_keys", txn_func)
