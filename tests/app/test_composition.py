"""The composition root builds each role explicitly, and a process stops in
one order: listeners, loops, positions, CLEAR_USER_SYNC, replication, database."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, task
from twisted.trial import unittest

from synapse_lite.app.services import CallbackService, ProcessService
from synapse_lite.clock import Clock
from synapse_lite.federation.send_queue import FederationRemoteSendQueue
from synapse_lite.federation.sender.federation_sender import FederationSender
from synapse_lite.handlers.presence import PresenceFollowerHandler, PresenceWriterHandler
from synapse_lite.handlers.typing import TypingFollowerHandler, TypingWriterHandler
from synapse_lite.replication.http.devices import REGISTER_DEVICE
from synapse_lite.replication.http.send_events import SEND_EVENTS
from synapse_lite.replication.http.writes import SEND_RECEIPT, SET_PRESENCE, SET_TYPING
from synapse_lite.server import HomeServer
from tests.harness.server import DatabaseTestCase, make_config, make_homeserver


class CompositionTestCase(DatabaseTestCase):
    def build(self, **config: Any) -> dict[str, HomeServer]:
        workers = ["persister1", "writer1", "reader", "sender"]
        made = make_config(
            self.test_db,
            workers=workers,
            stream_writers={
                "events": ["persister1"],
                "typing": "writer1",
                "presence": "writer1",
                "receipts": "writer1",
            },
            federation_sender="sender",
            **config,
        )
        return {name: make_homeserver(self, made, name) for name in ["main", *workers]}

    def test_each_role_gets_its_classes_and_nothing_else(self) -> None:
        hs = self.build()
        self.assertIsInstance(hs["writer1"].typing, TypingWriterHandler)
        self.assertIsInstance(hs["writer1"].presence, PresenceWriterHandler)
        for name in ("main", "persister1", "reader", "sender"):
            self.assertIsInstance(hs[name].typing, TypingFollowerHandler)
            self.assertIsInstance(hs[name].presence, PresenceFollowerHandler)
        self.assertIsInstance(hs["main"].outbox, FederationRemoteSendQueue)
        self.assertIsInstance(hs["sender"].outbox, FederationSender)
        self.assertIsNone(hs["reader"].outbox)

        served = {
            name: {
                c
                for c in (SEND_EVENTS, SET_TYPING, SET_PRESENCE, SEND_RECEIPT, REGISTER_DEVICE)
                if h.calls.serves(c)
            }
            for name, h in hs.items()
        }
        self.assertEqual(served["persister1"], {SEND_EVENTS})
        self.assertEqual(served["writer1"], {SET_TYPING, SET_PRESENCE, SEND_RECEIPT})
        self.assertEqual(served["main"], {REGISTER_DEVICE})
        self.assertEqual(served["reader"], set())

        self.assertEqual(hs["reader"].streamer.sourced_stream_names, ["caches"])
        self.assertEqual(
            hs["persister1"].streamer.sourced_stream_names, ["events", "backfill", "caches"]
        )
        self.assertEqual(
            hs["writer1"].streamer.sourced_stream_names,
            ["presence", "typing", "receipts", "caches"],
        )
        self.assertIn("federation", hs["main"].streamer.sourced_stream_names)

    def test_no_component_holds_the_process_record(self) -> None:
        """Every component got its collaborators; none can reach the rest."""
        hs = self.build()["main"]
        handlers = hs.handlers
        components = [
            getattr(handlers, name) for name in handlers.__slots__ if name not in ("__weakref__",)
        ]
        components += [hs.typing, hs.presence, hs.outbox, hs.replication, hs.streamer, hs.calls]
        components += [hs.store, hs.directory, hs.notifier]
        for component in components:
            values = vars(component).values() if hasattr(component, "__dict__") else ()
            for value in values:
                self.assertFalse(isinstance(value, HomeServer), type(component).__name__)

    def test_the_stop_order(self) -> None:
        hs = self.build()["reader"]
        self.assertEqual(
            [child.name for child in hs.service],
            [
                "database",
                "position log",
                "http clients",
                "media jobs",
                "replication",
                "user syncs",
                "stream positions",
                "background loops",
                "rooms of removed writers",
                "listeners",
            ],
        )


class ProcessServiceTestCase(unittest.TestCase):
    def test_children_stop_one_after_another_in_reverse_order(self) -> None:
        clock = task.Clock()
        events: list[str] = []
        pending: dict[str, defer.Deferred[None]] = {}

        def stopper(name: str) -> Any:
            def stop() -> defer.Deferred[None]:
                events.append(f"stop {name}")
                pending[name] = defer.Deferred()
                return pending[name]

            return stop

        service = ProcessService(Clock(clock), "p")

        def starter(name: str) -> Any:
            return lambda: events.append(f"start {name}")

        for name in ("database", "replication", "listeners"):
            CallbackService(name, start=starter(name), stop=stopper(name)).setServiceParent(service)
        service.startService()
        self.assertEqual(events, ["start database", "start replication", "start listeners"])
        done = service.stopService()
        # The listeners drain first; nothing else stops meanwhile.
        self.assertEqual(events[3:], ["stop listeners"])
        pending["listeners"].callback(None)
        self.assertEqual(events[4:], ["stop replication"])
        # A child that never finishes is given up on after its allowance.
        clock.advance(11)
        self.assertEqual(events[5:], ["stop database"])
        pending["database"].callback(None)
        self.assertTrue(done.called)
