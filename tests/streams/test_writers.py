"""The writers directory (``streams/writers.py``): its rule, its answers, and
that the routing table, the internal calls and each process's role agree
with it for every layout ``generate-config`` writes and for a sharded one."""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st
from twisted.trial import unittest

from synapse_lite.app.role import Role
from synapse_lite.config.generate import LAYOUTS
from synapse_lite.config.homeserver import MAIN_PROCESS, HomeServerConfig, load_config
from synapse_lite.handlers.pusher_delivery import owner_of
from synapse_lite.replication.http import (
    devices,
    e2e_keys,
    instances,
    send_events,
    stream_updates,
    writes,
)
from synapse_lite.replication.http.calls import InternalCall
from synapse_lite.routing.table import BALANCE_ROOM, BALANCE_SINGLE, BALANCE_USER, RoutingTable
from synapse_lite.streams.catalog import BUILTIN_STREAMS
from synapse_lite.streams.definition import ShardKey, StableHash, WriterRule
from synapse_lite.streams.writers import (
    MAIN,
    READERS_ROLE,
    ROOM_EVENTS_WRITER_ROLE,
    STREAM_WRITER_ROLE,
    ServedBy,
    WritersDirectory,
    writer_of,
)
from tests.routing.test_table import layout_config

names = st.lists(
    st.text(alphabet="abcdefgh123", min_size=1, max_size=6), min_size=1, max_size=6, unique=True
)


def _old_hash(key: str, instances: list[str]) -> str:
    """The hash the events writers, the device-list writers and the pushers
    were each chosen by before the directory: any change moves rooms, users
    or pushers to another process on upgrade."""
    return instances[
        int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % len(instances)
    ]


class StableHashTestCase(unittest.TestCase):
    @given(key=st.text(max_size=40), instances=names)
    def test_the_same_choice_as_before(self, key: str, instances: list[str]) -> None:
        events = BUILTIN_STREAMS["events"].writers.shard
        device_lists = BUILTIN_STREAMS["device_lists"].writers.shard
        assert events is not None and device_lists is not None
        self.assertEqual(events.pick(key, instances), _old_hash(key, sorted(instances)))
        self.assertEqual(device_lists.pick(key, instances), _old_hash(key, instances))
        pusher = (key, "pushkey", "@u:x")
        self.assertEqual(owner_of(pusher, instances), _old_hash("\0".join(pusher), instances))

    @given(key=st.text(max_size=40), instances=names, data=st.data())
    def test_sorted_rules_ignore_the_order_instances_are_listed_in(
        self, key: str, instances: list[str], data: Any
    ) -> None:
        rule = StableHash(ShardKey.DESTINATION)
        shuffled = data.draw(st.permutations(instances))
        self.assertIn(rule.pick(key, instances), instances)
        self.assertEqual(rule.pick(key, instances), rule.pick(key, shuffled))

    def test_no_instances_is_an_error(self) -> None:
        with self.assertRaises(ValueError):
            StableHash(ShardKey.SERVICE).pick("as1", [])

    def test_several_writers_need_a_rule(self) -> None:
        with self.assertRaises(ValueError):
            WriterRule("things", several=True)


class DirectoryTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.writers = WritersDirectory(
            BUILTIN_STREAMS,
            {"events": ("p1", "p2"), "typing": ("t1",), "device_lists": ("d1", "d2")},
            MAIN_PROCESS,
        )

    def test_answers(self) -> None:
        w = self.writers
        self.assertEqual(w.writers("events"), ("p1", "p2"))
        self.assertEqual(w.writers("backfill"), ("p1", "p2"))  # the events writers
        self.assertEqual(w.writers("receipts"), (MAIN_PROCESS,))  # not configured
        self.assertEqual(w.writers("caches"), ())  # any process
        self.assertEqual(w.single("typing"), "t1")
        self.assertTrue(w.writes("anyone", "caches"))
        self.assertFalse(w.writes("p1", "typing"))
        self.assertEqual(w.streams_written_by("p1"), ["events", "backfill", "caches"])
        self.assertEqual(w.server_of(MAIN), MAIN_PROCESS)
        self.assertEqual(w.server_of(writer_of("typing")), "t1")
        self.assertIn(w.writer_for("device_lists", "@u:x"), ("d1", "d2"))
        self.assertEqual(w.writer_for("typing", "anything"), "t1")
        # A room's writer among the writers known now (one added at run time).
        self.assertEqual(w.writer_for("events", "!r:x", among=["p9"]), "p9")

    def test_questions_without_one_answer(self) -> None:
        with self.assertRaises(ValueError):
            self.writers.single("events")
        with self.assertRaises(ValueError):
            self.writers.single("caches")
        with self.assertRaises(ValueError):
            self.writers.server_of(ServedBy(ROOM_EVENTS_WRITER_ROLE))
        with self.assertRaises(KeyError):
            self.writers.writers("no such stream")


def _internal_calls() -> list[InternalCall[Any, Any]]:
    found = []
    for module in (devices, e2e_keys, instances, send_events, stream_updates, writes):
        found += [v for v in vars(module).values() if isinstance(v, InternalCall)]
    return found


