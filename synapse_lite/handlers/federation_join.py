"""Our users joining and leaving rooms of other servers (docs/federation.md,
"Joining rooms of other servers").

* **Join**: ``make_join`` to a resident server (each candidate in turn: the
  ``via``/``server_name`` of the request, the servers of a remote alias, the
  room id's server), the template filled and signed as a join of the room's
  version, ``send_join`` (v2, v1's answer shape as a fallback), and the
  answer checked before anything is stored (:func:`check_join_answer`: every
  event's id, content hash, room, its servers' signatures, each against its
  own auth events by the spec's rules, the create event naming the room and
  its version, the join allowed by the state before it). The room's events
  writer then stores the state and auth chain as outliers and the join with
  that state before it (``EventsStore.persist_remote_join``), so the room is
  in our user's ``/sync`` with its state.
* **Leave**: when no other user of ours is joined and another server's is,
  ``make_leave``/``send_leave`` through the servers in the room; the leave is
  stored with the state we hold before it.

The pure checks (:func:`check_join_answer`) take plain values and raise
:class:`JoinAnswerError`; the handler fetches keys and talks to servers.
"""

from __future__ import annotations

import logging
import secrets
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attr
from twisted.internet import defer

from synapse_lite.api.errors import AuthError, Codes, SynapseError
from synapse_lite.api.identifiers import server_of
from synapse_lite.api.room_versions import SPEC_ROOM_VERSIONS, EventIdFormat, RoomVersion
from synapse_lite.event_graph.authorisation import (
    CREATE,
    EventAuthError,
    auth_events_state,
    authorise,
)
from synapse_lite.event_graph.hashing import (
    add_event_signature,
    content_hash_matches,
    event_id_of,
    sign_event,
)
from synapse_lite.event_graph.pdu import Pdu, PduFormatError, StateKey, room_id_of_create
from synapse_lite.events import event_canonical_json
from synapse_lite.federation.client import FederationRequestError
from synapse_lite.federation.crypto import CanonicalJsonError
from synapse_lite.federation.pdu_checks import PduRefused, check_pdu_signatures
from synapse_lite.federation.server_acl import room_allows_server
from synapse_lite.handlers.federation_rooms import membership_template
from synapse_lite.handlers.received_events import pdu_as_content
from synapse_lite.handlers.sync_sections.rooms import stripped_state
from synapse_lite.replication.http.federation_rooms import (
    PERSIST_RECEIVED_EVENT,
    PERSIST_REMOTE_JOIN,
    ReceivedEvent,
    RemoteJoin,
)
from synapse_lite.replication.http.send_events import EventsPersisted
from synapse_lite.storage.databases.main.events import RemoteJoinToPersist

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.federation.client import FederationClient
    from synapse_lite.federation.crypto import SigningKey
    from synapse_lite.federation.keyring import Keyring
    from synapse_lite.handlers.message import EventCreationHandler
    from synapse_lite.handlers.remote_devices import RemoteDeviceLists
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.storage.databases.main import GenericWorkerStore
    from synapse_lite.streams.writers import WritersDirectory

logger = logging.getLogger(__name__)

FEDERATION_V1 = "/_matrix/federation/v1"
FEDERATION_V2 = "/_matrix/federation/v2"
#: Room versions we can join (``ver`` of make_join), oldest first.
SUPPORTED_VERSIONS = tuple(SPEC_ROOM_VERSIONS)
#: Most events one send_join answer may hold (state and auth chain): a
#: bound on what a server can make us check and store.
MAX_ANSWER_EVENTS = 100_000
#: Servers tried for one join or leave at most.
MAX_CANDIDATES = 10


class JoinAnswerError(Exception):
    """A resident server's ``send_join`` answer (or template) that we refuse:
    nothing of it is stored."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ReceivedPdu:
    """A PDU of an answer, read: the graph's view and the form it came in."""

    event: Pdu
    pdu: dict[str, Any]


def read_answer_pdu(version: RoomVersion, room_id: str, pdu: Any) -> ReceivedPdu:
    """One event of a send_join answer: its id computed (versions 3 on; a
    served ``event_id`` is ignored) or read (1-2), its shape, its room, its
    content hash. :class:`JoinAnswerError` for anything wrong: decided, a
    hash mismatch in a join's state is refused, not redacted and kept (the
    resident server answers with events it holds and must hold them whole)."""
    if not isinstance(pdu, dict):
        raise JoinAnswerError("an event is not a JSON object")
    pdu = {k: v for k, v in pdu.items() if k != "unsigned"}
    if version.event_ids is not EventIdFormat.SERVER_SUFFIXED:
        pdu.pop("event_id", None)
    try:
        # The whole event as its version's canonical JSON (a float in the
        # content of a version 6 event, say, is no event of that version).
        event_canonical_json(pdu, version.strict_canonical_json)
        event_id = event_id_of(version, pdu)
        event = Pdu.from_json(version, pdu, event_id)
    except (CanonicalJsonError, KeyError, TypeError, ValueError, PduFormatError) as e:
        raise JoinAnswerError(
            f"an event is malformed for room version {version.identifier}: {e}"
        ) from None
    if event.room_id != room_id:
        raise JoinAnswerError(f"event {event_id} is of room {event.room_id}, not {room_id}")
    if not content_hash_matches(version, pdu):
        raise JoinAnswerError(f"event {event_id}'s content does not match its hash (forged)")
    return ReceivedPdu(event, pdu)


