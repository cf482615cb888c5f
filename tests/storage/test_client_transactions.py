"""Client transaction ids kept with their writes (``client_transactions``): a
retried to-device send writes nothing, whatever the writer forgot in between
(SQLite and PostgreSQL)."""

from __future__ import annotations

from synapse_lite.replication.http.writes import ToDeviceSend
from synapse_lite.server import HomeServer
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
