"""The ephemeral EDUs of a received transaction (typing, receipts,
presence, device list and signing key updates): each checked on its own, then applied
through the stream writer that owns what it changes, so our users' /sync
shows it (docs/federation.md, "EDUs").

Every EDU is untrusted input: one whose content is malformed, names a user
who is not of the origin server, or a room the user is not joined to is
logged and dropped, and costs the transaction's other EDUs and PDUs
nothing (:meth:`InboundEdus.on_edu` never raises). ``m.direct_to_device``
is not handled here (``inbound.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import SynapseError
from synapse_lite.api.identifiers import is_valid_user_id, server_of
from synapse_lite.federation.sender.edus import (
    DEVICE_LIST_UPDATE,
    PRESENCE,
    RECEIPT,
    SIGNING_KEY_UPDATE,
    TYPING,
)
from synapse_lite.replication.http.writes import (
    SEND_RECEIPT,
    SET_REMOTE_PRESENCE,
    ReceiptWrite,
    RemotePresence,
)

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.handlers.typing import TypingHandlerBase
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: Longest room id, event id or thread id taken from an EDU.
MAX_ID = 255
#: Receipts taken from one ``m.receipt`` EDU (rooms x users).
MAX_RECEIPTS_PER_EDU = 1_000


class DroppedEdu(Exception):
    """An EDU (or part of one) refused: why, for the log."""


def _room_id(value: object) -> str:
    if not isinstance(value, str) or not value.startswith("!") or len(value) > MAX_ID:
        raise DroppedEdu(f"no valid room id ({value!r:.80})")
    return value


def user_of(origin: str, value: object) -> str:
    """``value`` when it is a user id of ``origin``'s."""
    if not isinstance(value, str) or not is_valid_user_id(value):
        raise DroppedEdu(f"no valid user id ({value!r:.80})")
    if server_of(value) != origin:
        raise DroppedEdu(f"user {value} is not of {origin}")
    return value


def parse_typing(origin: str, content: dict[str, Any]) -> tuple[str, str, bool]:
    """``(room_id, user_id, typing)`` of an ``m.typing`` EDU's content."""
    typing = content.get("typing")
    if not isinstance(typing, bool):
        raise DroppedEdu("'typing' is not true or false")
    return _room_id(content.get("room_id")), user_of(origin, content.get("user_id")), typing


def parse_receipts(origin: str, content: dict[str, Any]) -> list[ReceiptWrite]:
    """The ``m.read`` receipts of an ``m.receipt`` EDU's content, one per
    room and user (the last of its ``event_ids``), each of a user of
    ``origin``'s; malformed parts are skipped (logged), other receipt
    types ignored."""
    receipts: list[ReceiptWrite] = []
    for room_id, by_type in content.items():
        try:
            _room_id(room_id)
            if not isinstance(by_type, dict):
                raise DroppedEdu(f"receipts of {room_id} are not an object")
            reads = by_type.get("m.read", {})
            if not isinstance(reads, dict):
                raise DroppedEdu(f"m.read receipts of {room_id} are not an object")
        except DroppedEdu as e:
            logger.info("Skipping receipts from %s: %s", origin, e)
            continue
        for user_id, receipt in reads.items():
            try:
                user_of(origin, user_id)
                if not isinstance(receipt, dict):
                    raise DroppedEdu("a receipt is not an object")
                event_ids, data = receipt.get("event_ids"), receipt.get("data", {})
                if (
                    not isinstance(event_ids, list)
                    or not event_ids
                    or not all(isinstance(e, str) and 0 < len(e) <= MAX_ID for e in event_ids)
                ):
                    raise DroppedEdu("'event_ids' is not a list of event ids")
                if not isinstance(data, dict):
                    raise DroppedEdu("'data' is not an object")
                ts, thread_id = data.get("ts", 0), data.get("thread_id")
                if isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
                    raise DroppedEdu("'ts' is not a timestamp")
                if thread_id is not None and (
                    not isinstance(thread_id, str) or not 0 < len(thread_id) <= MAX_ID
                ):
                    raise DroppedEdu("'thread_id' is not a thread id")
            except DroppedEdu as e:
                logger.info("Skipping a receipt from %s in %s: %s", origin, room_id, e)
                continue
            stored: dict[str, Any] = {"ts": ts}
            if thread_id is not None:
                stored["thread_id"] = thread_id
            receipts.append(
                ReceiptWrite(room_id, "m.read", user_id, event_ids[-1], thread_id, stored)
            )
            if len(receipts) >= MAX_RECEIPTS_PER_EDU:
                return receipts
    return receipts