def _readable(version: RoomVersion, room_id: str, pdus: Sequence[Any]) -> list[ReceivedPdu]:
    """The events of a send_join answer's ``state`` or ``auth_chain`` that
    :func:`read_answer_pdu` accepts. Decided (as the reference server and
    SyTest's "Event with an invalid signature in the send_join response
    should not cause room join to fail" expect): one that is malformed, of
    another room or forged (content hash) is **dropped** with a WARNING,
    not the whole answer; what the join needs (the create event, the auth
    events of what is kept) is then missing, and :func:`check_join_answer`
    refuses the answer for that."""
    kept = []
    for pdu in pdus:
        try:
            kept.append(read_answer_pdu(version, room_id, pdu))
        except JoinAnswerError as e:
            logger.warning("Dropped an event of a send_join answer for %s: %s", room_id, e.reason)
    return kept


@attr.s(slots=True, frozen=True, auto_attribs=True)
class CheckedJoin:
    """A send_join answer that passed :func:`check_join_answer`."""

    join: ReceivedPdu
    #: The state before the join.
    state_before: dict[StateKey, str]
    #: The state and auth chain events (not the join), by id.
    events: dict[str, ReceivedPdu]
    create: Pdu


def check_join_answer(
    version: RoomVersion,
    room_id: str,
    join: ReceivedPdu,
    state: Sequence[ReceivedPdu],
    auth_chain: Sequence[ReceivedPdu],
) -> CheckedJoin:
    """The spec's checks of a send_join answer that do not need keys (the
    caller verified every event's signatures): the state has one event per
    key and the room's create event, which names ``room_id`` (version 12:
    its id is the room's) and the room's version; every event of the state
    and auth chain is allowed by its own auth events (all in the answer);
    the join is allowed by its auth events and by the state before it.
    :class:`JoinAnswerError` naming what is wrong."""
    events: dict[str, ReceivedPdu] = {}
    for received in [*state, *auth_chain]:
        events.setdefault(received.event.event_id, received)
    state_before: dict[StateKey, str] = {}
    for received in state:
        pair = received.event.state_pair
        if pair is None:
            raise JoinAnswerError(f"state event {received.event.event_id} has no state key")
        if state_before.get(pair, received.event.event_id) != received.event.event_id:
            raise JoinAnswerError(f"the state has two events for {pair}")
        state_before[pair] = received.event.event_id
    create_id = state_before.get(CREATE)
    if create_id is None:
        raise JoinAnswerError("the state has no m.room.create event")
    create = events[create_id].event
    created_version = create.content.get("room_version", "1")
    if created_version != version.identifier:
        raise JoinAnswerError(
            f"the create event says room version {created_version!r}, not {version.identifier}"
        )
    if version.hashed_room_ids and room_id_of_create(create_id) != room_id:
        raise JoinAnswerError(f"the create event {create_id} is not the one of {room_id}")
    by_id = {i: r.event for i, r in events.items()}
    for received in events.values():
        _check_against_own_auth_events(version, received.event, by_id, create)
    _check_against_own_auth_events(version, join.event, by_id, create)
    try:
        authorise(version, join.event, {k: by_id[i] for k, i in state_before.items()})
    except EventAuthError as e:
        raise JoinAnswerError(f"the state before the join does not allow it: {e.reason}") from e
    return CheckedJoin(join=join, state_before=state_before, events=events, create=create)


def _check_against_own_auth_events(
    version: RoomVersion, event: Pdu, by_id: Mapping[str, Pdu], create: Pdu
) -> None:
    if event.type == "m.room.create" and event.state_key == "":
        if event.event_id != create.event_id:
            raise JoinAnswerError(f"a second create event {event.event_id}")
        try:
            authorise(version, event, {})
        except EventAuthError as e:
            raise JoinAnswerError(f"the create event is not valid: {e.reason}") from e
        return
    missing = [a for a in event.auth_event_ids if a not in by_id]
    if missing:
        raise JoinAnswerError(
            f"the auth events of {event.event_id} are not in the answer: {missing}"
        )
    try:
        own = auth_events_state(
            version, event, [by_id[a] for a in event.auth_event_ids], create=create
        )
        authorise(version, event, own)
    except EventAuthError as e:
        raise JoinAnswerError(
            f"event {event.event_id} ({event.type}) is not allowed by its auth events: {e.reason}"
        ) from e


