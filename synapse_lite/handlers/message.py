"""Creating and sending events, routed to their room's events writer.

Any process builds the event a client asks for; the room's writer (stored with
the room, see ``storage/databases/main/room.py``) checks it against the room's
current state and persists it, one request per room at a time, so the check
and the write cannot interleave with another request's. A process that is not
the writer forwards over internal HTTP and answers once the event is in its
own view of the events stream.
"""

from __future__ import annotations

import logging
from collections import ChainMap
from collections.abc import (
    Awaitable,
    Callable,
    Mapping,
    MutableMapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, cast

import attr

from synapse_lite.api.content import check_events
from synapse_lite.api.errors import AuthError, Codes, NotFoundError, SynapseError
from synapse_lite.api.room_versions import RoomVersion
from synapse_lite.event_graph.authorisation import (
    EventAuthError,
    auth_events_state,
    authorise,
    select_auth_event_ids,
)
from synapse_lite.event_graph.graph import (
    MAX_PREV_EVENTS,
    depth_of_new_event,
    prev_events_for_new_event,
)
from synapse_lite.event_graph.pdu import Pdu, StateKey, create_event_id_of_room, room_id_of_create
from synapse_lite.events import Event, EventContent, EventSpec
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.event_auth import (
    RoomAuthState,
)
from synapse_lite.handlers.ratelimit import Ratelimiter
from synapse_lite.handlers.received_events import (
    received_event_content,
    received_pdu,
    stored_as_pdu,
)
from synapse_lite.handlers.restricted_joins import load_auth_state, restricted_join_authoriser
from synapse_lite.keyed_locks import KeyedLocks
from synapse_lite.replication.http.forward_extremities import (
    DELETE_FORWARD_EXTREMITIES,
    ExtremitiesDeleted,
    RoomExtremities,
)
from synapse_lite.replication.http.send_events import (
    SEND_EVENTS,
    EventsPersisted,
    EventsToPersist,
)
from synapse_lite.storage.caches import LruCache
from synapse_lite.storage.databases.main.events import (
    DuplicateTransactionError,
    RemoteJoinToPersist,
)
from synapse_lite.storage.databases.main.events_worker import redaction_txn_id

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.config.homeserver import HomeServerConfig
    from synapse_lite.handlers.push import PushActionsHandler
    from synapse_lite.notifier import Notifier
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: Client transaction ids remembered per process (a retry usually comes soon).
RECENT_TXNS = 10_000
#: Rooms whose forward extremities a writer remembers.
ROOM_EXTREMITIES = 10_000


class RoomMovedError(SynapseError):
    """This process is not (any more) the room's writer: the caller should
    look the writer up again."""

    def __init__(self, room_id: str) -> None:
        super().__init__(
            503,
            f"Room {room_id} is moving to another writer; try again",
            Codes.UNKNOWN,
            {"room_moved": True},
        )


def _revokes_guest_access(event: Event) -> bool:
    return (
        event.type == "m.room.guest_access"
        and event.state_key == ""
        and event.content.get("guest_access") != "can_join"
    )


def place_in_graph(
    room_id: str,
    room_version: RoomVersion,
    server_name: str,
    specs: Sequence[EventSpec],
    extremities: Mapping[str, int],
    state_ids: Mapping[StateKey, str],
) -> list[EventContent]:
    """The events a writer persists for ``specs`` (checked, in order), each
    placed in the room's graph: the first names the room's forward
    extremities (event id -> depth) as parents (the core's choice: the
    10 deepest), each later one the event before it; depth 1 + the deepest
    parent; auth events selected by the spec's rules from the state before
    it (``state_ids``: the room's current state, then each state event of
    the batch)."""
    added: dict[StateKey, str] = {}
    # A ChainMap writes only to its first map: the cached state is only read.
    state = ChainMap(added, cast("MutableMapping[StateKey, str]", state_ids))
    parents = prev_events_for_new_event(extremities)
    depth = depth_of_new_event(extremities[p] for p in parents)
    contents = []
    for spec in specs:
        auth_ids = select_auth_event_ids(room_version, spec_as_pdu(room_id, spec, depth), state)
        content = spec.to_persist(room_id, room_version, server_name, parents, depth, auth_ids)
        contents.append(content)
        if spec.state_key is not None:
            added[(spec.type, spec.state_key)] = content.event_id
        parents, depth = [content.event_id], depth_of_new_event([depth])
    return contents


def hashed_room_id(room_version: RoomVersion, server_name: str, create: EventSpec) -> str:
    """The id of a new version 12 room (``room_version.hashed_room_ids``)
    whose create event is ``create``: that event's id as the room's writer
    will make it in :func:`place_in_graph` (the room's first event: no
    parents, no auth events, the first depth; no ``room_id`` in it), with
    ``!`` for ``$``. Known before the writer is chosen, since the room id
    chooses it."""
    first = create.to_persist("", room_version, server_name, [], depth_of_new_event([]))
    return room_id_of_create(first.event_id)


def authorise_placed(
    room_version: RoomVersion, contents: Sequence[EventContent], stored: Mapping[str, Pdu]
) -> None:
    """Check each placed event by the core's rules (``authorise``) against
    its own ``auth_events``: the batch's earlier events, else ``stored``
    (event id -> Pdu). A local event's auth events are selected from the
    state before it, so this is also the check against that state (the
    rules read only the selected keys). Raises :class:`EventAuthError`."""
    known = dict(stored)
    for content in contents:
        pdu = content_as_pdu(content)
        missing = [a for a in content.auth_event_ids if a not in known]
        if missing:
            raise EventAuthError(f"auth events not found: {missing}")
        # Version 12: the create event is named by the room id, not an auth event.
        create = (
            known.get(create_event_id_of_room(content.room_id))
            if room_version.hashed_room_ids
            else None
        )
        state = auth_events_state(
            room_version, pdu, [known[a] for a in content.auth_event_ids], create
        )
        authorise(room_version, pdu, state)
        known[pdu.event_id] = pdu


def content_as_pdu(content: EventContent) -> Pdu:
    """An event about to be persisted as the core's rules read it."""
    return Pdu(
        event_id=content.event_id,
        room_id=content.room_id,
        type=content.type,
        state_key=content.state_key,
        sender=content.sender,
        content=content.content,
        prev_event_ids=content.prev_event_ids,
        auth_event_ids=content.auth_event_ids,
        depth=content.depth,
        origin_server_ts=content.origin_server_ts,
        redacts=content.redacts,
    )


def spec_as_pdu(room_id: str, spec: EventSpec, depth: int) -> Pdu:
    """What the core's rules read of an event about to be made (no id or
    edges yet)."""
    return Pdu(
        event_id="",
        room_id=room_id,
        type=spec.type,
        state_key=spec.state_key,
        sender=spec.sender,
        content=spec.content,
        prev_event_ids=(),
        auth_event_ids=(),
        depth=depth,
        origin_server_ts=spec.origin_server_ts,
        redacts=spec.redacts,
    )


class EventCreationHandler:
    """Sends events: builds them here, persists them on the room's writer."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        config: HomeServerConfig,
        instance_name: str,
        notifier: Notifier,
        calls: InternalCalls,
        event_writers: Callable[[], Sequence[str]],
        push: PushActionsHandler | None = None,
    ) -> None:
        """``event_writers()``: the events writers this process knows of now;
        ``push``: evaluates push rules on an events writer."""
        self.push = push
        self._store = store
        self._clock = clock
        self._me = instance_name
        self._notifier = notifier
        self._calls = calls
        self._event_writers = event_writers
        self._server_name = config.server_name
        self._locks = KeyedLocks()
        #: Each room's forward extremities (event id -> depth), on its
        #: writer: the next event names them as its parents (so a send
        #: reads no extra row), and its id is made with them.
        self._room_extremities: LruCache[dict[str, int]] = LruCache(ROOM_EXTREMITIES)
        limits = config.rate_limits
        self._ratelimiter = Ratelimiter(clock, limits.messages, limits.enabled)
        #: Transaction ids this process sent lately, so a client's retry here
        #: is answered without the database.
        self._recent_txns: LruCache[str] = LruCache(RECENT_TXNS)

    async def send_client_event(
        self,
        requester: Requester,
        room_id: str,
        event_type: str,
        content: dict[str, object],
        state_key: str | None = None,
        txn_id: str | None = None,
        redacts: str | None = None,
        origin_server_ts: int | None = None,
    ) -> str:
        """Send an event for a client; returns its id. ``origin_server_ts``:
        the time an application service gave (``?ts=``), else now. With ``txn_id`` the send
        is idempotent per (user, device, txn_id); a state event without one
        that repeats the current state's sender and content is not sent
        again (its id is returned). ``redacts``: the event an
        ``m.room.redaction`` redacts."""
        if state_key is not None:
            # PUT /state has no transaction id: a client retrying it would
            # send a second, identical state event; the same sender setting
            # the same content is answered with the event already there.
            unchanged = await self._unchanged_state(
                requester.user_id, room_id, event_type, state_key, content
            )
            if unchanged is not None:
                return unchanged
        txn_key = None
        if txn_id is not None:
            # /redact and /send are two endpoints: their ids never meet.
            stored = txn_id if redacts is None else redaction_txn_id(txn_id)
            txn_key = (requester.user_id, requester.device_id, stored)
            seen, recent = self._recent_txns.get(txn_key)
            if seen and recent is not None:
                return recent
        # No database lookup of the transaction id up front: the writer's
        # persist transaction records it under a unique key and answers a
        # repeat with the first event, so a first send costs one interaction.
        # Only a refused send looks the id up, so that a retry of a send that
        # succeeded still gets its event after a rate limit or a leave.
        try:
            if requester.is_rate_limited:
                self._ratelimiter.ratelimit(
                    requester.user_id, override=requester.ratelimit_override
                )
            spec = EventSpec(
                type=event_type,
                state_key=state_key,
                sender=requester.user_id,
                content=content,
                origin_server_ts=(
                    self._clock.time_msec() if origin_server_ts is None else origin_server_ts
                ),
                txn_key=txn_key,
                redacts=redacts,
            )
            [(event_id, _)] = await self.send_events(room_id, [spec])
        except SynapseError:
            if txn_key is None:
                raise
            existing = await self._store.get_event_id_for_txn(*txn_key)
            if existing is None:
                raise
            event_id = existing
        if txn_key is not None:
            self._recent_txns.set(txn_key, event_id)
        return event_id

    async def _unchanged_state(
        self, user_id: str, room_id: str, event_type: str, state_key: str, content: object
    ) -> str | None:
        """The current state event a state send would repeat (same sender,
        same content), if any: setting state twice is idempotent, so the
        second send answers the first event's id and persists nothing. Only
        for a user in the room; anyone else goes on to the usual refusal."""
        event_id = (await self._store.get_current_state_ids(room_id)).get((event_type, state_key))
        if event_id is None or user_id not in await self._store.get_users_in_room(room_id):
            return None
        event = await self._store.get_event(event_id)
        if event is None or event.sender != user_id or event.content != content:
            return None
        return event_id

    async def send_events(
        self, room_id: str, specs: list[EventSpec], new_room_writer: str | None = None
    ) -> list[tuple[str, int]]:
        """Persist events in a room on its writer; ``(event_id,
        stream_ordering)`` of each. ``new_room_writer``: the room is being
        created (by these events) on that writer. Every event is checked
        here first (canonical content, size): each handler sends through
        this."""
        check_events(room_id, specs)
        request = EventsToPersist(room_id, specs, create_room=new_room_writer is not None)
        for attempt in (1, 2):
            writer = new_room_writer or await self._store.get_event_writer_for_room(
                room_id, self._event_writers()
            )
            if writer is None:
                raise NotFoundError("Unknown room")
            try:
                answer = await self._calls.call(SEND_EVENTS, request, instance=writer)
            except SynapseError as e:
                if e.additional.get("room_moved") and attempt == 1 and not new_room_writer:
                    self._store.invalidate_event_writer(room_id)
                    continue
                raise
            return answer.events
        raise RoomMovedError(room_id)

    async def delete_forward_extremities(self, room_id: str) -> int:
        """Delete the room's forward extremities but its newest (the
        deepest, then the last persisted), on the room's writer; how many
        went. (The admin API's ``DELETE .../forward_extremities``.)"""
        for attempt in (1, 2):
            writer = await self._store.get_event_writer_for_room(room_id, self._event_writers())
            if writer is None:
                raise NotFoundError("Room not found")
            try:
                answer = await self._calls.call(
                    DELETE_FORWARD_EXTREMITIES, RoomExtremities(room_id), instance=writer
                )
            except SynapseError as e:
                if e.additional.get("room_moved") and attempt == 1:
                    self._store.invalidate_event_writer(room_id)
                    continue
                raise
            return answer.deleted
        raise RoomMovedError(room_id)

    async def delete_extremities_as_writer(self, request: RoomExtremities) -> ExtremitiesDeleted:
        """Serves :data:`DELETE_FORWARD_EXTREMITIES` (on the room's writer):
        under the room's lock, so no send is placing an event on them, and
        forgetting the extremities held here, so the next event names only
        the one left."""
        room_id = request.room_id
        async with self._locks.hold(room_id):
            writer = await self._store.get_event_writer_for_room(room_id, self._event_writers())
            if writer is None:
                raise NotFoundError("Room not found")
            if writer != self._me:
                raise RoomMovedError(room_id)
            self._room_extremities.pop(room_id)
            extremities = await self._store.get_forward_extremities(room_id)
            if len(extremities) <= 1:
                return ExtremitiesDeleted(0)
            events = await self._store.get_events(extremities)
            keep = max(
                extremities,
                key=lambda e: (
                    extremities[e],
                    events[e].stream_ordering if e in events else 0,
                    e,
                ),
            )
            deleted = await self._store.delete_forward_extremities_but(room_id, keep)
        logger.info("deleted %d forward extremities of %s, kept %s", deleted, room_id, keep)
        return ExtremitiesDeleted(deleted)

    async def persist_events(self, request: EventsToPersist) -> EventsPersisted:
        """Serves :data:`SEND_EVENTS` (on the room's writer)."""
        events = await self.persist_as_writer(
            request.room_id, request.specs, create_room=request.create_room
        )
        return EventsPersisted([(e.event_id, e.stream_ordering) for e in events])

    async def persist_as_writer(
        self, room_id: str, specs: list[EventSpec], create_room: bool = False
    ) -> list[Event]:
        """On the room's writer: check each event against the room's state (and
        the events before it in the batch) and persist them, holding the
        room's lock throughout."""
        async with self._locks.hold(room_id):
            if create_room:
                if await self._store.get_room(room_id) is not None:
                    raise SynapseError(400, "The room already exists", Codes.INVALID_PARAM)
                state = RoomAuthState(room_id)
                state_ids: Mapping[StateKey, str] = {}
                extremities: dict[str, int] = {}
            else:
                writer = await self._store.get_event_writer_for_room(room_id, self._event_writers())
                if writer is None:
                    raise NotFoundError("Unknown room")
                if writer != self._me:
                    raise RoomMovedError(room_id)
                state, state_ids = await self._load_auth_state(room_id, specs)
                state.guests = await self._guests_joining(specs)
                extremities = await self._forward_extremities(room_id)
            checked = []
            for spec in specs:
                if spec.membership == "join" and state.exists:
                    spec = await self._authorise_restricted_join(room_id, spec, state)
                state.check(spec)
                if spec.type == "m.room.redaction":
                    await self._check_redaction(room_id, spec, state)
                state.apply_spec(spec)
                checked.append(spec)
            contents = place_in_graph(
                room_id, state.version, self._server_name, checked, extremities, state_ids
            )
            await self._authorise_with_core(state.version, contents)
            # Evaluated for the room's members before the batch, with the
            # power levels as the batch leaves them.
            push_actions = (
                await self.push.actions_for(room_id, contents, state) if self.push else {}
            )
            childless = self._store.childless_events
            generation = childless.generation
            drops = self._store.event_cache_drops()
            try:
                events = await self._store.persist_events(contents, push_actions)
            except DuplicateTransactionError as e:
                # The same client transaction won a race: answer with its event.
                existing = await self._store.get_event(e.event_id)
                if existing is None:
                    raise
                return [existing]
            except Exception:
                # Whether it was persisted is unknown: read them again.
                self._room_extremities.pop(room_id)
                raise
            # Made here just now, their ids known to no one before: nothing
            # relates to them yet, so a /sync serving them reads no bundles
            # (unless a relation was persisted meanwhile, this batch's own).
            childless.found_childless((e.event_id for e in events), generation)
            # Nor has any a redaction yet, unless one came meanwhile.
            self._store.remember_made_unredacted(events, drops)
            if len(extremities) <= MAX_PREV_EVENTS:
                # A batch is a line from every extremity: its last event is
                # the room's one extremity now.
                self._room_extremities.set(room_id, {events[-1].event_id: events[-1].depth})
            else:
                # Some extremities were left out (the oldest): read them again.
                self._room_extremities.pop(room_id)
        targets = [e.state_key for e in events if e.type == "m.room.member" and e.state_key]
        self._notifier.notify(users=targets, rooms=[room_id])
        if not create_room and any(_revokes_guest_access(e) for e in events):
            await self._remove_guests(room_id)
        return events

    async def persist_received_event(
        self,
        pdu: Mapping[str, Any],
        outlier: bool = False,
        given_states: Sequence[Mapping[StateKey, str]] = (),
        from_inbound_queue: bool = False,
    ) -> Event:
        """On the room's writer: persist an event another server sent
        (``pdu``, server-server JSON, its format, hashes and signatures
        already checked by the caller) with its outcome: rejected,
        soft-failed or accepted by the spec's checks against its auth
        events, the state before it and the current state; ``outlier``:
        known without the state before it (its auth events checked only).
        ``given_states``: the states after those of its parents we do not
        have, as another server gave them (``handlers/state_gaps.py``):
        resolved with its other parents' into the state before it. An
        accepted event's push actions are stored with it, as a local one's.
        ``from_inbound_queue``: taken from the durable inbound queue, whose
        row goes in the persist transaction (or now, when the event was
        stored already). Holds the room's lock, like a local send. An event
        already stored is returned as it is. Only an accepted event wakes
        clients."""
        room_id = pdu.get("room_id")
        if not isinstance(room_id, str):
            raise SynapseError(400, "The event has no room_id", Codes.BAD_JSON)
        async with self._locks.hold(room_id):
            writer = await self._store.get_event_writer_for_room(room_id, self._event_writers())
            if writer is None:
                raise NotFoundError("Unknown room")
            if writer != self._me:
                raise RoomMovedError(room_id)
            version = await self._store.get_room_version(room_id)
            event = received_pdu(version, pdu)
            if event.room_id != room_id:
                raise SynapseError(400, "The event is of another room", Codes.BAD_JSON)
            stored = await self._store.get_event(event.event_id)
            if stored is not None:
                if from_inbound_queue:
                    await self._store.remove_inbound_pdu(event.event_id)
                return stored
            before = None
            if given_states:
                before = await self._store.get_state_ids_before_received(
                    room_id, event.prev_event_ids, given_states
                )
            content = await received_event_content(self._store, version, event, outlier, before)
            dequeued = [event.event_id] if from_inbound_queue else []
            # What it does for our members, as a local event (an accepted
            # event only: the others are shown to no one), against the
            # room's current power levels.
            push_actions = {}
            if self.push is not None and content.in_room:
                auth_state, _ = await load_auth_state(self._store, room_id, {event.sender})
                push_actions = await self.push.actions_for(room_id, [content], auth_state)
            try:
                [persisted] = await self._store.persist_events(
                    [content],
                    push_actions,
                    given_state_before={event.event_id: before} if before else None,
                    from_inbound_queue=dequeued,
                )
            finally:
                # The room's extremities may have changed in any way.
                self._room_extremities.pop(room_id)
        if persisted.served:
            targets = [persisted.state_key] if persisted.membership and persisted.state_key else []
            self._notifier.notify(users=targets, rooms=[room_id])
        return persisted

    async def persist_received_as_writer(
        self,
        content: EventContent,
        authorise: Callable[[Mapping[StateKey, str]], Awaitable[None]],
    ) -> Event:
        """On the room's writer: persist one event another server made,
        already placed in the graph (its parents, depth and auth events are
        its own and in its id), once ``authorise`` (given the room's current
        state ids) returned; it raises to refuse. The room's lock is held
        throughout, so no local send interleaves. An event already stored is
        answered as it is (a retried request). Its parents need not be the
        room's extremities now: the store resolves the state where the graph
        branches.

        For the join or leave of ``send_join``/``send_leave``, which the spec
        refuses outright when it breaks the rules; a PDU of a transaction is
        stored with its outcome (rejected, soft-failed, accepted) by
        :meth:`persist_received_event` instead."""
        room_id = content.room_id
        async with self._locks.hold(room_id):
            writer = await self._store.get_event_writer_for_room(room_id, self._event_writers())
            if writer is None:
                raise NotFoundError("Unknown room")
            if writer != self._me:
                raise RoomMovedError(room_id)
            existing = await self._store.get_event(content.event_id)
            if existing is not None:
                return existing
            await authorise(await self._store.get_current_state_ids(room_id))
            # Its parents were the extremities when it was made, maybe not
            # now: the next local send reads them again.
            self._room_extremities.pop(room_id)
            [event] = await self._store.persist_events([content], {})
        targets = [event.state_key] if event.type == "m.room.member" and event.state_key else []
        self._notifier.notify(users=targets, rooms=[room_id])
        return event

    async def persist_remote_membership_as_writer(
        self, join: RemoteJoinToPersist, outliers: list[EventContent], content: EventContent
    ) -> Event:
        """On the room's writer (or the one a room new here goes to): persist
        our user's join to another server's room, or leave from it, as the
        process that made it checked it (``handlers/federation_join.py``):
        ``outliers`` (those not stored yet) and ``content`` with
        ``join.state_before`` as the state before it."""

        async def persist() -> Event:
            have = await self._store.get_events([o.event_id for o in outliers])
            fresh = [o for o in outliers if o.event_id not in have]
            return await self._store.persist_remote_join(join, fresh, content)

        return await self._persist_membership_here(content, persist)

    async def persist_remote_invite_as_writer(
        self, content: EventContent, origin: str, pdu: dict[str, Any], version: str
    ) -> Event:
        """On the room's writer (or the one a room new here goes to): persist
        another server's invite of our user, checked and countersigned by the
        process that received it, as an outlier that is our user's
        membership (``EventsStore.persist_remote_invite``)."""

        async def persist() -> Event:
            return await self._store.persist_remote_invite(content, origin, pdu, version)

        return await self._persist_membership_here(content, persist)

    async def _persist_membership_here(
        self, content: EventContent, persist: Callable[[], Awaitable[Event]]
    ) -> Event:
        """Run ``persist`` (storing the membership event ``content``) under
        the room's lock, on its writer (:class:`RoomMovedError`
        elsewhere); an event already stored is answered as it is. Its
        member is woken."""
        room_id = content.room_id
        async with self._locks.hold(room_id):
            writer = await self._store.get_event_writer_for_room(room_id, self._event_writers())
            if writer is not None and writer != self._me:
                raise RoomMovedError(room_id)
            existing = await self._store.get_event(content.event_id)
            if existing is not None:
                return existing
            try:
                event = await persist()
            finally:
                # The room's extremities may have changed in any way.
                self._room_extremities.pop(room_id)
        self._notifier.notify(users=[content.state_key or ""], rooms=[room_id])
        return event

    async def _authorise_with_core(
        self, room_version: RoomVersion, contents: Sequence[EventContent]
    ) -> None:
        """The spec's rules (the pure core) over the placed events, after
        this server's own checks (which give clients their errors): what
        other servers will check of our events. A refusal is a 403; an
        event the core refuses is never persisted."""
        in_batch = {c.event_id for c in contents}
        wanted = {a for c in contents for a in c.auth_event_ids}
        if room_version.hashed_room_ids:
            wanted |= {create_event_id_of_room(c.room_id) for c in contents}
        outside = sorted(wanted - in_batch)
        stored = await self._store.get_events(outside) if outside else {}
        try:
            authorise_placed(
                room_version, contents, {i: stored_as_pdu(e) for i, e in stored.items()}
            )
        except EventAuthError as e:
            logger.warning("The room's rules refuse an event our checks allowed: %s", e)
            raise AuthError(403, f"The room's authorisation rules refuse this event: {e}") from e

    async def _guests_joining(self, specs: list[EventSpec]) -> frozenset[str]:
        """The guest accounts among those ``specs`` make join (a guest may
        join only where ``m.room.guest_access`` is ``can_join``)."""
        joining = {s.state_key for s in specs if s.membership == "join" and s.state_key}
        return await self._store.get_guests_among(sorted(joining))

    async def _remove_guests(self, room_id: str) -> None:
        """Guest access was revoked: the spec has the server make every guest
        in the room leave it (each guest's own leave, so no power is needed)."""
        now = self._clock.time_msec()
        specs = [
            EventSpec(
                type="m.room.member",
                state_key=guest,
                sender=guest,
                content={"membership": "leave"},
                origin_server_ts=now,
            )
            for guest in await self._store.get_guests_in_room(room_id)
        ]
        if specs:
            await self.persist_as_writer(room_id, specs)
            logger.info("Guest access revoked in %s: %d guests removed", room_id, len(specs))

    async def _forward_extremities(self, room_id: str) -> dict[str, int]:
        """The room's forward extremities and their depths, as this writer
        last persisted them (the room's lock is held, and only its writer
        adds events to a room), else from the database."""
        found, extremities = self._room_extremities.get(room_id)
        if found and extremities is not None:
            return extremities
        extremities = await self._store.get_forward_extremities(room_id)
        self._room_extremities.set(room_id, extremities)
        return extremities

    async def _authorise_restricted_join(
        self, room_id: str, spec: EventSpec, state: RoomAuthState
    ) -> EventSpec:
        """A join that only a restricted join rule can admit (the user is
        neither invited nor joined) is vouched for by this server, as the
        spec has the resident server do: a member who may invite is named
        in ``join_authorised_via_users_server`` (``restricted_join_authoriser``;
        the auth rules then check that member); otherwise 403. A name the
        client put there is never trusted."""
        content = dict(spec.content)
        content.pop("join_authorised_via_users_server", None)
        authoriser = await restricted_join_authoriser(
            self._store, self._server_name, room_id, spec.sender, state
        )
        if authoriser is not None:
            content["join_authorised_via_users_server"] = authoriser
        return spec if content == spec.content else attr.evolve(spec, content=content)

    async def _check_redaction(self, room_id: str, spec: EventSpec, state: RoomAuthState) -> None:
        """A redaction names an event of its room (404 for an unknown event,
        400 for one of another room); redacting
        someone else's event needs the room's ``redact`` power level."""
        if spec.redacts is None:
            raise SynapseError(400, "A redaction must name the event it redacts", Codes.BAD_JSON)
        target = await self._store.get_event(spec.redacts)
        if target is None:
            raise NotFoundError("Event not found")
        if target.room_id != room_id:
            raise SynapseError(400, "That event is in another room", Codes.INVALID_PARAM)
        if target.sender != spec.sender:
            needed = state.named_level("redact", 50)
            if state.user_level(spec.sender) < needed:
                raise AuthError(403, f"You need power level {needed} to redact others' events")

    async def _load_auth_state(
        self, room_id: str, specs: list[EventSpec]
    ) -> tuple[RoomAuthState, Mapping[StateKey, str]]:
        """What the rules need of the room's current state, and the ids of
        that state (its auth events are selected from them)."""
        users = {s.sender for s in specs} | {
            s.state_key for s in specs if s.type == "m.room.member" and s.state_key
        }
        return await load_auth_state(self._store, room_id, users)