#: Users one ``m.presence`` EDU may update.
MAX_PRESENCE_PER_EDU = 1_000
PRESENCE_STATES = ("online", "unavailable", "offline")
MAX_STATUS_MSG = 1_024


def parse_presence(origin: str, content: dict[str, Any], now_ms: int) -> list[RemotePresence]:
    """The entries of an ``m.presence`` EDU's ``push``, each of a user of
    ``origin``'s and well-formed (others skipped, logged)."""
    push = content.get("push")
    if not isinstance(push, list):
        raise DroppedEdu("'push' is not a list")
    states: list[RemotePresence] = []
    for item in push[:MAX_PRESENCE_PER_EDU]:
        try:
            if not isinstance(item, dict):
                raise DroppedEdu("an entry is not an object")
            user_id = user_of(origin, item.get("user_id"))
            presence, ago = item.get("presence"), item.get("last_active_ago", 0)
            status_msg, active = item.get("status_msg"), item.get("currently_active", False)
            if presence not in PRESENCE_STATES:
                raise DroppedEdu(f"'presence' is not one of {', '.join(PRESENCE_STATES)}")
            if isinstance(ago, bool) or not isinstance(ago, int) or not 0 <= ago <= now_ms:
                raise DroppedEdu("'last_active_ago' is not a duration")
            if status_msg is not None and (
                not isinstance(status_msg, str)
                or len(status_msg) > MAX_STATUS_MSG
                or "\x00" in status_msg
            ):
                raise DroppedEdu("'status_msg' is not a short string")
            if not isinstance(active, bool):
                raise DroppedEdu("'currently_active' is not true or false")
        except DroppedEdu as e:
            logger.info("Skipping a presence entry from %s: %s", origin, e)
            continue
        assert isinstance(presence, str)
        states.append(RemotePresence(user_id, presence, status_msg, now_ms - ago, active))
    return states


class InboundEdus:
    """Applies other servers' ephemeral EDUs (see the module docstring)."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        typing: TypingHandlerBase,
        calls: InternalCalls,
        device_lists: Callable[[str, str, dict[str, Any]], Awaitable[None]] | None = None,
        clock: Clock | None = None,
    ) -> None:
        """``device_lists(origin, edu_type, content)``: takes device list
        and signing key updates (the remote device list cache)."""
        self._store = store
        self._typing = typing
        self._calls = calls
        self._device_lists = device_lists
        self._clock = clock

    async def on_edu(self, origin: str, edu_type: str, content: dict[str, Any]) -> None:
        """Check and apply one EDU; never raises (a refusal is logged)."""
        try:
            if edu_type == TYPING:
                await self._on_typing(origin, content)
            elif edu_type == RECEIPT:
                await self._on_receipts(origin, content)
            elif edu_type == PRESENCE and self._clock is not None:
                await self._on_presence(origin, content, self._clock.time_msec())
            elif edu_type in (DEVICE_LIST_UPDATE, SIGNING_KEY_UPDATE):
                if self._device_lists is not None:
                    await self._device_lists(origin, edu_type, content)
            else:
                logger.debug("Ignoring an EDU of type %r from %s", edu_type, origin)
        except DroppedEdu as e:
            logger.warning("Dropping an %s EDU from %s: %s", edu_type, origin, e)
        except SynapseError as e:
            logger.warning("Dropping an %s EDU from %s: %s", edu_type, origin, e.msg)
        except Exception:
            logger.exception("Applying an %s EDU from %s failed", edu_type, origin)

    async def _on_typing(self, origin: str, content: dict[str, Any]) -> None:
        room_id, user_id, typing = parse_typing(origin, content)
        if user_id not in await self._store.get_users_in_room(room_id):
            raise DroppedEdu(f"{user_id} is not in {room_id}")
        await self._typing.set_typing(user_id, user_id, room_id, typing, None)

    async def _on_presence(self, origin: str, content: dict[str, Any], now_ms: int) -> None:
        for state in parse_presence(origin, content, now_ms):
            if not await self._store.get_rooms_shared_with_local_users(state.user_id):
                logger.info(
                    "Skipping presence from %s: %s shares no room with us", origin, state.user_id
                )
                continue
            await self._calls.call(SET_REMOTE_PRESENCE, state)

    async def _on_receipts(self, origin: str, content: dict[str, Any]) -> None:
        for receipt in parse_receipts(origin, content):
            if receipt.user_id not in await self._store.get_users_in_room(receipt.room_id):
                logger.warning(
                    "Dropping a receipt from %s: %s is not in %s",
                    origin,
                    receipt.user_id,
                    receipt.room_id,
                )
                continue
            await self._calls.call(SEND_RECEIPT, receipt)
