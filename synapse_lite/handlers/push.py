"""Push actions: what each local member's push rules say about events about
to be persisted, computed on the room's events writer before the persist
transaction (which stores them with the events)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from synapse_lite.push.evaluator import CompiledRule, EventView, compile_ruleset, evaluate
from synapse_lite.storage.caches import LruCache

if TYPE_CHECKING:
    from synapse_lite.events import EventContent
    from synapse_lite.handlers.event_auth import RoomAuthState
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: event_id -> user_id -> (actions, highlight), for the users an event notifies.
PushActions = dict[str, dict[str, tuple[list[Any], bool]]]

#: Users whose compiled rules are kept.
COMPILED_RULES_CACHE_SIZE = 50_000


class PushActionsHandler:
    """Evaluates push rules for every local member of a room (but the sender).

    Compiled rules are cached per user and forgotten when the push_rules
    stream (or a local write) says the user's rules changed; the room's
    members and display names come from a store cache forgotten with the
    room's state.
    """

    def __init__(self, store: GenericWorkerStore) -> None:
        self._store = store
        self._compiled: LruCache[list[CompiledRule]] = LruCache(COMPILED_RULES_CACHE_SIZE)
        # Bumped by every invalidation: a compile that started before one
        # must not be cached.
        self._generation = 0
        store.add_push_rules_listener(self._forget)
        #: Off only for benchmarks comparing with evaluation off.
        self.enabled = True
        #: Seconds of CPU spent evaluating, and (event, member) evaluations.
        self.cpu_seconds = 0.0
        self.evaluations = 0

    def _forget(self, user_ids: Sequence[str]) -> None:
        self._generation += 1
        for user_id in user_ids:
            self._compiled.pop(user_id)

    async def rules_for(self, user_id: str) -> list[CompiledRule]:
        found, rules = self._compiled.get(user_id)
        if found and rules is not None:
            return rules
        generation = self._generation
        doc = await self._store.get_push_rules_doc(user_id)
        rules = compile_ruleset(doc.ruleset(user_id))
        if generation == self._generation:
            self._compiled.set(user_id, rules)
        return rules

    async def actions_for(
        self, room_id: str, events: Sequence[EventContent], state: RoomAuthState
    ) -> PushActions:
        """For each event, the local members it notifies. ``state``: the
        room's auth state (power levels, creator) as the events are checked."""
        if not self.enabled or not events:
            return {}
        members = await self._store.get_push_room_members(room_id)
        local = [(u, name) for u, name in members if self._store.hs.is_mine_id(u)]
        rules_by_user = {u: await self.rules_for(u) for u, _ in local}
        power_levels = state.power_levels or {}
        notification_levels = power_levels.get("notifications")
        if not isinstance(notification_levels, dict):
            notification_levels = {}
        result: PushActions = {}
        started = time.process_time()
        for content in events:
            event: dict[str, Any] = {
                "type": content.type,
                "room_id": room_id,
                "sender": content.sender,
                "content": content.content,
            }
            if content.state_key is not None:
                event["state_key"] = content.state_key
            view = EventView(
                event, len(members), state.user_level(content.sender), notification_levels
            )
            notified: dict[str, tuple[list[Any], bool]] = {}
            targets = list(local)
            # An invite notifies its (local, not yet joined) target.
            if (
                content.type == "m.room.member"
                and content.state_key
                and content.content.get("membership") == "invite"
                and self._store.hs.is_mine_id(content.state_key)
                and content.state_key not in rules_by_user
            ):
                invitee = content.state_key
                rules_by_user[invitee] = await self.rules_for(invitee)
                targets.append((invitee, None))
            for user_id, display_name in targets:
                if user_id == content.sender:
                    continue
                rule = evaluate(rules_by_user[user_id], view, display_name)
                if rule is not None and rule.notify:
                    notified[user_id] = (list(rule.actions), rule.highlight)
            self.evaluations += len(targets)
            if notified:
                result[content.event_id] = notified
        self.cpu_seconds += time.process_time() - started
        return result
