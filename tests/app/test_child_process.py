"""The launcher relays each process's output in whole lines, each naming it."""

from __future__ import annotations

from twisted.internet import error
from twisted.python.failure import Failure
from twisted.trial import unittest

from synapse_lite.app.child_process import ChildProcess, _LineRelay, describe_exit
from synapse_lite.app.launch_plan import ProcessSpec


class LineRelayTestCase(unittest.TestCase):
    def test_lines_are_whole_whatever_the_chunks(self) -> None:
        lines: list[str] = []
        ended: list[Failure] = []
        relay = _LineRelay(lines.append, ended.append)
        relay.childDataReceived(2, b"2024-01-01 first li")
        relay.childDataReceived(1, b"out\npartial")
        relay.childDataReceived(2, b"ne\r\nsecond line\nthi")
        self.assertEqual(lines, ["out", "2024-01-01 first line", "second line"])
        relay.processEnded(Failure(error.ProcessDone(0)))
        self.assertEqual(lines[3:], ["partial", "thi"])
        self.assertEqual(len(ended), 1)

    def test_lines_not_from_the_logger_are_named(self) -> None:
        written: list[str] = []
        spec = ProcessSpec("persister1", 1, ("python",), (), ("caches",), None)
        child = ChildProcess(spec, reactor=None, write_line=written.append)
        own = "2024-01-01 10:00:00,123 persister1 ERROR synapse_lite: boom"
        child._relay(own)
        child._relay("Traceback (most recent call last):")
        self.assertEqual(written, [own, "persister1 | Traceback (most recent call last):"])
        self.assertEqual(list(child.tail), [own, "Traceback (most recent call last):"])

    def test_describe_exit(self) -> None:
        self.assertEqual(describe_exit(Failure(error.ProcessTerminated(3))), "exit code 3")
        killed = Failure(error.ProcessTerminated(None, signal=9))
        self.assertEqual(describe_exit(killed), "signal 9 (SIGKILL)")
