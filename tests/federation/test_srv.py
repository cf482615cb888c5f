"""SRV lookups: records read from ``twisted.names`` answers, cached for their
TTL; no record, and a name server that fails, believed for a while."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, task
from twisted.names import dns
from twisted.names.error import DNSNameError, DNSQueryTimeoutError
from twisted.trial import unittest

from synapse_lite.federation.connect import (
    FAILED_SRV_CACHE_SECONDS,
    NEGATIVE_SRV_CACHE_SECONDS,
    TwistedSrvResolver,
)
from synapse_lite.federation.discovery import SrvRecord


class ScriptedResolver:
    def __init__(self) -> None:
        self.answers: dict[str, Any] = {}
        self.asked: list[str] = []

    def lookupService(self, name: str) -> defer.Deferred[Any]:
        self.asked.append(name)
        answer = self.answers[name]
        if isinstance(answer, Exception):
            return defer.fail(answer)
        return defer.succeed((answer, [], []))


def srv(ttl: int, priority: int, weight: int, port: int, target: str) -> dns.RRHeader:
    return dns.RRHeader(
        name="x", type=dns.SRV, ttl=ttl, payload=dns.Record_SRV(priority, weight, port, target)
    )


class SrvResolverTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.clock = task.Clock()
        self.names = ScriptedResolver()
        self.srv = TwistedSrvResolver(self.clock, self.names)

    def lookup(self, name: str) -> list[SrvRecord]:
        result: list[SrvRecord] = self.successResultOf(
            defer.ensureDeferred(self.srv.lookup_srv(name))
        )
        return result

    def test_records_cached_for_their_ttl(self) -> None:
        self.names.answers["_matrix-fed._tcp.a"] = [
            srv(100, 10, 5, 8448, "fed.a"),
            srv(50, 20, 0, 8449, "backup.a"),
        ]
        expected = [SrvRecord(10, 5, "fed.a", 8448), SrvRecord(20, 0, "backup.a", 8449)]
        self.assertEqual(self.lookup("_matrix-fed._tcp.a"), expected)
        self.clock.advance(49)
        self.assertEqual(self.lookup("_matrix-fed._tcp.a"), expected)
        self.assertEqual(len(self.names.asked), 1)
        self.clock.advance(2)  # past the smallest TTL
        self.lookup("_matrix-fed._tcp.a")
        self.assertEqual(len(self.names.asked), 2)

    def test_no_record_and_failures_are_believed_for_a_while(self) -> None:
        self.names.answers["_matrix-fed._tcp.none"] = DNSNameError("nxdomain")
        self.names.answers["_matrix-fed._tcp.slow"] = DNSQueryTimeoutError("slow")
        for name, period in [
            ("_matrix-fed._tcp.none", NEGATIVE_SRV_CACHE_SECONDS),
            ("_matrix-fed._tcp.slow", FAILED_SRV_CACHE_SECONDS),
        ]:
            self.assertEqual(self.lookup(name), [])
            self.clock.advance(period - 1)
            self.lookup(name)
            self.assertEqual(self.names.asked.count(name), 1)
            self.clock.advance(2)
            self.lookup(name)
            self.assertEqual(self.names.asked.count(name), 2)
