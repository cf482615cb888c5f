"""Relations and threads: ``/relations``, ``/threads`` and the bundled
aggregations (``unsigned["m.relations"]``) of the events served.

What a reader sees of relations follows the room's visibility rules: the
parent must be visible to them (404 otherwise, as for ``/event``) and children
they may not see are left out. Aggregations are worked out when events are
served (not stored), from ``event_relations``:

* ``m.thread``: reply count, the latest reply (as an event) and whether the
  reader took part (sent the root or a reply);
* ``m.replace``: the latest edit by the original sender, as an event;
* ``m.reference``: the ids of the events referencing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.events import Event
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.visibility import RoomVisibility, load_room_visibility
from synapse_lite.tokens import RoomStreamToken

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.handlers.pagination import PaginationHandler
    from synapse_lite.storage.databases.main import GenericWorkerStore

MAX_RELATIONS_PAGE = 1000
#: How deep ``recurse=true`` follows relations of relations (the spec's
#: suggested minimum).
RECURSION_DEPTH = 3


class RelationsHandler:
    def __init__(
        self, store: GenericWorkerStore, clock: Clock, pagination: PaginationHandler
    ) -> None:
        self._store = store
        self._clock = clock
        self._pagination = pagination

    # Bundled aggregations

    async def serve(
        self, events: list[Event], user_id: str, visibility: RoomVisibility | None = None
    ) -> list[dict[str, Any]]:
        """``events`` as clients see them, with their bundled aggregations."""
        now_ms = self._clock.time_msec()
        dicts = [e.to_client_dict(now_ms) for e in events]
        bundles = await self.bundles(events, user_id, visibility)
        for event, data in zip(events, dicts, strict=True):
            if event.event_id in bundles:
                data["unsigned"]["m.relations"] = bundles[event.event_id]
        return dicts

    async def add_bundles(self, room_id: str, dicts: list[dict[str, Any]], user_id: str) -> None:
        """Add the bundled aggregations to events of ``room_id`` already shaped
        for a client (``/messages``, ``/context``); events that a filter's
        ``event_fields`` cut down to no ``event_id`` get none."""
        dicts = [d for d in dicts if "event_id" in d]
        if not dicts:
            return
        events = await self._store.get_events([d["event_id"] for d in dicts])
        visibility = await load_room_visibility(self._store, user_id, room_id)
        bundles = await self.bundles(list(events.values()), user_id, visibility)
        for data in dicts:
            if data["event_id"] in bundles:
                data.setdefault("unsigned", {})["m.relations"] = bundles[data["event_id"]]

    async def add_bundles_to(self, dicts: list[dict[str, Any]], user_id: str) -> None:
        """Add the bundled aggregations to client-shaped events of any rooms
        the user is joined to (the /sync timelines), without visibility checks
        of the related events: one query for all of them."""
        if not dicts:
            return
        events = await self._store.get_events([d["event_id"] for d in dicts])
        bundles = await self.bundles(list(events.values()), user_id)
        for data in dicts:
            if data["event_id"] in bundles:
                data.setdefault("unsigned", {})["m.relations"] = bundles[data["event_id"]]

    async def bundles(
        self, events: list[Event], user_id: str, visibility: RoomVisibility | None = None
    ) -> dict[str, dict[str, Any]]:
        """event id -> its aggregations, for those of ``events`` that have any.
        Events related to are shown only when ``visibility`` (if given) allows."""
        ids = [e.event_id for e in events if e.redacted_because is None]
        if not ids:
            return {}
        now_ms = self._clock.time_msec()
        senders = {e.event_id: e.sender for e in events}
        threads: dict[str, list[tuple[str, str]]] = {}
        edits: dict[str, str] = {}
        references: dict[str, list[str]] = {}
        for parent, event_id, rel_type, sender in await self._store.get_aggregated_relations(ids):
            if rel_type == "m.thread":
                threads.setdefault(parent, []).append((event_id, sender))
            elif rel_type == "m.replace" and sender == senders.get(parent):
                # Only the original sender's edits count; the latest wins.
                edits[parent] = event_id
            elif rel_type == "m.reference":
                references.setdefault(parent, []).append(event_id)
        wanted = [replies[-1][0] for replies in threads.values()] + list(edits.values())
        found = await self._store.get_events(wanted) if wanted else {}

        def visible(event: Event | None) -> bool:
            return event is not None and (visibility is None or visibility.can_see(event))

        result: dict[str, dict[str, Any]] = {}
        for root, replies in threads.items():
            latest = found.get(replies[-1][0])
            if latest is None or not visible(latest):
                continue
            result.setdefault(root, {})["m.thread"] = {
                "latest_event": latest.to_client_dict(now_ms),
                "count": len(replies),
                "current_user_participated": senders.get(root) == user_id
                or any(sender == user_id for _, sender in replies),
            }
        for parent, edit_id in edits.items():
            edit = found.get(edit_id)
            if edit is not None and visible(edit):
                result.setdefault(parent, {})["m.replace"] = edit.to_client_dict(now_ms)
        for parent, children in references.items():
            result.setdefault(parent, {})["m.reference"] = {
                "chunk": [{"event_id": event_id} for event_id in children]
            }
        return result

    # /relations

    async def get_relations(
        self,
        requester: Requester,
        room_id: str,
        event_id: str,
        rel_type: str | None,
        event_type: str | None,
        from_token: str | None,
        to_token: str | None,
        limit: int,
        direction: str,
        recurse: bool,
    ) -> dict[str, Any]:
        parent = await self._pagination.get_event(requester, room_id, event_id)
        visibility = await load_room_visibility(self._store, requester.user_id, room_id)
        limit = max(0, min(limit, MAX_RELATIONS_PAGE))
        newest_first = direction == "b"
        start = (
            (await self._pagination.parse_token(from_token)).get_max_position()
            if from_token
            else None
        )
        end = (
            (await self._pagination.parse_token(to_token)).get_max_position() if to_token else None
        )
        if newest_first:
            after, upto = end, start
        else:
            after, upto = start, end
        cap = visibility.last_left_position
        if cap is not None:
            upto = cap if upto is None else min(upto, cap)
        parents = [parent.event_id]
        found: list[tuple[str, int]] = []
        for _ in range(RECURSION_DEPTH if recurse else 1):
            # Relations of relations ignore the type filters past the first
            # level (a thread's edits are still the thread's), as the spec says.
            level = await self._store.get_relation_children(
                room_id,
                parents,
                rel_type if not found else None,
                event_type if not found else None,
                after,
                upto,
                limit + 1,
                newest_first,
            )
            if not level:
                break
            found.extend(level)
            parents = [event_id for event_id, _ in level]
        found.sort(key=lambda row: row[1], reverse=newest_first)
        page = found[:limit]
        events = await self._store.get_events([event_id for event_id, _ in page])
        shown = [events[event_id] for event_id, _ in page if event_id in events]
        response: dict[str, Any] = {
            "chunk": await self.serve(visibility.filter(shown), requester.user_id, visibility)
        }
        if len(found) > limit and page:
            last = page[-1][1]
            token = RoomStreamToken(last - 1 if newest_first else last)
            response["next_batch"] = await self._store.room_token_to_string(token)
        if from_token is not None:
            response["prev_batch"] = from_token
        if recurse:
            response["recursion_depth"] = RECURSION_DEPTH
        return response

    # /threads

    async def get_threads(
        self,
        requester: Requester,
        room_id: str,
        include: str,
        from_token: str | None,
        limit: int,
    ) -> dict[str, Any]:
        visibility = await self._pagination.room_visibility(requester, room_id)
        before = None
        if from_token is not None:
            if (
                not from_token.startswith("t")
                or not from_token[1:].isdigit()
                or len(from_token) > 20
            ):
                raise SynapseError(400, "Unknown 'from' token", Codes.INVALID_PARAM)
            before = int(from_token[1:])
        limit = max(0, min(limit, MAX_RELATIONS_PAGE))
        participant = requester.user_id if include == "participated" else None
        roots = await self._store.get_thread_roots(room_id, participant, before, limit + 1)
        page = roots[:limit]
        events = await self._store.get_events([root for root, _ in page])
        shown = [events[root] for root, _ in page if root in events]
        response: dict[str, Any] = {
            "chunk": await self.serve(visibility.filter(shown), requester.user_id, visibility)
        }
        if len(roots) > limit and page:
            response["next_batch"] = f"t{page[-1][1]}"
        return response
