"""``device_lists``: whose devices the client should fetch again, and whose
it may forget."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from synapse_lite.handlers.sync_sections.request import Memberships, SyncRequest, SyncResponse
from synapse_lite.tokens import RoomStreamToken, StreamToken

if TYPE_CHECKING:
    from synapse_lite.storage.change_tracker import PositionChangeTracker


class DeviceListsStore(Protocol):
    @property
    def device_list_changes(self) -> PositionChangeTracker: ...

    async def get_users_whose_devices_changed(
        self, from_id: int, to_id: int, viewer: str
    ) -> set[str]: ...

    async def get_users_in_room(self, room_id: str) -> frozenset[str]: ...

    async def get_membership_changes_in_rooms(
        self, room_ids: list[str], from_token: RoomStreamToken, to_token: RoomStreamToken
    ) -> list[tuple[str, str]]: ...


class DeviceListsSection:
    """Also answers ``GET /keys/changes`` (:meth:`changes`)."""

    independent = False

    def __init__(self, store: DeviceListsStore) -> None:
        self._store = store

    async def add_to(self, request: SyncRequest, response: SyncResponse) -> None:
        changed, left = await self.changes(
            request.user_id,
            request.memberships,
            request.joined,
            request.sharing,
            request.since,
            response.now,
        )
        response.put("device_lists", {"changed": changed, "left": left}, news=bool(changed or left))

    async def changes(
        self,
        user_id: str,
        memberships: Memberships,
        joined: list[str],
        sharing: set[str],
        since: StreamToken | None,
        now: StreamToken,
    ) -> tuple[list[str], list[str]]:
        """``device_lists``: who of the users sharing a room with ``user_id``
        changed devices or keys in (since, now], or began sharing one or
        were invited to one of its joined rooms (their keys are new to the
        client); who no longer shares any room."""
        if since is None:
            return [], []
        changed: set[str] = set()
        left: set[str] = set()
        if since.get("device_lists") < now.get(
            "device_lists"
        ) and self._store.device_list_changes.changed_among(sharing, since.get("device_lists")):
            changed = await self._store.get_users_whose_devices_changed(
                since.get("device_lists"), now.get("device_lists"), user_id
            )
            changed &= sharing
        if since.room_key != now.room_key:
            for room_id in memberships.changed:
                was_joined = memberships.at_since.get(room_id) == "join"
                if room_id in joined and not was_joined:
                    changed |= await self._store.get_users_in_room(room_id)
                elif was_joined and room_id not in joined:
                    left |= await self._store.get_users_in_room(room_id)
            others = await self._store.get_membership_changes_in_rooms(
                joined, since.room_key, now.room_key
            )
            latest: dict[str, str] = {}
            for other, membership in others:
                if other == user_id:
                    continue
                latest[other] = membership
                if membership == "join":
                    changed.add(other)
                elif membership != "invite":
                    left.add(other)
            # Invited now to a room of ours: clients encrypt to invited
            # members (shared history), so their keys are wanted before
            # they join; an invite never means they left.
            invited = {other for other, membership in latest.items() if membership == "invite"}
        else:
            invited = set()
        left -= sharing | invited
        changed = (changed & sharing) | invited
        return sorted(changed), sorted(left)
