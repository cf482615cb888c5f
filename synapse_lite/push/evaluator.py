"""Evaluating push rules against an event, for every local member of its room.

A user's ruleset (``rules.UserPushRules.ruleset``) is compiled once into a
list of :class:`CompiledRule` (enabled rules only, in priority order, each
condition a hashable :class:`Condition`) and cached until the push_rules
stream says the user's rules changed. Evaluating an event for many users
shares work: an :class:`EventView` flattens the event once, and remembers the
result of every condition it has checked, so a condition most users share
(the default rules) is checked once per event, not once per user; only the
conditions that name the user (their id, localpart or display name) are
checked per user.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attr

from synapse_lite.push.rules import KINDS, parse_member_count
from synapse_lite.storage.caches import LruCache

#: Rules of the spec's "legacy mentions", skipped when an event has
#: ``m.mentions`` (its sender's client uses intentional mentions).
LEGACY_MENTION_RULES = frozenset(
    (".m.rule.contains_display_name", ".m.rule.roomnotif", ".m.rule.contains_user_name")
)
#: The notification level a ``sender_notification_permission`` key needs
#: when the power levels do not say.
DEFAULT_NOTIFICATION_LEVEL = 50
MAX_INTERNED_CONDITIONS = 200_000


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Condition:
    """One condition, hashable so its result can be shared between users.
    ``kind`` is the spec's kind; ``key``/``arg`` its fields (``arg``: the
    pattern, value, member-count test or the user's display-name marker)."""

    kind: str
    key: str = ""
    arg: Any = None


@attr.s(slots=True, frozen=True, auto_attribs=True, eq=False)
class CompiledRule:
    """One enabled rule. Compiled rules are interned: users with the same rule
    share one object, so an event's result for it is computed once
    (:class:`EventView` keys its results by object identity)."""

    rule_id: str
    conditions: tuple[Condition, ...]
    actions: tuple[Any, ...]
    notify: bool
    highlight: bool
    #: Skipped for events with ``m.mentions`` (the spec's legacy mention rules).
    legacy_mention: bool
    #: Whether its result is the same for every user (no display name).
    shared: bool
    #: Equal for rules doing the same (what notifying users are grouped by).
    outcome_key: str = ""


def _flatten(value: Mapping[str, Any], prefix: str, out: dict[str, Any]) -> None:
    for key, item in value.items():
        # Dots in a key are escaped, so "m.relates_to" is "m\.relates_to".
        name = prefix + key.replace("\\", "\\\\").replace(".", "\\.")
        if isinstance(item, dict):
            _flatten(item, name + ".", out)
        else:
            out[name] = item


_glob_cache: LruCache[re.Pattern[str]] = LruCache(10_000)


