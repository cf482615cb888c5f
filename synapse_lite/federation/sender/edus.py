"""Ephemeral EDUs for other servers: our users' typing, read receipts,
presence and device list changes, sent to every other server sharing a room with them
(docs/federation.md, "EDUs").

Each feed runs beside the sender (like ``room_events.py``'s feed): it
follows one stream on this process (woken by the stream's rows from other
processes and by this process's own writes), turns what changed into EDUs
(pure functions below, tested on their own) and hands them to the
destinations' queues (``DestinationQueue.add_edus``), which carry them in
the next transaction. EDUs wait in memory only: a sender that restarts
forgets what it had not sent (typing and receipts are worth little once
stale; a device list change missed shows as a ``prev_id`` gap to the
receiver, which then asks for the whole list).

Typing and receipts are about one room each: they go to no server that
the room's ``m.room.server_acl`` denies (the server-server spec's "Server
Access Control Lists"), as the room's events do not.

* :class:`TypingFeed`: ``m.typing`` when one of our users starts or stops
  typing in a room (from the typing handler's view of the stream), and
  every :data:`TYPING_RENEW_SECONDS` again for those still typing.
* :class:`ReceiptsFeed`: ``m.receipt`` for our users' public (``m.read``)
  receipts, one EDU per destination per batch, grouped by room.
* :class:`PresenceFeed`: ``m.presence`` for our users' presence changes,
  to the servers sharing a room with them.
* :class:`DeviceListsFeed`: ``m.device_list_update`` for each device of
  our users that changed, ``m.signing_key_update`` for their cross-signing
  keys, to the servers sharing a room with the user.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet import defer

from synapse_lite.api.identifiers import server_of
from synapse_lite.federation.server_acl import room_acl, server_allowed

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.handlers.typing import TypingHandlerBase
    from synapse_lite.replication.notifier import ReplicationNotifier
    from synapse_lite.storage.databases.main import GenericWorkerStore
    from synapse_lite.storage.databases.main.presence import UserPresenceState

logger = logging.getLogger(__name__)

TYPING = "m.typing"
RECEIPT = "m.receipt"
DEVICE_LIST_UPDATE = "m.device_list_update"
SIGNING_KEY_UPDATE = "m.signing_key_update"
PRESENCE = "m.presence"
#: Stream rows read per look.
BATCH = 100
#: How often our users still typing are announced again (receivers forget
#: typing after 30 s here, 60 s on Synapse).
TYPING_RENEW_SECONDS = 20.0

SendEdus = Callable[[str, Sequence[dict[str, Any]]], None]


def edu(edu_type: str, content: dict[str, Any]) -> dict[str, Any]:
    return {"edu_type": edu_type, "content": content}


def other_servers(users: Iterable[str], server_name: str) -> list[str]:
    """The servers of ``users`` but us, sorted."""
    return sorted({server_of(u) for u in users} - {server_name})


def typing_changes(
    room_id: str, before: frozenset[str], now: frozenset[str]
) -> list[dict[str, Any]]:
    """``m.typing`` EDUs for the users of ours who started (``now`` but
    not ``before``) or stopped typing in ``room_id``, sorted by user."""
    started = [
        edu(TYPING, {"room_id": room_id, "user_id": u, "typing": True})
        for u in sorted(now - before)
    ]
    stopped = [
        edu(TYPING, {"room_id": room_id, "user_id": u, "typing": False})
        for u in sorted(before - now)
    ]
    return started + stopped


def receipt_content(
    receipts: Iterable[tuple[str, str, str, str | None, dict[str, Any]]],
) -> dict[str, Any]:
    """An ``m.receipt`` EDU's content from ``(room_id, user_id, event_id,
    thread_id, data)`` receipts (a later one of a user in a room replaces
    an earlier): ``{room_id: {"m.read": {user_id: {"event_ids": [id],
    "data": {...}}}}}``."""
    content: dict[str, Any] = {}
    for room_id, user_id, event_id, thread_id, data in receipts:
        sent = {k: v for k, v in data.items() if k in ("ts", "thread_id")}
        if thread_id is not None:
            sent["thread_id"] = thread_id
        content.setdefault(room_id, {}).setdefault("m.read", {})[user_id] = {
            "event_ids": [event_id],
            "data": sent,
        }
    return content


class _Feed:
    """One look at a stream at a time, looked at again when woken during
    it; what it finds goes to ``send_edus(destination, edus)``."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        server_name: str,
        send_edus: SendEdus,
        local_writes: ReplicationNotifier,
    ) -> None:
        self._store = store
        self._clock = clock
        self._server_name = server_name
        self._send_edus = send_edus
        self._started = False
        self._running = False
        self._again = False
        local_writes.add_replication_callback(self.wake)

    def start(self) -> None:
        self._begin()
        self._started = True

    def stop(self) -> None:
        self._started = False

    def on_rows(self, writer: str, token: int, rows: Sequence[Any]) -> None:
        """Row hook: runs before this process's position moves past the
        rows, so look once it has."""
        self._clock.call_later(0, self.wake)

    def wake(self) -> None:
        """The stream may have moved: look (cheap, safe to call spuriously)."""
        if not self._started:
            return
        if self._running:
            self._again = True
            return
        if not self._moved():
            # Woken by another stream's write (every local write wakes every
            # feed): nothing to look at, so no look is started (issue 35).
            return
        self._running = True
        defer.ensureDeferred(self._run())

    async def _run(self) -> None:
        try:
            while True:
                self._again = False
                if not await self._take_batch() and not self._again:
                    return
        except Exception:
            if self._started:
                logger.exception("%s failed", type(self).__name__)
        finally:
            self._running = False

    def _begin(self) -> None:
        raise NotImplementedError

    def _moved(self) -> bool:
        """Whether the stream is past what was looked at (read from memory,
        no database): ``_take_batch`` would find nothing otherwise."""
        raise NotImplementedError

    async def _servers_sharing_a_room(self, user_id: str) -> list[str]:
        """The other servers with a user joined to a room our ``user_id`` is in."""
        users: set[str] = set()
        for room_id in await self._store.get_rooms_for_user(user_id):
            users |= await self._store.get_users_in_room(room_id)
        return other_servers(users, self._server_name)

    async def _room_destinations(self, room_id: str) -> list[str]:
        """The other servers with a user joined to ``room_id`` that the
        room's current ``m.room.server_acl`` lets take part: an EDU about a
        room (typing, receipts) goes to no server the room denies, as its
        events do not (``room_events.py``)."""
        joined = await self._store.get_users_in_room(room_id)
        servers = other_servers(joined, self._server_name)
        if not servers:
            return servers
        acl = await room_acl(self._store, room_id)
        if acl is None:
            return servers
        return [s for s in servers if server_allowed(acl, s)]

    async def _take_batch(self) -> bool:
        """Send what changed; whether there may be more."""
        raise NotImplementedError


