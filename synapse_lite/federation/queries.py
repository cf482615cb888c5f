"""Questions our clients ask about other servers' users, aliases and room
directories, asked of those servers: ``GET /_matrix/federation/v1/query/profile``,
``/query/directory`` and ``GET``/``POST /publicRooms``.

Any process serving the client API may ask. One that takes part in
federation anyway uses its federation client; another (a client worker)
makes its own on the first question, reading the signing key the main
process created. Answers are checked before they are used: a server answers
for its own users and aliases only, in the shapes the spec gives.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.api.errors import Codes, NotFoundError, SynapseError
from synapse_lite.federation.client import FederationClient, FederationRequestError
from synapse_lite.federation.crypto import SigningKeyFileError, load_or_create_signing_key
from synapse_lite.federation.discovery import ServerNameError, parse_server_name

if TYPE_CHECKING:
    from synapse_lite.config.federation import FederationConfig
    from synapse_lite.handlers.directory import PublicRoomsQuery

logger = logging.getLogger(__name__)

QUERY_PREFIX = "/_matrix/federation/v1/query"
PUBLIC_ROOMS_PATH = "/_matrix/federation/v1/publicRooms"
HIERARCHY_PATH = "/_matrix/federation/v1/hierarchy"
PROFILE_FIELDS = ("displayname", "avatar_url")
#: The most rooms of another server's directory page we pass on.
MAX_REMOTE_PUBLIC_ROOMS = 500
_ROOM_STRINGS = (
    "name",
    "topic",
    "canonical_alias",
    "avatar_url",
    "join_rule",
    "room_type",
    "encryption",
    "room_version",
)
_ROOM_FLAGS = ("world_readable", "guest_can_join")


#: The most ``children_state`` entries kept of one room's summary.
MAX_CHILDREN_STATE = 500


def check_room_chunk(room: Any) -> dict[str, Any] | None:
    """A room of another server's ``/publicRooms`` or ``/hierarchy`` answer
    with only the keys of the spec's room summary, of their types; None when
    a required one is missing or of the wrong type. ``allowed_room_ids`` is
    kept when it is a list of strings, ``children_state`` (hierarchy) when
    present, without the entries that are not ``m.space.child`` stripped
    events with an ``origin_server_ts``."""
    if not isinstance(room, dict):
        return None
    members = room.get("num_joined_members")
    room_id = room.get("room_id")
    if (
        not isinstance(room_id, str)
        or not room_id.startswith("!")
        or isinstance(members, bool)
        or not isinstance(members, int)
        or not all(isinstance(room.get(k), bool) for k in _ROOM_FLAGS)
    ):
        return None
    entry: dict[str, Any] = {"room_id": room_id, "num_joined_members": members}
    entry.update({k: room[k] for k in _ROOM_FLAGS})
    entry.update({k: room[k] for k in _ROOM_STRINGS if isinstance(room.get(k), str)})
    allowed = room.get("allowed_room_ids")
    if isinstance(allowed, list) and all(isinstance(r, str) for r in allowed):
        entry["allowed_room_ids"] = allowed
    children = room.get("children_state")
    if isinstance(children, list):
        entry["children_state"] = [c for c in children[:MAX_CHILDREN_STATE] if _is_child_state(c)]
    return entry


def _is_child_state(child: Any) -> bool:
    ts = child.get("origin_server_ts") if isinstance(child, dict) else None
    return (
        isinstance(child, dict)
        and child.get("type") == "m.space.child"
        and isinstance(child.get("state_key"), str)
        and isinstance(child.get("sender"), str)
        and isinstance(child.get("content"), dict)
        and isinstance(ts, int)
        and not isinstance(ts, bool)
    )


def check_public_rooms_answer(server: str, answer: Any, limit: int | None) -> dict[str, Any]:
    """Another server's ``/publicRooms`` answer in the spec's shape, for our
    client: rooms failing :func:`check_room_chunk` are left out (logged);
    unknown keys are dropped; at most ``limit`` (and
    :data:`MAX_REMOTE_PUBLIC_ROOMS`) rooms. No ``chunk`` list at all is a
    :class:`RemoteUnavailable`."""
    chunk = answer.get("chunk") if isinstance(answer, dict) else None
    if not isinstance(chunk, list):
        raise RemoteUnavailable(server, "the answer has no 'chunk' list")
    most = MAX_REMOTE_PUBLIC_ROOMS if limit is None else min(limit, MAX_REMOTE_PUBLIC_ROOMS)
    rooms: list[dict[str, Any]] = []
    dropped = 0
    for room in chunk[:most]:
        entry = check_room_chunk(room)
        if entry is None:
            dropped += 1
        else:
            entry.pop("children_state", None)
            rooms.append(entry)
    if dropped:
        logger.info("Left out %d malformed rooms of %s's public room list", dropped, server)
    result: dict[str, Any] = {"chunk": rooms}
    for key in ("next_batch", "prev_batch"):
        if isinstance(answer.get(key), str):
            result[key] = answer[key]
    estimate = answer.get("total_room_count_estimate")
    if isinstance(estimate, int) and not isinstance(estimate, bool) and estimate >= 0:
        result["total_room_count_estimate"] = estimate
    return result


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RemoteHierarchy:
    """Another server's ``/hierarchy`` answer, checked."""

    #: The space's summary, with its ``children_state``.
    room: dict[str, Any]
    #: Summaries of the children it could give, by room id.
    children: dict[str, dict[str, Any]]
    #: Children it says we cannot peek or join.
    inaccessible: frozenset[str]


