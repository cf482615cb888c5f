"""Push rules: the spec's server-default rule set, a user's own rules, and
the edits the client API makes to them.

A user's rules are stored as one JSON document (:class:`UserPushRules`): the
rules they added, by kind and in priority order, and what they changed of the
server-default rules (enabled, actions). Everything a client sees, and what
the evaluator runs, is :meth:`UserPushRules.ruleset`: the defaults (written
here, from the spec's "Predefined Rules") merged with the user's rules in the
spec's priority order. Edits are pure functions of a document that raise a
:class:`SynapseError` for bad input, so the writer can apply them inside one
transaction and store nothing when one fails.
"""

from __future__ import annotations

import copy
from typing import Any

import attr

from synapse_lite.api.errors import Codes, NotFoundError, SynapseError

#: The kinds of rule, highest priority first.
KINDS = ("override", "content", "room", "sender", "underride")
#: The only scope the spec defines.
SCOPE = "global"
#: Condition kinds the spec defines, with the fields each requires.
CONDITION_FIELDS: dict[str, tuple[str, ...]] = {
    "event_match": ("key", "pattern"),
    "event_property_is": ("key", "value"),
    "event_property_contains": ("key", "value"),
    "contains_display_name": (),
    "room_member_count": ("is",),
    "sender_notification_permission": ("key",),
}
#: Actions with no parameters (``dont_notify`` and ``coalesce`` are the
#: spec's legacy no-ops, still accepted).
SIMPLE_ACTIONS = ("notify", "dont_notify", "coalesce")
#: Bounds on what a client may store.
MAX_RULE_ID_LENGTH = 255
MAX_CONDITIONS = 20
MAX_ACTIONS = 20
MAX_USER_RULES = 500

_NOTIFY_SOUND_HIGHLIGHT = [
    "notify",
    {"set_tweak": "sound", "value": "default"},
    {"set_tweak": "highlight"},
]


def _match(key: str, pattern: str) -> dict[str, Any]:
    return {"kind": "event_match", "key": key, "pattern": pattern}


def default_rules(user_id: str) -> dict[str, list[dict[str, Any]]]:
    """The spec's server-default rules for ``user_id``, by kind, in order
    (``enabled`` and ``default`` included)."""
    localpart = user_id[1:].split(":", 1)[0]
    override: list[dict[str, Any]] = [
        {"rule_id": ".m.rule.master", "conditions": [], "actions": [], "enabled": False},
        {
            "rule_id": ".m.rule.suppress_notices",
            "conditions": [_match("content.msgtype", "m.notice")],
            "actions": [],
        },
        {
            "rule_id": ".m.rule.invite_for_me",
            "conditions": [
                _match("type", "m.room.member"),
                _match("content.membership", "invite"),
                _match("state_key", user_id),
            ],
            "actions": ["notify", {"set_tweak": "sound", "value": "default"}],
        },
        {
            "rule_id": ".m.rule.member_event",
            "conditions": [_match("type", "m.room.member")],
            "actions": [],
        },
        {
            "rule_id": ".m.rule.is_user_mention",
            "conditions": [
                {
                    "kind": "event_property_contains",
                    "key": "content.m\\.mentions.user_ids",
                    "value": user_id,
                }
            ],
            "actions": list(_NOTIFY_SOUND_HIGHLIGHT),
        },
        {
            "rule_id": ".m.rule.contains_display_name",
            "conditions": [{"kind": "contains_display_name"}],
            "actions": list(_NOTIFY_SOUND_HIGHLIGHT),
        },
        {
            "rule_id": ".m.rule.is_room_mention",
            "conditions": [
                {"kind": "event_property_is", "key": "content.m\\.mentions.room", "value": True},
                {"kind": "sender_notification_permission", "key": "room"},
            ],
            "actions": ["notify", {"set_tweak": "highlight"}],
        },
        {
            "rule_id": ".m.rule.roomnotif",
            "conditions": [
                {"kind": "sender_notification_permission", "key": "room"},
                _match("content.body", "@room"),
            ],
            "actions": ["notify", {"set_tweak": "highlight"}],
        },
        {
            "rule_id": ".m.rule.tombstone",
            "conditions": [_match("type", "m.room.tombstone"), _match("state_key", "")],
            "actions": ["notify", {"set_tweak": "highlight"}],
        },
        {
            "rule_id": ".m.rule.reaction",
            "conditions": [_match("type", "m.reaction")],
            "actions": [],
        },
        {
            "rule_id": ".m.rule.room.server_acl",
            "conditions": [_match("type", "m.room.server_acl"), _match("state_key", "")],
            "actions": [],
        },
        {
            "rule_id": ".m.rule.suppress_edits",
            "conditions": [
                {
                    "kind": "event_property_is",
                    "key": "content.m\\.relates_to.rel_type",
                    "value": "m.replace",
                }
            ],
            "actions": [],
        },
    ]
    content: list[dict[str, Any]] = [
        {
            "rule_id": ".m.rule.contains_user_name",
            "pattern": localpart,
            "actions": list(_NOTIFY_SOUND_HIGHLIGHT),
        }
    ]
    underride: list[dict[str, Any]] = [
        {
            "rule_id": ".m.rule.call",
            "conditions": [_match("type", "m.call.invite")],
            "actions": ["notify", {"set_tweak": "sound", "value": "ring"}],
        },
        {
            "rule_id": ".m.rule.encrypted_room_one_to_one",
            "conditions": [
                {"kind": "room_member_count", "is": "2"},
                _match("type", "m.room.encrypted"),
            ],
            "actions": ["notify", {"set_tweak": "sound", "value": "default"}],
        },
        {
            "rule_id": ".m.rule.room_one_to_one",
            "conditions": [
                {"kind": "room_member_count", "is": "2"},
                _match("type", "m.room.message"),
            ],
            "actions": ["notify", {"set_tweak": "sound", "value": "default"}],
        },
        {
            "rule_id": ".m.rule.message",
            "conditions": [_match("type", "m.room.message")],
            "actions": ["notify"],
        },
        {
            "rule_id": ".m.rule.encrypted",
            "conditions": [_match("type", "m.room.encrypted")],
            "actions": ["notify"],
        },
    ]
    rules = {"override": override, "content": content, "underride": underride}
    for kind_rules in rules.values():
        for rule in kind_rules:
            rule.setdefault("enabled", True)
            rule["default"] = True
    return rules