def glob_regex(pattern: str, words: bool) -> re.Pattern[str]:
    """The spec's glob (``*``, ``?``) as a case-insensitive regex matching the
    whole value, or (``words``, for ``content.body``) whole words in it."""
    key = (pattern, words)
    found, compiled = _glob_cache.get(key)
    if found and compiled is not None:
        return compiled
    body = "".join(".*?" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    if words:
        text = r"(?:^|\W)" + body + r"(?:\W|$)" if body else r"^$"
    else:
        text = r"\A" + body + r"\Z"
    compiled = re.compile(text, re.IGNORECASE | re.DOTALL)
    _glob_cache.set(key, compiled)
    return compiled


class EventView:
    """One event as push rules see it, with the results of the conditions
    checked so far (shared by every user evaluated against it)."""

    def __init__(
        self,
        event: Mapping[str, Any],
        member_count: int,
        sender_level: int,
        notification_levels: Mapping[str, Any],
    ) -> None:
        self.flat: dict[str, Any] = {}
        _flatten(event, "", self.flat)
        self.room_id = event.get("room_id")
        self.sender = event.get("sender")
        content = event.get("content")
        self.has_mentions = isinstance(content, dict) and "m.mentions" in content
        body = self.flat.get("content.body")
        self.body = body if isinstance(body, str) else None
        self.member_count = member_count
        self.sender_level = sender_level
        self.notification_levels = notification_levels
        # Keyed by the identity of interned rules and conditions (alive as
        # long as the compiled rules evaluated against this view).
        self._rule_results: dict[int, bool] = {}
        self._condition_results: dict[int, bool] = {}
        self._display_name_results: dict[str, bool] = {}
        self._lower: str | None = None
        self._words: list[str] | None = None
        self.is_invite = (
            event.get("type") == "m.room.member" and self.flat.get("content.membership") == "invite"
        )
        mentioned = self.flat.get("content.m\\.mentions.user_ids")
        self.mentioned_users = (
            frozenset(u for u in mentioned if isinstance(u, str))
            if isinstance(mentioned, list)
            else frozenset()
        )

    def rule_matches(self, rule: CompiledRule, display_name: str | None) -> bool:
        if rule.legacy_mention and self.has_mentions:
            return False
        key = id(rule)
        result = self._rule_results.get(key)
        if result is None:
            result = all(self.matches(c, display_name) for c in rule.conditions)
            if rule.shared:
                self._rule_results[key] = result
        return result

    def matches(self, condition: Condition, display_name: str | None) -> bool:
        if condition.kind == "contains_display_name":
            return self.contains_display_name(display_name)
        key = id(condition)
        result = self._condition_results.get(key)
        if result is None:
            result = self._condition_results[key] = self._check(condition)
        return result

    def words(self) -> list[str]:
        """The body's words, lower case, in order."""
        if self._words is None:
            self._words = [w for w in re.split(r"\W+", self._body_lower()) if w]
        return self._words

    def contains_word(self, word: str) -> bool:
        """Whether ``word`` (no glob characters) is a whole word of the body."""
        if self.body is None or word.lower() not in self._body_lower():
            return False
        return glob_regex(word, True).search(self.body) is not None

    def contains_display_name(self, display_name: str | None) -> bool:
        if not display_name or self.body is None:
            return False
        # Most names are not in the body at all: a substring test rules them
        # out before any regex is built (one per name would thrash re's cache).
        if display_name.lower() not in self._body_lower():
            return False
        result = self._display_name_results.get(display_name)
        if result is None:
            pattern = r"(?:^|\W)" + re.escape(display_name) + r"(?:\W|$)"
            result = re.search(pattern, self.body, re.IGNORECASE) is not None
            self._display_name_results[display_name] = result
        return result

    def _body_lower(self) -> str:
        if self._lower is None:
            self._lower = (self.body or "").lower()
        return self._lower

    def _check(self, condition: Condition) -> bool:
        kind = condition.kind
        if kind == "event_match":
            value = self.flat.get(condition.key)
            if not isinstance(value, str):
                return False
            words = condition.key == "content.body"
            pattern = condition.arg
            if words and "*" not in pattern and "?" not in pattern:
                # A plain word (a user name): rule it out without a regex.
                if pattern.lower() not in self._body_lower():
                    return False
            return glob_regex(pattern, words).search(value) is not None
        if kind == "event_property_is":
            return _same(self.flat.get(condition.key, _MISSING), condition.arg)
        if kind == "event_property_contains":
            value = self.flat.get(condition.key)
            return isinstance(value, list) and any(_same(v, condition.arg) for v in value)
        if kind == "room_member_count":
            parsed = parse_member_count(condition.arg)
            if parsed is None:
                return False
            op, number = parsed
            count = self.member_count
            return {
                "==": count == number,
                "<": count < number,
                ">": count > number,
                "<=": count <= number,
                ">=": count >= number,
            }[op]
        if kind == "sender_notification_permission":
            needed = self.notification_levels.get(condition.key, DEFAULT_NOTIFICATION_LEVEL)
            if not isinstance(needed, int) or isinstance(needed, bool):
                needed = DEFAULT_NOTIFICATION_LEVEL
            return self.sender_level >= needed
        # A kind the spec does not define never matches.
        return False


_MISSING = object()


def _same(a: Any, b: Any) -> bool:
    """Canonical-JSON equality: ``True`` is not ``1``."""
    return type(a) is type(b) and a == b


def compile_ruleset(ruleset: Mapping[str, Iterable[Mapping[str, Any]]]) -> list[CompiledRule]:
    """The enabled rules in priority order, ready to evaluate."""
    compiled: list[CompiledRule] = []
    for kind in KINDS:
        for rule in ruleset.get(kind, ()):
            if not rule.get("enabled", True):
                continue
            rule_id = rule["rule_id"]
            if kind in ("override", "underride"):
                conditions = tuple(_condition(c) for c in rule.get("conditions", ()))
            elif kind == "content":
                conditions = (Condition("event_match", "content.body", rule["pattern"]),)
            elif kind == "room":
                conditions = (Condition("event_match", "room_id", rule_id),)
            else:
                conditions = (Condition("event_match", "sender", rule_id),)
            actions = tuple(rule.get("actions", ()))
            key = json.dumps([kind, rule_id, [attr.astuple(c) for c in conditions], actions])
            found, interned = _interned_rules.get(key)
            if not found or interned is None:
                if len(_conditions) > MAX_INTERNED_CONDITIONS:
                    _conditions.clear()  # only sharing is lost, never correctness
                conditions = tuple(_conditions.setdefault(c, c) for c in conditions)
                interned = CompiledRule(
                    rule_id,
                    conditions,
                    actions,
                    "notify" in actions,
                    _highlight(actions),
                    legacy_mention=rule_id in LEGACY_MENTION_RULES,
                    shared=all(c.kind != "contains_display_name" for c in conditions),
                    outcome_key=json.dumps(actions) if "notify" in actions else "",
                )
                _interned_rules.set(key, interned)
            compiled.append(interned)
    return compiled


#: Interned compiled rules and conditions (see :class:`CompiledRule`).
_interned_rules: LruCache[CompiledRule] = LruCache(200_000)
_conditions: dict[Condition, Condition] = {}


def _condition(raw: Mapping[str, Any]) -> Condition:
    kind = raw.get("kind", "")
    if kind == "event_match":
        return Condition(kind, raw.get("key", ""), raw.get("pattern", ""))
    if kind in ("event_property_is", "event_property_contains"):
        return Condition(kind, raw.get("key", ""), raw.get("value"))
    if kind == "room_member_count":
        return Condition(kind, arg=raw.get("is", ""))
    if kind == "sender_notification_permission":
        return Condition(kind, raw.get("key", ""))
    return Condition(kind)


def _highlight(actions: Iterable[Any]) -> bool:
    for action in actions:
        if isinstance(action, dict) and action.get("set_tweak") == "highlight":
            return action.get("value", True) is not False
    return False


def evaluate(
    rules: list[CompiledRule], view: EventView, display_name: str | None
) -> CompiledRule | None:
    """The first rule matching the event (None: no rule matches)."""
    for rule in rules:
        if view.rule_matches(rule, display_name):
            return rule
    return None


#: The default rules whose conditions name the user (their id, name or
#: display name), in priority order.
USER_SPECIFIC_DEFAULTS = (
    ".m.rule.invite_for_me",
    ".m.rule.is_user_mention",
    ".m.rule.contains_display_name",
    ".m.rule.contains_user_name",
)


class DefaultRulesEvaluator:
    """Evaluation for the many users who never changed their rules: the
    default rules that do not name the user are evaluated once per event
    (the ``base`` outcome); per user only the few rules naming them that come
    before it, with checks that rule most users out at once (a substring
    test for names, a set for mentions)."""

    def __init__(self, template: list[CompiledRule]) -> None:
        """``template``: the compiled default rules of any user."""
        self._template = template
        self._by_id = {rule.rule_id: rule for rule in template}

    def for_event(self, view: EventView) -> tuple[CompiledRule | None, list[str]]:
        """The first matching rule that names nobody, and the rules naming the
        user that could still come first for this event."""
        base = None
        position = len(self._template)
        for index, rule in enumerate(self._template):
            if rule.rule_id in USER_SPECIFIC_DEFAULTS:
                continue
            if view.rule_matches(rule, None):
                base, position = rule, index
                break
        candidates = []
        for index, rule in enumerate(self._template):
            if index >= position or rule.rule_id not in USER_SPECIFIC_DEFAULTS:
                continue
            if rule.legacy_mention and view.has_mentions:
                continue
            if rule.rule_id == ".m.rule.invite_for_me" and not view.is_invite:
                continue
            if rule.rule_id == ".m.rule.is_user_mention" and not view.mentioned_users:
                continue
            if rule.rule_id in (".m.rule.contains_display_name", ".m.rule.contains_user_name"):
                if view.body is None:
                    continue
            candidates.append(rule.rule_id)
        return base, candidates

    def outcomes(
        self,
        view: EventView,
        base: CompiledRule | None,
        candidates: list[str],
        users: DefaultUsers,
    ) -> dict[str, CompiledRule]:
        """For ``users`` (all with the default rules): those whose outcome is
        not ``base``, and the rule that decided it. Nothing here loops over
        the room's members: the event's words, mentions and invitee are
        looked up in ``users``' indexes, so a big room costs no more than a
        small one."""
        if not candidates:
            return {}
        hits: dict[str, set[str]] = {}
        for rule_id in candidates:
            if rule_id == ".m.rule.invite_for_me":
                state_key = view.flat.get("state_key")
                found = {state_key} if state_key in users.ids else set()
            elif rule_id == ".m.rule.is_user_mention":
                found = {u for u in view.mentioned_users if u in users.ids}
            elif rule_id == ".m.rule.contains_display_name":
                found = users.named_in(view)
            else:
                found = users.user_names_in(view)
            if found:
                hits[rule_id] = found
        different: dict[str, CompiledRule] = {}
        decided: set[str] = set()
        for rule_id in candidates:  # in priority order: the first match decides
            rule = self._by_id[rule_id]
            for user_id in hits.get(rule_id, ()):
                if user_id in decided:
                    continue
                decided.add(user_id)
                if rule is not base:
                    different[user_id] = rule
        return different


class DefaultUsers:
    """A room's local members with the default rules, indexed by what the
    rules naming a user look for: their id, their localpart as a word, their
    display name as words. Found names are confirmed with the exact check;
    names that are not plain words (punctuation inside) are checked one by
    one."""

    def __init__(self, users: list[tuple[str, str | None]]) -> None:
        self.users = users
        self.ids = frozenset(u for u, _ in users)
        self._by_localpart: dict[str, list[str]] = {}
        self._odd_localparts: list[tuple[str, str]] = []
        self._by_name: dict[str, list[str]] = {}
        self._odd_names: list[tuple[str, str]] = []
        self._longest_name = 1
        for user_id, display_name in users:
            localpart = user_id[1:].split(":", 1)[0].lower()
            if _WORD.fullmatch(localpart):
                self._by_localpart.setdefault(localpart, []).append(user_id)
            else:
                self._odd_localparts.append((user_id, localpart))
            if display_name:
                words = display_name.lower().split(" ")
                if all(_WORD.fullmatch(w) for w in words):
                    self._by_name.setdefault(" ".join(words), []).append(user_id)
                    self._longest_name = max(self._longest_name, len(words))
                else:
                    self._odd_names.append((user_id, display_name))
        self._names = dict(users)

    def __len__(self) -> int:
        return len(self.users)

    def user_names_in(self, view: EventView) -> set[str]:
        found: set[str] = set()
        for word in view.words():
            for user_id in self._by_localpart.get(word, ()):
                if view.contains_word(word):
                    found.add(user_id)
        for user_id, localpart in self._odd_localparts:
            if view.contains_word(localpart):
                found.add(user_id)
        return found

    def named_in(self, view: EventView) -> set[str]:
        found: set[str] = set()
        words = view.words()
        for size in range(1, self._longest_name + 1):
            for start in range(len(words) - size + 1):
                phrase = " ".join(words[start : start + size])
                for user_id in self._by_name.get(phrase, ()):
                    if view.contains_display_name(self._names[user_id]):
                        found.add(user_id)
        for user_id, display_name in self._odd_names:
            if view.contains_display_name(display_name):
                found.add(user_id)
        return found


_WORD = re.compile(r"\w+")


_INVITE, _MENTION, _DISPLAY_NAME, _USER_NAME = range(4)
_CHECKS = dict(
    zip(USER_SPECIFIC_DEFAULTS, (_INVITE, _MENTION, _DISPLAY_NAME, _USER_NAME), strict=True)
)
