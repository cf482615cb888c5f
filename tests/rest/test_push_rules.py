"""Push rules over the client API: the spec's default set, per-user rules
(order, enable/disable, actions), bad input, ``m.push_rules`` in /sync, and
the push_rules stream written by a worker and followed by the others."""

from __future__ import annotations

from typing import Any

from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase
from tests.harness.spec import assert_spec_response

SPEC_FILE = "pushrules.yaml"

DEFAULT_IDS = {
    "override": [
        ".m.rule.master",
        ".m.rule.suppress_notices",
        ".m.rule.invite_for_me",
        ".m.rule.member_event",
        ".m.rule.is_user_mention",
        ".m.rule.contains_display_name",
        ".m.rule.is_room_mention",
        ".m.rule.roomnotif",
        ".m.rule.tombstone",
        ".m.rule.reaction",
        ".m.rule.room.server_acl",
        ".m.rule.suppress_edits",
    ],
    "content": [".m.rule.contains_user_name"],
    "room": [],
    "sender": [],
    "underride": [
        ".m.rule.call",
        ".m.rule.encrypted_room_one_to_one",
        ".m.rule.room_one_to_one",
        ".m.rule.message",
        ".m.rule.encrypted",
    ],
}


def _ids(ruleset: dict[str, Any], kind: str) -> list[str]:
    return [r["rule_id"] for r in ruleset[kind]]


def _m_push_rules(sync: dict[str, Any]) -> dict[str, Any] | None:
    for event in sync["account_data"]["events"]:
        if event["type"] == "m.push_rules":
            return event["content"]
    return None


class PushRulesApiTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        _, clients, _ = start_cluster(self, self.test_db)
        self.alice = await ClientApi(self, clients["main"].base_url).register("alice")
        self.bob = await ClientApi(self, clients["main"].base_url).register("bob")

    async def test_the_default_rules_in_spec_order_and_form(self) -> None:
        everything = await self.alice.ok("GET", "/pushrules/")
        assert_spec_response(self, SPEC_FILE, "/pushrules/", "GET", 200, everything)
        ruleset = everything["global"]
        for kind, ids in DEFAULT_IDS.items():
            self.assertEqual(_ids(ruleset, kind), ids, kind)
        self.assertEqual(await self.alice.ok("GET", "/pushrules/global/"), ruleset)
        master = ruleset["override"][0]
        self.assertEqual((master["enabled"], master["default"]), (False, True))
        [user_name] = ruleset["content"]
        self.assertEqual(user_name["pattern"], "alice")
        invite = await self.alice.ok("GET", "/pushrules/global/override/.m.rule.invite_for_me")
        assert_spec_response(
            self, SPEC_FILE, "/pushrules/global/{kind}/{ruleId}", "GET", 200, invite
        )
        self.assertIn(
            {"kind": "event_match", "key": "state_key", "pattern": "@alice:test.local"},
            invite["conditions"],
        )

    async def test_own_rules_in_order_with_before_and_after(self) -> None:
        put = "/pushrules/global/override/"
        for rule_id in ("one", "two"):
            await self.alice.ok(
                "PUT",
                put + rule_id,
                {
                    "actions": ["notify"],
                    "conditions": [
                        {"kind": "event_match", "key": "type", "pattern": f"org.{rule_id}"}
                    ],
                },
            )
        # A new rule without before/after is the highest of its kind, after
        # the master rule.
        ruleset = await self.alice.ok("GET", "/pushrules/global/")
        self.assertEqual(_ids(ruleset, "override")[:3], [".m.rule.master", "two", "one"])
        await self.alice.ok("PUT", put + "three?after=one", {"actions": []})
        await self.alice.ok("PUT", put + "zero?before=two", {"actions": []})
        ruleset = await self.alice.ok("GET", "/pushrules/global/")
        self.assertEqual(
            _ids(ruleset, "override")[:5], [".m.rule.master", "zero", "two", "one", "three"]
        )
        self.assertEqual(_ids(ruleset, "override")[5:], DEFAULT_IDS["override"][1:])
        mine = await self.alice.ok("GET", put + "one")
        self.assertEqual(mine["default"], False)
        self.assertEqual(mine["conditions"][0]["pattern"], "org.one")
        # Replacing a rule keeps its place and its enabled state.
        await self.alice.ok("PUT", put + "one/enabled", {"enabled": False})
        await self.alice.ok("PUT", put + "one", {"actions": ["notify"], "conditions": []})
        mine = await self.alice.ok("GET", put + "one")
        self.assertEqual((mine["enabled"], mine["conditions"]), (False, []))
        ruleset = await self.alice.ok("GET", "/pushrules/global/")
        self.assertEqual(_ids(ruleset, "override")[3], "one")
        # Content, room and sender rules.
        await self.alice.ok(
            "PUT", "/pushrules/global/content/cats", {"actions": ["notify"], "pattern": "cat*"}
        )
        await self.alice.ok("PUT", "/pushrules/global/room/!r:test.local", {"actions": []})
        ruleset = await self.alice.ok("GET", "/pushrules/")
        assert_spec_response(self, SPEC_FILE, "/pushrules/", "GET", 200, ruleset)
        self.assertEqual(_ids(ruleset["global"], "content"), ["cats", ".m.rule.contains_user_name"])
        self.assertEqual(_ids(ruleset["global"], "room"), ["!r:test.local"])
        # Deleted.
        await self.alice.ok("DELETE", put + "two")
        code, body = await self.alice.request("GET", put + "two")
        self.assertEqual((code, body["errcode"]), (404, "M_NOT_FOUND"))
        # Bob's rules are his own.
        self.assertEqual(
            _ids(await self.bob.ok("GET", "/pushrules/global/"), "override"),
            DEFAULT_IDS["override"],
        )

    async def test_enabled_and_actions_of_default_and_own_rules(self) -> None:
        path = "/pushrules/global/underride/.m.rule.message"
        self.assertEqual(await self.alice.ok("GET", path + "/enabled"), {"enabled": True})
        self.assertEqual(await self.alice.ok("GET", path + "/actions"), {"actions": ["notify"]})
        await self.alice.ok("PUT", path + "/enabled", {"enabled": False})
        new_actions = ["notify", {"set_tweak": "sound", "value": "bell"}]
        await self.alice.ok("PUT", path + "/actions", {"actions": new_actions})
        rule = await self.alice.ok("GET", path)
        self.assertEqual((rule["enabled"], rule["actions"]), (False, new_actions))
        self.assertEqual(rule["default"], True)
        master = "/pushrules/global/override/.m.rule.master/enabled"
        await self.alice.ok("PUT", master, {"enabled": True})
        self.assertEqual(await self.alice.ok("GET", master), {"enabled": True})

    async def test_bad_input_is_refused_and_nothing_is_stored(self) -> None:
        before = await self.alice.ok("GET", "/pushrules/")
        base = "/pushrules/global"
        cases: list[tuple[str, str, Any, int, str]] = [
            ("GET", "/pushrules/device/", None, 400, "M_INVALID_PARAM"),
            ("GET", base + "/nonsense/x", None, 400, "M_INVALID_PARAM"),
            ("PUT", base + "/nonsense/x", {"actions": []}, 400, "M_INVALID_PARAM"),
            ("GET", base + "/override/nope", None, 404, "M_NOT_FOUND"),
            ("DELETE", base + "/override/nope", None, 404, "M_NOT_FOUND"),
            ("PUT", base + "/override/nope/enabled", {"enabled": True}, 404, "M_NOT_FOUND"),
            ("PUT", base + "/override/.m.rule.mine", {"actions": []}, 400, "M_INVALID_PARAM"),
            ("DELETE", base + "/override/.m.rule.master", None, 400, "M_INVALID_PARAM"),
            ("PUT", base + "/override/x", {}, 400, "M_INVALID_PARAM"),
            ("PUT", base + "/override/x", {"actions": ["shout"]}, 400, "M_INVALID_PARAM"),
            ("PUT", base + "/override/x", {"actions": [{"value": 1}]}, 400, "M_INVALID_PARAM"),
            ("PUT", base + "/override/x", {"actions": "notify"}, 400, "M_INVALID_PARAM"),
            (
                "PUT",
                base + "/override/x",
                {"actions": [], "conditions": [{"kind": "event_match", "key": "type"}]},
                400,
                "M_INVALID_PARAM",
            ),
            (
                "PUT",
                base + "/override/x",
                {"actions": [], "conditions": [{"kind": "room_member_count", "is": "lots"}]},
                400,
                "M_INVALID_PARAM",
            ),
            (
                "PUT",
                base + "/override/x",
                {"actions": [], "conditions": "x"},
                400,
                "M_INVALID_PARAM",
            ),
            ("PUT", base + "/content/x", {"actions": []}, 400, "M_INVALID_PARAM"),
            ("PUT", base + "/override/x?before=nope", {"actions": []}, 404, "M_NOT_FOUND"),
            (
                "PUT",
                base + "/override/x?before=.m.rule.master",
                {"actions": []},
                400,
                "M_INVALID_PARAM",
            ),
            ("PUT", base + "/override/x?before=a&after=b", {"actions": []}, 400, "M_INVALID_PARAM"),
            (
                "PUT",
                base + "/override/.m.rule.master/enabled",
                {"enabled": "yes"},
                400,
                "M_INVALID_PARAM",
            ),
            ("PUT", base + "/override/.m.rule.master/enabled", {}, 400, "M_MISSING_PARAM"),
            (
                "PUT",
                base + "/override/.m.rule.master/actions",
                {"actions": [7]},
                400,
                "M_INVALID_PARAM",
            ),
            # Paths short of a rule or past one (SyTest's 61push/80torture).
            ("PUT", "/pushrules/", {}, 400, "M_INVALID_PARAM"),
            ("PUT", base, {}, 400, "M_INVALID_PARAM"),
            ("PUT", base + "/room", {}, 400, "M_INVALID_PARAM"),
            ("PUT", base + "/room/", {}, 400, "M_INVALID_PARAM"),
            ("DELETE", base + "/room/", None, 400, "M_INVALID_PARAM"),
            ("PUT", base + "/nonsense/", {}, 400, "M_INVALID_PARAM"),
            ("PUT", base + "/override/.m.rule.master/x", {}, 400, "M_INVALID_PARAM"),
            ("GET", base + "/override/.m.rule.master/x", None, 400, "M_INVALID_PARAM"),
            ("DELETE", base + "/override/.m.rule.master/enabled", None, 405, "M_UNRECOGNIZED"),
            ("GET", base, None, 400, "M_INVALID_PARAM"),
            ("GET", base + "/room", None, 400, "M_INVALID_PARAM"),
            ("GET", "/pushrules/device", None, 400, "M_INVALID_PARAM"),
            # The ruleset is at /pushrules/ (with its slash) only.
            ("GET", "/pushrules", None, 404, "M_UNRECOGNIZED"),
        ]
        for method, path, body, status, errcode in cases:
            code, answer = await self.alice.request(method, path, body)
            self.assertEqual(
                (code, answer and answer.get("errcode")),
                (status, errcode),
                f"{method} {path} {body}",
            )
        code, _ = await self.alice.request("GET", "/pushrules/", token=None)
        self.assertEqual(code, 401)
        self.assertEqual(await self.alice.ok("GET", "/pushrules/"), before)

    async def test_changes_appear_as_m_push_rules_account_data_in_sync(self) -> None:
        first = await self.alice.sync()
        initial = _m_push_rules(first)
        assert initial is not None
        self.assertEqual(initial, await self.alice.ok("GET", "/pushrules/"))
        since = first["next_batch"]
        # Nothing new: not repeated.
        quiet = await self.alice.sync(since=since)
        self.assertIsNone(_m_push_rules(quiet))
        await self.alice.ok(
            "PUT", "/pushrules/global/sender/@bob:test.local", {"actions": ["notify"]}
        )
        changed = await self.alice.sync(since=quiet["next_batch"])
        content = _m_push_rules(changed)
        assert content is not None
        self.assertEqual(_ids(content["global"], "sender"), ["@bob:test.local"])
        # Bob's sync does not show alice's change.
        bob_first = await self.bob.sync()
        await self.alice.ok("DELETE", "/pushrules/global/sender/@bob:test.local")
        bob_next = await self.bob.sync(since=bob_first["next_batch"])
        self.assertIsNone(_m_push_rules(bob_next))


