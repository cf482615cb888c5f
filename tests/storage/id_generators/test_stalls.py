"""A stalled stream is noticed: persisted-up-to standing still for 30 s while
this process holds unfinished ids, or while a writer holds it back; logged,
shown by the gauge and by /health. Time is a task.Clock."""

from __future__ import annotations

import json
from typing import Any, cast

from prometheus_client import REGISTRY
from twisted.internet import task
from twisted.trial import unittest
from twisted.web.test.requesthelper import DummyRequest

from synapse_lite.app.listeners import HealthResource
from synapse_lite.clock import Clock
from synapse_lite.storage.id_generators.generator import PositionsSnapshot
from synapse_lite.storage.id_generators.positions import PositionModel
from synapse_lite.storage.id_generators.stalls import StallDetector
from synapse_lite.streams.definition import IdSpace


class FakeGenerator:
    def __init__(self, name: str, positive: bool = True) -> None:
        self.stream_name = name
        self.persisted_upto = 10
        self.positions: dict[str, int] = {"me": 10}
        self.unfinished: list[int] = []
        self.id_space = IdSpace(f"{name}_seq", (), positive=positive)

    def snapshot(self) -> PositionsSnapshot:
        return PositionsSnapshot(
            self.persisted_upto, dict(self.positions), list(self.unfinished), self.id_space
        )


def gauge(stream: str, writer: str) -> float | None:
    return REGISTRY.get_sample_value(
        "synapse_lite_stream_stalled_seconds", {"stream": stream, "writer": writer}
    )


class StallDetectorTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.clock = task.Clock()
        self.events = FakeGenerator("events")

    def detector(self, *generators: tuple[FakeGenerator, bool]) -> StallDetector:
        return StallDetector(
            Clock(cast(Any, self.clock)), "me", [(cast(Any, g), w) for g, w in generators]
        )

    def test_unfinished_ids_held_for_30_seconds(self) -> None:
        detector = self.detector((self.events, True))
        detector.check()
        self.events.unfinished = [11, 12]
        self.clock.advance(29)
        self.assertEqual(detector.check(), [])
        # Persisted-up-to has stood for 31 s, but the ids were first seen at
        # 29 s: they are 2 s old.
        self.clock.advance(2)
        self.assertEqual(detector.check(), [])
        self.clock.advance(29)
        with self.assertLogs("synapse_lite.storage.id_generators.stalls", "WARNING") as logs:
            [stall] = detector.check()
        self.assertEqual((stall.stream, stall.writer), ("events", "me"))
        self.assertIn("ids 11, 12 unfinished for 31 s", stall.reason)
        self.assertIn("persisted-up-to stuck at 10 for 60 s", stall.reason)
        self.assertIn("ids 11, 12", logs.output[0])
        self.assertEqual(gauge("events", "me"), 60)
        self.assertEqual(detector.reasons(), [stall.reason])
        # Finished: it moves again, and says so.
        self.events.unfinished = []
        self.events.persisted_upto = 12
        with self.assertLogs("synapse_lite.storage.id_generators.stalls", "INFO"):
            self.assertEqual(detector.check(), [])
        self.assertEqual(gauge("events", "me"), 0)
        self.assertEqual(detector.reasons(), [])

    def test_a_new_id_after_a_quiet_spell_is_not_a_stall(self) -> None:
        detector = self.detector((self.events, True))
        detector.check()
        self.clock.advance(300)  # nothing written: persisted-up-to stands still, rightly
        detector.check()
        self.events.unfinished = [11]
        self.clock.advance(5)
        self.assertEqual(detector.check(), [])

    def test_a_writer_holding_it_back(self) -> None:
        detector = self.detector((self.events, True))
        self.events.positions = {"persister1": 180, "persister2": 10}
        detector.check()
        self.clock.advance(31)
        [stall] = detector.check()
        self.assertEqual(stall.writer, "persister2")
        self.assertIn("held back by persister2 (at 10; others are up to 180)", stall.reason)

    def test_streams_any_process_writes_are_not_held_back(self) -> None:
        caches = FakeGenerator("caches")
        caches.positions = {"gone": 10, "me": 500}
        detector = self.detector((caches, False))
        detector.check()
        self.clock.advance(60)
        self.assertEqual(detector.check(), [])

    def test_negative_streams_show_their_ids(self) -> None:
        backfill = FakeGenerator("backfill", positive=False)
        detector = self.detector((backfill, True))
        backfill.unfinished = [11]
        detector.check()
        self.clock.advance(31)
        [stall] = detector.check()
        self.assertIn("ids -11 unfinished", stall.reason)
        self.assertIn("stuck at -10", stall.reason)

    def test_health_says_degraded_with_the_reason(self) -> None:
        problems: list[str] = []
        resource = HealthResource("persister1", lambda: problems)
        self.assertEqual(
            json.loads(resource.render_GET(cast(Any, DummyRequest([])))),
            {"status": "ok", "instance": "persister1"},
        )
        problems.append("stream events: stuck")
        answer = json.loads(resource.render_GET(cast(Any, DummyRequest([]))))
        self.assertEqual(answer["status"], "degraded")
        self.assertEqual(answer["reasons"], ["stream events: stuck"])


class UnfinishedIdsTestCase(unittest.TestCase):
    def test_model_reports_its_unfinished_ids(self) -> None:
        model = PositionModel("me")
        model.load({"me": 7}, 7, writers=["me"])
        marker = model.begin_fetch()
        model.fetched([8, 9, 10])
        model.end_fetch(marker)
        model.finish([9])
        self.assertEqual(model.unfinished_ids(), [8, 10])