def check_hierarchy_answer(server: str, room_id: str, answer: Any) -> RemoteHierarchy:
    """``server``'s answer about ``room_id``: its ``room`` must be a valid
    summary of that room (else :class:`RemoteUnavailable`); malformed
    children and ids are left out; at most :data:`MAX_CHILDREN_STATE` of
    each."""
    room = check_room_chunk(answer.get("room")) if isinstance(answer, dict) else None
    if room is None or room["room_id"] != room_id:
        raise RemoteUnavailable(server, f"the answer has no summary of {room_id}")
    room.setdefault("children_state", [])
    children: dict[str, dict[str, Any]] = {}
    raw_children = answer.get("children")
    for child in raw_children[:MAX_CHILDREN_STATE] if isinstance(raw_children, list) else []:
        entry = check_room_chunk(child)
        if entry is not None:
            entry.pop("children_state", None)
            children[entry["room_id"]] = entry
    raw_inaccessible = answer.get("inaccessible_children")
    inaccessible = frozenset(
        r
        for r in (
            raw_inaccessible[:MAX_CHILDREN_STATE] if isinstance(raw_inaccessible, list) else []
        )
        if isinstance(r, str)
    )
    return RemoteHierarchy(room, children, inaccessible)


class RemoteUnavailable(SynapseError):
    """The other server could not be asked, or answered nonsense: for our
    client a 404 saying why (the profile or alias is not to be had here; a
    client-API answer is never a 5xx for what a user can name)."""

    def __init__(self, server: str, why: str) -> None:
        super().__init__(
            404, f"Not found: no answer could be had from {server}: {why}", Codes.NOT_FOUND
        )