def fill_template(
    version: RoomVersion,
    template: Any,
    room_id: str,
    user_id: str,
    membership: str,
    content: Mapping[str, Any],
    server_name: str,
    now_ms: int,
) -> dict[str, Any]:
    """Our membership event from a make_join/make_leave ``template``: its
    room, sender, state key and membership checked (:class:`JoinAnswerError`
    otherwise), ``content`` ours, our ``origin`` and time, an ``event_id``
    of ours in versions 1-2; unsigned (see :func:`sign_event`)."""
    if not isinstance(template, dict):
        raise JoinAnswerError("the template is not a JSON object")
    template_room = template.get("room_id")
    if template_room != room_id:
        raise JoinAnswerError(f"the template is for room {template_room!r}")
    if template.get("type") != "m.room.member" or template.get("state_key") != user_id:
        raise JoinAnswerError("the template is not a membership event of our user")
    if template.get("sender") != user_id:
        raise JoinAnswerError("the template's sender is not our user")
    event = {
        k: v
        for k, v in template.items()
        if k not in ("signatures", "hashes", "unsigned", "event_id", "origin")
    }
    event["content"] = {**content, "membership": membership}
    authoriser = _dict(template.get("content")).get("join_authorised_via_users_server")
    if membership == "join" and isinstance(authoriser, str):
        # A restricted join the resident server vouches for (it signs the
        # join it names itself in; the send_join answer carries that).
        event["content"]["join_authorised_via_users_server"] = authoriser
    event["origin"] = server_name
    event["origin_server_ts"] = now_ms
    if version.event_ids is EventIdFormat.SERVER_SUFFIXED:
        event["event_id"] = f"${secrets.token_urlsafe(18)}:{server_name}"
    return event


def candidate_servers(servers: Iterable[str], room_id: str, me: str) -> list[str]:
    """The servers to try, in order, without duplicates or us: those given,
    then the room id's server (rooms before version 12 name one)."""
    found = list(dict.fromkeys(s for s in servers if isinstance(s, str) and s))
    if ":" in room_id:
        found.append(room_id.split(":", 1)[1])
    return [s for s in dict.fromkeys(found) if s != me][:MAX_CANDIDATES]


