"""The default rules against the spec's own examples, and users' own rules
(overrides, order, enable/disable), evaluated as the events writer does."""

from __future__ import annotations

from typing import Any

from twisted.trial import unittest

from synapse_lite.push.evaluator import EventView, compile_ruleset, evaluate, glob_regex
from synapse_lite.push.rules import UserPushRules

ALICE = "@alice:test.local"
ROOM = "!room:test.local"


def message(body: str, **content: Any) -> dict[str, Any]:
    """An m.text message (``sender`` among the keywords: bob by default)."""
    sender = content.pop("sender", "@bob:test.local")
    return {
        "type": "m.room.message",
        "room_id": ROOM,
        "sender": sender,
        "content": {"msgtype": "m.text", "body": body, **content},
    }


def outcome(
    event: dict[str, Any],
    rules: UserPushRules | None = None,
    members: int = 5,
    sender_level: int = 0,
    display_name: str | None = "Alice Liddell",
    levels: dict[str, Any] | None = None,
) -> tuple[str | None, bool, bool]:
    """(rule id, notify, highlight) for alice."""
    compiled = compile_ruleset((rules or UserPushRules()).ruleset(ALICE))
    view = EventView(event, members, sender_level, levels or {})
    rule = evaluate(compiled, view, display_name)
    if rule is None:
        return None, False, False
    return rule.rule_id, rule.notify, rule.highlight


class DefaultRulesTestCase(unittest.TestCase):
    def test_a_plain_message_in_a_group_notifies_without_highlight(self) -> None:
        self.assertEqual(outcome(message("hello all")), (".m.rule.message", True, False))

    def test_a_one_to_one_room(self) -> None:
        self.assertEqual(
            outcome(message("hi"), members=2), (".m.rule.room_one_to_one", True, False)
        )
        encrypted = {
            "type": "m.room.encrypted",
            "room_id": ROOM,
            "sender": "@bob:test.local",
            "content": {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "x"},
        }
        self.assertEqual(
            outcome(encrypted, members=2), (".m.rule.encrypted_room_one_to_one", True, False)
        )
        self.assertEqual(outcome(encrypted, members=3), (".m.rule.encrypted", True, False))

    def test_a_user_mention(self) -> None:
        event = message("hey", **{"m.mentions": {"user_ids": [ALICE]}})
        self.assertEqual(outcome(event), (".m.rule.is_user_mention", True, True))
        # Someone else mentioned: an ordinary message (and with m.mentions
        # present, the legacy display-name rule does not apply).
        other = message("Alice Liddell", **{"m.mentions": {"user_ids": ["@carol:test.local"]}})
        self.assertEqual(outcome(other), (".m.rule.message", True, False))

    def test_the_display_name_and_user_name_in_the_body(self) -> None:
        self.assertEqual(
            outcome(message("ask alice liddell, she knows")),
            (".m.rule.contains_display_name", True, True),
        )
        # Whole words only.
        self.assertEqual(
            outcome(message("Lewis Carrollian"), display_name="Lewis Carroll"),
            (".m.rule.message", True, False),
        )
        self.assertEqual(
            outcome(message("ping alice!"), display_name=None),
            (".m.rule.contains_user_name", True, True),
        )
        self.assertEqual(
            outcome(message("malice"), display_name=None), (".m.rule.message", True, False)
        )

    def test_a_notice_and_an_edit_do_not_notify(self) -> None:
        notice = message("bot says", msgtype="m.notice")
        self.assertEqual(outcome(notice), (".m.rule.suppress_notices", False, False))
        edit = message("* fixed", **{"m.relates_to": {"rel_type": "m.replace", "event_id": "$e"}})
        self.assertEqual(outcome(edit), (".m.rule.suppress_edits", False, False))
        reaction = {
            "type": "m.reaction",
            "room_id": ROOM,
            "sender": "@bob:test.local",
            "content": {"m.relates_to": {"rel_type": "m.annotation", "key": "+1"}},
        }
        self.assertEqual(outcome(reaction), (".m.rule.reaction", False, False))

    def test_room_mentions_need_the_senders_notification_power(self) -> None:
        event = message("hi", **{"m.mentions": {"room": True}})
        self.assertEqual(outcome(event, sender_level=0)[0], ".m.rule.message")
        self.assertEqual(outcome(event, sender_level=50), (".m.rule.is_room_mention", True, True))
        self.assertEqual(
            outcome(event, sender_level=10, levels={"room": 10})[0], ".m.rule.is_room_mention"
        )
        self.assertEqual(outcome(message("@room look"), sender_level=100)[0], ".m.rule.roomnotif")

    def test_an_invite_for_me_and_other_members_events(self) -> None:
        invite = {
            "type": "m.room.member",
            "room_id": ROOM,
            "sender": "@bob:test.local",
            "state_key": ALICE,
            "content": {"membership": "invite"},
        }
        self.assertEqual(outcome(invite), (".m.rule.invite_for_me", True, False))
        invite_other = dict(invite, state_key="@carol:test.local")
        self.assertEqual(outcome(invite_other), (".m.rule.member_event", False, False))

    def test_tombstone_highlights_and_master_silences_everything(self) -> None:
        tombstone = {
            "type": "m.room.tombstone",
            "room_id": ROOM,
            "sender": "@bob:test.local",
            "state_key": "",
            "content": {"replacement_room": "!new:x"},
        }
        self.assertEqual(outcome(tombstone), (".m.rule.tombstone", True, True))
        rules = UserPushRules()
        rules.set_enabled(ALICE, "override", ".m.rule.master", True)
        self.assertEqual(outcome(message("hello"), rules), (".m.rule.master", False, False))


