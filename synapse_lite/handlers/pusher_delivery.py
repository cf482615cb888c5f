"""Delivering notifications to push gateways, on the pusher instances.

Each pusher is owned by exactly one of ``pusher_instances`` (a stable hash of
the pusher). Its owner delivers the pusher's notifications one at a time, in
stream order, with the Push Gateway API (``POST /_matrix/push/v1/notify``),
and records after each delivery how far it has got (``pushers.
last_stream_ordering``), so a restarted instance resumes there. A gateway
that fails (unreachable, slower than :data:`GATEWAY_TIMEOUT_SECONDS`, an
error status) is retried after an exponentially growing pause, the same
notification first; a gateway rejecting the pushkey gets the pusher removed
(on the pushers writer). Sends never wait for any of this: delivery reads
what the events writers stored, on its own loop, woken (:meth:`PusherDelivery.
wake`) when events are persisted here or arrive over replication, and polling
every :data:`POLL_SECONDS` besides (new pushers, retries after a pause).
A user's read receipt sends their pushers' gateways a notification with only
the new ``counts`` (the spec's badge update), once, not retried.

Delivery is at least once: the position is recorded after the gateway's
answer, so an instance killed in between pushes that one notification again
on restart (the Push Gateway API has no idempotency key; the notification's
``event_id`` is what a gateway de-duplicates on). See docs/push.md.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import treq
from twisted.internet import defer, task
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IPolicyForHTTPS

from synapse_lite.push.pushers import PusherSet
from synapse_lite.replication.http.writes import SET_PUSHER
from synapse_lite.streams.definition import ShardKey, StableHash

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.events import Event
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.replication.notifier import ReplicationNotifier
    from synapse_lite.storage.databases.main import GenericWorkerStore
    from synapse_lite.storage.databases.main.pushers import Pusher

logger = logging.getLogger(__name__)

#: How often an instance looks for new notifications and pushers without
#: being woken.
POLL_SECONDS = 1.0
#: Wake-ups closer together than this are merged into one look (a busy
#: events writer pokes many times a second).
WAKE_GAP_SECONDS = 0.05
GATEWAY_TIMEOUT_SECONDS = 10.0
FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 600.0
#: Notifications read per pusher per turn.
BATCH = 20


_JSON_HEADERS: dict[bytes | str, list[bytes | str]] = {"Content-Type": ["application/json"]}


#: Which of ``pusher_instances`` delivers a pusher's notifications: the
#: stable hash of the pusher's key, over the instances in config order.
PUSHER_SHARD = StableHash(ShardKey.PUSHER, sorted_instances=False)


def owner_of(pusher_key: tuple[str, str, str], instances: Sequence[str]) -> str:
    """The pusher instance delivering for a pusher (stable across restarts
    and processes)."""
    return PUSHER_SHARD.pick("\0".join(pusher_key), instances)


class PusherDelivery:
    """The delivery loop of one pusher instance (a ``Loop`` of its process)."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        calls: InternalCalls,
        instance_name: str,
        instances: Sequence[str],
        reactor: Any,
        tls_policy: IPolicyForHTTPS,
        local_writes: ReplicationNotifier | None = None,
    ) -> None:
        """``local_writes``: poked when this process's ids finish, where it
        writes events or receipts (new notifications, badge updates); rows
        written elsewhere wake it through :meth:`on_rows`."""
        self._store = store
        self._clock = clock
        self._calls = calls
        self._me = instance_name
        self._instances = list(instances)
        self._reactor = reactor
        self._loop: task.LoopingCall | None = None
        self._stopping = False
        #: Pushers with a delivery running now.
        self._busy: set[tuple[str, str, str]] = set()
        #: Pusher -> (next attempt time, current pause) while its gateway fails.
        self._backoff: dict[tuple[str, str, str], tuple[float, float]] = {}
        #: Pusher -> how far this process has delivered: a list of pushers
        #: read before a delivery finished carries an older position.
        self._positions: dict[tuple[str, str, str], int] = {}
        #: Deliveries made (for tests and metrics).
        self.delivered = 0
        #: Wake-ups so far: a delivery that saw this change while it ran
        #: looks again when it ends (its rows were read before the new ones).
        self._wakes = 0
        self._wake_call: Any = None
        self._last_look = 0.0
        #: The pushers stream position at which there was no pusher at all.
        self._none_at: int | None = None
        # One connection per delivery: nothing stays open between polls.
        self._pool = HTTPConnectionPool(reactor, persistent=False)
        #: Gateways' certificates are checked with ``tls_policy`` (the
        #: system's CAs and ``outbound_requests.extra_ca_paths``).
        self._agent = Agent(reactor, contextFactory=tls_policy, pool=self._pool)
        #: The receipts stream position up to which read receipts have been
        #: looked at for badge updates (older ones are not this process's
        #: business: it was not running, or the pushers did not exist).
        self._receipts_seen = store.get_receipts_position()
        if local_writes is not None:
            local_writes.add_replication_callback(self.wake)

    def start(self) -> None:
        self._loop = task.LoopingCall(self._tick)
        self._loop.clock = self._reactor
        self._loop.start(POLL_SECONDS, now=False).addErrback(
            lambda f: logger.error("Pusher loop stopped: %s", f.getTraceback())
        )

    def stop(self) -> None:
        self._stopping = True  # deliveries under way end after their current one
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self._wake_call is not None and self._wake_call.active():
            self._wake_call.cancel()
        self._wake_call = None

    def wake(self) -> None:
        """New events may be stored: look for notifications soon, instead
        of at the next poll. Cheap and safe to call spuriously."""
        self._wakes += 1
        if self._stopping or self._loop is None or self._wake_call is not None:
            return
        delay = max(0.0, self._last_look + WAKE_GAP_SECONDS - self._reactor.seconds())
        self._wake_call = self._reactor.callLater(delay, self._woken)

    def on_rows(self, writer: str, token: int, rows: Sequence[Any]) -> None:
        """Row hook of the events and receipts streams (rows written by
        another process)."""
        if rows:
            self.wake()

    def _woken(self) -> None:
        self._wake_call = None
        self._tick()

    async def _tick_async(self) -> None:
        self._last_look = self._reactor.seconds()
        now = self._clock.time()
        readers = await self._readers_since_last_look()
        # The position before the read: a pusher added meanwhile moves it.
        pushers_at = self._store.get_pushers_position()
        if pushers_at == self._none_at:
            # No pusher at the last look, and none added since: the usual
            # server with no push gateway reads nothing per event here.
            return
        pushers = await self._store.get_all_pushers()
        self._none_at = None if pushers else pushers_at
        for pusher in pushers:
            key = pusher.key
            if owner_of(key, self._instances) != self._me:
                continue
            if pusher.user_id in readers:
                defer.ensureDeferred(self._send_badge(pusher)).addErrback(
                    lambda f: logger.warning("Badge update failed: %s", f.value)
                )
            if key in self._busy:
                continue
            retry_at, _ = self._backoff.get(key, (0.0, 0.0))
            if retry_at > now:
                continue
            self._busy.add(key)
            defer.ensureDeferred(self._deliver_then_free(pusher))

    async def _readers_since_last_look(self) -> set[str]:
        """Users whose read receipts moved since the last look."""
        position = self._store.get_receipts_position()
        if position <= self._receipts_seen:
            return set()
        since, self._receipts_seen = self._receipts_seen, position
        return await self._store.get_readers_between(since, position)

    def _tick(self) -> defer.Deferred[None]:
        d = defer.ensureDeferred(self._tick_async())
        d.addErrback(lambda f: logger.warning("Pusher poll failed: %s", f.value))
        return d

    async def _deliver_then_free(self, pusher: Pusher) -> None:
        wakes = self._wakes
        more = False
        try:
            more = await self._deliver(pusher)
        except Exception:
            logger.exception("Delivery for a pusher failed")
            self._back_off(pusher.key)
        finally:
            self._busy.discard(pusher.key)
        if more or (self._wakes != wakes and pusher.key not in self._backoff):
            self.wake()

    async def _deliver(self, pusher: Pusher) -> bool:
        """Deliver what is waiting for one pusher, in order, stopping at the
        first failure (retried later from the same notification). True if a
        whole batch went out (there may be more waiting)."""
        position = max(pusher.last_stream_ordering, self._positions.get(pusher.key, 0))
        rows = await self._store.get_notifications(
            pusher.user_id, None, BATCH, False, after=position
        )
        for event_id, room_id, ordering, actions, highlight, _ in rows:
            if self._stopping:
                return False
            outcome = await self._send(pusher, event_id, room_id, actions, highlight)
            if outcome == "failed":
                self._back_off(pusher.key)
                return False
            self._backoff.pop(pusher.key, None)
            self._positions[pusher.key] = ordering
            await self._store.set_pusher_position(pusher, ordering)
            self.delivered += 1
            if outcome == "rejected":
                logger.info("Gateway rejected pushkey of %s: removing the pusher", pusher.key)
                await self._calls.call(
                    SET_PUSHER, PusherSet(pusher.user_id, pusher.app_id, pusher.pushkey, None)
                )
                return False
        return len(rows) >= BATCH

    def _back_off(self, key: tuple[str, str, str]) -> None:
        _, pause = self._backoff.get(key, (0.0, 0.0))
        pause = min(MAX_BACKOFF_SECONDS, pause * 2 if pause else FIRST_BACKOFF_SECONDS)
        self._backoff[key] = (self._clock.time() + pause, pause)

    async def _send(
        self,
        pusher: Pusher,
        event_id: str,
        room_id: str,
        actions: list[Any],
        highlight: bool,
    ) -> str:
        """``"delivered"``, ``"rejected"`` (the gateway refused the pushkey) or
        ``"failed"`` (try again later)."""
        tweaks = {
            a["set_tweak"]: a.get("value", True)
            for a in actions
            if isinstance(a, dict) and "set_tweak" in a
        }
        notification: dict[str, Any] = {
            "event_id": event_id,
            "room_id": room_id,
            "prio": "high" if highlight else "low",
            "counts": await self._counts(pusher.user_id),
            "devices": [_device(pusher, tweaks)],
        }
        if pusher.data.get("format") != "event_id_only":
            event = await self._store.get_event(event_id)
            if event is not None:
                notification.update(await self._describe(pusher.user_id, event))
        return await self._post(pusher, notification)

    async def _send_badge(self, pusher: Pusher) -> None:
        """Tell the gateway the user's new unread count (after a read
        receipt): once, never retried; a later notification carries it too."""
        notification = {
            "prio": "low",
            "counts": await self._counts(pusher.user_id),
            "devices": [_device(pusher, {})],
        }
        await self._post(pusher, notification)

    async def _counts(self, user_id: str) -> dict[str, int]:
        """The spec's ``counts``: the user's unread notifications over every
        room they are joined to (the count /sync gives per room)."""
        rooms = await self._store.get_rooms_for_user(user_id)
        counts = await self._store.get_unread_counts(
            user_id, sorted(rooms), self._store.get_room_max_stream_ordering()
        )
        return {"unread": sum(notifications for notifications, _ in counts.values())}

    async def _describe(self, user_id: str, event: Event) -> dict[str, Any]:
        """What the full format adds about the event and its room: type,
        sender and content; the sender's display name, the room's name
        and canonical alias as they are now; for a membership event whether
        it is about the user. ``id`` repeats ``event_id`` (the field's name
        in the Push Gateway API before r0; the reference server and SyTest
        still use it)."""
        fields: dict[str, Any] = {
            "id": event.event_id,
            "type": event.type,
            "sender": event.sender,
            "content": event.content,
        }
        state = await self._store.get_current_state_ids(event.room_id)
        wanted = {
            "sender_display_name": (("m.room.member", event.sender), "displayname"),
            "room_name": (("m.room.name", ""), "name"),
            "room_alias": (("m.room.canonical_alias", ""), "alias"),
        }
        found = await self._store.get_events(
            [state[key] for key, _ in wanted.values() if key in state]
        )
        for field, (key, content_key) in wanted.items():
            state_event = found.get(state.get(key, ""))
            value = state_event.content.get(content_key) if state_event else None
            if isinstance(value, str) and value:
                fields[field] = value
        # A room without a name is named by its alias, as clients show it.
        if "room_name" not in fields and "room_alias" in fields:
            fields["room_name"] = fields["room_alias"]
        if event.type == "m.room.member":
            fields["user_is_target"] = event.state_key == user_id
            fields["membership"] = event.content.get("membership")
        return fields

    async def _post(self, pusher: Pusher, notification: dict[str, Any]) -> str:
        """POST one notification to the pusher's gateway: ``"delivered"``,
        ``"rejected"`` (the gateway refused the pushkey) or ``"failed"``."""
        try:
            response = await treq.post(
                pusher.data["url"],
                json.dumps({"notification": notification}).encode("utf-8"),
                headers=_JSON_HEADERS,
                timeout=GATEWAY_TIMEOUT_SECONDS,
                reactor=self._reactor,
                agent=self._agent,
            )
            body = await treq.content(response)
        except Exception as e:  # a gateway down or slow: retried, never fatal
            logger.info("Push gateway %s failed: %s", pusher.data.get("url"), e)
            return "failed"
        if not 200 <= response.code < 300:
            logger.info("Push gateway %s answered %d", pusher.data.get("url"), response.code)
            return "failed"
        try:
            rejected = json.loads(body).get("rejected", [])
        except (ValueError, AttributeError):
            # Accepted, with an answer we cannot read: counted as delivered.
            return "delivered"
        if isinstance(rejected, list) and pusher.pushkey in rejected:
            return "rejected"
        return "delivered"


def _device(pusher: Pusher, tweaks: dict[str, Any]) -> dict[str, Any]:
    """The pusher as the Push Gateway API's ``devices`` entry (its data
    without ``url``, which is for us)."""
    return {
        "app_id": pusher.app_id,
        "pushkey": pusher.pushkey,
        "pushkey_ts": pusher.pushkey_ts // 1000,
        "data": {k: v for k, v in pusher.data.items() if k != "url"},
        "tweaks": tweaks,
    }
