"""Push actions: what each local member's push rules say about events about
to be persisted, computed on the room's events writer before the persist
transaction (which stores them with the events)."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.push.evaluator import (
    CompiledRule,
    DefaultRulesEvaluator,
    EventView,
    compile_ruleset,
    evaluate,
)
from synapse_lite.push.rules import UserPushRules
from synapse_lite.storage.caches import LruCache

if TYPE_CHECKING:
    from synapse_lite.events import EventContent
    from synapse_lite.handlers.event_auth import RoomAuthState
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class EventPushActions:
    """What one event does for the local members evaluated: ``default``
    ``(actions, highlight)`` for every local member joined when it is sent
    (but its sender) unless ``exceptions`` has a row for them (None: it
    notifies nobody by default); ``exceptions``: user -> ``(actions,
    notify, highlight)`` where a member's outcome differs from the default
    (or the member is an invitee). Stored so, most events of a big room
    cost one row, not one per member."""

    default: tuple[list[Any], bool] | None
    exceptions: dict[str, tuple[list[Any], bool, bool]]


#: event_id -> what it does, for the events that notify anyone.
PushActions = dict[str, EventPushActions]

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
        self._compiled: LruCache[list[CompiledRule] | None] = LruCache(COMPILED_RULES_CACHE_SIZE)
        self._defaults = DefaultRulesEvaluator(
            compile_ruleset(UserPushRules().ruleset("@template:invalid"))
        )
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

    async def rules_for(self, user_id: str) -> list[CompiledRule] | None:
        """The user's compiled rules; None when they are the defaults (the
        :class:`DefaultRulesEvaluator` evaluates those)."""
        found, rules = self._compiled.get(user_id)
        if found:
            return rules
        generation = self._generation
        doc = await self._store.get_push_rules_doc(user_id)
        rules = None if doc.is_default() else compile_ruleset(doc.ruleset(user_id))
        if generation == self._generation:
            self._compiled.set(user_id, rules)
        return rules

    def _evaluate(
        self,
        rules: list[CompiledRule] | None,
        view: EventView,
        fast: tuple[CompiledRule | None, list[str]],
        user_id: str,
        display_name: str | None,
    ) -> CompiledRule | None:
        if rules is None:
            return self._defaults.outcome(view, fast[0], fast[1], user_id, display_name)
        return evaluate(rules, view, display_name)

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
            fast = self._defaults.for_event(view)
            outcomes: dict[str, CompiledRule | None] = {}
            targets = list(local)
            # An invite notifies its (local, not yet joined) target.
            invitee: str | None = None
            if (
                content.type == "m.room.member"
                and content.state_key
                and content.content.get("membership") == "invite"
                and self._store.hs.is_mine_id(content.state_key)
                and content.state_key not in rules_by_user
            ):
                invitee = content.state_key
                rules_by_user[invitee] = await self.rules_for(invitee)
            for user_id, display_name in targets:
                if user_id != content.sender:
                    outcomes[user_id] = self._evaluate(
                        rules_by_user[user_id], view, fast, user_id, display_name
                    )
            self.evaluations += len(outcomes)
            actions = _group(outcomes)
            if invitee is not None:
                rule = self._evaluate(rules_by_user[invitee], view, fast, invitee, None)
                if rule is not None and rule.notify:
                    actions.exceptions[invitee] = (list(rule.actions), True, rule.highlight)
            if actions.default is not None or actions.exceptions:
                result[content.event_id] = actions
        self.cpu_seconds += time.process_time() - started
        return result


def _group(outcomes: dict[str, CompiledRule | None]) -> EventPushActions:
    """The most common outcome as the default, the others as exceptions."""
    counts: Counter[str] = Counter()
    by_key: dict[str, CompiledRule | None] = {}
    for rule in outcomes.values():
        key = rule.outcome_key if rule is not None else ""
        counts[key] += 1
        by_key[key] = rule if key else None
    if not counts:
        return EventPushActions(None, {})
    common_key = counts.most_common(1)[0][0]
    common = by_key[common_key]
    exceptions: dict[str, tuple[list[Any], bool, bool]] = {}
    for user_id, rule in outcomes.items():
        key = rule.outcome_key if rule is not None else ""
        if key == common_key:
            continue
        if rule is None or not rule.notify:
            exceptions[user_id] = ([], False, False)
        else:
            exceptions[user_id] = (list(rule.actions), True, rule.highlight)
    default = None if common is None else (list(common.actions), common.highlight)
    return EventPushActions(default, exceptions)