class FederationQueries:
    """Profile and alias lookups on other servers."""

    def __init__(self, get_client: Callable[[], FederationClient]) -> None:
        self._get_client = get_client

    @classmethod
    def on_demand(
        cls, config: FederationConfig, data_dir: str, reactor: Any, server_name: str
    ) -> tuple[FederationQueries, Callable[[], Any]]:
        """Queries with a client made at the first question; and what closes
        that client (if it was made) at shutdown."""
        made: list[FederationClient] = []

        def get_client() -> FederationClient:
            if not made:
                try:
                    key = load_or_create_signing_key(data_dir, create=False)
                except SigningKeyFileError as e:
                    raise SynapseError(503, str(e), Codes.UNKNOWN) from e
                made.append(FederationClient(config, reactor, key, server_name))
            return made[0]

        async def close() -> None:
            for client in made:
                await client.close()

        return cls(get_client), close

    def client(self) -> FederationClient:
        """The federation client these queries use (made now if it was not:
        503 when the signing key does not exist yet)."""
        return self._get_client()

    async def _ask(
        self,
        server: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        refusal_is_ours: bool = False,
    ) -> Any:
        """``server``'s answer to ``path`` (POST ``body`` when given). Its
        404 is ours; with ``refusal_is_ours`` its 400 too (the client's
        parameters were passed on as they were: a bad ``since`` token is the
        client's mistake); anything else a :class:`RemoteUnavailable`."""
        try:
            parse_server_name(server)
        except ServerNameError as e:
            raise SynapseError(400, f"Not a valid server name: {e}", Codes.INVALID_PARAM) from e
        try:
            if body is not None:
                return await self._get_client().post_json(server, path, body)
            return await self._get_client().get_json(server, path)
        except FederationRequestError as e:
            if e.code == 404:
                raise NotFoundError(f"{server} does not know it") from e
            if e.code == 400 and refusal_is_ours:
                raise SynapseError(
                    400, f"{server} refused the request: {e}", Codes.INVALID_PARAM
                ) from e
            logger.info("A query to %s failed: %s", server, e)
            raise RemoteUnavailable(server, str(e)) from e

    async def profile(self, user_id: str, field: str | None = None) -> dict[str, Any]:
        """``user_id``'s profile from its server (only ``field`` with one)."""
        server = user_id.split(":", 1)[1]
        query = {"user_id": user_id, **({"field": field} if field else {})}
        answer = await self._ask(server, f"{QUERY_PREFIX}/profile?{urllib.parse.urlencode(query)}")
        if not isinstance(answer, dict):
            raise RemoteUnavailable(server, "the profile is not a JSON object")
        profile: dict[str, Any] = {}
        for name in PROFILE_FIELDS if field is None else (field,):
            value = answer.get(name)
            if value is not None and not isinstance(value, str):
                raise RemoteUnavailable(server, f"'{name}' is not a string")
            if value is not None:
                profile[name] = value
        return profile

    async def directory(self, alias: str) -> dict[str, Any]:
        """``{room_id, servers}`` of ``alias`` from its server."""
        server = alias.split(":", 1)[1]
        query = urllib.parse.urlencode({"room_alias": alias})
        answer = await self._ask(server, f"{QUERY_PREFIX}/directory?{query}")
        room_id = answer.get("room_id") if isinstance(answer, dict) else None
        servers = answer.get("servers") if isinstance(answer, dict) else None
        if not isinstance(room_id, str) or not room_id.startswith("!"):
            raise RemoteUnavailable(server, "the answer has no room_id")
        if not isinstance(servers, list) or not all(isinstance(s, str) for s in servers):
            raise RemoteUnavailable(server, "the answer has no list of servers")
        return {"room_id": room_id, "servers": servers}

    async def public_rooms(self, server: str, query: PublicRoomsQuery) -> dict[str, Any]:
        """``server``'s public room list as :func:`check_public_rooms_answer`
        passes it: ``GET`` when only ``limit``, ``since`` and the networks
        are asked for, ``POST`` with a search filter (the spec has both)."""
        if query.search_term is None and query.room_types is None:
            params: dict[str, str] = {}
            if query.limit is not None:
                params["limit"] = str(query.limit)
            if query.since is not None:
                params["since"] = query.since
            if query.all_networks:
                params["include_all_networks"] = "true"
            if query.instance_id is not None:
                params["third_party_instance_id"] = query.instance_id
            path = PUBLIC_ROOMS_PATH + (f"?{urllib.parse.urlencode(params)}" if params else "")
            answer = await self._ask(server, path, refusal_is_ours=True)
        else:
            answer = await self._ask(
                server, PUBLIC_ROOMS_PATH, query.to_body(), refusal_is_ours=True
            )
        return check_public_rooms_answer(server, answer, query.limit)

    async def hierarchy(self, server: str, room_id: str, suggested_only: bool) -> RemoteHierarchy:
        """``GET /hierarchy/{roomId}`` of ``server``, checked
        (:func:`check_hierarchy_answer`)."""
        path = f"{HIERARCHY_PATH}/{urllib.parse.quote(room_id, safe='')}"
        if suggested_only:
            path += "?suggested_only=true"
        return check_hierarchy_answer(server, room_id, await self._ask(server, path))
