"""The test harness's port choice (tests/harness/processes.py): trial
workers never share a port, a process never hands one out twice."""

from __future__ import annotations

import os
import socket
import tempfile
from unittest import mock

from twisted.trial import unittest

from tests.harness import processes
from tests.harness.processes import (
    PORT_STRIPES,
    free_port,
    free_port_block,
    ports_to_choose_from,
    trial_worker_number,
)


class PortStripesTestCase(unittest.TestCase):
    def in_directory(self, name: str) -> None:
        """Run the rest of the test as if trial had put this process in
        a directory called ``name``."""
        path = os.path.join(tempfile.mkdtemp(), name)
        os.mkdir(path)
        self.patch(os, "getcwd", lambda: path)

    def test_a_worker_is_known_by_its_directory(self) -> None:
        self.in_directory("3")
        self.assertEqual(trial_worker_number(), 3)
        self.in_directory("_trial_temp")
        self.assertIsNone(trial_worker_number())

    def test_workers_stripes_are_disjoint_and_inside_the_whole_range(self) -> None:
        self.in_directory("_trial_temp")
        whole = ports_to_choose_from()
        stripes = []
        for worker in range(PORT_STRIPES):
            self.in_directory(str(worker))
            stripes.append(range(*ports_to_choose_from()))
        for i, stripe in enumerate(stripes):
            self.assertGreaterEqual(stripe.start, whole[0])
            self.assertLessEqual(stripe.stop, whole[1])
            self.assertGreater(len(stripe), 1000)
            for other in stripes[i + 1 :]:
                self.assertTrue(set(stripe).isdisjoint(other))


class HandedOutTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.patch(processes, "_handed_out", set())

    def test_a_port_is_never_handed_out_twice_singly_or_in_a_block(self) -> None:
        # A narrow range makes a repeat likely if the bookkeeping failed.
        with mock.patch.object(processes, "ports_to_choose_from", lambda: (20000, 20040)):
            seen: set[int] = set()
            for _ in range(8):
                base = free_port_block(3)
                block = set(range(base, base + 3))
                self.assertTrue(seen.isdisjoint(block))
                seen |= block
            for _ in range(10):
                port = free_port()
                self.assertNotIn(port, seen)
                seen.add(port)

    def test_a_port_something_listens_on_is_not_handed_out(self) -> None:
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            held.listen()
            port = held.getsockname()[1]
            with mock.patch.object(processes, "ports_to_choose_from", lambda: (port, port + 1)):
                self.assertRaises(RuntimeError, free_port)
        with mock.patch.object(processes, "ports_to_choose_from", lambda: (port, port + 1)):
            self.assertEqual(free_port(), port)