class FederationJoinHandler:
    """Joins and leaves of our users in rooms of other servers. Any process
    serving the client API (the writer of the room persists)."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        server_name: str,
        client: Callable[[], FederationClient],
        keyring: Callable[[], Keyring],
        signing_key: Callable[[], SigningKey],
        calls: InternalCalls,
        writers: WritersDirectory,
        event_writers: Callable[[], Sequence[str]],
        device_lists: RemoteDeviceLists | None = None,
    ) -> None:
        """``device_lists``: told of each room we join through another
        server (:meth:`RemoteDeviceLists.on_room_rejoined`)."""
        self._store = store
        self._clock = clock
        self._server_name = server_name
        self._client = client
        self._keyring = keyring
        self._signing_key = signing_key
        self._calls = calls
        self._writers = writers
        self._event_writers = event_writers
        self._device_lists = device_lists

    async def is_remote_room(self, room_id: str, leaving: str | None = None) -> bool:
        """Whether a membership change of ours in ``room_id`` goes through
        another server: we do not have the room, or no user of ours (but
        ``leaving``, the user whose leave it is) is joined to it and another
        server's is."""
        if CREATE not in await self._store.get_current_state_ids(room_id):
            # Unknown here, or known only by an invite of another server's.
            return True
        joined = (await self._store.get_users_in_room(room_id)) - {leaving}
        return not any(server_of(u) == self._server_name for u in joined) and bool(joined)

    async def join(
        self, user_id: str, room_id: str, servers: Sequence[str], content: Mapping[str, Any]
    ) -> str:
        """Join ``user_id`` to ``room_id`` through one of ``servers`` (then
        the room id's server); the join's id. 404 when no server could be
        had, naming each one's failure; 403 when a server said the room's
        rules refuse it and no other let us in; else a server's 400 with
        its Matrix error (``M_INCOMPATIBLE_ROOM_VERSION`` and its
        ``room_version``, say) is passed through to the client."""
        return await self._through_each(servers, room_id, "join", user_id, content)

    async def knock(
        self, user_id: str, room_id: str, servers: Sequence[str], content: Mapping[str, Any]
    ) -> str:
        """Knock ``user_id`` on ``room_id`` through one of ``servers`` (then
        the room id's server): ``make_knock``, our knock signed and sent
        with ``send_knock``, then stored as our user's outlier membership
        with the ``knock_room_state`` answered (as a received invite is, so
        /sync's ``knock`` section shows it). Errors as :meth:`join`'s."""
        return await self._through_each(servers, room_id, "knock", user_id, content)

    async def _through_each(
        self,
        servers: Sequence[str],
        room_id: str,
        membership: str,
        user_id: str,
        content: Mapping[str, Any],
    ) -> str:
        """A join or knock (``membership``) through each candidate server in
        turn until one works; the errors of :meth:`join` when none did."""
        attempt = self._join_through if membership == "join" else self._knock_through
        verb = "join" if membership == "join" else "knock on"
        candidates = candidate_servers(servers, room_id, self._server_name)
        if not candidates:
            raise SynapseError(
                404, f"No server to {verb} this room through: give one (via)", Codes.NOT_FOUND
            )
        problems: list[str] = []
        refused = False
        passed: FederationRequestError | None = None
        for server in candidates:
            try:
                return await attempt(server, user_id, room_id, content)
            except FederationRequestError as e:
                refused = refused or e.code == 403
                if passed is None and e.code == 400 and _errcode(e) is not None:
                    passed = e
                problems.append(f"{server}: {_error_of(e)}")
            except JoinAnswerError as e:
                logger.warning("Refused %s's answer to %s %s: %s", server, verb, room_id, e.reason)
                problems.append(f"{server}: refused its answer: {e.reason}")
        detail = "; ".join(problems)
        if refused:
            raise AuthError(403, f"Could not {verb} {room_id}: {detail}")
        if passed is not None:
            body = _dict(passed.body)
            extra = {k: v for k, v in body.items() if k not in ("errcode", "error")}
            errcode = _errcode(passed) or Codes.UNKNOWN
            raise SynapseError(400, f"Could not {verb} {room_id}: {detail}", errcode, extra)
        raise SynapseError(404, f"Could not {verb} {room_id}: {detail}", Codes.NOT_FOUND)

    async def _knock_through(
        self, server: str, user_id: str, room_id: str, content: Mapping[str, Any]
    ) -> str:
        client = self._client()
        versions = "&".join(f"ver={v}" for v in SUPPORTED_VERSIONS)
        answer = await client.get_json(
            server, f"{FEDERATION_V1}/make_knock/{_q(room_id)}/{_q(user_id)}?{versions}"
        )
        version = _version_of(answer)
        if not version.knocking:
            raise JoinAnswerError(f"room version {version.identifier} has no knocking")
        signed, sent = await self._send_membership(
            server, version, answer, room_id, user_id, "knock", content, v2=False
        )
        stripped = _dict(sent).get("knock_room_state")
        if not _is_stripped_state(stripped):
            raise JoinAnswerError(
                f"knock_room_state is not at most {MAX_STRIPPED_STATE} objects with type,"
                " state_key, sender and content"
            )
        # Kept as a received invite's stripped state is (the key /sync reads).
        stored = {**signed, "unsigned": {"invite_room_state": stripped}}
        request = RemoteJoin(
            room_id=room_id,
            origin=server,
            answer={"room_version": version.identifier, "event": stored, "invite": True},
        )
        await self._calls.call(
            PERSIST_REMOTE_JOIN, request, instance=await self._writer_of(room_id)
        )
        logger.info("%s knocked on %s through %s", user_id, room_id, server)
        return event_id_of(version, signed)

    async def _join_through(
        self, server: str, user_id: str, room_id: str, content: Mapping[str, Any]
    ) -> str:
        client = self._client()
        versions = "&".join(f"ver={v}" for v in SUPPORTED_VERSIONS)
        answer = await client.get_json(
            server, f"{FEDERATION_V1}/make_join/{_q(room_id)}/{_q(user_id)}?{versions}"
        )
        version = _version_of(answer)
        signed, sent = await self._send_membership(
            server, version, answer, room_id, user_id, "join", content
        )
        if not isinstance(sent, dict):
            raise JoinAnswerError("the send_join answer is not a JSON object")
        checked = await self.check_answer(version, room_id, signed, sent)
        persisted = await self._persist(server, version, room_id, checked)
        logger.info("%s joined %s through %s", user_id, room_id, server)
        if self._device_lists is not None:
            members = [
                event.state_key
                for event in (checked.events[i].event for i in checked.state_before.values())
                if event.membership == "join" and event.state_key is not None
            ]
            d = defer.ensureDeferred(self._device_lists.on_room_rejoined(room_id, members))
            d.addErrback(
                lambda f: logger.error(
                    "Could not check the device lists of %s's members: %s", room_id, f.value
                )
            )
        return persisted

    async def _send_membership(
        self,
        server: str,
        version: RoomVersion,
        answer: dict[str, Any],
        room_id: str,
        user_id: str,
        membership: str,
        content: Mapping[str, Any],
        v2: bool = True,
    ) -> tuple[dict[str, Any], Any]:
        """Our ``membership`` event from ``server``'s make_join/make_leave/
        make_knock ``answer``, signed and sent with ``send_join``/
        ``send_leave`` v2 (v1, whose answer is ``[200, {...}]``, when the
        server does not know v2; v1 only when not ``v2``, as ``send_knock``):
        the event and the server's answer."""
        event = fill_template(
            version,
            answer.get("event"),
            room_id,
            user_id,
            membership,
            content,
            self._server_name,
            self._clock.time_msec(),
        )
        signed = sign_event(version, event, self._server_name, self._signing_key())
        event_id = event_id_of(version, signed)
        path = f"/send_{membership}/{_q(room_id)}/{_q(event_id)}"
        client = self._client()
        try:
            if v2:  # send_knock has no v2
                return signed, await client.put_json(server, FEDERATION_V2 + path, signed)
        except FederationRequestError as e:
            if not _v2_unknown(e):
                raise
        old = await client.put_json(server, FEDERATION_V1 + path, signed)
        return signed, _v1_answer(old)

    async def check_answer(
        self, version: RoomVersion, room_id: str, signed: dict[str, Any], sent: dict[str, Any]
    ) -> CheckedJoin:
        """A send_join answer checked in full (signatures here, the rest by
        :func:`check_join_answer`)."""
        state, chain = sent.get("state"), sent.get("auth_chain")
        if not isinstance(state, list) or not isinstance(chain, list):
            raise JoinAnswerError("the answer has no 'state' and 'auth_chain' lists")
        if len(state) + len(chain) > MAX_ANSWER_EVENTS:
            raise JoinAnswerError(f"the answer holds more than {MAX_ANSWER_EVENTS} events")
        join = read_answer_pdu(version, room_id, signed)
        countersigned = sent.get("event")
        if isinstance(countersigned, dict):
            # The resident server's copy carries its signature too (needed
            # for a restricted join); it must be our event.
            theirs = read_answer_pdu(version, room_id, countersigned)
            if theirs.event.event_id != join.event.event_id:
                raise JoinAnswerError("the answer's event is not our join")
            join = theirs
        state_pdus = _readable(version, room_id, state)
        chain_pdus = _readable(version, room_id, chain)
        distinct: dict[str, ReceivedPdu] = {}
        for received in [*state_pdus, *chain_pdus, join]:
            seen = distinct.setdefault(received.event.event_id, received)
            if seen.pdu != received.pdu:
                # One id, two forms (signatures, or content under a hash that
                # does not cover it): which is checked and which is kept
                # must not differ.
                raise JoinAnswerError(f"two different copies of {received.event.event_id}")
        await self._check_signatures(version, join)
        forged: set[str] = set()
        for event_id, received in distinct.items():
            if received is join:
                continue
            try:
                await self._check_signatures(version, received)
            except JoinAnswerError as e:
                logger.warning("Dropped an event of a send_join answer for %s: %s", room_id, e)
                forged.add(event_id)
        return check_join_answer(
            version,
            room_id,
            join,
            [r for r in state_pdus if r.event.event_id not in forged],
            [r for r in chain_pdus if r.event.event_id not in forged],
        )

    async def _check_signatures(self, version: RoomVersion, received: ReceivedPdu) -> None:
        try:
            await check_pdu_signatures(self._keyring(), version, received.pdu)
        except PduRefused as e:
            raise JoinAnswerError(f"event {received.event.event_id} is {e}") from None

    async def _persist(
        self, origin: str, version: RoomVersion, room_id: str, checked: CheckedJoin
    ) -> str:
        writer = await self._writer_of(room_id)
        in_state = set(checked.state_before.values())
        request = RemoteJoin(
            room_id=room_id,
            origin=origin,
            answer={
                "room_version": version.identifier,
                "event": checked.join.pdu,
                "state": [checked.events[i].pdu for i in sorted(in_state)],
                "auth_chain": [
                    r.pdu for i, r in sorted(checked.events.items()) if i not in in_state
                ],
            },
        )
        answer = await self._calls.call(PERSIST_REMOTE_JOIN, request, instance=writer)
        [(event_id, _)] = answer.events
        return event_id

    async def leave(
        self,
        user_id: str,
        room_id: str,
        content: Mapping[str, Any],
        invited_by: str | None = None,
    ) -> str:
        """Leave a room of other servers, or reject an invite to one
        (``invited_by``: the inviter), through ``make_leave``/``send_leave``
        (the servers of its joined members or the inviter's, in turn); the
        leave is stored with the state we hold. 404 naming each server's
        failure when none took it; a rejected invite whose servers cannot be
        had is rejected here alone (the spec's "servers that are gone")."""
        joined = await self._store.get_users_in_room(room_id)
        servers = sorted({server_of(u) for u in joined})
        if invited_by is not None:
            servers.insert(0, server_of(invited_by))
        problems = []
        for server in candidate_servers(servers, room_id, self._server_name):
            try:
                return await self._leave_through(server, user_id, room_id, content)
            except FederationRequestError as e:
                problems.append(f"{server}: {_error_of(e)}")
            except JoinAnswerError as e:
                problems.append(f"{server}: refused its template: {e.reason}")
        detail = "; ".join(problems) or "no server"
        if invited_by is None:
            raise SynapseError(404, f"Could not leave {room_id}: {detail}", Codes.NOT_FOUND)
        logger.info("Rejecting the invite to %s here alone: %s", room_id, detail)
        return await self._reject_locally(user_id, room_id, content)

    async def _reject_locally(self, user_id: str, room_id: str, content: Mapping[str, Any]) -> str:
        """Our leave after an invite, made and stored here only (nobody could
        be asked): after the invite, as its only child."""
        version = await self._store.get_room_version(room_id)
        current = await self._store.get_membership_in_room(user_id, room_id)
        invite = await self._store.get_event(current[1]) if current else None
        if invite is None:
            raise SynapseError(404, "No invite to reject", Codes.NOT_FOUND)
        refs: list[Any] = [invite.event_id]
        if version.event_ids is EventIdFormat.SERVER_SUFFIXED:
            refs = [[invite.event_id, {}]]
        event = {
            "room_id": room_id,
            "type": "m.room.member",
            "state_key": user_id,
            "sender": user_id,
            "content": {**content, "membership": "leave"},
            "origin": self._server_name,
            "origin_server_ts": self._clock.time_msec(),
            "depth": invite.depth + 1,
            "prev_events": refs,
            "auth_events": refs,
        }
        if version.event_ids is EventIdFormat.SERVER_SUFFIXED:
            event["event_id"] = f"${secrets.token_urlsafe(18)}:{self._server_name}"
        signed = sign_event(version, event, self._server_name, self._signing_key())
        return await self._persist_leave(version, room_id, signed)

    async def _leave_through(
        self, server: str, user_id: str, room_id: str, content: Mapping[str, Any]
    ) -> str:
        client = self._client()
        answer = _dict(
            await client.get_json(server, f"{FEDERATION_V1}/make_leave/{_q(room_id)}/{_q(user_id)}")
        )
        version = await self._store.get_room_version(room_id)
        if answer.get("room_version", version.identifier) != version.identifier:
            raise JoinAnswerError(f"the template is of room version {answer.get('room_version')}")
        signed, _ = await self._send_membership(
            server, version, answer, room_id, user_id, "leave", content
        )
        logger.info("%s left %s through %s", user_id, room_id, server)
        return await self._persist_leave(version, room_id, signed)

    async def _writer_of(self, room_id: str) -> str:
        """The room's events writer, or the one a room new here goes to."""
        writer = await self._store.get_event_writer_for_room(room_id, self._event_writers())
        if writer is None:
            writer = self._writers.writer_for("events", room_id, among=self._event_writers())
        return writer

    async def _persist_leave(self, version: RoomVersion, room_id: str, signed: Any) -> str:
        request = RemoteJoin(
            room_id=room_id,
            origin=self._server_name,
            answer={"room_version": version.identifier, "event": signed, "leave": True},
        )
        writer = await self._writer_of(room_id)
        persisted = await self._calls.call(PERSIST_REMOTE_JOIN, request, instance=writer)
        return persisted.events[0][0]

    # Invites across servers

    async def invite(self, sender: str, room_id: str, target: str, content: dict[str, Any]) -> str:
        """Our user ``sender`` invites ``target`` of another server: the
        invite is made here (on the room's extremities, checked by the
        rules), signed, sent to the target's server (``/v2/invite`` with the
        room's stripped state), and the event it countersigned stored by the
        room's writer. 403 when the rules refuse it; 404 naming the failure
        when the server cannot be had or refuses."""
        version = await self._store.get_room_version(room_id)
        template = await membership_template(
            self._store, version, room_id, sender, target, content, self._clock.time_msec()
        )
        event = {**template, "origin": self._server_name}
        if version.event_ids is EventIdFormat.SERVER_SUFFIXED:
            event["event_id"] = f"${secrets.token_urlsafe(18)}:{self._server_name}"
        signed = sign_event(version, event, self._server_name, self._signing_key())
        event_id = event_id_of(version, signed)
        server = server_of(target)
        body = {
            "room_version": version.identifier,
            "event": signed,
            "invite_room_state": await self._stripped_state(room_id, sender),
        }
        path = f"/invite/{_q(room_id)}/{_q(event_id)}"
        try:
            try:
                answer = await self._client().put_json(server, FEDERATION_V2 + path, body)
            except FederationRequestError as e:
                # v1 knows only rooms of versions 1 and 2 (it names none).
                v1_room = version.event_ids is EventIdFormat.SERVER_SUFFIXED
                if not (v1_room and _v2_unknown(e)):
                    raise
                # v1: the event, its stripped state in ``unsigned``.
                unsigned = {"invite_room_state": body["invite_room_state"]}
                v1_body = {**signed, "unsigned": unsigned}
                answer = _v1_answer(
                    await self._client().put_json(server, FEDERATION_V1 + path, v1_body)
                )
            returned = read_answer_pdu(version, room_id, _dict(answer).get("event"))
            if returned.event.event_id != event_id:
                raise JoinAnswerError("the answer's event is not our invite")
            await self._check_signatures(version, returned)
        except FederationRequestError as e:
            if e.code == 403:
                raise AuthError(403, f"{server} refused the invite: {_error_of(e)}") from e
            raise SynapseError(
                404, f"Could not invite {target}: {server}: {_error_of(e)}", Codes.NOT_FOUND
            ) from e
        except JoinAnswerError as e:
            raise SynapseError(
                404, f"Could not invite {target}: {server}: {e.reason}", Codes.NOT_FOUND
            ) from e
        await self._store.store_received_pdu(event_id, room_id, server, returned.pdu)
        writer = await self._writer_of(room_id)
        await self._calls.call(
            PERSIST_RECEIVED_EVENT, ReceivedEvent(room_id, server, returned.pdu), instance=writer
        )
        return event_id

    async def _stripped_state(self, room_id: str, sender: str) -> list[dict[str, Any]]:
        """The stripped state an invite carries (``stripped_state``) with
        the inviter's member event."""
        state_ids = await self._store.get_current_state_ids(room_id)
        member = state_ids.get(("m.room.member", sender))
        return await stripped_state(self._store, room_id, [member] if member else [])

    async def on_invite(
        self, origin: str, room_id: str, event_id: str, body: Any, v2: bool
    ) -> dict[str, Any]:
        """``PUT /v2/invite/{roomId}/{eventId}`` (``v2``; v1's body is the
        event itself): another server invites one of our users. The event is
        checked (its version, id, room, content hash, a user of ``origin``
        inviting a user of ours who exists, ``origin``'s signature),
        countersigned, and stored as our user's invite with the stripped
        state it came with; the answer is the countersigned event."""
        if not isinstance(body, dict):
            raise SynapseError(400, "The body must be an object", Codes.BAD_JSON)
        # The ACL of a room we hold (an invite to a room new here has none).
        if not await room_allows_server(self._store, room_id, origin):
            raise AuthError(403, f"{origin} is denied by the room's server ACL")
        if v2:
            pdu, identifier = body.get("event"), body.get("room_version", "1")
            stripped = body.get("invite_room_state", [])
        else:
            pdu, identifier = body, "1"
            stripped = _dict(body.get("unsigned")).get("invite_room_state", [])
        version = SPEC_ROOM_VERSIONS.get(identifier) if isinstance(identifier, str) else None
        if version is None:
            raise SynapseError(
                400,
                f"Room version {identifier!r} is not supported here",
                "M_INCOMPATIBLE_ROOM_VERSION",
            )
        if not _is_stripped_state(stripped):
            raise SynapseError(
                400,
                f"invite_room_state must be at most {MAX_STRIPPED_STATE} objects with type,"
                " state_key, sender and content",
                Codes.BAD_JSON,
            )
        try:
            received = read_answer_pdu(version, room_id, pdu)
        except JoinAnswerError as e:
            raise SynapseError(400, f"Bad invite: {e.reason}", Codes.BAD_JSON) from e
        event = received.event
        if event.event_id != event_id:
            raise SynapseError(400, f"The event's id is {event.event_id}", Codes.INVALID_PARAM)
        target = event.state_key or ""
        if event.type != "m.room.member" or event.membership != "invite":
            raise SynapseError(400, "The event is not an invite", Codes.BAD_JSON)
        if server_of(event.sender) != origin:
            raise AuthError(403, f"{event.sender} is not a user of {origin}")
        if not target.startswith("@") or server_of(target) != self._server_name:
            raise SynapseError(400, f"{target} is not a user of ours", Codes.INVALID_PARAM)
        if await self._store.get_user(target) is None:
            raise SynapseError(404, f"Unknown user {target}", Codes.NOT_FOUND)
        try:
            await self._check_signatures(version, received)
        except JoinAnswerError as e:
            raise AuthError(403, e.reason) from e
        signed = add_event_signature(version, received.pdu, self._server_name, self._signing_key())
        stored = {**signed, "unsigned": {"invite_room_state": stripped}}
        request = RemoteJoin(
            room_id=room_id,
            origin=origin,
            answer={"room_version": version.identifier, "event": stored, "invite": True},
        )
        await self._calls.call(
            PERSIST_REMOTE_JOIN, request, instance=await self._writer_of(room_id)
        )
        logger.info("%s invited %s to %s", event.sender, target, room_id)
        return {"event": signed}


