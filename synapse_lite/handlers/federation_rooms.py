"""Our rooms served to other servers (docs/federation.md, "Rooms: serving").

* Reading: ``/event``, ``/state``, ``/state_ids``, ``/event_auth``,
  ``/backfill`` and ``/get_missing_events`` answer a server that has a user
  joined to the room now, or anyone when the room is ``world_readable``
  (404 for a room or event we do not have, 403 otherwise). Events are served
  in the server-server form: ours as ``event_format: federation`` renders
  them (hashed and signed with our key), other servers' as they sent them.
* Joining: ``make_join`` gives a remote user a join event to sign, placed
  on the room's forward extremities; ``send_join`` checks the signed event
  (its id, canonical JSON, content hash, the signatures of the servers that
  must sign it through the keyring, that it is a join of a user of the
  calling server in this room) here, then the room's writer checks it by the
  spec's rules against its own auth events and the room's current state and
  persists it (:class:`ReceivedEventsWriter`, reached through the internal
  call path as client sends are). Nothing is stored for a refused join.

Every walk over the graph (backfill, missing events) is bounded by a limit
the caller cannot raise past ours.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import AuthError, Codes, NotFoundError, SynapseError
from synapse_lite.api.identifiers import is_valid_user_id, server_of
from synapse_lite.api.room_versions import EventIdFormat, RoomVersion
from synapse_lite.event_graph.authorisation import (
    CREATE,
    EventAuthError,
    auth_events_state,
    auth_types_for_event,
    authorise,
    select_auth_event_ids,
)
from synapse_lite.event_graph.graph import depth_of_new_event, prev_events_for_new_event
from synapse_lite.event_graph.hashing import (
    add_event_signature,
    content_hash_matches,
    event_id_of,
    servers_that_must_sign,
)
from synapse_lite.event_graph.pdu import Pdu, PduFormatError, StateKey
from synapse_lite.events import event_canonical_json, pruned_event
from synapse_lite.federation.crypto import CanonicalJsonError, SigningKey
from synapse_lite.federation.pdu_checks import (
    MAX_AUTH_EVENTS,
    MAX_PDU_BYTES,
    MAX_PREV_EVENTS,
    PduRefused,
    check_signed_by,
)
from synapse_lite.federation.sender.room_events import PduRenderer
from synapse_lite.federation.server_acl import room_allows_server
from synapse_lite.handlers.received_events import pdu_as_content, stored_as_pdu
from synapse_lite.handlers.restricted_joins import (
    UnableToAuthoriseJoin,
    UnableToGrantJoin,
    load_auth_state,
    restricted_join_authoriser,
)
from synapse_lite.handlers.sync_sections.rooms import stripped_state
from synapse_lite.handlers.visibility import load_room_visibility
from synapse_lite.replication.http.federation_rooms import PERSIST_RECEIVED_EVENT, ReceivedEvent
from synapse_lite.replication.http.send_events import EventsPersisted

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.federation.keyring import Keyring
    from synapse_lite.handlers.client_events import ClientEventFormatter
    from synapse_lite.handlers.message import EventCreationHandler
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: Most events one ``/backfill`` answers (a larger ``limit`` is cut to it).
MAX_BACKFILL = 100
#: Most events one ``/get_missing_events`` answers (the spec's default is 10).
MAX_MISSING_EVENTS = 20
#: Most event ids ``/backfill``'s ``v`` or a ``get_missing_events`` list may name.
MAX_START_EVENTS = 50
#: The users of one server whose views decide what it sees (the first by id).
MAX_VIEWING_USERS = 100
INCOMPATIBLE_ROOM_VERSION = "M_INCOMPATIBLE_ROOM_VERSION"
UNABLE_TO_AUTHORISE_JOIN = "M_UNABLE_TO_AUTHORISE_JOIN"
UNABLE_TO_GRANT_JOIN = "M_UNABLE_TO_GRANT_JOIN"


def _bad(msg: str, errcode: str = Codes.BAD_JSON) -> SynapseError:
    return SynapseError(400, msg, errcode)


def _event_id_list(value: Any, key: str) -> list[str]:
    if (
        not isinstance(value, list)
        or not all(isinstance(v, str) for v in value)
        or len(value) > MAX_START_EVENTS
    ):
        raise _bad(f"'{key}' must be a list of at most {MAX_START_EVENTS} event ids")
    return list(dict.fromkeys(value))


def _limit(value: Any, default: int, cap: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad("'limit' must be a non-negative integer", Codes.INVALID_PARAM)
    return min(value, cap)


def received_content(room_version: RoomVersion, pdu: Mapping[str, Any], event_id: str) -> Pdu:
    """The graph's view of a received event (:class:`PduFormatError` for a
    shape its version does not allow)."""
    return Pdu.from_json(room_version, pdu, event_id)


async def check_rules(
    store: GenericWorkerStore,
    version: RoomVersion,
    event: Pdu,
    state_ids: Mapping[StateKey, str],
    auth_ids: Sequence[str],
) -> None:
    """The spec's rules for ``event`` against its own auth events
    ``auth_ids`` (stored, of its room) and against the room's current state
    ``state_ids``; :class:`EventAuthError` when either refuses it. A refusal
    by the current state is final here (not a soft failure): the callers are
    a server asking us to accept its event now, and we store nothing."""
    wanted = set(auth_ids)
    keys = auth_types_for_event(version, event) | {CREATE}
    current = {key: state_ids[key] for key in keys if key in state_ids}
    loaded = await store.get_events(sorted(wanted | set(current.values())))
    missing = sorted(wanted - loaded.keys())
    if missing:
        raise EventAuthError(f"auth events unknown here: {missing}")
    create_id = state_ids.get(CREATE)
    create = loaded.get(create_id) if create_id else None
    own = auth_events_state(
        version,
        event,
        [stored_as_pdu(loaded[a]) for a in auth_ids],
        create=stored_as_pdu(create) if create else None,
    )
    authorise(version, event, own)
    authorise(
        version, event, {k: stored_as_pdu(loaded[i]) for k, i in current.items() if i in loaded}
    )


async def membership_template(
    store: GenericWorkerStore,
    version: RoomVersion,
    room_id: str,
    sender: str,
    target: str,
    content: dict[str, Any],
    now_ms: int,
) -> dict[str, Any]:
    """A membership event of ``target`` by ``sender`` placed as a local
    event would be (parents: the room's forward extremities, the 10
    deepest; depth one more than the deepest; ``auth_events`` the spec's
    selection from the current state), unsigned and without ``origin``;
    403 when the room's rules refuse it now (the core's ``authorise``)."""
    state_ids = await store.get_current_state_ids(room_id)
    extremities = await store.get_forward_extremities(room_id)
    prevs = prev_events_for_new_event(extremities)
    template: dict[str, Any] = {
        "room_id": room_id,
        "type": "m.room.member",
        "state_key": target,
        "sender": sender,
        "content": content,
        "origin_server_ts": now_ms,
        "depth": depth_of_new_event(extremities[p] for p in prevs),
    }
    probe = Pdu.from_json(version, {**template, "prev_events": [], "auth_events": []}, "")
    auth_ids = select_auth_event_ids(version, probe, state_ids)
    try:
        await check_rules(store, version, probe, state_ids, auth_ids)
    except EventAuthError as e:
        raise AuthError(403, f"The room's rules refuse this {probe.membership}: {e.reason}") from e
    if version.event_ids is EventIdFormat.SERVER_SUFFIXED:
        template["prev_events"] = [[e, {}] for e in prevs]
        template["auth_events"] = [[e, {}] for e in auth_ids]
    else:
        template["prev_events"] = prevs
        template["auth_events"] = auth_ids
    return template


class FederationRoomsHandler:
    """Serves our rooms to other servers; any process with the
    ``federation`` resource (a join is persisted by the room's writer)."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        server_name: str,
        keyring: Keyring,
        formatter: ClientEventFormatter,
        signing_key: Callable[[], SigningKey],
        calls: InternalCalls,
        event_writers: Callable[[], Sequence[str]],
    ) -> None:
        self._store = store
        self._clock = clock
        self._server_name = server_name
        self._keyring = keyring
        self._formatter = formatter
        self._renderer = PduRenderer(store, formatter, clock)
        self._signing_key = signing_key
        self._calls = calls
        self._event_writers = event_writers

    # Reading

    async def _room_version(self, room_id: str) -> RoomVersion:
        """The room's version; 404 when we do not have the room."""
        if await self._store.get_room(room_id) is None:
            raise NotFoundError("Unknown room", Codes.NOT_FOUND)
        return await self._store.get_room_version(room_id)

    async def check_server_acl(self, origin: str, room_id: str) -> None:
        """403 when the room's ``m.room.server_acl`` denies ``origin``."""
        if not await room_allows_server(self._store, room_id, origin):
            raise AuthError(403, f"{origin} is denied by the room's server ACL")

    async def check_server_may_read(self, origin: str, room_id: str) -> None:
        """404 for a room we do not have; 403 when its server ACL denies
        ``origin``, or unless ``origin`` has a user joined to it now or the
        room is ``world_readable``."""
        await self._room_version(room_id)
        await self.check_server_acl(origin, room_id)
        members = await self._store.get_users_in_room(room_id)
        if any(server_of(m) == origin for m in members):
            return
        state_ids = await self._store.get_current_state_ids(room_id)
        visibility_id = state_ids.get(("m.room.history_visibility", ""))
        if visibility_id is not None:
            visibility = await self._store.get_event(visibility_id)
            if visibility is not None and visibility.content.get("history_visibility") == (
                "world_readable"
            ):
                return
        raise AuthError(403, f"{origin} is not in room {room_id}")

    async def _event_in_room(self, room_id: str, event_id: str) -> None:
        event = await self._store.get_event(event_id)
        if event is None or event.room_id != room_id:
            raise NotFoundError("Unknown event", Codes.NOT_FOUND)

    async def pdus(self, event_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The events found among ``event_ids`` in the server-server form,
        in the order given: other servers' as they sent them (without
        ``unsigned``), ours rendered and signed."""
        by_id = await self._pdus_by_id(event_ids)
        return [by_id[e] for e in event_ids if e in by_id]

    async def _pdus_by_id(self, event_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        return await self._renderer.pdus_by_id(event_ids)

    async def pdus_seen_by(
        self, origin: str, room_id: str, event_ids: Sequence[str]
    ) -> list[dict[str, Any]]:
        """:meth:`pdus`, each event the history visibility at it hides from
        ``origin`` served redacted (the spec's server behaviour: the graph
        stays whole, the content is gone; the signatures, over the redacted
        form, still verify). A server sees an event when one of its users
        with a membership in the room would (handlers/visibility.py, the
        rules clients get), or when it is ``world_readable``."""
        users = sorted(
            key[1]
            for key in await self._store.get_current_state_ids(room_id)
            if key[0] == "m.room.member" and server_of(key[1]) == origin
        )[:MAX_VIEWING_USERS]
        # Nobody's view: what anyone sees (world_readable events).
        views = [await load_room_visibility(self._store, u, room_id) for u in ["", *users]]
        events = await self._store.get_events(list(event_ids))
        hidden = {
            event_id
            for event_id, event in events.items()
            if not any(view.can_see(event) for view in views)
        }
        by_id = await self._pdus_by_id(event_ids)
        version = await self._store.get_room_version(room_id)
        return [
            pruned_event(version, by_id[e]) if e in hidden else by_id[e]
            for e in event_ids
            if e in by_id
        ]

    def _transaction(self, pdus: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "origin": self._server_name,
            "origin_server_ts": self._clock.time_msec(),
            "pdus": pdus,
        }

    async def on_event(self, origin: str, event_id: str) -> dict[str, Any]:
        """``GET /event/{eventId}``: one event in a transaction."""
        event = await self._store.get_event(event_id)
        if event is None:
            raise NotFoundError("Unknown event", Codes.NOT_FOUND)
        await self.check_server_may_read(origin, event.room_id)
        return self._transaction(await self.pdus_seen_by(origin, event.room_id, [event_id]))

    async def _state_before(self, origin: str, room_id: str, event_id: str) -> list[str]:
        await self.check_server_may_read(origin, room_id)
        await self._event_in_room(room_id, event_id)
        event = await self._store.get_event(event_id)
        if event is not None and event.rejected:
            # Not part of the room: no state is vouched for at it (as for
            # an outlier, whose state is unknown).
            raise NotFoundError("That event was rejected", Codes.NOT_FOUND)
        state = await self._store.get_state_ids_before_event(event_id)
        if state is None:
            raise NotFoundError("The state at that event is unknown here", Codes.NOT_FOUND)
        return sorted(state.values())

    async def on_state_ids(self, origin: str, room_id: str, event_id: str) -> dict[str, Any]:
        """``GET /state_ids/{roomId}?event_id=``: the state before the
        event and the auth chain of that state, as ids."""
        state = await self._state_before(origin, room_id, event_id)
        chain = await self._store.get_auth_chain_ids(state)
        return {"pdu_ids": state, "auth_chain_ids": sorted(chain)}

    async def on_state(self, origin: str, room_id: str, event_id: str) -> dict[str, Any]:
        """``GET /state/{roomId}?event_id=``: as ``/state_ids``, as events."""
        state = await self._state_before(origin, room_id, event_id)
        chain = await self._store.get_auth_chain_ids(state)
        return {
            "pdus": await self.pdus(await self._oldest_first(state)),
            "auth_chain": await self.pdus(await self._oldest_first(chain)),
        }

    async def _oldest_first(self, event_ids: Iterable[str]) -> list[str]:
        """``event_ids`` in the room's order, oldest first (depth, then
        stream order; ids we do not have last): a server that reads an
        answer's events in order, each replacing the state before it (as
        SyTest's does), ends with the newest of each key."""
        ids = sorted(set(event_ids))
        events = await self._store.get_events(ids)
        return sorted(
            ids,
            key=lambda i: (
                (0, events[i].depth, events[i].stream_ordering) if i in events else (1, 0, 0),
                i,
            ),
        )

    async def on_event_auth(self, origin: str, room_id: str, event_id: str) -> dict[str, Any]:
        """``GET /event_auth/{roomId}/{eventId}``: the event's auth chain."""
        await self.check_server_may_read(origin, room_id)
        await self._event_in_room(room_id, event_id)
        chain = await self._store.get_auth_chain_ids([event_id])
        return {"auth_chain": await self.pdus(await self._oldest_first(chain))}

    async def _walk_back(
        self,
        room_id: str,
        start: Sequence[str],
        limit: int,
        include_start: bool,
        stop: frozenset[str] = frozenset(),
        min_depth: int = 0,
    ) -> list[str]:
        """Up to ``limit`` events of ``room_id`` reached from ``start`` by
        ``prev_events``, deepest first (ties by id), not entering ``stop``
        nor events below ``min_depth``."""
        events = await self._store.get_events(list(start))
        heap: list[tuple[int, str]] = []
        seen: set[str] = set(stop)
        for event_id, event in events.items():
            if event.room_id == room_id and event_id not in seen:
                seen.add(event_id)
                heapq.heappush(heap, (-event.depth, event_id))
        found: list[str] = []
        first = set(start)
        while heap and len(found) < limit:
            _depth, event_id = heapq.heappop(heap)
            if include_start or event_id not in first:
                found.append(event_id)
            prevs, _auth = (await self._store.get_event_edges([event_id]))[event_id]
            fresh = [p for p in prevs if p not in seen]
            seen.update(fresh)
            for prev_id, prev in (await self._store.get_events(fresh)).items():
                if prev.room_id == room_id and prev.depth >= min_depth:
                    heapq.heappush(heap, (-prev.depth, prev_id))
        return found

    async def on_backfill(
        self, origin: str, room_id: str, starts: list[str], limit: int | None
    ) -> dict[str, Any]:
        """``GET /backfill/{roomId}?v=&limit=``: the events ``v`` names and
        their ancestors, deepest first, at most ``limit`` (cut to
        :data:`MAX_BACKFILL`)."""
        starts = _event_id_list(starts, "v")
        if not starts:
            raise _bad("'v' must name at least one event", Codes.INVALID_PARAM)
        count = _limit(limit, 10, MAX_BACKFILL)
        await self.check_server_may_read(origin, room_id)
        found = await self._walk_back(room_id, starts, count, include_start=True)
        return self._transaction(await self.pdus_seen_by(origin, room_id, found))

    async def on_get_missing_events(
        self, origin: str, room_id: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """``POST /get_missing_events/{roomId}``: ancestors of
        ``latest_events`` (not themselves) that are not ``earliest_events``
        nor behind them, at most ``limit`` (default 10, cut to
        :data:`MAX_MISSING_EVENTS`), not below ``min_depth``; oldest first."""
        earliest = _event_id_list(body.get("earliest_events", []), "earliest_events")
        latest = _event_id_list(body.get("latest_events"), "latest_events")
        count = _limit(body.get("limit"), 10, MAX_MISSING_EVENTS)
        min_depth = body.get("min_depth", 0)
        if isinstance(min_depth, bool) or not isinstance(min_depth, int):
            raise _bad("'min_depth' must be an integer")
        await self.check_server_may_read(origin, room_id)
        found = await self._walk_back(
            room_id,
            latest,
            count,
            include_start=False,
            stop=frozenset(earliest),
            min_depth=min_depth,
        )
        return {"events": list(reversed(await self.pdus_seen_by(origin, room_id, found)))}

    # Joining

    async def on_make_join(
        self, origin: str, room_id: str, user_id: str, versions: list[str]
    ) -> dict[str, Any]:
        """``GET /make_join/{roomId}/{userId}?ver=``: an unsigned join for
        ``user_id`` (a user of ``origin``) on the room's forward
        extremities, with the auth events the spec selects; 404 when none of
        our users is joined to it (we are no resident server); 403 when the
        room's rules would refuse it now, 400
        ``M_INCOMPATIBLE_ROOM_VERSION`` when the room's version is not
        among ``versions`` (``["1"]`` when none is given, as the spec says)."""
        return await self._make_membership(origin, room_id, user_id, "join", versions or ["1"])

    async def on_make_leave(self, origin: str, room_id: str, user_id: str) -> dict[str, Any]:
        """``GET /make_leave/{roomId}/{userId}``: as ``make_join``, a leave."""
        return await self._make_membership(origin, room_id, user_id, "leave", None)

    async def on_make_knock(
        self, origin: str, room_id: str, user_id: str, versions: list[str]
    ) -> dict[str, Any]:
        """``GET /make_knock/{roomId}/{userId}?ver=``: as ``make_join``, a
        knock; 400 ``M_INCOMPATIBLE_ROOM_VERSION`` also when the room's
        version has no knocking (before 7), 403 when the room's join rule
        takes no knocks (or the user may not knock: banned, joined)."""
        return await self._make_membership(origin, room_id, user_id, "knock", versions or ["1"])

    async def _make_membership(
        self,
        origin: str,
        room_id: str,
        user_id: str,
        membership: str,
        versions: list[str] | None,
    ) -> dict[str, Any]:
        if not is_valid_user_id(user_id):
            raise _bad(f"{user_id!r} is not a user id", Codes.INVALID_PARAM)
        if server_of(user_id) != origin:
            raise AuthError(403, f"{user_id} is not a user of {origin}")
        version = await self._room_version(room_id)
        await self.check_server_acl(origin, room_id)
        # Only a resident server makes membership events: with none of our
        # users joined we may hold a stale view of the room, and our events
        # in it would reach no one.
        members = await self._store.get_users_in_room(room_id)
        if not any(server_of(m) == self._server_name for m in members):
            raise NotFoundError("None of this server's users is in that room", Codes.NOT_FOUND)
        if versions is not None and version.identifier not in versions:
            raise SynapseError(
                400,
                f"This room's version is {version.identifier}, which your server does not support",
                INCOMPATIBLE_ROOM_VERSION,
                {"room_version": version.identifier},
            )
        _check_knocking(version, membership)
        content: dict[str, Any] = {"membership": membership}
        if membership == "join":
            authoriser = await self._restricted_join_authoriser(room_id, user_id)
            if authoriser is not None:
                content["join_authorised_via_users_server"] = authoriser
        template = await membership_template(
            self._store, version, room_id, user_id, user_id, content, self._clock.time_msec()
        )
        return {"event": template, "room_version": version.identifier}

    async def _restricted_join_authoriser(self, room_id: str, user_id: str) -> str | None:
        """The member of ours who vouches for ``user_id``'s join when only
        the room's restricted join rule admits it (None: no need); 403 when
        the user is in none of the allowed rooms, 400
        ``M_UNABLE_TO_AUTHORISE_JOIN`` when we are in none of them to tell,
        400 ``M_UNABLE_TO_GRANT_JOIN`` when no member of ours may invite
        (the joining server then tries another resident server)."""
        state, _ids = await load_auth_state(self._store, room_id, [user_id])
        try:
            return await restricted_join_authoriser(
                self._store, self._server_name, room_id, user_id, state
            )
        except UnableToAuthoriseJoin as e:
            raise SynapseError(400, e.msg, UNABLE_TO_AUTHORISE_JOIN) from None
        except UnableToGrantJoin as e:
            raise SynapseError(400, e.msg, UNABLE_TO_GRANT_JOIN) from None

    async def _check_authoriser(self, room_id: str, event: Pdu) -> bool:
        """A received join naming a member of ours in
        ``join_authorised_via_users_server`` is one we vouch for: the
        restricted rule must need it and its ``allow`` conditions hold for
        the user now (a forged name is refused, 403); whether that member
        may invite is the rules' check. One naming another server's member
        carries that server's signature (checked with the others). Whether
        we vouch for it."""
        authoriser = event.content.get("join_authorised_via_users_server")
        if not isinstance(authoriser, str) or server_of(authoriser) != self._server_name:
            return False
        if await self._restricted_join_authoriser(room_id, event.sender) is None:
            raise AuthError(
                403, "This join needs no join_authorised_via_users_server: we vouch for nothing"
            )
        return True

    async def on_send_join(
        self, origin: str, room_id: str, event_id: str, pdu: Any
    ) -> dict[str, Any]:
        """``PUT /v2/send_join/{roomId}/{eventId}``: check and persist a
        join ``origin`` signed; answer the state before it, that state's
        auth chain, the event countersigned by us and the servers in the
        room."""
        version, event = await self._persist_membership(origin, room_id, event_id, pdu, "join")
        state = await self._store.get_state_ids_before_event(event.event_id)
        state_ids = sorted((state or {}).values())
        chain = await self._store.get_auth_chain_ids([*state_ids, event.event_id])
        members = await self._store.get_users_in_room(room_id)
        signed = add_event_signature(version, pdu, self._server_name, self._signing_key())
        return {
            "origin": self._server_name,
            "state": await self.pdus(await self._oldest_first(state_ids)),
            "auth_chain": await self.pdus(await self._oldest_first(chain)),
            "event": signed,
            "members_omitted": False,
            "servers_in_room": sorted({server_of(m) for m in members} | {self._server_name}),
        }

    async def on_send_leave(
        self, origin: str, room_id: str, event_id: str, pdu: Any
    ) -> dict[str, Any]:
        """``PUT /v2/send_leave/{roomId}/{eventId}``: check and persist a
        leave ``origin`` signed; answers ``{}``."""
        await self._persist_membership(origin, room_id, event_id, pdu, "leave")
        return {}

    async def on_send_knock(
        self, origin: str, room_id: str, event_id: str, pdu: Any
    ) -> dict[str, Any]:
        """``PUT /v1/send_knock/{roomId}/{eventId}``: check and persist a
        knock ``origin`` signed (as ``send_join`` checks a join); answers the
        room's stripped state (``knock_room_state``: what an invite carries)
        for the knocking user's client."""
        await self._persist_membership(origin, room_id, event_id, pdu, "knock")
        state = await stripped_state(self._store, room_id, ())
        return {"knock_room_state": state}

    async def _persist_membership(
        self, origin: str, room_id: str, event_id: str, pdu: Any, membership: str
    ) -> tuple[RoomVersion, Pdu]:
        """Check a signed ``membership`` event and have the room's writer
        persist it (its rules checked there)."""
        version = await self._room_version(room_id)
        await self.check_server_acl(origin, room_id)
        _check_knocking(version, membership)
        event = await self._check_received_membership(
            origin, room_id, event_id, version, pdu, membership
        )
        if membership == "join" and await self._check_authoriser(room_id, event):
            # We vouch for it: stored (and served) with our signature, which
            # every server checking it needs.
            pdu = add_event_signature(version, pdu, self._server_name, self._signing_key())
        writer = await self._store.get_event_writer_for_room(room_id, self._event_writers())
        if writer is None:
            raise NotFoundError("Unknown room", Codes.NOT_FOUND)
        await self._store.store_received_pdu(event_id, room_id, origin, pdu)
        try:
            await self._calls.call(
                PERSIST_RECEIVED_EVENT, ReceivedEvent(room_id, origin, pdu), instance=writer
            )
        except SynapseError as e:
            # Refused by the writer (its rules, unknown parents): keep no
            # copy of an event we do not have. Not after a 5xx, where the
            # writer may have persisted it before failing to answer.
            if e.code < 500 and await self._store.get_event(event_id) is None:
                await self._store.delete_received_pdu(event_id)
            raise
        return version, event

    async def _check_received_membership(
        self,
        origin: str,
        room_id: str,
        event_id: str,
        version: RoomVersion,
        pdu: Any,
        membership: str,
    ) -> Pdu:
        """The ``membership`` event (join, leave) ``origin`` sent,
        checked as far as it can be without the room's state: 400 for a
        malformed event, one whose id is not ``event_id``, of another room,
        not that membership of its sender, or (once its signatures are
        checked) whose content hash does not match; 403 for a user of
        another server than ``origin`` or a missing or bad signature."""
        if not isinstance(pdu, dict):
            raise _bad("The event must be an object")
        try:
            encoded = event_canonical_json(pdu, version.strict_canonical_json)
            actual_id = event_id_of(version, pdu)
        except (CanonicalJsonError, KeyError, TypeError, ValueError) as e:
            raise _bad(
                f"The event is not valid in room version {version.identifier}: {e}"
            ) from None
        if len(encoded) > MAX_PDU_BYTES:
            raise SynapseError(413, "The event is larger than 65536 bytes", Codes.TOO_LARGE)
        if actual_id != event_id:
            raise _bad(f"The event's id is {actual_id}, not {event_id}", Codes.INVALID_PARAM)
        try:
            event = received_content(version, pdu, event_id)
        except PduFormatError as e:
            raise _bad(f"The event is malformed: {e}") from None
        if event.room_id != room_id:
            raise _bad("The event is for another room", Codes.INVALID_PARAM)
        if not 0 < len(event.prev_event_ids) <= MAX_PREV_EVENTS:
            raise _bad(f"An event names 1 to {MAX_PREV_EVENTS} prev_events")
        if len(event.auth_event_ids) > MAX_AUTH_EVENTS:
            raise _bad(f"An event names at most {MAX_AUTH_EVENTS} auth_events")
        if not (
            event.type == "m.room.member"
            and event.membership == membership
            and event.state_key == event.sender
        ):
            raise _bad(f"The event is not a {membership} of its sender")
        if not is_valid_user_id(event.sender):
            raise _bad("The event's sender is not a user id")
        if server_of(event.sender) != origin:
            raise AuthError(403, f"{event.sender} is not a user of {origin}")
        # Signatures first: an unsigned event is refused as unsigned (403,
        # as SyTest expects), whatever its hashes; a signed one whose
        # content was changed after signing is then 400.
        for server in sorted(servers_that_must_sign(version, pdu)):
            if server != self._server_name:  # we sign what we accept below
                await self._check_signed_by(version, pdu, server)
        if not content_hash_matches(version, pdu):
            raise _bad("The event's content hash does not match its content")
        return event

    async def _check_signed_by(
        self, version: RoomVersion, pdu: dict[str, Any], server: str
    ) -> None:
        """403 unless one of ``server``'s current keys signed ``pdu``."""
        try:
            await check_signed_by(self._keyring, version, pdu, server, None)
        except PduRefused as e:
            raise AuthError(403, f"The event is {e}") from None


def _check_knocking(version: RoomVersion, membership: str) -> None:
    """400 ``M_INCOMPATIBLE_ROOM_VERSION`` for a knock in a room whose
    version has none (the spec's answer to make_knock/send_knock)."""
    if membership == "knock" and not version.knocking:
        raise SynapseError(
            400,
            f"Room version {version.identifier} does not support knocking",
            INCOMPATIBLE_ROOM_VERSION,
            {"room_version": version.identifier},
        )


class ReceivedEventsWriter:
    """On a room's events writer: persists the events other servers made
    (:data:`PERSIST_RECEIVED_EVENT`) after the spec's rules."""

    def __init__(self, store: GenericWorkerStore, events: EventCreationHandler) -> None:
        self._store = store
        self._events = events

    async def persist_received(self, request: ReceivedEvent) -> EventsPersisted:
        version = await self._store.get_room_version(request.room_id)
        try:
            event_id = event_id_of(version, request.pdu)
            event = received_content(version, request.pdu, event_id)
        except (PduFormatError, KeyError, ValueError) as e:
            raise _bad(f"The event is malformed: {e}") from None
        if event.room_id != request.room_id:
            raise _bad("The event is for another room", Codes.INVALID_PARAM)
        content = pdu_as_content(event)

        async def check(state_ids: Mapping[StateKey, str]) -> None:
            await self._check_parents(event)
            try:
                await check_rules(self._store, version, event, state_ids, event.auth_event_ids)
            except EventAuthError as e:
                logger.info("Refused %s from %s: %s", event_id, request.origin, e.reason)
                raise AuthError(403, f"The room's rules refuse this event: {e.reason}") from e

        persisted = await self._events.persist_received_as_writer(content, check)
        logger.info(
            "Accepted %s (%s of %s) from %s",
            event_id,
            event.type,
            event.sender,
            request.origin,
        )
        return EventsPersisted([(persisted.event_id, persisted.stream_ordering)])

    async def _check_parents(self, event: Pdu) -> None:
        """400 unless every ``prev_events`` entry is an event of the room we
        have in the graph: a join is made on the extremities ``make_join``
        named (the inbound ``/send`` path is the one that fetches missing
        parents)."""
        parents = await self._store.get_events(list(event.prev_event_ids))
        unknown = [
            p
            for p in event.prev_event_ids
            if p not in parents or parents[p].room_id != event.room_id or parents[p].outlier
        ]
        if unknown:
            raise _bad(f"The event's prev_events are unknown here: {unknown}", Codes.INVALID_PARAM)