#: Rule ids of the server defaults -> their kind.
DEFAULT_RULE_KINDS: dict[str, str] = {
    rule["rule_id"]: kind for kind, rules in default_rules("@x:x").items() for rule in rules
}

#: Rules that stay ahead of the user's own override rules.
_FIRST_OVERRIDES = (".m.rule.master",)


# Validation of what clients send


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise SynapseError(
            400, f"Unknown push rule kind {kind!r}: one of {', '.join(KINDS)}", Codes.INVALID_PARAM
        )
    return kind


def check_scope(scope: str) -> None:
    if scope != SCOPE:
        raise SynapseError(400, "The only push rule scope is 'global'", Codes.INVALID_PARAM)


def check_rule_id(kind: str, rule_id: str) -> None:
    if not rule_id or len(rule_id) > MAX_RULE_ID_LENGTH or "/" in rule_id or "\\" in rule_id:
        raise SynapseError(
            400,
            f"A push rule id must be 1 to {MAX_RULE_ID_LENGTH} characters without '/' or '\\'",
            Codes.INVALID_PARAM,
        )


def check_actions(actions: Any) -> list[Any]:
    """The actions of a rule, or a 400 M_INVALID_PARAM naming what is wrong."""
    if not isinstance(actions, list):
        raise SynapseError(400, "'actions' must be a list", Codes.INVALID_PARAM)
    if len(actions) > MAX_ACTIONS:
        raise SynapseError(400, f"At most {MAX_ACTIONS} actions", Codes.INVALID_PARAM)
    for action in actions:
        if isinstance(action, str):
            if action not in SIMPLE_ACTIONS:
                raise SynapseError(400, f"Unknown action {action!r}", Codes.INVALID_PARAM)
        elif isinstance(action, dict):
            tweak = action.get("set_tweak")
            if not isinstance(tweak, str) or not tweak or len(tweak) > 255:
                raise SynapseError(
                    400, "An action object must have a 'set_tweak' string", Codes.INVALID_PARAM
                )
            if set(action) - {"set_tweak", "value"}:
                raise SynapseError(
                    400, "An action object has only 'set_tweak' and 'value'", Codes.INVALID_PARAM
                )
        else:
            raise SynapseError(
                400, "Each action is a string or a 'set_tweak' object", Codes.INVALID_PARAM
            )
    return actions


