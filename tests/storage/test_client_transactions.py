"""Client transaction ids kept with their writes (``client_transactions``): a
retried to-device send writes nothing, whatever the writer forgot in between;
ids older than a day, and those of a deleted device, are forgotten (SQLite and
PostgreSQL)."""

from __future__ import annotations

from twisted.internet import task

from synapse_lite.clock import Clock
from synapse_lite.handlers import client_transactions as expiry_module
from synapse_lite.handlers.client_transactions import (
    PRUNE_INTERVAL_SECONDS,
    ClientTransactionExpiry,
)
from synapse_lite.replication.http.writes import ToDeviceSend
from synapse_lite.server import HomeServer
from synapse_lite.storage.databases.main.client_transactions import (
    CLIENT_TXN_LIFETIME_MS,
    TxnKey,
    claim_client_transaction_txn,
)
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase, make_config, make_homeserver

BOB = "@bob:test.local"


async def inbox_rows(hs: HomeServer) -> list[tuple[str, int]]:
    rows = await hs.store.db_pool.select(
        "t", "SELECT device_id, stream_id FROM device_inbox ORDER BY stream_id"
    )
    return [(r[0], int(r[1])) for r in rows]


class ClientTransactionsTestCase(DatabaseTestCase):
    async def test_a_repeated_txn_id_writes_nothing_and_answers_the_first_id(self) -> None:
        hs = make_homeserver(self, make_config(self.test_db))
        store = hs.store
        messages = {BOB: {"PHONE": {"type": "m.test", "sender": "@a:test.local", "content": {}}}}
        key = ("@a:test.local", "ADEV", "t1")
        first, new = await store.add_messages_to_device_inbox(messages, {}, key)
        self.assertTrue(new)
        again, new = await store.add_messages_to_device_inbox(messages, {}, key)
        self.assertEqual((again, new), (first, False))
        self.assertEqual(await inbox_rows(hs), [("PHONE", first)])
        # The same id from another device, or without a device, is another send.
        other, new = await store.add_messages_to_device_inbox(
            messages, {}, ("@a:test.local", "BDEV", "t1")
        )
        self.assertTrue(new)
        self.assertGreater(other, first)
        no_device, new = await store.add_messages_to_device_inbox(
            messages, {}, ("@a:test.local", None, "t1")
        )
        self.assertTrue(new)
        again, new = await store.add_messages_to_device_inbox(
            messages, {}, ("@a:test.local", None, "t1")
        )
        self.assertEqual((again, new), (no_device, False))
        self.assertEqual(len(await inbox_rows(hs)), 3)

    async def test_a_retry_after_the_writer_restarted_is_delivered_once(self) -> None:
        """The writer's memory is gone (a new process on the same database):
        the retry is answered with the first stream id and stores nothing."""
        config = make_config(self.test_db)
        send = ToDeviceSend(
            "@alice:test.local", "ADEV", "m.test", "txn-1", {BOB: {"PHONE": {"n": 1}}}
        )
        first_hs = make_homeserver(self, config)
        first = await first_hs.handlers.device_messages.write_messages(send)
        await first_hs.service.stopService()
        second_hs = make_homeserver(self, config)
        retry = await second_hs.handlers.device_messages.write_messages(send)
        self.assertEqual(retry, first)
        self.assertEqual(await inbox_rows(second_hs), [("PHONE", first.stream_id)])
        # A new txnId is a new message.
        other = await second_hs.handlers.device_messages.write_messages(
            ToDeviceSend("@alice:test.local", "ADEV", "m.test", "txn-2", {BOB: {"PHONE": {}}})
        )
        self.assertGreater(other.stream_id, first.stream_id)


async def record_txn(hs: HomeServer, key: TxnKey, now_ms: int) -> None:
    await hs.store.db_pool.runInteraction(
        "t", claim_client_transaction_txn, key, "to_device", now_ms
    )


async def txn_ids(hs: HomeServer) -> list[tuple[str, str]]:
    rows = await hs.store.db_pool.select(
        "t", "SELECT device_id, txn_id FROM client_transactions ORDER BY device_id, txn_id"
    )
    return [(r[0], r[1]) for r in rows]


class ClientTransactionsForgottenTestCase(DatabaseTestCase):
    async def test_ids_older_than_a_day_are_pruned_every_interval(self) -> None:
        """Five ids from a day and a second ago, one from a day minus a
        second ago; deleted two per transaction (the batch made small): after
        one interval of the main process's loop only the recent one is left,
        and a day later that one too."""
        self.patch(expiry_module, "PRUNE_BATCH", 2)
        hs = make_homeserver(self, make_config(self.test_db))
        now_ms = 1_800_000_000_000
        for i in range(5):
            await record_txn(
                hs, ("@a:test.local", "ADEV", f"old-{i}"), now_ms - CLIENT_TXN_LIFETIME_MS - 1000
            )
        await record_txn(
            hs, ("@a:test.local", "ADEV", "recent"), now_ms - CLIENT_TXN_LIFETIME_MS + 1000
        )
        clock = task.Clock()
        clock.advance(now_ms / 1000 - PRUNE_INTERVAL_SECONDS)
        loop = ClientTransactionExpiry(hs.store, Clock(clock))
        loop.start()
        self.addCleanup(loop.stop)
        clock.advance(PRUNE_INTERVAL_SECONDS - 1)
        self.assertEqual(len(await txn_ids(hs)), 6)  # not yet run
        clock.advance(1)
        await eventually(lambda: self._count_is(hs, 1), what="the old ids pruned")
        self.assertEqual(await txn_ids(hs), [("ADEV", "recent")])
        clock.advance(CLIENT_TXN_LIFETIME_MS / 1000)
        await eventually(lambda: self._count_is(hs, 0), what="the recent id pruned")

    async def _count_is(self, hs: HomeServer, count: int) -> bool:
        return len(await txn_ids(hs)) == count

    async def test_a_deleted_device_takes_its_ids_with_it(self) -> None:
        hs = make_homeserver(self, make_config(self.test_db))
        now_ms = hs.clock.time_msec()
        await record_txn(hs, ("@a:test.local", "ADEV", "t1"), now_ms)
        await record_txn(hs, ("@a:test.local", "BDEV", "t1"), now_ms)
        await record_txn(hs, ("@b:test.local", "ADEV", "t1"), now_ms)
        await hs.store.delete_devices("@a:test.local", ["ADEV"])
        rows = await hs.store.db_pool.select(
            "t", "SELECT user_id, device_id FROM client_transactions ORDER BY user_id, device_id"
        )
        self.assertEqual(
            [tuple(r) for r in rows], [("@a:test.local", "BDEV"), ("@b:test.local", "ADEV")]
        )
