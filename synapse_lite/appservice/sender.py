"""Sending each application service the events that concern it, as
transactions (``PUT /_matrix/app/v1/transactions/{txnId}``), in stream order.

One loop per sending process serves the services it owns. For each
service, one transaction at a time:

1. read the events after the service's acknowledged position, up to the
   events stream's persisted-up-to position (below it no event can still
   appear, whichever writer persists it), at most :data:`BATCH`;
2. keep those that concern it (``interest.py``); none: the position moves
   past them and nothing is sent;
3. record the transaction (id: one more than the last acknowledged, its
   event ids, the position it completes) *before* sending it;
4. send it; acknowledged (2xx): the position and last id are stored and the
   next one follows at once. Otherwise it is sent again, the same id and
   events, after a pause doubling from :data:`FIRST_BACKOFF_SECONDS` to
   :data:`MAX_BACKOFF_SECONDS`, or at once when the service pings.

A restart finds a recorded transaction and sends exactly it again, so an
event is never lost, and never delivered twice to a service that (as the
spec requires) ignores a transaction id it has already processed. A slow or
failing service only delays itself: each service's sends run on their own.
Ephemeral data (typing, receipts, presence) of the services with
``receive_ephemeral`` is carried by the next transaction, best effort: it
is kept in memory, not across restarts (it is stale by then).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet import defer, task

from synapse_lite.appservice.api import track_until_done
from synapse_lite.appservice.interest import (
    event_concerns_service,
    is_local,
    user_concerns_service,
)
from synapse_lite.storage.databases.main.appservice import (
    AppServiceProgress,
    PendingTransaction,
)
from synapse_lite.streams.definition import ShardKey, StableHash

if TYPE_CHECKING:
    from synapse_lite.appservice.api import ApplicationServiceApi
    from synapse_lite.appservice.registration import ApplicationService
    from synapse_lite.clock import Clock
    from synapse_lite.events import Event
    from synapse_lite.handlers.typing import TypingHandlerBase
    from synapse_lite.replication.notifier import ReplicationNotifier
    from synapse_lite.storage.databases.main import GenericWorkerStore
    from synapse_lite.storage.databases.main.presence import UserPresenceState

logger = logging.getLogger(__name__)

POLL_SECONDS = 1.0
WAKE_GAP_SECONDS = 0.02
FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 300.0
#: Events read per look, and so the most a transaction carries.
BATCH = 100
#: Ephemeral items kept per service while it is unreachable.
MAX_EPHEMERAL = 1000

#: The transaction fields of the unstable extensions (the names the
#: reference homeserver and the bridges use; no stable names yet).
TO_DEVICE_FIELD = "de.sorunome.msc2409.to_device"
DEVICE_LISTS_FIELD = "org.matrix.msc3202.device_lists"
OTK_COUNTS_FIELD = "org.matrix.msc3202.device_one_time_keys_count"
FALLBACK_KEYS_FIELD = "org.matrix.msc3202.device_unused_fallback_key_types"


#: Which of ``appservice_instances`` sends to a service: the stable hash of
#: its id over the instances sorted by name (the writers directory's rule
#: type, as for events writers).
APP_SERVICE_SHARD = StableHash(ShardKey.SERVICE)


def sender_of(service_id: str, instances: Sequence[str]) -> str:
    """The instance sending to ``service_id`` (the same in every process
    and across restarts)."""
    return APP_SERVICE_SHARD.pick(service_id, instances)


class ApplicationServiceSender:
    """The transaction loop of one process, for the services it owns."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        reactor: Any,
        api: ApplicationServiceApi,
        services: Sequence[ApplicationService],
        server_name: str,
        local_writes: ReplicationNotifier | None = None,
        typing: TypingHandlerBase | None = None,
    ) -> None:
        """``services``: those this process sends to (with a ``url``);
        ``typing``: this process's view of who types where."""
        self._typing = typing
        self._typing_seen = typing.get_current_token() if typing is not None else 0
        self._store = store
        self._clock = clock
        self._reactor = reactor
        self._api = api
        self._services = [s for s in services if s.url is not None]
        self._server_name = server_name
        self._progress: dict[str, AppServiceProgress] = {}
        self._busy: set[str] = set()
        #: The sends under way (one per busy service).
        self._runs: set[defer.Deferred[None]] = set()
        #: Service id -> (next attempt time, current pause) while it fails.
        self._backoff: dict[str, tuple[float, float]] = {}
        self._ephemeral: dict[str, list[dict[str, Any]]] = {s.id: [] for s in self._services}
        #: To-device messages (MSC2409's unstable extension) waiting, and
        #: (MSC3202) users whose device lists changed, per service.
        self._to_device: dict[str, list[dict[str, Any]]] = {s.id: [] for s in self._services}
        self._devices_changed: dict[str, set[str]] = {s.id: set() for s in self._services}
        self._wants_ephemeral = any(s.receive_ephemeral or s.msc3202 for s in self._services)
        #: The receipts stream position up to which receipts were looked at.
        self._receipts_seen = store.get_receipts_position()
        #: Likewise for presence.
        self._presence_seen = store.get_presence_position()
        self._to_device_seen = store.get_to_device_stream_token()
        self._device_lists_seen = store.get_device_lists_position()
        self._collecting = False
        self._loop: task.LoopingCall | None = None
        self._wake_call: Any = None
        self._stopping = False
        #: Transactions acknowledged (tests, metrics).
        self.acknowledged = 0
        if local_writes is not None:
            local_writes.add_replication_callback(self.wake)

    @property
    def services(self) -> list[ApplicationService]:
        return list(self._services)

    def start(self) -> None:
        if not self._services:
            return
        self._loop = task.LoopingCall(self._tick)
        self._loop.clock = self._reactor
        self._loop.start(POLL_SECONDS, now=True).addErrback(
            lambda f: logger.error("Application service loop stopped: %s", f.getTraceback())
        )

    def stop(self) -> defer.Deferred[None]:
        """Stop looking, cancel the requests under way; fires when every
        service's send has ended (a transaction under way stays recorded,
        sent again at the next start)."""
        self._stopping = True
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self._wake_call is not None and self._wake_call.active():
            self._wake_call.cancel()
        self._wake_call = None
        self._api.stop()
        runs = list(self._runs)
        return defer.DeferredList(runs, consumeErrors=True).addCallback(lambda _: None)

    def wake(self) -> None:
        """New events may be stored: look soon. Cheap, safe to call spuriously."""
        if self._stopping or self._loop is None or self._wake_call is not None:
            return
        self._wake_call = self._reactor.callLater(WAKE_GAP_SECONDS, self._woken)

    def on_rows(self, writer: str, token: int, rows: Sequence[Any]) -> None:
        """Row hook of the events and receipts streams (rows written
        elsewhere)."""
        if rows:
            self.wake()

    async def _collect_ephemeral(self) -> None:
        """Queue, for the services with ``receive_ephemeral``, the receipts
        stored and the typing changes since the last look, of the rooms that
        concern them (private receipts are nobody else's business: never
        sent), and the presence changes of users that concern them."""
        edus: list[tuple[str, str, dict[str, Any]]] = []  # (room, user, EDU)
        position = self._store.get_receipts_position()
        if position > self._receipts_seen:
            rows = await self._store.get_receipts_between(self._receipts_seen, position, BATCH)
            self._receipts_seen = rows[-1][0] if len(rows) == BATCH else position
            for _, row in rows:
                if row.receipt_type != "m.read.private":
                    content = {row.event_id: {row.receipt_type: {row.user_id: row.data}}}
                    edus.append(
                        (row.room_id, row.user_id, {"type": "m.receipt", "content": content})
                    )
        if self._typing is not None:
            typing, self._typing_seen = self._typing.get_typing_for_rooms(
                self._typing.rooms_seen(), self._typing_seen
            )
            for room_id, user_ids in typing.items():
                typing_edu: dict[str, Any] = {"type": "m.typing", "content": {"user_ids": user_ids}}
                edus.append((room_id, user_ids[0] if user_ids else "", typing_edu))
        presence = await self._presence_changes()
        aliases: dict[str, list[tuple[str, int]]] = {}
        for service in self._services:
            if not service.receive_ephemeral:
                continue
            queue = self._ephemeral[service.id]
            for state, shared_rooms in presence:
                if user_concerns_service(
                    service,
                    self._server_name,
                    user_id=state.user_id,
                    members_of_shared_rooms=shared_rooms,
                ):
                    content = state.to_client_content(self._clock.time_msec())
                    queue.append(
                        {"type": "m.presence", "sender": state.user_id, "content": content}
                    )
            for room_id, user_id, edu in edus:
                concerns = event_concerns_service(
                    service,
                    self._server_name,
                    room_id=room_id,
                    sender=user_id,
                    event_type=edu["type"],
                    state_key=None,
                    joined_members=await self._store.get_users_in_room(room_id),
                    room_aliases=[a for a, _ in await self._aliases(service, room_id, aliases)],
                )
                if concerns:
                    queue.append({"room_id": room_id, **edu})
            del queue[:-MAX_EPHEMERAL]
        await self._collect_to_device()
        await self._collect_device_list_changes()

    async def _collect_to_device(self) -> None:
        """Queue the to-device messages of the services' local users (for
        those with ``receive_ephemeral``)."""
        position = self._store.get_to_device_stream_token()
        if position <= self._to_device_seen:
            return
        rows = await self._store.get_device_messages_between(self._to_device_seen, position, BATCH)
        self._to_device_seen = rows[-1][0] if len(rows) == BATCH else position
        for service in self._services:
            if not service.receive_ephemeral:
                continue
            queue = self._to_device[service.id]
            for _, user_id, device_id, message in rows:
                if is_local(user_id, self._server_name) and service.is_user_in_namespace(user_id):
                    queue.append({**message, "to_user_id": user_id, "to_device_id": device_id})
            del queue[:-MAX_EPHEMERAL]

    async def _collect_device_list_changes(self) -> None:
        """Note, for the services with ``org.matrix.msc3202``, the users
        whose device lists changed that are theirs or share a room with
        theirs."""
        if not any(s.msc3202 for s in self._services):
            return
        position = self._store.get_device_lists_position()
        if position <= self._device_lists_seen:
            return
        since, self._device_lists_seen = self._device_lists_seen, position
        for service in self._services:
            if not service.msc3202:
                continue
            changed = await self._store.get_users_whose_devices_changed(
                since, position, service.sender
            )
            for user_id in sorted(changed):
                rooms = await self._store.get_rooms_for_user(user_id)
                members = [await self._store.get_users_in_room(r) for r in sorted(rooms)]
                if user_concerns_service(
                    service, self._server_name, user_id=user_id, members_of_shared_rooms=members
                ):
                    self._devices_changed[service.id].add(user_id)

    async def _presence_changes(
        self,
    ) -> list[tuple[UserPresenceState, list[frozenset[str]]]]:
        """The presence changes since the last look, each with the members
        of the rooms its user is joined to (who may see it)."""
        position = self._store.get_presence_position()
        if position <= self._presence_seen:
            return []
        rows = await self._store.get_presence_between(self._presence_seen, position, BATCH)
        self._presence_seen = rows[-1][0] if len(rows) == BATCH else position
        changes = []
        for _, state in rows:
            rooms = await self._store.get_rooms_for_user(state.user_id)
            members = [await self._store.get_users_in_room(room_id) for room_id in sorted(rooms)]
            changes.append((state, members))
        return changes

    def retry_now(self, service_id: str) -> None:
        """The service answered a ping: send what is waiting without
        waiting out its pause."""
        self._backoff.pop(service_id, None)
        self.wake()

    def _woken(self) -> None:
        self._wake_call = None
        self._tick()

    def _tick(self) -> defer.Deferred[None]:
        d = defer.ensureDeferred(self._tick_async())
        d.addErrback(lambda f: logger.warning("Application service poll failed: %s", f.value))
        return d

    async def _tick_async(self) -> None:
        if self._wants_ephemeral and not self._collecting:
            self._collecting = True
            try:
                await self._collect_ephemeral()
            finally:
                self._collecting = False
        now = self._clock.time()
        for service in self._services:
            retry_at, _ = self._backoff.get(service.id, (0.0, 0.0))
            if service.id in self._busy or retry_at > now:
                continue
            self._busy.add(service.id)
            run = defer.ensureDeferred(self._run(service))
            track_until_done(self._runs, run)

    async def _run(self, service: ApplicationService) -> None:
        try:
            while not self._stopping and await self._send_next(service):
                pass
        except Exception:
            logger.exception("Sending to application service %r failed", service.id)
            self._back_off(service.id)
        finally:
            self._busy.discard(service.id)

    async def _send_next(self, service: ApplicationService) -> bool:
        """Send the service's next transaction, if there is one: True if it
        was acknowledged or skipped (there may be more)."""
        progress = self._progress.get(service.id)
        if progress is None:
            progress = await self._store.get_app_service_progress(
                service.id, self._store.get_room_max_stream_ordering()
            )
            self._progress[service.id] = progress
        pending = progress.pending
        if pending is None:
            pending = await self._next_transaction(service, progress)
            if pending is None:
                return False
        events = await self._store.get_events(list(pending.event_ids))
        formatted = [
            events[event_id].to_client_dict(self._clock.time_msec())
            for event_id in pending.event_ids
            if event_id in events
        ]
        ephemeral = None
        extensions: dict[str, Any] = {}
        to_device = list(self._to_device[service.id])
        devices_changed = set(self._devices_changed[service.id])
        if service.receive_ephemeral:
            ephemeral = list(self._ephemeral[service.id])
            extensions[TO_DEVICE_FIELD] = to_device
        if service.msc3202:
            extensions.update(
                await self._msc3202_fields(service, formatted, to_device, devices_changed)
            )
        acknowledged = await self._api.push_transaction(
            service, pending.txn_id, formatted, ephemeral, extensions
        )
        if self._stopping:
            return False  # recorded as pending: sent again after the restart
        if not acknowledged:
            self._back_off(service.id)
            return False
        if ephemeral:
            del self._ephemeral[service.id][: len(ephemeral)]
        del self._to_device[service.id][: len(to_device)]
        self._devices_changed[service.id] -= devices_changed
        await self._store.set_app_service_position(service.id, pending.upto, pending.txn_id)
        self._progress[service.id] = AppServiceProgress(pending.upto, pending.txn_id)
        self._backoff.pop(service.id, None)
        self.acknowledged += 1
        return True

    async def _next_transaction(
        self, service: ApplicationService, progress: AppServiceProgress
    ) -> PendingTransaction | None:
        """The next transaction, recorded; None when nothing waits (the
        position is moved past events that do not concern the service)."""
        upto = self._store.get_room_max_stream_ordering()
        has_ephemeral = bool(
            self._ephemeral.get(service.id)
            or self._to_device.get(service.id)
            or self._devices_changed.get(service.id)
        )
        if upto <= progress.position and not has_ephemeral:
            return None
        rows = await self._store.get_stream_events_between(progress.position, upto, BATCH)
        if len(rows) == BATCH:
            upto = rows[-1].stream_ordering
        aliases: dict[str, list[tuple[str, int]]] = {}
        concerning = [e.event_id for e in rows if await self._concerns(service, e, aliases)]
        if not concerning and not has_ephemeral:
            if upto > progress.position:
                await self._store.set_app_service_position(service.id, upto, progress.last_txn_id)
                self._progress[service.id] = AppServiceProgress(upto, progress.last_txn_id)
            return None
        pending = PendingTransaction(
            progress.last_txn_id + 1, tuple(concerning), max(upto, progress.position)
        )
        await self._store.set_app_service_pending(service.id, pending)
        self._progress[service.id] = AppServiceProgress(
            progress.position, progress.last_txn_id, pending
        )
        return pending

    async def _msc3202_fields(
        self,
        service: ApplicationService,
        events: list[dict[str, Any]],
        to_device: list[dict[str, Any]],
        devices_changed: set[str],
    ) -> dict[str, Any]:
        """MSC3202's fields: the device lists changed, and the one-time key
        counts and unused fallback key types of every device of the
        service's users appearing in the transaction (senders of its events,
        receivers of its to-device messages)."""
        appearing = {e.get("sender") for e in events} | {m["to_user_id"] for m in to_device}
        counts: dict[str, dict[str, dict[str, int]]] = {}
        fallback: dict[str, dict[str, list[str]]] = {}
        for user_id in sorted(u for u in appearing if isinstance(u, str)):
            if not (is_local(user_id, self._server_name) and service.is_user_in_namespace(user_id)):
                continue
            for device_id in await self._store.get_device_ids(user_id):
                counts.setdefault(user_id, {})[device_id] = await self._store.count_one_time_keys(
                    user_id, device_id
                )
                fallback.setdefault(user_id, {})[
                    device_id
                ] = await self._store.get_unused_fallback_key_types(user_id, device_id)
        return {
            DEVICE_LISTS_FIELD: {"changed": sorted(devices_changed), "left": []},
            OTK_COUNTS_FIELD: counts,
            FALLBACK_KEYS_FIELD: fallback,
        }

    async def _concerns(
        self,
        service: ApplicationService,
        event: Event,
        aliases: dict[str, list[tuple[str, int]]],
    ) -> bool:
        """``aliases``: rooms' aliases read so far in this batch."""
        return event_concerns_service(
            service,
            self._server_name,
            room_id=event.room_id,
            sender=event.sender,
            event_type=event.type,
            state_key=event.state_key,
            joined_members=await self._store.get_users_in_room(event.room_id),
            # The aliases the room had when the event was written: one
            # made just after must not bring earlier events along.
            room_aliases=[
                alias
                for alias, made_at in await self._aliases(service, event.room_id, aliases)
                if made_at < event.stream_ordering
            ],
        )

    async def _aliases(
        self, service: ApplicationService, room_id: str, known: dict[str, list[tuple[str, int]]]
    ) -> list[tuple[str, int]]:
        """The room's aliases and the positions they were made at if the
        service has alias namespaces (read once per batch: ``known``), else
        none (they cannot matter)."""
        if not service.aliases:
            return []
        if room_id not in known:
            known[room_id] = await self._store.get_alias_positions_for_room(room_id)
        return known[room_id]

    def _back_off(self, service_id: str) -> None:
        _, pause = self._backoff.get(service_id, (0.0, 0.0))
        pause = min(MAX_BACKOFF_SECONDS, pause * 2 if pause else FIRST_BACKOFF_SECONDS)
        # The poll after the pause sends it again.
        self._backoff[service_id] = (self._clock.time() + pause, pause)