class UserRulesTestCase(unittest.TestCase):
    def test_own_rules_come_first_and_can_be_disabled(self) -> None:
        rules = UserPushRules()
        rules.put_rule("room", ROOM, {"actions": []}, None, None)
        self.assertEqual(outcome(message("hi")), (".m.rule.message", True, False))
        self.assertEqual(outcome(message("hi"), rules), (ROOM, False, False))
        rules.set_enabled(ALICE, "room", ROOM, False)
        self.assertEqual(outcome(message("hi"), rules)[0], ".m.rule.message")
        # A sender rule; an override with a glob wins over it.
        rules.put_rule(
            "sender",
            "@bob:test.local",
            {"actions": ["notify", {"set_tweak": "highlight"}]},
            None,
            None,
        )
        self.assertEqual(outcome(message("hi"), rules), ("@bob:test.local", True, True))
        rules.put_rule(
            "override",
            "cats",
            {
                "actions": [],
                "conditions": [{"kind": "event_match", "key": "content.body", "pattern": "c?t*"}],
            },
            None,
            None,
        )
        self.assertEqual(outcome(message("my Cats are here"), rules)[0], "cats")
        self.assertEqual(outcome(message("dogs"), rules)[0], "@bob:test.local")
        # A content rule and changed actions of a default rule.
        rules.put_rule("content", "rust", {"actions": ["notify"], "pattern": "rust"}, None, None)
        self.assertEqual(outcome(message("rust rocks", sender="@eve:test.local"), rules)[0], "rust")
        rules.set_actions(ALICE, "underride", ".m.rule.message", [])
        self.assertEqual(
            outcome(message("hello", sender="@eve:test.local"), rules),
            (".m.rule.message", False, False),
        )

    def test_event_property_is_compares_types(self) -> None:
        rules = UserPushRules()
        rules.put_rule(
            "override",
            "flag",
            {
                "actions": ["notify"],
                "conditions": [{"kind": "event_property_is", "key": "content.flag", "value": 1}],
            },
            None,
            None,
        )
        self.assertEqual(outcome(message("x", flag=1), rules)[0], "flag")
        self.assertEqual(outcome(message("x", flag=True), rules)[0], ".m.rule.message")
        self.assertEqual(outcome(message("x", flag="1"), rules)[0], ".m.rule.message")

    def test_globs(self) -> None:
        self.assertTrue(glob_regex("m.room.*", False).search("m.room.message"))
        self.assertFalse(glob_regex("m.room.*", False).search("xm.room.message"))
        self.assertTrue(glob_regex("ca?", False).search("CAT"))
        self.assertFalse(glob_regex("ca?", False).search("cats"))
        self.assertTrue(glob_regex("cat", True).search("a cat!"))
        self.assertFalse(glob_regex("cat", True).search("concatenate"))


class DefaultRulesFastPathTestCase(unittest.TestCase):
    def test_agrees_with_evaluating_every_rule(self) -> None:
        """The shortcut for users with the default rules gives the same rule
        as the full evaluation, on every example event and member."""
        from synapse_lite.push.evaluator import DefaultRulesEvaluator, DefaultUsers

        users = [
            (ALICE, "Alice Liddell"),
            ("@bob:test.local", None),
            ("@carol:test.local", "C"),
            ("@d.e-f:test.local", "Dr. Who?"),
        ]
        indexed = DefaultUsers(users)
        template = compile_ruleset(UserPushRules().ruleset("@template:x"))
        fast = DefaultRulesEvaluator(template)
        events = [
            message("hello"),
            message("alice and carol"),
            message("is d.e-f here? ask dr. who? now"),
            message("Liddell Alice"),
            message("Alice Liddell!"),
            message("hi", **{"m.mentions": {"user_ids": ["@bob:test.local"]}}),
            message("@room alice", **{"m.mentions": {"room": True}}),
            message("note", msgtype="m.notice"),
            {
                "type": "m.room.member",
                "room_id": ROOM,
                "sender": "@eve:test.local",
                "state_key": "@carol:test.local",
                "content": {"membership": "invite"},
            },
            {
                "type": "m.room.encrypted",
                "room_id": ROOM,
                "sender": "@eve:test.local",
                "content": {},
            },
            {"type": "m.call.invite", "room_id": ROOM, "sender": "@eve:test.local", "content": {}},
        ]
        for event in events:
            for members in (2, 5):
                for level in (0, 100):
                    view = EventView(event, members, level, {})
                    base, candidates = fast.for_event(view)
                    decided = fast.outcomes(view, base, candidates, indexed)
                    for user_id, name in users:
                        full = evaluate(
                            compile_ruleset(UserPushRules().ruleset(user_id)), view, name
                        )
                        quick = decided.get(user_id, base)
                        self.assertEqual(
                            (quick and quick.rule_id, quick and quick.outcome_key),
                            (full and full.rule_id, full and full.outcome_key),
                            (event, user_id, members, level),
                        )
