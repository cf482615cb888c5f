"""End-to-end encryption keys of local devices: identity keys, one-time and
fallback keys, cross-signing keys and their signatures.

A change clients must hear about (a device's identity keys, a cross-signing
key) is a row of the device_lists stream, written in the same transaction as
the key, so those writes run on the stream's writer. One-time and fallback
keys belong to no stream: any process stores and claims them straight in the
database, and a claim is atomic there (see :meth:`claim_one_time_keys`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from synapse_lite.storage._base import db_to_json, json_encoder
from synapse_lite.storage.caches import cached
from synapse_lite.storage.database import LoggingTransaction
from synapse_lite.storage.databases.main.cache import CacheInvalidationWorkerStore
from synapse_lite.storage.databases.main.devices import DeviceWorkerStore

#: A one-time or fallback key: ``(algorithm, key_id, key JSON)``.
KeyTriple = tuple[str, str, Any]


#: Devices whose key counts a process keeps.
DEVICE_KEY_COUNTS = 50_000

_COUNT_ONE_TIME_KEYS = (
    "SELECT algorithm, COUNT(*) FROM e2e_one_time_keys_json"
    " WHERE user_id = ? AND device_id = ? GROUP BY algorithm"
)
_UNUSED_FALLBACK_KEY_TYPES = (
    "SELECT algorithm FROM e2e_fallback_keys_json"
    " WHERE user_id = ? AND device_id = ? AND used = ? ORDER BY algorithm"
)


class OneTimeKeyConflict(Exception):
    """A one-time key id was uploaded again with other contents."""

    def __init__(self, key_id: str) -> None:
        super().__init__(key_id)
        self.key_id = key_id


class OneTimeKeyLimit(Exception):
    """An upload would take a device past its cap of stored one-time keys."""

    def __init__(self, stored: int, new: int, max_stored: int) -> None:
        super().__init__(stored, new, max_stored)
        self.stored = stored
        self.new = new
        self.max_stored = max_stored


class EndToEndKeyWorkerStore(DeviceWorkerStore, CacheInvalidationWorkerStore):
    """E2E key reads and one-time key writes anywhere; identity and
    cross-signing key writes on the device_lists writer. (A deleted device's
    keys are deleted with it, by :meth:`DeviceWorkerStore.delete_device_txn`.)"""

    def _key_counts_changed_txn(
        self, txn: LoggingTransaction, user_id: str, device_id: str
    ) -> None:
        """The device's key counts change with this transaction: every
        process forgets what :meth:`get_device_key_counts` cached of them
        (this one after the commit, the others from the caches stream)."""
        self.send_invalidation_txn(txn, "get_device_key_counts", [user_id, device_id])
        txn.call_after(self.get_device_key_counts.invalidate, (user_id, device_id))

    def delete_device_txn(self, txn: LoggingTransaction, user_id: str, device_id: str) -> bool:
        deleted = super().delete_device_txn(txn, user_id, device_id)
        if deleted:
            self._key_counts_changed_txn(txn, user_id, device_id)
        return deleted

    # Device identity keys

    async def get_device_keys(
        self, queries: dict[str, list[str]], viewer: str | None = None
    ) -> dict[str, dict[str, dict[str, Any]]]:
        """``{user: {device: keys}}`` for the devices named (every device of
        the user for an empty list) that exist and have uploaded keys; each
        with ``unsigned.device_display_name`` and the separately uploaded
        signatures merged in (see :meth:`_merge_signatures_txn`)."""

        def txn_func(txn: LoggingTransaction) -> dict[str, dict[str, dict[str, Any]]]:
            result: dict[str, dict[str, dict[str, Any]]] = {}
            for user_id, device_ids in queries.items():
                txn.execute(
                    "SELECT k.device_id, k.key_json, d.display_name FROM e2e_device_keys_json k"
                    " JOIN devices d ON d.user_id = k.user_id AND d.device_id = k.device_id"
                    " WHERE k.user_id = ?",
                    (user_id,),
                )
                wanted = set(device_ids)
                devices: dict[str, dict[str, Any]] = {}
                for device_id, key_json, display_name in txn.fetchall():
                    if wanted and device_id not in wanted:
                        continue
                    keys = db_to_json(key_json)
                    unsigned = dict(keys.get("unsigned") or {})
                    if display_name is not None:
                        unsigned["device_display_name"] = display_name
                    keys["unsigned"] = unsigned
                    devices[device_id] = keys
                if devices:
                    self._merge_signatures_txn(txn, user_id, devices, viewer)
                result[user_id] = devices
            return result

        return await self.db_pool.runInteraction("get_device_keys", txn_func, read_only=True)

    def _merge_signatures_txn(
        self,
        txn: LoggingTransaction,
        target_user_id: str,
        keys_by_id: dict[str, dict[str, Any]],
        viewer: str | None,
    ) -> None:
        """Add the signatures of ``e2e_cross_signing_signatures`` to each key
        (by target device id, or a cross-signing key's public key). A user's
        signature of another user's key (made with their user-signing key) is
        shown only to the signer, ``viewer``."""
        txn.execute(
            "SELECT user_id, key_id, target_device_id, signature"
            " FROM e2e_cross_signing_signatures WHERE target_user_id = ?",
            (target_user_id,),
        )
        for signer, key_id, target, signature in txn.fetchall():
            keys = keys_by_id.get(target)
            if keys is None or (signer != target_user_id and signer != viewer):
                continue
            keys.setdefault("signatures", {}).setdefault(signer, {})[key_id] = signature

    async def get_signatures_of_other_users(
        self, signer: str, target_user_ids: list[str]
    ) -> dict[str, dict[str, dict[str, str]]]:
        """``signer``'s signatures of these users' keys: ``{target user:
        {target key (device id or public key): {signing key id: signature}}}``.
        For the users of other servers, whose keys are not in our tables
        (the others' signatures are merged by :meth:`_merge_signatures_txn`)."""
        result: dict[str, dict[str, dict[str, str]]] = {}
        # One query per 500 users (a /keys/query names up to 1,000), not one
        # per user.
        for start in range(0, len(target_user_ids), 500):
            chunk = target_user_ids[start : start + 500]
            marks = ", ".join("?" for _ in chunk)
            rows = await self.db_pool.select(
                "get_signatures_of_other_users",
                "SELECT target_user_id, target_device_id, key_id, signature"
                " FROM e2e_cross_signing_signatures"
                f" WHERE user_id = ? AND target_user_id IN ({marks})",
                signer,
                *chunk,
            )
            for target_user_id, target, key_id, signature in rows:
                result.setdefault(target_user_id, {}).setdefault(target, {})[key_id] = signature
        return result

    async def set_device_keys(
        self, user_id: str, device_id: str, keys: dict[str, Any]
    ) -> int | None:
        """Store a device's identity keys; a change (not a repeat of the same
        keys) is announced on the device_lists stream. Returns the stream id
        written, None when nothing changed. On the device_lists writer only."""

        def txn_func(txn: LoggingTransaction) -> int | None:
            encoded = json_encoder(keys)
            txn.execute(
                "SELECT key_json FROM e2e_device_keys_json WHERE user_id = ? AND device_id = ?",
                (user_id, device_id),
            )
            row = txn.fetchone()
            if row is not None and db_to_json(row[0]) == keys:
                return None
            txn.execute(
                "DELETE FROM e2e_device_keys_json WHERE user_id = ? AND device_id = ?",
                (user_id, device_id),
            )
            txn.execute(
                "INSERT INTO e2e_device_keys_json (user_id, device_id, ts_added_ms, key_json)"
                " VALUES (?, ?, ?, ?)",
                (user_id, device_id, self.clock.time_msec(), encoded),
            )
            return self.add_device_change_txn(txn, user_id, device_id)

        return await self.db_pool.runInteraction("set_device_keys", txn_func)

    # One-time and fallback keys

    async def add_one_time_keys(
        self, user_id: str, device_id: str, keys: list[KeyTriple], max_stored: int
    ) -> None:
        """Store one-time keys. A key id already stored with the same contents
        is ignored (a client retrying its upload); with other contents the
        whole upload is refused with :class:`OneTimeKeyConflict`, nothing stored.
        When the new keys would take the device past ``max_stored`` keys (all
        algorithms together) the upload is refused with
        :class:`OneTimeKeyLimit`, nothing stored. The count is read in the
        insert's transaction; on PostgreSQL two uploads of one device at the
        same instant could each pass it (past the cap by one upload at most)."""

        def txn_func(txn: LoggingTransaction) -> None:
            now = self.clock.time_msec()
            new: list[KeyTriple] = []
            for algorithm, key_id, key in keys:
                txn.execute(
                    "SELECT key_json FROM e2e_one_time_keys_json WHERE user_id = ?"
                    " AND device_id = ? AND algorithm = ? AND key_id = ?",
                    (user_id, device_id, algorithm, key_id),
                )
                row = txn.fetchone()
                if row is not None:
                    if db_to_json(row[0]) != key:
                        raise OneTimeKeyConflict(f"{algorithm}:{key_id}")
                    continue
                new.append((algorithm, key_id, key))
            if not new:
                return
            txn.execute(
                "SELECT COUNT(*) FROM e2e_one_time_keys_json WHERE user_id = ? AND device_id = ?",
                (user_id, device_id),
            )
            stored = int(txn.fetchone()[0])
            if stored + len(new) > max_stored:
                raise OneTimeKeyLimit(stored, len(new), max_stored)
            for algorithm, key_id, key in new:
                txn.execute(
                    "INSERT INTO e2e_one_time_keys_json"
                    " (user_id, device_id, algorithm, key_id, ts_added_ms, key_json)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (user_id, device_id, algorithm, key_id, now, json_encoder(key)),
                )
            self._key_counts_changed_txn(txn, user_id, device_id)

        await self.db_pool.runInteraction("add_one_time_keys", txn_func)

    async def set_fallback_keys(self, user_id: str, device_id: str, keys: list[KeyTriple]) -> None:
        """Replace the device's fallback key of each algorithm given (the same
        key again keeps its ``used`` mark)."""

        def txn_func(txn: LoggingTransaction) -> None:
            changed = False
            for algorithm, key_id, key in keys:
                txn.execute(
                    "SELECT key_id, key_json FROM e2e_fallback_keys_json"
                    " WHERE user_id = ? AND device_id = ? AND algorithm = ?",
                    (user_id, device_id, algorithm),
                )
                row = txn.fetchone()
                if row is not None and row[0] == key_id and db_to_json(row[1]) == key:
                    continue
                txn.execute(
                    "DELETE FROM e2e_fallback_keys_json"
                    " WHERE user_id = ? AND device_id = ? AND algorithm = ?",
                    (user_id, device_id, algorithm),
                )
                txn.execute(
                    "INSERT INTO e2e_fallback_keys_json"
                    " (user_id, device_id, algorithm, key_id, key_json, used)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (user_id, device_id, algorithm, key_id, json_encoder(key), False),
                )
                changed = True
            if changed:
                self._key_counts_changed_txn(txn, user_id, device_id)

        await self.db_pool.runInteraction("set_fallback_keys", txn_func)

    @cached(max_entries=DEVICE_KEY_COUNTS)
    async def get_device_key_counts(
        self, user_id: str, device_id: str
    ) -> tuple[dict[str, int], tuple[str, ...]]:
        """:meth:`count_one_time_keys` and :meth:`get_unused_fallback_key_types`
        in one interaction, cached: every /sync serves both, and they change
        only by an upload, a claim or the device's deletion, each of which
        invalidates them everywhere (the caches stream). Callers must not
        change the dict."""

        def read(txn: LoggingTransaction) -> tuple[dict[str, int], tuple[str, ...]]:
            txn.execute(_COUNT_ONE_TIME_KEYS, (user_id, device_id))
            counts = {r[0]: int(r[1]) for r in txn.fetchall()}
            txn.execute(_UNUSED_FALLBACK_KEY_TYPES, (user_id, device_id, False))
            return counts, tuple(r[0] for r in txn.fetchall())

        return await self.db_pool.runInteraction("get_device_key_counts", read, read_only=True)

    async def count_one_time_keys(self, user_id: str, device_id: str) -> dict[str, int]:
        """Unclaimed one-time keys of a device, by algorithm."""
        rows = await self.db_pool.select(
            "count_one_time_keys", _COUNT_ONE_TIME_KEYS, user_id, device_id
        )
        return {r[0]: int(r[1]) for r in rows}

    async def get_unused_fallback_key_types(self, user_id: str, device_id: str) -> list[str]:
        rows = await self.db_pool.select(
            "get_unused_fallback_key_types", _UNUSED_FALLBACK_KEY_TYPES, user_id, device_id, False
        )
        return [r[0] for r in rows]

    async def claim_one_time_keys(
        self, claims: Iterable[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], tuple[str, Any]]:
        """Take one key for each ``(user, device, algorithm)``: a one-time key,
        removed as it is taken, or else the fallback key (marked used, and
        handed out again until the device replaces it). Returns
        ``{(user, device, algorithm): (key_id, key)}`` for those that had one.

        Exactly once, whatever runs concurrently on any process: each key is
        taken by a single ``DELETE ... RETURNING`` of one row. On SQLite the
        transaction holds the database's write lock. On PostgreSQL it runs at
        READ COMMITTED and locks its row with ``FOR UPDATE SKIP LOCKED``: a
        row another claim holds or has just deleted is passed over for the
        next one, where at REPEATABLE READ it would fail the transaction."""
        claims = list(claims)
        postgres = self.db_pool.engine.name == "postgres"
        if postgres:
            take_sql = (
                "DELETE FROM e2e_one_time_keys_json WHERE ctid = ("
                " SELECT ctid FROM e2e_one_time_keys_json"
                " WHERE user_id = ? AND device_id = ? AND algorithm = ?"
                " ORDER BY key_id LIMIT 1 FOR UPDATE SKIP LOCKED"
                ") RETURNING key_id, key_json"
            )
        else:
            take_sql = (
                "DELETE FROM e2e_one_time_keys_json WHERE rowid = ("
                " SELECT rowid FROM e2e_one_time_keys_json"
                " WHERE user_id = ? AND device_id = ? AND algorithm = ?"
                " ORDER BY key_id LIMIT 1"
                ") RETURNING key_id, key_json"
            )

        def txn_func(txn: LoggingTransaction) -> dict[tuple[str, str, str], tuple[str, Any]]:
            if postgres:
                txn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            taken: dict[tuple[str, str, str], tuple[str, Any]] = {}
            for user_id, device_id, algorithm in claims:
                txn.execute(take_sql, (user_id, device_id, algorithm))
                row = txn.fetchone()
                if row is None:
                    txn.execute(
                        "UPDATE e2e_fallback_keys_json SET used = ?"
                        " WHERE user_id = ? AND device_id = ? AND algorithm = ?"
                        " RETURNING key_id, key_json",
                        (True, user_id, device_id, algorithm),
                    )
                    row = txn.fetchone()
                if row is not None:
                    taken[(user_id, device_id, algorithm)] = (row[0], db_to_json(row[1]))
            for user_id, device_id in sorted({(u, d) for u, d, _ in taken}):
                self._key_counts_changed_txn(txn, user_id, device_id)
            return taken

        return await self.db_pool.runInteraction("claim_one_time_keys", txn_func)

    # Cross-signing keys and signatures

    async def get_cross_signing_keys(
        self, user_ids: list[str], viewer: str | None = None
    ) -> dict[str, dict[str, dict[str, Any]]]:
        """``{user: {key type: key}}`` with separately uploaded signatures
        merged in (keyed by the key's public key)."""

        def txn_func(txn: LoggingTransaction) -> dict[str, dict[str, dict[str, Any]]]:
            result: dict[str, dict[str, dict[str, Any]]] = {}
            for user_id in user_ids:
                txn.execute(
                    "SELECT keytype, key_json FROM e2e_cross_signing_keys WHERE user_id = ?",
                    (user_id,),
                )
                by_type = {r[0]: db_to_json(r[1]) for r in txn.fetchall()}
                if not by_type:
                    continue
                by_public = {public_key(k): k for k in by_type.values()}
                self._merge_signatures_txn(txn, user_id, by_public, viewer)
                result[user_id] = by_type
            return result

        return await self.db_pool.runInteraction("get_cross_signing_keys", txn_func, read_only=True)

    async def set_cross_signing_keys(self, user_id: str, keys: dict[str, dict[str, Any]]) -> int:
        """Replace the given cross-signing keys of a user: one device_lists
        id, on each key's row. Returns it. On the user's device_lists writer
        only. A replaced master key takes the signatures of the old one with it."""

        def txn_func(txn: LoggingTransaction) -> int:
            stream_id = self._device_list_id_gen.get_next_txn(txn)
            self.device_list_changes.record_after_commit(txn, user_id, stream_id)
            for keytype, key in keys.items():
                txn.execute(
                    "SELECT key_json FROM e2e_cross_signing_keys WHERE user_id = ? AND keytype = ?",
                    (user_id, keytype),
                )
                row = txn.fetchone()
                if row is not None:
                    txn.execute(
                        "DELETE FROM e2e_cross_signing_signatures"
                        " WHERE target_user_id = ? AND target_device_id = ?",
                        (user_id, public_key(db_to_json(row[0]))),
                    )
                    txn.execute(
                        "DELETE FROM e2e_cross_signing_keys WHERE user_id = ? AND keytype = ?",
                        (user_id, keytype),
                    )
                txn.execute(
                    "INSERT INTO e2e_cross_signing_keys"
                    " (user_id, keytype, key_json, stream_id, instance_name)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (user_id, keytype, json_encoder(key), stream_id, self._instance_name),
                )
            return stream_id

        return await self.db_pool.runInteraction("set_cross_signing_keys", txn_func)

    async def add_cross_signing_signatures(self, signer: str, signatures: list[list[str]]) -> int:
        """Store signatures by ``signer`` (``[target user, target device or
        public key, signing key id, signature]``). Signatures of the signer's
        own keys are one change of the signer's devices (everyone sharing a
        room fetches them again); a signature of another user's master key
        is a change of that user's keys told to the signer alone (only they
        are shown it). Returns the last stream id written. On the signer's
        device_lists writer only."""

        def txn_func(txn: LoggingTransaction) -> int:
            last = 0
            for target_user, target_id, key_id, signature in signatures:
                txn.execute(
                    "DELETE FROM e2e_cross_signing_signatures WHERE user_id = ? AND key_id = ?"
                    " AND target_user_id = ? AND target_device_id = ?",
                    (signer, key_id, target_user, target_id),
                )
                txn.execute(
                    "INSERT INTO e2e_cross_signing_signatures"
                    " (user_id, key_id, target_user_id, target_device_id, signature)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (signer, key_id, target_user, target_id, signature),
                )
            own = sorted({s[1] for s in signatures if s[0] == signer})
            if own:
                last = self.add_device_changes_txn(txn, signer, own)
            others: dict[str, set[str]] = {}
            for target_user, target_id, _, _ in signatures:
                if target_user != signer:
                    others.setdefault(target_user, set()).add(target_id)
            for target_user, target_ids in sorted(others.items()):
                last = self.add_device_changes_txn(txn, target_user, sorted(target_ids), signer)
            return last

        return await self.db_pool.runInteraction("add_cross_signing_signatures", txn_func)


def public_key(key: dict[str, Any]) -> str:
    """The public key of a cross-signing key (its one ``keys`` value)."""
    return str(next(iter(key["keys"].values())))