def check_conditions(conditions: Any) -> list[dict[str, Any]]:
    """Conditions of an override or underride rule. A kind the spec does not
    define is kept (the spec says it never matches); a defined kind missing
    a field it needs, or with a field of the wrong type, is refused."""
    if not isinstance(conditions, list):
        raise SynapseError(400, "'conditions' must be a list", Codes.INVALID_PARAM)
    if len(conditions) > MAX_CONDITIONS:
        raise SynapseError(400, f"At most {MAX_CONDITIONS} conditions", Codes.INVALID_PARAM)
    for condition in conditions:
        if not isinstance(condition, dict) or not isinstance(condition.get("kind"), str):
            raise SynapseError(400, "Each condition needs a 'kind' string", Codes.INVALID_PARAM)
        kind = condition["kind"]
        for field in CONDITION_FIELDS.get(kind, ()):
            if field not in condition:
                raise SynapseError(400, f"A {kind} condition needs '{field}'", Codes.INVALID_PARAM)
            value = condition[field]
            if field == "value":
                if not (value is None or isinstance(value, (str, int, bool))) or isinstance(
                    value, float
                ):
                    raise SynapseError(
                        400,
                        f"A {kind} condition's value is a string, integer, boolean or null",
                        Codes.INVALID_PARAM,
                    )
            elif not isinstance(value, str):
                raise SynapseError(
                    400, f"A {kind} condition's '{field}' must be a string", Codes.INVALID_PARAM
                )
        if kind == "room_member_count" and parse_member_count(condition["is"]) is None:
            raise SynapseError(
                400,
                "room_member_count 'is' is a number, optionally after ==, <, >, <= or >=",
                Codes.INVALID_PARAM,
            )
    return conditions


def parse_member_count(text: str) -> tuple[str, int] | None:
    """``("<=", 5)`` from ``"<=5"``; None if it is not a count."""
    for op in ("==", "<=", ">=", "<", ">"):
        if text.startswith(op):
            number = text[len(op) :]
            break
    else:
        op, number = "==", text
    if not number.isdigit():
        return None
    return op, int(number)


# The stored document and its edits


