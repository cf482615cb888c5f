"""``presence``: the presence of the users sharing a room with the user."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from synapse_lite.handlers.sync_sections.request import Memberships, SyncRequest, SyncResponse
from synapse_lite.storage.databases.main.presence import UserPresenceState
from synapse_lite.tokens import StreamToken

if TYPE_CHECKING:
    from synapse_lite.storage.change_tracker import PositionChangeTracker


class PresenceStore(Protocol):
    @property
    def presence_changes(self) -> PositionChangeTracker: ...

    async def get_presence_for_users(self, user_ids: list[str]) -> dict[str, UserPresenceState]: ...

    async def get_presence_changes(
        self, user_ids: list[str], from_id: int, to_id: int
    ) -> list[UserPresenceState]: ...

    async def get_users_in_room(self, room_id: str) -> frozenset[str]: ...


class PresenceSection:
    """Runs after the rooms section: whoever joins a room in the response is
    newly seen, and comes with their presence."""

    independent = False

    def __init__(self, store: PresenceStore) -> None:
        self._store = store

    async def add_to(self, request: SyncRequest, response: SyncResponse) -> None:
        newly_seen = await self._newly_seen_users(
            request.user_id, request.memberships, request.since, response.joined_rooms
        )
        presence = [
            event
            for event in await self.events(
                request.sharing, request.since, response.now, request.now_ms, newly_seen
            )
            if request.filter.presence.allows(event)
        ]
        response.put("presence", {"events": presence}, news=bool(presence))

    async def _newly_seen_users(
        self,
        user_id: str,
        memberships: Memberships,
        since: StreamToken | None,
        join: dict[str, dict[str, Any]],
    ) -> set[str]:
        """Users an incremental sync introduces: the members of rooms the user
        joined since ``since``, and whoever joins a room in this response.
        Their presence comes with it, changed or not: the client has none."""
        if since is None:
            return set()
        users: set[str] = set()
        for room_id in memberships.changed:
            if room_id in join and memberships.at_since.get(room_id) != "join":
                users |= await self._store.get_users_in_room(room_id)
        for entry in join.values():
            for event in entry["timeline"]["events"] + entry["state"]["events"]:
                if event.get("type") == "m.room.member" and (
                    event.get("content", {}).get("membership") == "join"
                ):
                    users.add(str(event.get("state_key")))
        users.discard(user_id)
        return users

    async def events(
        self,
        users: set[str],
        since: StreamToken | None,
        now: StreamToken,
        now_ms: int,
        newly_seen: set[str],
    ) -> list[dict[str, Any]]:
        """Presence of ``users`` that changed since ``since`` (all of it,
        initially), plus the current presence of ``newly_seen``."""
        if since is None:
            states = list((await self._store.get_presence_for_users(sorted(users))).values())
        else:
            states = []
            if since.get("presence") < now.get("presence"):
                # Only the users whose presence may have changed are asked for.
                changed = self._store.presence_changes.changed_among(
                    sorted(users), since.get("presence")
                )
                if changed:
                    states = await self._store.get_presence_changes(
                        changed, since.get("presence"), now.get("presence")
                    )
            missing = newly_seen & users - {s.user_id for s in states}
            if missing:
                found = await self._store.get_presence_for_users(sorted(missing))
                states.extend(found.get(u) or UserPresenceState.default(u) for u in sorted(missing))
        return [
            {"type": "m.presence", "sender": s.user_id, "content": s.to_client_content(now_ms)}
            for s in states
        ]
