"""The federation stream between the main process (whose queue owns it) and
a federation sender worker, in process: rows, catch-up over internal HTTP
after a reconnection, FEDERATION_ACK trimming the queue."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer

from synapse_lite.federation.send_queue import FederationRemoteSendQueue
from synapse_lite.federation.sender.federation_sender import FederationSender
from tests.harness.client_api import start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase


class AcceptingRemote:
    """A destination that accepts every transaction, recording the EDUs."""

    def __init__(self) -> None:
        self.edus: list[Any] = []

    def put_json(self, destination: str, path: str, body: dict[str, Any]) -> defer.Deferred[Any]:
        self.edus.extend(edu["content"]["messages"] for edu in body["edus"])
        return defer.succeed({"pdus": {}})

    def close(self) -> None:
        pass


class FederationStreamTestCase(DatabaseTestCase):
    async def test_worker_follows_the_queue_and_acks(self) -> None:
        servers, clients, bus = start_cluster(
            self, self.test_db, workers=["fed1"], federation_sender="fed1", server_name="a.test"
        )
        main, worker = servers["main"], servers["fed1"]
        remote = AcceptingRemote()
        queue, sender = main.outbox, worker.outbox
        assert isinstance(queue, FederationRemoteSendQueue)
        assert isinstance(sender, FederationSender)
        # Before any destination queue exists: they all take this client.
        sender._client = remote  # type: ignore[assignment]
        self.assertIn("federation", main.streamer.sourced_stream_names)
        self.assertNotIn("federation", worker.streamer.sourced_stream_names)

        alice = await clients["main"].register("alice")

        async def send(n: int) -> None:
            await alice.ok(
                "PUT", f"/sendToDevice/m.t/x{n}", {"messages": {"@bob:b.test": {"D": {"n": n}}}}
            )

        await send(0)
        await eventually(lambda: len(remote.edus) == 1, what="the first EDU")
        # The worker acknowledged: the queue dropped the item.
        await eventually(lambda: queue.pending_items() == 0, what="the ack")
        self.assertEqual(sender.get_current_token(), queue.get_current_token())

        # Disconnected, the worker misses RDATA; on reconnection the POSITION
        # makes it catch up from the queue over internal HTTP.
        endpoint = next(e for e in bus.endpoints if e.hs is worker)
        bus.leave(endpoint)
        await send(1)
        await send(2)
        self.assertEqual(queue.pending_items(), 1)  # one item per destination
        self.assertEqual(len(remote.edus), 1)
        bus.join(worker)
        await eventually(lambda: len(remote.edus) == 3, what="the caught-up EDUs")
        self.assertEqual([e["@bob:b.test"]["D"]["n"] for e in remote.edus], [0, 1, 2])
        await eventually(lambda: queue.pending_items() == 0, what="the second ack")
        rows = await main.store.db_pool.select("t", "SELECT COUNT(*) FROM device_federation_outbox")
        self.assertEqual(rows[0][0], 0)

    async def test_token_falling_back_rescans(self) -> None:
        servers, _, _ = start_cluster(
            self, self.test_db, workers=["fed1"], federation_sender="fed1", server_name="a.test"
        )
        sender = servers["fed1"].outbox
        queue = servers["main"].outbox
        assert isinstance(sender, FederationSender)
        assert isinstance(queue, FederationRemoteSendQueue)
        await eventually(lambda: sender.get_current_token() == queue.get_current_token())
        rescans: list[int] = []
        self.patch(sender, "rescan", lambda: rescans.append(1))
        sender.process_federation_rows("main", 10**13, [])
        self.assertEqual(rescans, [])
        sender.process_federation_rows("main", 5, [])
        self.assertEqual((rescans, sender.get_current_token()), ([1], 5))
