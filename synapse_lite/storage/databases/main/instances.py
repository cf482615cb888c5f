"""The ``instances`` table: each process's internal HTTP address and whether it
writes events, as recorded when it last started (or when an events writer was
retired). :class:`synapse_lite.replication.instance_directory.InstanceDirectory`
keeps the running view of it."""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence

import attr

from synapse_lite.config.homeserver import InstanceLocation
from synapse_lite.storage.database import LoggingTransaction
from synapse_lite.storage.databases.main.cache import CacheInvalidationWorkerStore

#: The caches-stream name under which changes to ``instances`` are announced.
INSTANCES_CACHE_NAME = "instances"


@attr.s(slots=True, frozen=True, auto_attribs=True)
class InstanceRecord:
    """One row of ``instances``."""

    instance_name: str
    location: InstanceLocation | None
    writes_events: bool


def _now_ms() -> int:
    return int(time.time() * 1000)


class InstancesWorkerStore(CacheInvalidationWorkerStore):
    """Reads and writes ``instances``. Startup writes go through the startup
    connection (``*_txn``); the rest through the pool."""

    @staticmethod
    def record_instance_txn(
        txn: LoggingTransaction,
        instance_name: str,
        location: InstanceLocation | None,
        writes_events: bool,
    ) -> None:
        """Record this process as it starts: its address and whether it writes events."""
        txn.execute(
            "INSERT INTO instances (instance_name, replication_host, replication_port,"
            " replication_tls, writes_events, updated_ts)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (instance_name) DO UPDATE SET"
            " replication_host = EXCLUDED.replication_host,"
            " replication_port = EXCLUDED.replication_port,"
            " replication_tls = EXCLUDED.replication_tls,"
            " writes_events = EXCLUDED.writes_events, updated_ts = EXCLUDED.updated_ts",
            (
                instance_name,
                location.host if location else None,
                location.port if location else None,
                bool(location and location.tls),
                writes_events,
                _now_ms(),
            ),
        )

    @staticmethod
    def reconcile_events_writers_txn(
        txn: LoggingTransaction,
        writers: Sequence[str],
        locations: dict[str, InstanceLocation],
    ) -> list[str]:
        """Make the table agree with the main process's config at its startup:
        exactly ``writers`` write events. A writer's recorded address is kept
        (it wrote it itself); a writer never started gets the configured one.
        Returns the instances that stopped being writers."""
        placeholders = ", ".join("?" for _ in writers)
        txn.execute(
            f"SELECT instance_name FROM instances"
            f" WHERE writes_events = ? AND instance_name NOT IN ({placeholders})",
            (True, *writers),
        )
        retired = [r[0] for r in txn.fetchall()]
        for name in retired:
            txn.execute(
                "UPDATE instances SET writes_events = ?, updated_ts = ? WHERE instance_name = ?",
                (False, _now_ms(), name),
            )
        for writer in writers:
            location = locations.get(writer)
            txn.execute(
                "INSERT INTO instances (instance_name, replication_host, replication_port,"
                " replication_tls, writes_events, updated_ts)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (instance_name) DO UPDATE SET"
                " writes_events = EXCLUDED.writes_events",
                (
                    writer,
                    location.host if location else None,
                    location.port if location else None,
                    bool(location and location.tls),
                    True,
                    _now_ms(),
                ),
            )
        return retired

    @staticmethod
    def load_or_create_deployment_id_txn(txn: LoggingTransaction) -> str:
        """The id of the deployment this database belongs to, made (random)
        by the first process that asks; every process of the deployment
        reads the same one."""
        txn.execute(
            "INSERT INTO deployment (id, deployment_id) VALUES (1, ?) ON CONFLICT (id) DO NOTHING",
            (secrets.token_hex(8),),
        )
        txn.execute("SELECT deployment_id FROM deployment WHERE id = 1")
        row = txn.fetchone()
        assert row is not None
        return str(row[0])

    @staticmethod
    def record_claim_note_key_txn(
        txn: LoggingTransaction, instance_name: str, verify_key: str
    ) -> None:
        """Record the key the main process signs CHECKED notes with (the
        public half, unpadded base64), replacing its previous run's."""
        txn.execute(
            "INSERT INTO claim_note_key (id, instance_name, verify_key, updated_ts)"
            " VALUES (1, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
            " instance_name = EXCLUDED.instance_name, verify_key = EXCLUDED.verify_key,"
            " updated_ts = EXCLUDED.updated_ts",
            (instance_name, verify_key, _now_ms()),
        )

    async def get_claim_note_key(self) -> tuple[str, str] | None:
        """``(instance name, verify key)`` of the CHECKED notes' signer now,
        or None if no main process has recorded one."""

        def txn_func(txn: LoggingTransaction) -> tuple[str, str] | None:
            txn.execute("SELECT instance_name, verify_key FROM claim_note_key WHERE id = 1")
            row = txn.fetchone()
            return None if row is None else (str(row[0]), str(row[1]))

        return await self.db_pool.runInteraction(
            "get_claim_note_key", txn_func, read_only=True, db_autocommit=True
        )

    @staticmethod
    def get_instances_txn(txn: LoggingTransaction) -> list[InstanceRecord]:
        txn.execute(
            "SELECT instance_name, replication_host, replication_port, writes_events,"
            " replication_tls FROM instances ORDER BY instance_name"
        )
        return [
            InstanceRecord(
                instance_name=r[0],
                location=InstanceLocation(r[1], int(r[2]), bool(r[4])) if r[1] and r[2] else None,
                writes_events=bool(r[3]),
            )
            for r in txn.fetchall()
        ]

    async def get_instances(self) -> list[InstanceRecord]:
        return await self.db_pool.runInteraction(
            "get_instances", self.get_instances_txn, read_only=True
        )

    async def retire_events_writer(self, instance_name: str) -> None:
        """Record that ``instance_name`` no longer writes events and tell every
        process (through the caches stream) to read ``instances`` again."""

        def txn_func(txn: LoggingTransaction) -> None:
            txn.execute(
                "UPDATE instances SET writes_events = ?, updated_ts = ? WHERE instance_name = ?",
                (False, _now_ms(), instance_name),
            )
            if txn.rowcount == 0:
                self.record_instance_txn(txn, instance_name, None, False)
            self.send_invalidation_txn(txn, INSTANCES_CACHE_NAME, [instance_name])

        await self.db_pool.runInteraction("retire_events_writer", txn_func)

    async def announce_instances_changed(self, instance_names: list[str]) -> None:
        """Tell every process to read ``instances`` again."""
        await self.db_pool.runInteraction(
            "announce_instances_changed",
            self.send_invalidation_txn,
            INSTANCES_CACHE_NAME,
            instance_names,
        )
