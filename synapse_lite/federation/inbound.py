"""What an authenticated transaction from another server does.

* A transaction ``(origin, txn_id)`` seen before is answered with the stored
  response and applies nothing again; two copies arriving at once share one
  processing.
* ``m.direct_to_device`` EDUs are delivered to local devices through the
  to_device writer, once per ``(origin, message_id)`` (see
  ``DeviceInboxWorkerStore.add_remote_messages_to_device_inbox``).
* Other EDUs (typing, receipts, device lists) are checked and applied one
  by one by ``inbound_edus.py``; a refused one costs the others nothing.
* PDUs are checked and persisted by their rooms' writers
  (``handlers/inbound_pdus.py``), each answered in ``pdus`` (``{}`` or an
  ``error``); one refused PDU costs the others nothing. A process built
  without that handler answers every PDU with an error.
* Room EDUs (``m.typing``, ``m.receipt``) about rooms whose server ACL
  denies the origin are dropped first (``federation/server_acl.py``).
* A request from a server we are backing off from means it is up again:
  ``REMOTE_SERVER_UP`` goes to every process, and to our own sender.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet import defer

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import is_mine_id, is_valid_user_id
from synapse_lite.federation.server_acl import acl_filtered_edu
from synapse_lite.metrics import FEDERATION_TRANSACTIONS_RECEIVED
from synapse_lite.replication.tcp.commands import RemoteServerUpCommand

if TYPE_CHECKING:
    from synapse_lite.federation.inbound_edus import InboundEdus
    from synapse_lite.federation.outbox import OutboxConsumer
    from synapse_lite.handlers.devicemessage import DeviceMessageHandler
    from synapse_lite.handlers.inbound_pdus import InboundPdus
    from synapse_lite.replication.tcp.commands import Command
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

MAX_PDUS = 50
MAX_EDUS = 100
DIRECT_TO_DEVICE = "m.direct_to_device"
#: Longest device id, message id or event type accepted.
MAX_ID = 255


def announce_server_up(
    send_command: Callable[[Command], None], outbox: OutboxConsumer | None, server_name: str
) -> None:
    """Tell every process, and this one's sender, that ``server_name`` is
    reachable: whichever sends to it forgets its backoff and sends now
    (``REMOTE_SERVER_UP``)."""
    send_command(RemoteServerUpCommand(server_name))
    if outbox is not None:
        outbox.on_remote_server_up(server_name)


class FederationInboundHandler:
    """Processes received transactions (any process with ``federation``)."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        server_name: str,
        device_messages: DeviceMessageHandler,
        send_command: Callable[[Command], None],
        outbox: OutboxConsumer | None,
        pdus: InboundPdus | None = None,
        edus: InboundEdus | None = None,
    ) -> None:
        """``outbox``: this process's federation sender, if it is one;
        ``pdus``: what checks and persists the PDUs; ``edus``: what checks
        and applies the other EDUs (typing, receipts, device lists)."""
        self._store = store
        self._server_name = server_name
        self._device_messages = device_messages
        self._send_command = send_command
        self._outbox = outbox
        self._pdus = pdus
        self._edus = edus
        #: Transactions being processed -> copies waiting for the outcome.
        self._in_flight: dict[tuple[str, str], list[defer.Deferred[Any]]] = {}

    async def on_transaction(self, origin: str, txn_id: str, body: dict[str, Any]) -> Any:
        """``PUT /send/{txn_id}`` from ``origin`` (already authenticated)."""
        await self._note_server_up(origin)
        if body.get("origin", origin) != origin:
            raise SynapseError(403, "'origin' does not match the signature", Codes.FORBIDDEN)
        pdus, edus = body.get("pdus", []), body.get("edus", [])
        if not isinstance(pdus, list) or not isinstance(edus, list):
            raise SynapseError(400, "'pdus' and 'edus' must be lists", Codes.BAD_JSON)
        if len(pdus) > MAX_PDUS or len(edus) > MAX_EDUS:
            raise SynapseError(400, "Too many PDUs or EDUs in one transaction", Codes.BAD_JSON)

        key = (origin, txn_id)
        waiting = self._in_flight.get(key)
        if waiting is not None:
            waiter: defer.Deferred[Any] = defer.Deferred()
            waiting.append(waiter)
            return await waiter
        stored = await self._store.get_received_transaction(origin, txn_id)
        if stored is not None:
            FEDERATION_TRANSACTIONS_RECEIVED.labels("replayed").inc()
            logger.info(
                "Transaction %s from %s was received before: answering again", txn_id, origin
            )
            return stored
        self._in_flight[key] = []
        try:
            response = await self._process(origin, pdus, edus)
            await self._store.store_received_transaction(origin, txn_id, response)
        except Exception as e:
            for waiter in self._in_flight.pop(key):
                waiter.errback(e)
            raise
        for waiter in self._in_flight.pop(key):
            waiter.callback(response)
        FEDERATION_TRANSACTIONS_RECEIVED.labels("new").inc()
        logger.info(
            "Received transaction %s from %s: %d EDU(s), %d PDU(s)",
            txn_id,
            origin,
            len(edus),
            len(pdus),
        )
        return response

    async def _process(self, origin: str, pdus: list[Any], edus: list[Any]) -> dict[str, Any]:
        results: dict[str, Any] = {}
        if self._pdus is not None:
            results = await self._pdus.on_pdus(origin, pdus)
        else:
            for pdu in pdus:
                event_id = pdu.get("event_id") if isinstance(pdu, dict) else None
                if isinstance(event_id, str):
                    results[event_id] = {"error": "This process does not accept room events"}
        for edu in edus:
            if not isinstance(edu, dict) or not isinstance(edu.get("content"), dict):
                logger.info("Ignoring a malformed EDU from %s", origin)
            elif (edu := await acl_filtered_edu(self._store, origin, edu)) is None:
                logger.debug("Ignoring a room EDU from %s: denied by the room's ACL", origin)
            elif edu.get("edu_type") == DIRECT_TO_DEVICE:
                await self._on_direct_to_device(origin, edu["content"])
            elif self._edus is not None and isinstance(edu.get("edu_type"), str):
                await self._edus.on_edu(origin, edu["edu_type"], edu["content"])
            else:
                logger.debug("Ignoring an EDU of type %r from %s", edu.get("edu_type"), origin)
        return {"pdus": results}

    async def _on_direct_to_device(self, origin: str, content: dict[str, Any]) -> None:
        sender, event_type = content.get("sender"), content.get("type")
        message_id, messages = content.get("message_id"), content.get("messages")
        problem: str | None = None
        if not isinstance(sender, str) or not is_valid_user_id(sender):
            problem = "no valid sender"
        elif sender.split(":", 1)[1] != origin:
            problem = f"sender {sender} is not of {origin}"
        elif not isinstance(event_type, str) or not 0 < len(event_type) <= MAX_ID:
            problem = "no valid type"
        elif not isinstance(message_id, str) or not 0 < len(message_id) <= MAX_ID:
            problem = "no valid message_id"
        elif not isinstance(messages, dict):
            problem = "no messages"
        if problem is not None:
            logger.warning("Dropping a to-device EDU from %s: %s", origin, problem)
            return
        assert isinstance(sender, str) and isinstance(event_type, str)
        assert isinstance(message_id, str) and isinstance(messages, dict)
        local: dict[str, dict[str, Any]] = {}
        for user_id, devices in messages.items():
            if not is_valid_user_id(user_id) or not is_mine_id(user_id, self._server_name):
                logger.info("%s sent a to-device message for %r, not ours", origin, user_id)
            elif isinstance(devices, dict):
                local[user_id] = {
                    d: c
                    for d, c in devices.items()
                    if isinstance(d, str) and 0 < len(d) <= MAX_ID and isinstance(c, dict)
                }
        await self._device_messages.receive_remote_messages(
            origin, sender, event_type, message_id, local
        )

    async def _note_server_up(self, origin: str) -> None:
        """If we are backing off from ``origin``, everyone may stop now."""
        state = await self._store.get_retry_state(origin)
        if state.retry_interval_ms == 0:
            return
        logger.info("%s is up again (it sent us a request): resetting its backoff", origin)
        announce_server_up(self._send_command, self._outbox, origin)