def _sharded_config() -> HomeServerConfig:
    """Three events writers, two device-list writers, push rules and pushers
    on writers of their own, two readers and a pusher instance."""
    directory = tempfile.mkdtemp()

    def worker(port: int, resources: list[str]) -> dict[str, Any]:
        return {"listeners": [{"port": port, "resources": resources}]}

    writer = ["client", "replication", "health"]
    workers = {
        name: worker(31010 + i, writer)
        for i, name in enumerate(["p1", "p2", "p3", "d1", "d2", "rules1", "pushers1", "typing1"])
    }
    workers["reader1"] = worker(31030, ["client", "health"])
    workers["reader2"] = worker(31031, ["client", "health"])
    workers["push1"] = worker(31032, ["client", "health"])
    data = {
        "server_name": "test.local",
        "worker_replication_secret": "s",
        "listeners": [{"port": 31000, "resources": ["client", "replication", "health"]}],
        "workers": workers,
        "router": {"listeners": [{"port": 31001, "resources": ["client", "health"]}]},
        "stream_writers": {
            "events": ["p1", "p2", "p3"],
            "device_lists": ["d1", "d2"],
            "push_rules": "rules1",
            "pushers": "pushers1",
            "typing": "typing1",
        },
        "pusher_instances": ["push1", MAIN_PROCESS],
    }
    path = os.path.join(directory, "homeserver.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(data, f)
    return load_config(path)


class AgreementTestCase(unittest.TestCase):
    """The routing table, the internal calls and each process's role, as
    derived from the directory, for every layout."""

    def configs(self) -> dict[str, HomeServerConfig]:
        found = {layout: layout_config(layout) for layout in LAYOUTS}
        found["sharded, several writers"] = _sharded_config()
        return found

    def test_every_layout(self) -> None:
        for name, config in self.configs().items():
            with self.subTest(layout=name):
                self.check(config)

    def check(self, config: HomeServerConfig) -> None:
        writers = config.writers
        table = RoutingTable.build(config)
        processes = config.instance_names()
        with_client = [n for n in processes if config.http_address(n, "client") is not None]

        # Each process's role is the directory's answer.
        for process in processes:
            role = Role.of(config, process)
            self.assertEqual(role.writes_events, process in writers.writers("events"))
            self.assertEqual(role.writes_device_lists, writers.writes(process, "device_lists"))
            self.assertEqual(role.writes_typing, writers.single("typing") == process)
            self.assertEqual(role.writes_presence, writers.single("presence") == process)
            self.assertEqual(
                config.writers.streams_written_by(process),
                [d.name for d in config.streams if writers.writes(process, d.name)],
            )

        for route in [*table.routes, table.default]:
            declared = route.served_by
            if declared.role == STREAM_WRITER_ROLE:
                assert declared.stream is not None
                stream_writers = writers.writers(declared.stream)
                [instance] = route.instances
                if instance != MAIN_PROCESS or MAIN_PROCESS in stream_writers:
                    # Straight to a writer of the stream...
                    self.assertIn(instance, stream_writers)
                    if len(stream_writers) == 1:
                        # ... the one its internal calls go to.
                        self.assertEqual(instance, writers.server_of(declared))
                else:
                    # ... or main, which forwards, when no writer serves clients.
                    self.assertFalse(set(stream_writers) & set(with_client))
                self.assertEqual(route.balance, BALANCE_SINGLE)
            elif declared.role == ROOM_EVENTS_WRITER_ROLE:
                events_writers = [w for w in writers.writers("events") if w in with_client]
                if events_writers and events_writers != [MAIN_PROCESS]:
                    self.assertEqual(route.balance, BALANCE_ROOM)
                    self.assertEqual(list(route.instances), events_writers)
                    # A room goes where the events stream's rule puts it.
                    for i in range(20):
                        chosen = writers.writer_for("events", f"!room{i}:test")
                        self.assertIn(chosen, route.instances)
                else:
                    self.assertEqual(route.instances, (MAIN_PROCESS,))
            elif declared.role == READERS_ROLE:
                readers = [
                    n
                    for n in with_client
                    if n != MAIN_PROCESS
                    and writers.streams_written_by(n) == ["caches"]
                    and n != config.media_instance
                ]
                self.assertEqual(list(route.instances), readers or [MAIN_PROCESS])
                self.assertEqual(route.balance, BALANCE_USER if readers else BALANCE_SINGLE)
            elif declared == MAIN:
                self.assertEqual(route.instances, (MAIN_PROCESS,))

        # Every internal call with a fixed server goes to a writer of its
        # stream (or main), one that has the 'replication' listener calls use.
        for call in _internal_calls():
            if call.served_by is None:
                continue
            server = writers.server_of(call.served_by)
            if call.served_by.stream is not None:
                self.assertTrue(writers.writes(server, call.served_by.stream), call.name)
            else:
                self.assertEqual(server, MAIN_PROCESS)
            if config.workers:
                self.assertIn(server, config.instance_map, call.name)

        # Each user's device-list writes, and each pusher, go to one of them.
        for i in range(20):
            self.assertIn(
                writers.writer_for("device_lists", f"@user{i}:test"),
                writers.writers("device_lists"),
            )
            pusher = ("app", f"key{i}", f"@user{i}:test")
            self.assertIn(owner_of(pusher, config.pusher_instances), config.pusher_instances)

    def test_the_sharded_layout_spreads(self) -> None:
        writers = _sharded_config().writers
        rooms = {writers.writer_for("events", f"!r{i}:test") for i in range(100)}
        users = {writers.writer_for("device_lists", f"@u{i}:test") for i in range(100)}
        self.assertEqual(rooms, {"p1", "p2", "p3"})
        self.assertEqual(users, {"d1", "d2"})
        self.assertEqual(writers.single("push_rules"), "rules1")