#: Most stripped state events an invite may carry.
MAX_STRIPPED_STATE = 50


def _is_stripped_state(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) <= MAX_STRIPPED_STATE
        and all(
            isinstance(e, dict)
            and isinstance(e.get("type"), str)
            and isinstance(e.get("state_key"), str)
            and isinstance(e.get("sender"), str)
            and isinstance(e.get("content"), dict)
            for e in value
        )
    )


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _v2_unknown(e: FederationRequestError) -> bool:
    """Whether a v2 endpoint's refusal says the server has only v1: 400 or
    404 ``M_UNRECOGNIZED``, or a 404 with no Matrix error at all."""
    errcode = _errcode(e)
    return (e.code in (400, 404) and errcode == "M_UNRECOGNIZED") or (
        e.code == 404 and errcode is None
    )


def _v1_answer(answer: Any) -> Any:
    """A v1 answer's object, out of its ``[200, {...}]`` list."""
    return answer[1] if isinstance(answer, list) and len(answer) == 2 else answer


def _errcode(e: FederationRequestError) -> str | None:
    return e.body.get("errcode") if isinstance(e.body, dict) else None


def _error_of(e: FederationRequestError) -> str:
    """What a server's refusal said, for our client."""
    if isinstance(e.body, dict) and isinstance(e.body.get("error"), str):
        return f"{e.code} {e.body.get('errcode')}: {e.body['error']}"
    return str(e)