@attr.s(slots=True, auto_attribs=True)
class UserPushRules:
    """What a user changed: their own rules by kind (in priority order) and,
    per server-default rule id, ``{"enabled": bool, "actions": [...]}``
    overrides (either key optional)."""

    user_rules: dict[str, list[dict[str, Any]]] = attr.ib(factory=dict)
    defaults: dict[str, dict[str, Any]] = attr.ib(factory=dict)

    @classmethod
    def from_json(cls, doc: dict[str, Any] | None) -> UserPushRules:
        if not doc:
            return cls()
        return cls(dict(doc.get("user_rules", {})), dict(doc.get("defaults", {})))

    def to_json(self) -> dict[str, Any]:
        return {"user_rules": self.user_rules, "defaults": self.defaults}

    def is_default(self) -> bool:
        """Whether the user changed nothing (their rules are the defaults)."""
        return not any(self.user_rules.values()) and not self.defaults

    def copy(self) -> UserPushRules:
        return UserPushRules(copy.deepcopy(self.user_rules), copy.deepcopy(self.defaults))

    # What clients and the evaluator see

    def ruleset(self, user_id: str) -> dict[str, list[dict[str, Any]]]:
        """Every rule of the user by kind, in priority order, in the form
        of the spec's ``PushRule``."""
        defaults = default_rules(user_id)
        for rules in defaults.values():
            for rule in rules:
                changed = self.defaults.get(rule["rule_id"], {})
                if "enabled" in changed:
                    rule["enabled"] = changed["enabled"]
                if "actions" in changed:
                    rule["actions"] = changed["actions"]
        result: dict[str, list[dict[str, Any]]] = {}
        for kind in KINDS:
            mine = [_user_rule_view(kind, r) for r in self.user_rules.get(kind, [])]
            server = defaults.get(kind, [])
            if kind == "override":
                first = [r for r in server if r["rule_id"] in _FIRST_OVERRIDES]
                rest = [r for r in server if r["rule_id"] not in _FIRST_OVERRIDES]
                result[kind] = first + mine + rest
            else:
                result[kind] = mine + server
        return result

    def find(self, user_id: str, kind: str, rule_id: str) -> dict[str, Any]:
        """One rule as the client sees it; 404 M_NOT_FOUND if there is none."""
        for rule in self.ruleset(user_id)[kind]:
            if rule["rule_id"] == rule_id:
                return rule
        raise NotFoundError(f"No push rule {kind}/{rule_id}")

    # Edits (each validated first; on an error nothing has changed)

    def put_rule(
        self,
        kind: str,
        rule_id: str,
        body: dict[str, Any],
        before: str | None,
        after: str | None,
    ) -> None:
        """Add or replace one of the user's own rules (PUT .../{kind}/{ruleId})."""
        if rule_id.startswith("."):
            raise SynapseError(
                400,
                "Rule ids starting with '.' are the server's: only enabled/actions change",
                Codes.INVALID_PARAM,
            )
        if before is not None and after is not None:
            raise SynapseError(400, "Give 'before' or 'after', not both", Codes.INVALID_PARAM)
        rule: dict[str, Any] = {"rule_id": rule_id, "actions": check_actions(body.get("actions"))}
        if kind in ("override", "underride"):
            rule["conditions"] = check_conditions(body.get("conditions", []))
        elif kind == "content":
            pattern = body.get("pattern")
            if not isinstance(pattern, str) or not pattern or len(pattern) > 1000:
                raise SynapseError(
                    400, "A content rule needs a 'pattern' string", Codes.INVALID_PARAM
                )
            rule["pattern"] = pattern
        rules = self.user_rules.setdefault(kind, [])
        existing = next((r for r in rules if r["rule_id"] == rule_id), None)
        rule["enabled"] = existing.get("enabled", True) if existing else True
        anchor = before if before is not None else after
        if anchor is not None:
            if anchor.startswith("."):
                raise SynapseError(
                    400, "'before' and 'after' name one of your own rules", Codes.INVALID_PARAM
                )
            if anchor == rule_id:
                raise SynapseError(
                    400, "A rule cannot be placed next to itself", Codes.INVALID_PARAM
                )
            if not any(r["rule_id"] == anchor for r in rules):
                raise NotFoundError(f"No push rule {kind}/{anchor} to place this one next to")
        if existing is None and sum(len(r) for r in self.user_rules.values()) >= MAX_USER_RULES:
            raise SynapseError(400, f"At most {MAX_USER_RULES} push rules", Codes.INVALID_PARAM)
        if existing is not None:
            index = rules.index(existing)
            rules.remove(existing)
        else:
            # A new rule is the highest priority of its kind (the spec's
            # default placement without before/after).
            index = 0
        if anchor is not None:
            position = next(i for i, r in enumerate(rules) if r["rule_id"] == anchor)
            index = position if before is not None else position + 1
        rules.insert(index, rule)

    def delete_rule(self, user_id: str, kind: str, rule_id: str) -> None:
        if rule_id.startswith("."):
            self.find(user_id, kind, rule_id)  # 404 for an unknown one
            raise SynapseError(400, "Server-default rules cannot be deleted", Codes.INVALID_PARAM)
        rules = self.user_rules.get(kind, [])
        for rule in rules:
            if rule["rule_id"] == rule_id:
                rules.remove(rule)
                return
        raise NotFoundError(f"No push rule {kind}/{rule_id}")

    def set_enabled(self, user_id: str, kind: str, rule_id: str, enabled: Any) -> None:
        if not isinstance(enabled, bool):
            raise SynapseError(400, "'enabled' must be true or false", Codes.INVALID_PARAM)
        self._change(user_id, kind, rule_id, "enabled", enabled)

    def set_actions(self, user_id: str, kind: str, rule_id: str, actions: Any) -> None:
        self._change(user_id, kind, rule_id, "actions", check_actions(actions))

    def _change(self, user_id: str, kind: str, rule_id: str, field: str, value: Any) -> None:
        self.find(user_id, kind, rule_id)
        if rule_id.startswith("."):
            self.defaults.setdefault(rule_id, {})[field] = value
            return
        for rule in self.user_rules.get(kind, []):
            if rule["rule_id"] == rule_id:
                rule[field] = value


def _user_rule_view(kind: str, stored: dict[str, Any]) -> dict[str, Any]:
    rule: dict[str, Any] = {
        "rule_id": stored["rule_id"],
        "default": False,
        "enabled": stored.get("enabled", True),
        "actions": stored["actions"],
    }
    if kind in ("override", "underride"):
        rule["conditions"] = stored.get("conditions", [])
    elif kind == "content":
        rule["pattern"] = stored["pattern"]
    return rule
