"""The user's account data in /sync: global (with the push rules as
``m.push_rules``) and per room (with the tags as ``m.tag``)."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any, Protocol

from synapse_lite.handlers.sync_sections.ephemeral import filter_room_events
from synapse_lite.handlers.sync_sections.request import SyncRequest, SyncResponse
from synapse_lite.storage.databases.main.account_data import TAG_DATA_TYPE
from synapse_lite.tokens import StreamToken

if TYPE_CHECKING:
    from synapse_lite.push.rules import UserPushRules
    from synapse_lite.storage.change_tracker import PositionChangeTracker


class AccountDataStore(Protocol):
    @property
    def account_data_changes(self) -> PositionChangeTracker: ...

    @property
    def push_rules_changes(self) -> PositionChangeTracker: ...

    async def get_account_data_changes(
        self, user_id: str, from_id: int, to_id: int
    ) -> list[tuple[int, str | None, str]]: ...

    async def get_global_account_data(self, user_id: str) -> dict[str, dict[str, Any]]: ...

    async def get_room_account_data(self, user_id: str) -> dict[str, dict[str, dict[str, Any]]]: ...

    async def get_tags_for_user(self, user_id: str) -> dict[str, dict[str, dict[str, Any]]]: ...

    async def push_rules_changed(self, user_id: str, from_id: int, to_id: int) -> bool: ...

    async def get_push_rules_doc(self, user_id: str) -> UserPushRules: ...


class AccountDataSection:
    """``account_data``, and each room's ``account_data`` (for the rooms
    section to place in joined and left rooms' entries)."""

    independent = False

    def __init__(self, store: AccountDataStore) -> None:
        self._store = store

    async def add_to(self, request: SyncRequest, response: SyncResponse) -> None:
        global_data, room_data = await self.events(request.user_id, request.since, response.now)
        global_data = [d for d in global_data if request.filter.account_data.matches(d["type"], "")]
        filter_room_events(room_data, request.filter.room_account_data)
        for room_id, events in room_data.items():
            response.add_room_events(room_id, "account_data", events)
        response.put("account_data", {"events": global_data}, news=bool(global_data))

    async def events(
        self, user_id: str, since: StreamToken | None, now: StreamToken
    ) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
        """Global and per-room account data that changed in (since, now] (all
        of it when ``since`` is None), with the user's push rules as
        ``m.push_rules`` when they changed."""
        push_rules = await self._push_rules(user_id, since, now)
        if since is not None and (
            since.get("account_data") >= now.get("account_data")
            or not self._store.account_data_changes.may_have_changed(
                user_id, since.get("account_data")
            )
        ):
            return push_rules, {}
        changed_global: set[str] | None = None
        changed_rooms: set[tuple[str, str]] | None = None
        if since is not None:
            changes = await self._store.get_account_data_changes(
                user_id, since.get("account_data"), now.get("account_data")
            )
            if not changes:
                return push_rules, {}
            changed_global = {t for _, r, t in changes if r is None}
            changed_rooms = {(r, t) for _, r, t in changes if r is not None}
        global_data = push_rules + [
            {"type": t, "content": c}
            for t, c in (await self._store.get_global_account_data(user_id)).items()
            if changed_global is None or t in changed_global
        ]
        room_data: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for room_id, types in (await self._store.get_room_account_data(user_id)).items():
            for data_type, content in types.items():
                if changed_rooms is None or (room_id, data_type) in changed_rooms:
                    room_data[room_id].append({"type": data_type, "content": content})
        if changed_rooms is None or any(t == TAG_DATA_TYPE for _, t in changed_rooms):
            all_tags = await self._store.get_tags_for_user(user_id)
            if changed_rooms is not None:
                # A room whose last tag was deleted has no rows left: it is
                # sent with no tags, so clients drop the deleted one.
                for room_id, data_type in changed_rooms:
                    if data_type == TAG_DATA_TYPE:
                        all_tags.setdefault(room_id, {})
            for room_id, tags in all_tags.items():
                if changed_rooms is None or (room_id, TAG_DATA_TYPE) in changed_rooms:
                    room_data[room_id].append({"type": TAG_DATA_TYPE, "content": {"tags": tags}})
        return global_data, room_data

    async def _push_rules(
        self, user_id: str, since: StreamToken | None, now: StreamToken
    ) -> list[dict[str, Any]]:
        """``m.push_rules`` (the spec's ``{"global": ruleset}``) initially and
        when the push_rules stream changed the user's rules."""
        if since is not None:
            since_rules = since.get("push_rules")
            if since_rules >= now.get("push_rules") or not (
                self._store.push_rules_changes.may_have_changed(user_id, since_rules)
            ):
                return []
            if not await self._store.push_rules_changed(
                user_id, since.get("push_rules"), now.get("push_rules")
            ):
                return []
        doc = await self._store.get_push_rules_doc(user_id)
        return [{"type": "m.push_rules", "content": {"global": doc.ruleset(user_id)}}]
