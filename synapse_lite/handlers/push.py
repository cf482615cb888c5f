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

from synapse_lite.api.identifiers import is_mine_id
from synapse_lite.push.evaluator import (
    CompiledRule,
    DefaultRulesEvaluator,
    DefaultUsers,
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

    def __init__(self, store: GenericWorkerStore, server_name: str) -> None:
        self._store = store
        self._server_name = server_name
        self._compiled: LruCache[list[CompiledRule] | None] = LruCache(COMPILED_RULES_CACHE_SIZE)
        self._defaults = DefaultRulesEvaluator(
            compile_ruleset(UserPushRules().ruleset("@template:invalid"))
        )
        # Bumped by every invalidation: a compile that started before one
        # must not be cached.
        self._generation = 0
        store.add_push_rules_listener(self._forget)
        #: room_id -> (members tuple, rules generation, default users, users
        #: with rules of their own).
        self._room_cache: dict[str, tuple[Any, int, DefaultUsers, Any]] = {}
        #: Off only for benchmarks comparing with evaluation off.
        self.enabled = True
        #: Seconds spent evaluating (the rules' loop on the reactor thread,
        #: not the reads before it), and (event, member) evaluations.
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

    async def actions_for(
        self, room_id: str, events: Sequence[EventContent], state: RoomAuthState
    ) -> PushActions:
        """For each event, what it does for the room's local members (but its
        sender). ``state``: the room's auth state (power levels, creator) as
        the events are checked."""
        if not self.enabled or not events:
            return {}
        members = await self._store.get_push_room_members(room_id)
        default_users, own_rules = await self._room_users(room_id, members)
        # The evaluation's time on the reactor thread (it waits for nothing
        # but an invitee's rules): a wall clock, as a CPU-time clock is a
        # system call that cost 5-300 us a read here (issue 35).
        started = time.perf_counter()
        power_levels = state.power_levels or {}
        notification_levels = power_levels.get("notifications")
        if not isinstance(notification_levels, dict):
            notification_levels = {}
        result: PushActions = {}
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
            base, candidates = self._defaults.for_event(view)
            sender = content.sender
            # Users with the defaults: ``base`` unless a rule naming them
            # decides otherwise; users with rules of their own: evaluated.
            others: dict[str, CompiledRule | None] = dict(
                self._defaults.outcomes(view, base, candidates, default_users)
            )
            others.pop(sender, None)
            for user_id, (display_name, rules) in own_rules.items():
                if user_id != sender:
                    others[user_id] = evaluate(rules, view, display_name)
            # Default users left at ``base``: all but the sender and those
            # a rule naming them decided for.
            base_users = (
                len(default_users)
                - len([u for u in others if u not in own_rules])
                - (1 if sender in default_users.ids else 0)
            )
            self.evaluations += len(default_users) + len(own_rules)
            actions = _group(base, base_users, others, default_users, sender)
            invitee = content.state_key
            if (
                content.type == "m.room.member"
                and invitee
                and content.content.get("membership") == "invite"
                and is_mine_id(invitee, self._server_name)
            ):
                # An invite notifies its (local, not yet joined) target.
                found, invitee_rules = self._compiled.get(invitee)
                if not found:
                    invitee_rules = await self.rules_for(invitee)
                if invitee_rules is None:
                    decided = self._defaults.outcomes(
                        view, base, candidates, DefaultUsers([(invitee, None)])
                    )
                    rule = decided.get(invitee, base)
                else:
                    rule = evaluate(invitee_rules, view, None)
                if rule is not None and rule.notify:
                    actions.exceptions[invitee] = (list(rule.actions), True, rule.highlight)
            if actions.default is not None or actions.exceptions:
                result[content.event_id] = actions
        self.cpu_seconds += time.perf_counter() - started
        return result

    async def _room_users(
        self, room_id: str, members: tuple[tuple[str, str | None], ...]
    ) -> tuple[DefaultUsers, dict[str, tuple[str | None, list[CompiledRule]]]]:
        """The room's local members with the default rules (``(user_id,
        display name, lower-case localpart)``) and those with rules of their
        own, remembered while the room's members and everyone's rules stay
        the same."""
        known = self._room_cache.get(room_id)
        if known is not None and known[0] is members and known[1] == self._generation:
            return known[2], known[3]
        generation = self._generation
        defaults: list[tuple[str, str | None]] = []
        own_rules: dict[str, tuple[str | None, list[CompiledRule]]] = {}
        for user_id, display_name in members:
            if not is_mine_id(user_id, self._server_name):
                continue
            found, rules = self._compiled.get(user_id)
            if not found:
                rules = await self.rules_for(user_id)
            if rules is None:
                defaults.append((user_id, display_name))
            else:
                own_rules[user_id] = (display_name, rules)
        default_users = DefaultUsers(defaults)
        if generation == self._generation:
            if len(self._room_cache) > 10_000:
                self._room_cache.clear()
            self._room_cache[room_id] = (members, generation, default_users, own_rules)
        return default_users, own_rules


def _group(
    base: CompiledRule | None,
    base_users: int,
    others: dict[str, CompiledRule | None],
    default_users: DefaultUsers,
    sender: str,
) -> EventPushActions:
    """The most common outcome as the event's default, the others as
    exceptions. ``base_users`` members have the outcome ``base``; ``others``
    maps the rest to theirs."""
    counts: Counter[str] = Counter()
    by_key: dict[str, CompiledRule | None] = {}
    base_key = base.outcome_key if base is not None else ""
    counts[base_key] += base_users
    by_key[base_key] = base if base_key else None
    for rule in others.values():
        key = rule.outcome_key if rule is not None else ""
        counts[key] += 1
        by_key.setdefault(key, rule if key else None)
    if not +counts:
        return EventPushActions(None, {})
    common_key = counts.most_common(1)[0][0]
    common = by_key[common_key]
    exceptions: dict[str, tuple[list[Any], bool, bool]] = {}

    def add(user_id: str, rule: CompiledRule | None) -> None:
        key = rule.outcome_key if rule is not None else ""
        if key == common_key:
            return
        if rule is None or not rule.notify:
            exceptions[user_id] = ([], False, False)
        else:
            exceptions[user_id] = (list(rule.actions), True, rule.highlight)

    for user_id, rule in others.items():
        add(user_id, rule)
    if base_key != common_key:
        # Rare: the users left at ``base`` are not the majority.
        for user_id, _ in default_users.users:
            if user_id != sender and user_id not in others:
                add(user_id, base)
    default = None if common is None else (list(common.actions), common.highlight)
    return EventPushActions(default, exceptions)