class TypingFeed(_Feed):
    """Our users' typing, as ``m.typing`` EDUs (see the module docstring)."""

    def __init__(
        self,
        *,
        typing: TypingHandlerBase,
        store: GenericWorkerStore,
        clock: Clock,
        server_name: str,
        send_edus: SendEdus,
        local_writes: ReplicationNotifier,
    ) -> None:
        super().__init__(
            store=store,
            clock=clock,
            server_name=server_name,
            send_edus=send_edus,
            local_writes=local_writes,
        )
        self._typing_handler = typing
        self._since = 0
        #: room -> our users typing there, as last sent.
        self._sent: dict[str, frozenset[str]] = {}
        self._renewals: Any = None

    def _begin(self) -> None:
        self._since = self._typing_handler.get_current_token()
        self._renewals = self._clock.looping_call(self._renew, TYPING_RENEW_SECONDS)

    def stop(self) -> None:
        super().stop()
        if self._renewals is not None and self._renewals.running:
            self._renewals.stop()

    def _renew(self) -> defer.Deferred[None]:
        """Say again who of ours is still typing: receivers time typing
        out by their own rule (ours: 30 s), and a user typing for longer
        moves nothing on the stream."""

        async def renew() -> None:
            for room_id, users in sorted(self._sent.items()):
                edus = typing_changes(room_id, frozenset(), users)
                for destination in await self._room_destinations(room_id):
                    self._send_edus(destination, edus)

        d = defer.ensureDeferred(renew())
        d.addErrback(lambda f: logger.warning("Renewing typing failed: %s", f.value))
        return d

    def _moved(self) -> bool:
        return self._typing_handler.get_current_token() != self._since

    async def _take_batch(self) -> bool:
        handler = self._typing_handler
        if not self._moved():
            return False
        changed, token = handler.get_typing_for_rooms(handler.rooms_seen(), self._since)
        self._since = token
        for room_id, users in sorted(changed.items()):
            now = frozenset(u for u in users if server_of(u) == self._server_name)
            edus = typing_changes(room_id, self._sent.get(room_id, frozenset()), now)
            if now:
                self._sent[room_id] = now
            else:
                self._sent.pop(room_id, None)
            if not edus:
                continue
            for destination in await self._room_destinations(room_id):
                self._send_edus(destination, edus)
        return False