class PushRulesWorkersTestCase(DatabaseTestCase):
    async def test_written_by_its_worker_and_followed_by_the_others(self) -> None:
        servers, clients, _ = start_cluster(
            self,
            self.test_db,
            workers=["writer1", "reader"],
            stream_writers={"push_rules": "writer1"},
        )
        self.assertIn("push_rules", servers["writer1"].streamer.sourced_stream_names)
        self.assertNotIn("push_rules", servers["main"].streamer.sourced_stream_names)
        # A write made through a process that is not the writer goes to it,
        # and that process reads its own write at once.
        alice = await ClientApi(self, clients["reader"].base_url).register("alice")
        since = (await alice.sync())["next_batch"]
        await alice.ok("PUT", "/pushrules/global/override/mine", {"actions": []})
        rule = await alice.ok("GET", "/pushrules/global/override/mine")
        self.assertEqual(rule["rule_id"], "mine")
        synced = await alice.sync(since=since)
        while _m_push_rules(synced) is None:
            synced = await alice.sync(since=synced["next_batch"], timeout=10_000)
        content = _m_push_rules(synced)
        assert content is not None
        self.assertIn("mine", _ids(content["global"], "override"))
        # Every process follows the stream; main's cached rules are forgotten.
        main_store = servers["main"].store
        assert alice.user_id is not None
        user_id = alice.user_id
        await main_store.get_push_rules_doc(user_id)
        await alice.ok("PUT", "/pushrules/global/override/mine/enabled", {"enabled": False})

        async def main_sees_it() -> bool:
            doc = await main_store.get_push_rules_doc(user_id)
            return doc.find(user_id, "override", "mine")["enabled"] is False

        await eventually(main_sees_it, what="main to see the rule disabled")
        writer_position = servers["writer1"].streams["push_rules"].positions
        self.assertGreater(writer_position.persisted_upto_position(), 0)

        # The offline audit reads the stream's table like every other's, from
        # the catalog, and finds nothing wrong.
        from spark.progress import Progress
        from spark.runner import AuditOptions, run_audit
        from tests.spark.session import shared_spark

        writer = servers["writer1"]
        await writer.id_generators.flush_stream_positions()
        report = run_audit(
            AuditOptions(writer.config.config_files[0], partitions=1),
            Progress(None),
            spark=shared_spark(),
        )
        self.assertIn("push_rules", [s.stream for s in report.streams])
        self.assertEqual(list(report.findings), [])
