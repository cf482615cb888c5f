"""Sending one destination's queued PDUs and EDUs, one transaction at a time.

A wake-up says EDUs are queued up to some to_device stream id, or gives room
events (PDUs, in stream order: ``room_events.py``). The queue then reads the
outbox (oldest first, up to :data:`MAX_EDUS_PER_TRANSACTION` EDUs and about
:data:`MAX_TRANSACTION_BYTES`), takes the next PDUs (up to 50:
``pdu_queue.py``, which also decides when a destination that fell behind
catches up with the newest event of each room), sends one transaction, and
on a 200 deletes exactly what it sent and records how far the destination
got; whatever was queued meanwhile goes in the next transaction. Only one
transaction is ever in flight per destination, so events arrive in order.

The transaction id is derived from the stream ids and event ids it carries,
so retrying the same EDUs and PDUs (after a timeout, or after this process was killed mid-request)
reuses the id and the receiver answers from its record instead of applying
them again; a batch that differs gets another id, and the receiver's
per-message-id dedupe covers any EDU it had already applied.

A failure backs off (``backoff.py``); a wake-up does not cut a backoff short,
``REMOTE_SERVER_UP`` does. A destination that refuses a transaction as bad
(400, 413) gets the EDUs one by one, and an EDU refused on its own is dropped
with an error in the log: it could never be delivered and would block the rest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall

from synapse_lite.federation.client import FederationRequestError
from synapse_lite.federation.crypto import CanonicalJsonError, canonical_json
from synapse_lite.federation.inbound import DIRECT_TO_DEVICE
from synapse_lite.federation.sender import backoff
from synapse_lite.federation.sender.pdu_queue import FeedProgress, PduQueue
from synapse_lite.metrics import (
    FEDERATION_DESTINATION_BACKOFF_SECONDS,
    FEDERATION_DESTINATION_CATCHING_UP,
    FEDERATION_DESTINATION_LAST_SUCCESS,
    FEDERATION_DESTINATION_PENDING_EDUS,
    FEDERATION_DESTINATION_PENDING_PDUS,
    FEDERATION_DESTINATION_TRANSACTION_SECONDS,
    FEDERATION_DESTINATIONS_DOWN,
    FEDERATION_EDUS_SENT,
    FEDERATION_PDUS_SENT,
    FEDERATION_TRANSACTION_SECONDS,
    FEDERATION_TRANSACTIONS_SENT,
)
from synapse_lite.storage.databases.main.destination_rooms import QueuedPdu
from synapse_lite.storage.databases.main.federation import OutboxRow, RetryState

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.config.federation import RetryConfig
    from synapse_lite.federation.client import FederationClient
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

MAX_EDUS_PER_TRANSACTION = 100
#: Ephemeral EDUs kept for a destination that does not take them.
MAX_PENDING_EDUS = 1_000
MAX_TRANSACTION_BYTES = 512 * 1024
#: Answers meaning "this transaction will never be accepted as it is".
PERMANENT_REFUSALS = (400, 413)


def transaction_id(
    rows: Sequence[OutboxRow], pdu_ids: Sequence[str] = (), edus: Sequence[dict[str, Any]] = ()
) -> str:
    """Stable for one set of EDUs and PDUs, different for any other
    (``edus``: the in-memory ones, by their JSON)."""
    ids = ",".join([str(r.stream_id) for r in rows] + list(pdu_ids))
    if edus:
        ids += json.dumps(list(edus), sort_keys=True)
    digest = hashlib.sha256(ids.encode("utf-8")).hexdigest()[:10]
    if not rows:
        return f"p-{digest}"
    return f"{rows[0].stream_id}-{rows[-1].stream_id}-{digest}"


def take_batch(rows: list[OutboxRow]) -> list[OutboxRow]:
    """The longest prefix of ``rows`` within the transaction size limit (at
    least one row)."""
    size = 0
    for i, row in enumerate(rows):
        size += len(json.dumps(row.content))
        if size > MAX_TRANSACTION_BYTES and i > 0:
            return rows[:i]
    return rows


class DestinationQueue:
    """The EDUs of one destination and its backoff (see the module docstring)."""

    def __init__(
        self,
        destination: str,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        client: FederationClient,
        server_name: str,
        retry: RetryConfig,
        on_sent: Callable[[str], None],
        render_pdus: Callable[[Sequence[str]], Awaitable[list[dict[str, Any]]]] | None = None,
        feed: FeedProgress | None = None,
    ) -> None:
        """``on_sent(destination)``: after each transaction the destination
        took; ``render_pdus(event_ids)``: the PDUs of those events and
        ``feed``: where the room events feed is (both needed once PDUs are
        queued; without a feed no PDU is ever sent)."""
        self.destination = destination
        self._store = store
        self._clock = clock
        self._client = client
        self._server_name = server_name
        self._config = retry
        self._on_sent = on_sent
        self._render_pdus = render_pdus
        #: Room events waiting, and how far the destination took them.
        self.pdus = PduQueue(destination, store, feed or FeedProgress())
        #: Ephemeral EDUs waiting (typing, receipts, presence, device
        #: lists: ``sender/edus.py``), oldest first, in memory only.
        self._edus: list[dict[str, Any]] = []
        #: When the destination last accepted a transaction (ms; None: not in this run).
        self.last_success_ms: int | None = None
        #: Largest to_device stream id we were told is queued here.
        self._wanted_upto = 0
        self._running = False
        self._wake_again = False
        self._retry_call: IDelayedCall | None = None
        self._state: RetryState | None = None
        self._one_at_a_time = False
        #: REMOTE_SERVER_UP arrived while a transaction was in flight.
        self._up_again = False
        #: REMOTE_SERVER_UP arrived: the loop clears the recorded backoff.
        self._reset_requested = False
        #: Whether this queue counts in the destinations-down gauge.
        self._counted_down = False
        #: The process is stopping: nothing more is started or recorded.
        self._stopped = False
        #: The send loop under way, if any.
        self._current: defer.Deferred[None] | None = None

    @property
    def is_backing_off(self) -> bool:
        return self._retry_call is not None and self._retry_call.active()

    @property
    def is_down(self) -> bool:
        return self._state is not None and backoff.is_down(self._state, self._config)

    def wake(self, upto_stream_id: int | None = None) -> None:
        """EDUs are queued up to ``upto_stream_id`` (None: just look)."""
        if upto_stream_id is not None:
            self._wanted_upto = max(self._wanted_upto, upto_stream_id)
        if self._stopped:
            return
        if self._running:
            self._wake_again = True
            return
        if self.is_backing_off:
            return
        self._running = True
        self._current = defer.ensureDeferred(self._run())

    @property
    def pending_pdus(self) -> int:
        return self.pdus.pending

    @property
    def failing_since_ms(self) -> int | None:
        """When the current run of failures began (None: not failing)."""
        if self._state is None or not self._state.retry_interval_ms:
            return None
        return self._state.failure_ts

    @property
    def retry_interval_ms(self) -> int:
        return 0 if self._state is None else self._state.retry_interval_ms

    def add_pdus(self, pdus: Sequence[QueuedPdu]) -> None:
        """Send these room events (in this order, after those queued)."""
        self.pdus.add(pdus, self.is_backing_off)
        self._gauge(FEDERATION_DESTINATION_PENDING_PDUS, self.pdus.pending)
        self.wake()

    def add_edus(self, edus: Sequence[dict[str, Any]]) -> None:
        """Send these ephemeral EDUs (``{"edu_type", "content"}``) after
        those queued; kept in memory, at most :data:`MAX_PENDING_EDUS` (the
        oldest are dropped beyond: they are worth little once stale)."""
        self._edus.extend(edus)
        excess = len(self._edus) - MAX_PENDING_EDUS
        if excess > 0:
            logger.warning(
                "Dropping the oldest %d ephemeral EDU(s) waiting for %s", excess, self.destination
            )
            del self._edus[:excess]
        self.wake()

    def reset_backoff(self) -> None:
        """The destination is up again: forget the backoff and send now.

        The database is updated by the send loop (one write, not one per
        REMOTE_SERVER_UP: several processes may announce the same server)."""
        if self._retry_call is not None and self._retry_call.active():
            self._retry_call.cancel()
        self._retry_call = None
        if self._state is None or self._state.retry_interval_ms:
            self._reset_requested = True
        self._up_again = self._running
        self.wake()

    def stop(self) -> defer.Deferred[None] | None:
        """The process is stopping: a transaction in flight may finish (the
        Deferred returned fires then), but nothing more is sent or recorded
        (what it carried is sent again by the next run: EDUs from the
        outbox)."""
        self._stopped = True
        if self._retry_call is not None and self._retry_call.active():
            self._retry_call.cancel()
        return self._current if self._running else None

    async def _run(self) -> None:
        try:
            await self._send_all()
        except Exception:
            if self._stopped:
                logger.info("Sending to %s ended with the process", self.destination)
            else:
                logger.exception("Sending to %s failed unexpectedly", self.destination)
                self._schedule_retry(self._config.initial_seconds)
        finally:
            self._running = False
        if self._wake_again and not self.is_backing_off:
            self._wake_again = False
            self.wake()

    async def _send_all(self) -> None:
        store = self._store
        loaded = self._state is None
        if self._state is None:
            self._set_state(await store.get_retry_state(self.destination))
            assert self._state is not None
        if self._reset_requested:
            self._reset_requested = False
            if self._state.retry_interval_ms:
                logger.info("%s is up again: sending what is queued for it now", self.destination)
                self._mark_up()
                await store.set_retry_state(self.destination, self._state)
        elif loaded:
            delay = backoff.retry_delay_seconds(self._state, self._clock.time_msec())
            if delay > 0:
                self._schedule_retry(delay)
                return
        while True:
            self._wake_again = False
            bound = max(store.get_to_device_stream_token(), self._wanted_upto)
            limit = 1 if self._one_at_a_time else MAX_EDUS_PER_TRANSACTION
            rows = await store.get_pending_edus(self.destination, bound, limit)
            queued = await self.pdus.next_batch()
            edus = self._edus[: max(0, MAX_EDUS_PER_TRANSACTION - len(rows))]
            if self._one_at_a_time and rows:
                edus = []
            self._gauge(FEDERATION_DESTINATION_PENDING_EDUS, len(rows) + len(self._edus))
            self._gauge(FEDERATION_DESTINATION_PENDING_PDUS, self.pdus.pending)
            self._gauge(FEDERATION_DESTINATION_CATCHING_UP, int(self.pdus.catching_up))
            if not rows and not queued and not edus:
                return
            batch = take_batch(rows) if rows else []
            if not await self._send_transaction(batch, queued, edus):
                return

    def _gauge(self, gauge: Any, value: float) -> None:
        gauge.labels(self.destination).set(value)

    async def _send_transaction(
        self,
        rows: list[OutboxRow],
        queued: list[QueuedPdu],
        edus: list[dict[str, Any]] | None = None,
    ) -> bool:
        """Send one transaction; whether to go on with the next."""
        edus = edus or []
        pdu_ids = [p.event_id for p in queued]
        txn_id = transaction_id(rows, pdu_ids, edus)
        pdus: list[dict[str, Any]] = []
        if pdu_ids:
            assert self._render_pdus is not None, "PDUs queued without a renderer"
            pdus = await self._render_pdus(pdu_ids)
        body: dict[str, Any] = {
            "origin": self._server_name,
            "origin_server_ts": self._clock.time_msec(),
            "pdus": pdus,
            "edus": [{"edu_type": DIRECT_TO_DEVICE, "content": r.content} for r in rows] + edus,
        }
        try:
            canonical_json(body)
        except CanonicalJsonError as e:
            if edus:
                self._forget_edus(edus, f"they are not canonical JSON ({e})")
                return True
            if not rows:
                await self._forget_pdus(queued, f"they are not canonical JSON ({e})")
                return True
            # Events were checked when persisted: an EDU is the culprit
            # (the PDUs go in the next transaction).
            return await self._drop(rows, f"it is not canonical JSON ({e})")
        logger.info(
            "Sending transaction %s to %s: %d PDU(s), %d EDU(s)",
            txn_id,
            self.destination,
            len(pdus),
            len(rows),
        )
        started = time.monotonic()
        try:
            answer = await self._client.put_json(
                self.destination, f"/_matrix/federation/v1/send/{txn_id}", body
            )
        except FederationRequestError as e:
            if self._stopped:
                return False
            outcome = "refused" if e.code in PERMANENT_REFUSALS else "failed"
            FEDERATION_TRANSACTIONS_SENT.labels(outcome).inc()
            if e.code in PERMANENT_REFUSALS:
                if edus:
                    self._forget_edus(edus, f"{self.destination} refused them: {e}")
                    if not rows and not pdu_ids:
                        return True
                if pdu_ids:
                    # Its PDUs cannot be sent one by one any better (each is
                    # answered on its own in a 200): they are what it refused.
                    await self._forget_pdus(queued, f"{self.destination} refused them: {e}")
                    return True
                if len(rows) > 1 or (edus and rows):
                    logger.warning(
                        "%s refused transaction %s: sending its EDUs one by one",
                        self.destination,
                        txn_id,
                    )
                    self._one_at_a_time = True
                    return True
                return await self._drop(rows, f"{self.destination} refused it: {e}")
            await self._failed(txn_id, e)
            return False
        if self._stopped:
            # Taken, but recorded by nobody: the EDUs go again next run (the
            # receiver answers the same transaction id from its record).
            return False
        took = time.monotonic() - started
        FEDERATION_TRANSACTION_SECONDS.observe(took)
        self._gauge(FEDERATION_DESTINATION_TRANSACTION_SECONDS, took)
        self.last_success_ms = self._clock.time_msec()
        self._gauge(FEDERATION_DESTINATION_LAST_SUCCESS, self.last_success_ms / 1000)
        logger.info("Transaction %s to %s accepted", txn_id, self.destination)
        FEDERATION_TRANSACTIONS_SENT.labels("accepted").inc()
        FEDERATION_EDUS_SENT.inc(len(rows) + len(edus))
        FEDERATION_PDUS_SENT.inc(len(pdus))
        self._up_again = False
        if not isinstance(answer, dict):
            logger.warning("%s answered transaction %s with %r", self.destination, txn_id, answer)
        else:
            _log_pdu_errors(self.destination, answer.get("pdus"))
        await self._forget_pdus(queued, "")
        self._forget_edus(edus, "")
        if rows:
            await self._store.delete_sent_edus(self.destination, [r.stream_id for r in rows])
        self._one_at_a_time = False
        if self._state is not None and self._state.retry_interval_ms:
            self._mark_up()
            await self._store.set_retry_state(self.destination, self._state)
        self._on_sent(self.destination)
        return True

    async def _forget_pdus(self, queued: Sequence[QueuedPdu], reason: str) -> None:
        """Take ``queued`` off the queue and record the destination's
        position past them (sent; or, with a ``reason``, dropped: logged)."""
        if reason:
            pdu_ids = [p.event_id for p in queued]
            logger.error(
                "Dropping %d PDU(s) for %s (%s): %s",
                len(pdu_ids),
                self.destination,
                ", ".join(pdu_ids[:3]) + ("..." if len(pdu_ids) > 3 else ""),
                reason,
            )
        await self.pdus.sent(queued)

    def _forget_edus(self, edus: Sequence[dict[str, Any]], reason: str) -> None:
        """Take ``edus`` (the first ones queued) off the queue (sent; or,
        with a ``reason``, dropped: logged)."""
        if not edus:
            return
        if reason:
            logger.error(
                "Dropping %d ephemeral EDU(s) for %s: %s", len(edus), self.destination, reason
            )
        done = {id(e) for e in edus}
        self._edus = [e for e in self._edus if id(e) not in done]

    async def _drop(self, rows: list[OutboxRow], reason: str) -> bool:
        logger.error(
            "Dropping %d EDU(s) for %s (stream ids %s): %s",
            len(rows),
            self.destination,
            [r.stream_id for r in rows],
            reason,
        )
        await self._store.delete_sent_edus(self.destination, [r.stream_id for r in rows])
        return True

    async def _failed(self, txn_id: str, error: Exception) -> None:
        assert self._state is not None
        if self._up_again:
            # It told us it is up while this attempt was failing: try again
            # at once rather than back off.
            self._up_again = False
            logger.info(
                "Transaction %s to %s failed; retrying now: %s", txn_id, self.destination, error
            )
            self._schedule_retry(0)
            return
        was_down = self.is_down
        self._set_state(backoff.after_failure(self._state, self._clock.time_msec(), self._config))
        assert self._state is not None
        await self._store.set_retry_state(self.destination, self._state)
        delay = backoff.retry_delay_seconds(self._state, self._clock.time_msec())
        if self.is_down and not was_down:
            logger.warning(
                "%s is down (%d failures in a row); retrying in %.1f s: %s",
                self.destination,
                backoff.consecutive_failures(self._state, self._config),
                delay,
                error,
            )
        else:
            logger.info(
                "Transaction %s to %s failed; retrying in %.1f s: %s",
                txn_id,
                self.destination,
                delay,
                error,
            )
        self._schedule_retry(delay)
        # A backlog it is not taking: catch up when it is back.
        self.pdus.check_backlog(backing_off=True)

    def _mark_up(self) -> None:
        self._set_state(RetryState())

    def _set_state(self, state: RetryState) -> None:
        self._state = state
        self._gauge(FEDERATION_DESTINATION_BACKOFF_SECONDS, state.retry_interval_ms / 1000)
        down = backoff.is_down(state, self._config)
        if down != self._counted_down:
            FEDERATION_DESTINATIONS_DOWN.inc(1 if down else -1)
            self._counted_down = down

    def _schedule_retry(self, delay: float) -> None:
        if self._stopped:
            return  # a send loop that began before stop() ends here
        if self._retry_call is not None and self._retry_call.active():
            self._retry_call.cancel()
        self._retry_call = self._clock.call_later(delay, self._retry)

    def _retry(self) -> None:
        self._retry_call = None
        self.wake()


def _log_pdu_errors(destination: str, results: Any) -> None:
    """The receiver's per-PDU errors, logged (nothing to retry: it has
    decided about each)."""
    if not isinstance(results, dict):
        return
    for event_id, result in results.items():
        if isinstance(result, dict) and result.get("error"):
            logger.info("%s refused PDU %s: %s", destination, event_id, result["error"])