class ReceiptsFeed(_Feed):
    """Our users' public receipts, as ``m.receipt`` EDUs (see the module
    docstring)."""

    _position = 0

    def _begin(self) -> None:
        self._position = self._store.get_receipts_position()

    def _moved(self) -> bool:
        return self._store.get_receipts_position() > self._position

    async def _take_batch(self) -> bool:
        upto = self._store.get_receipts_position()
        if upto <= self._position:
            return False
        rows = await self._store.get_public_receipts_between(self._position, upto, BATCH)
        full = len(rows) == BATCH
        by_destination: dict[str, list[tuple[str, str, str, str | None, dict[str, Any]]]] = {}
        # Each room's destinations read once per batch.
        destinations: dict[str, list[str]] = {}
        for _, room_id, user_id, event_id, thread_id, data in rows:
            if server_of(user_id) != self._server_name:
                continue
            if room_id not in destinations:
                destinations[room_id] = await self._room_destinations(room_id)
            for destination in destinations[room_id]:
                by_destination.setdefault(destination, []).append(
                    (room_id, user_id, event_id, thread_id, data)
                )
        for destination, receipts in sorted(by_destination.items()):
            self._send_edus(destination, [edu(RECEIPT, receipt_content(receipts))])
        self._position = rows[-1][0] if full else upto
        return full


class DeviceListsFeed(_Feed):
    """Our users' device and cross-signing key changes, as
    ``m.device_list_update`` and ``m.signing_key_update`` EDUs to the
    servers sharing a room with them (see the module docstring). Each
    device update names the user's previous change everyone is told of as
    its ``prev_id``, so a receiver that missed one fetches the list again."""

    _position = 0

    def _begin(self) -> None:
        self._position = self._store.get_device_lists_position()

    def _moved(self) -> bool:
        return self._store.get_device_lists_position() > self._position

    async def _take_batch(self) -> bool:
        upto = self._store.get_device_lists_position()
        if upto <= self._position:
            return False
        rows = await self._store.get_device_list_changes_between(self._position, upto, BATCH)
        full = len(rows) == BATCH
        keys_sent: set[tuple[str, int]] = set()
        for stream_id, user_id, device_id, is_key in rows:
            if server_of(user_id) != self._server_name:
                continue
            if is_key:
                if (user_id, stream_id) in keys_sent:
                    continue
                keys_sent.add((user_id, stream_id))
                update = await self._signing_key_update(user_id)
            else:
                update = await self._device_update(user_id, device_id, stream_id)
            if update is None:
                continue
            for destination in await self._servers_sharing_a_room(user_id):
                self._send_edus(destination, [update])
        self._position = rows[-1][0] if full else upto
        return full

    async def _device_update(
        self, user_id: str, device_id: str, stream_id: int
    ) -> dict[str, Any] | None:
        store = self._store
        content: dict[str, Any] = {
            "user_id": user_id,
            "device_id": device_id,
            "stream_id": stream_id,
        }
        prev = await store.get_device_list_stream_id(user_id, before=stream_id)
        content["prev_id"] = [prev] if prev else []
        device = await store.get_device(user_id, device_id)
        if device is None:
            content["deleted"] = True
            return edu(DEVICE_LIST_UPDATE, content)
        if device["display_name"] is not None:
            content["device_display_name"] = device["display_name"]
        keys = (await store.get_device_keys({user_id: [device_id]}, None)).get(user_id, {})
        if device_id in keys:
            content["keys"] = {k: v for k, v in keys[device_id].items() if k != "unsigned"}
        return edu(DEVICE_LIST_UPDATE, content)

    async def _signing_key_update(self, user_id: str) -> dict[str, Any] | None:
        keys = (await self._store.get_cross_signing_keys([user_id], None)).get(user_id, {})
        content: dict[str, Any] = {"user_id": user_id}
        for field, usage in (("master_key", "master"), ("self_signing_key", "self_signing")):
            if usage in keys:
                content[field] = keys[usage]
        return edu(SIGNING_KEY_UPDATE, content) if len(content) > 1 else None


def presence_item(state: UserPresenceState, now_ms: int) -> dict[str, Any]:
    """One entry of an ``m.presence`` EDU's ``push``."""
    item: dict[str, Any] = {
        "user_id": state.user_id,
        "presence": state.state,
        "currently_active": state.currently_active,
        "last_active_ago": max(0, now_ms - state.last_active_ts) if state.last_active_ts else 0,
    }
    if state.status_msg is not None:
        item["status_msg"] = state.status_msg
    return item


class PresenceFeed(_Feed):
    """Our users' presence changes, as ``m.presence`` EDUs (one per
    destination per batch) to the servers sharing a room with them."""

    _position = 0

    def _begin(self) -> None:
        self._position = self._store.get_presence_position()

    def _moved(self) -> bool:
        return self._store.get_presence_position() > self._position

    async def _take_batch(self) -> bool:
        upto = self._store.get_presence_position()
        if upto <= self._position:
            return False
        rows = await self._store.get_presence_between(self._position, upto, BATCH)
        full = len(rows) == BATCH
        now = self._clock.time_msec()
        by_destination: dict[str, list[dict[str, Any]]] = {}
        for _, state in rows:
            if server_of(state.user_id) != self._server_name:
                continue
            for destination in await self._servers_sharing_a_room(state.user_id):
                by_destination.setdefault(destination, []).append(presence_item(state, now))
        for destination, push in sorted(by_destination.items()):
            self._send_edus(destination, [edu(PRESENCE, {"push": push})])
        self._position = rows[-1][0] if full else upto
        return full