def _version_of(answer: Any) -> RoomVersion:
    """The room version of a make_join answer (``"1"`` when it names none,
    as the spec says); :class:`JoinAnswerError` for one we cannot join."""
    if not isinstance(answer, dict):
        raise JoinAnswerError("the make_join answer is not a JSON object")
    identifier = answer.get("room_version", "1")
    version = SPEC_ROOM_VERSIONS.get(identifier) if isinstance(identifier, str) else None
    if version is None:
        raise JoinAnswerError(f"unknown room version {identifier!r}")
    return version


class RemoteJoinWriter:
    """On a room's events writer: stores a remote join (its state and auth
    chain as outliers, the join with the state before it) or a remote leave
    (with the state we hold before it), as checked by the process that
    made it (:data:`PERSIST_REMOTE_JOIN`)."""

    def __init__(self, store: GenericWorkerStore, events: EventCreationHandler) -> None:
        self._store = store
        self._events = events

    async def persist(self, request: RemoteJoin) -> EventsPersisted:
        answer = request.answer
        version = SPEC_ROOM_VERSIONS[answer["room_version"]]
        room_id = request.room_id
        join = read_answer_pdu(version, room_id, answer["event"])
        if answer.get("invite"):
            content = attr.evolve(pdu_as_content(join.event), outlier=True)
            # Stored as sent, ``unsigned.invite_room_state`` with it.
            invite = await self._events.persist_remote_invite_as_writer(
                content, request.origin, answer["event"], version.identifier
            )
            return EventsPersisted([(invite.event_id, invite.stream_ordering)])
        if answer.get("leave"):
            state_before = await self._store.get_current_state_ids(room_id)
            others: list[ReceivedPdu] = []
            create_id = state_before.get(CREATE)
            create = await self._store.get_event(create_id) if create_id else None
            # A rejected invite to a room we never had names no create event.
            creator = create.sender if create else join.event.sender
            created_ts = create.origin_server_ts if create else join.event.origin_server_ts
        else:
            state = [read_answer_pdu(version, room_id, p) for p in answer["state"]]
            chain = [read_answer_pdu(version, room_id, p) for p in answer["auth_chain"]]
            state_before = {r.event.state_pair: r.event.event_id for r in state}  # type: ignore[misc]
            others = _by_auth_order([*chain, *state])
            create_event = next(r.event for r in state if r.event.state_pair == CREATE)
            creator, created_ts = create_event.sender, create_event.origin_server_ts
        to_persist = RemoteJoinToPersist(
            room_id=room_id,
            room_version=version.identifier,
            creator=creator,
            creation_ts=created_ts,
            origin=request.origin,
            state_before=state_before,
            pdus={r.event.event_id: r.pdu for r in [*others, join]},
        )
        outliers = [attr.evolve(pdu_as_content(r.event), outlier=True) for r in others]
        event = await self._events.persist_remote_membership_as_writer(
            to_persist, outliers, pdu_as_content(join.event)
        )
        return EventsPersisted([(event.event_id, event.stream_ordering)])


def _by_auth_order(events: Sequence[ReceivedPdu]) -> list[ReceivedPdu]:
    """``events`` without duplicates, each after its auth events among them."""
    by_id = {r.event.event_id: r for r in events}
    done: set[str] = set()
    ordered: list[ReceivedPdu] = []
    for start in sorted(by_id):
        stack = [(start, False)]
        while stack:
            event_id, expanded = stack.pop()
            if event_id in done or event_id not in by_id:
                continue
            if expanded:
                done.add(event_id)
                ordered.append(by_id[event_id])
                continue
            stack.append((event_id, True))
            stack.extend((a, False) for a in by_id[event_id].event.auth_event_ids if a not in done)
    return ordered
