"""The federation roles in ``synapse-lite status`` and a sender's /health
(app/status.py, app/listeners.py ``HealthResource``): readers and senders
named, each sender's destinations and stalled ones; a stalled destination
leaves the process "ok"; a malformed answer is shown, not a crash."""

from __future__ import annotations

import json
from typing import Any

from twisted.trial import unittest
from twisted.web.test.requesthelper import DummyRequest

from synapse_lite.app.listeners import HealthResource
from synapse_lite.app.status import ProcessStatus, describe_sender, federation_roles

SENDER = {
    "destinations": 12,
    "active": 3,
    "stalled": [{"destination": "b.test", "failing_since_ms": 1, "retry_interval_ms": 20_000}],
}


def status(name: str, role: str, sender: dict[str, Any] | None = None) -> ProcessStatus:
    return ProcessStatus(name, role, 1, True, "ok", None, federation_sender=sender)


class FederationStatusTestCase(unittest.TestCase):
    def test_roles_and_destinations(self) -> None:
        statuses = [
            status("main", "main process; events writer"),
            status("reader1", "federation reader"),
            status("sender1", "federation sender", SENDER),
            status("sender2", "federation sender", {**SENDER, "stalled": []}),
        ]
        self.assertEqual(
            federation_roles(statuses), "federation: readers reader1; senders sender1, sender2"
        )
        self.assertEqual(
            describe_sender(SENDER),
            "federation sender: 12 destination(s), 3 with work this run, 1 stalled: b.test",
        )

    def test_the_main_process_sending_and_serving(self) -> None:
        statuses = [status("main", "main process", {"destinations": 0, "active": 0})]
        self.assertEqual(
            federation_roles(statuses),
            "federation: readers (none: the main process serves it); senders main",
        )

    def test_a_malformed_answer_is_described(self) -> None:
        self.assertEqual(
            describe_sender({"stalled": "yes"}),
            "federation sender: ? destination(s), ? with work this run, 0 stalled",
        )
        many = {"stalled": [{"destination": f"s{i}.test"} for i in range(7)]}
        self.assertTrue(
            describe_sender(many).endswith("s0.test, s1.test, s2.test, s3.test, s4.test ...")
        )


class SenderHealthTestCase(unittest.TestCase):
    def test_stalled_destinations_leave_the_process_ok(self) -> None:
        health = HealthResource("sender1", lambda: [], lambda: {"federation_sender": SENDER})
        body = json.loads(health.render_GET(DummyRequest([b""])))  # type: ignore[arg-type]
        self.assertEqual(body["status"], "ok")
        self.assertEqual(body["federation_sender"]["stalled"][0]["destination"], "b.test")

    def test_a_degraded_process_says_both(self) -> None:
        health = HealthResource(
            "sender1", lambda: ["events stalled"], lambda: {"federation_sender": SENDER}
        )
        body = json.loads(health.render_GET(DummyRequest([b""])))  # type: ignore[arg-type]
        self.assertEqual((body["status"], body["reasons"]), ("degraded", ["events stalled"]))
        self.assertIn("federation_sender", body)
