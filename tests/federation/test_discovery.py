"""Server discovery, step by step as the spec lists them, with a scripted
SRV resolver and well-known fetcher and a fake clock."""

from __future__ import annotations

import itertools
import json
import random

from twisted.internet import defer, task
from twisted.trial import unittest

from synapse_lite.federation.discovery import (
    Route,
    ServerDiscovery,
    ServerNameError,
    SrvRecord,
    WellKnownAnswer,
    order_srv_records,
    parse_server_name,
    parse_well_known,
    well_known_cache_seconds,
)


class FakeSrv:
    def __init__(self) -> None:
        self.records: dict[str, list[SrvRecord]] = {}
        self.asked: list[str] = []
        self.fail: set[str] = set()

    async def lookup_srv(self, name: str) -> list[SrvRecord]:
        self.asked.append(name)
        if name in self.fail:
            raise OSError("server failure")
        return self.records.get(name, [])


class FakeWellKnown:
    def __init__(self) -> None:
        self.answers: dict[str, WellKnownAnswer | Exception] = {}
        self.asked: list[str] = []

    def delegate(self, host: str, to: str, headers: dict[str, str] | None = None) -> None:
        body = json.dumps({"m.server": to}).encode()
        self.answers[host] = WellKnownAnswer(200, body, headers or {})

    async def fetch(self, hostname: str) -> WellKnownAnswer:
        self.asked.append(hostname)
        answer = self.answers.get(hostname, WellKnownAnswer(404, b"{}", {}))
        if isinstance(answer, Exception):
            raise answer
        return answer


class DiscoveryTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.clock = task.Clock()
        self.clock.advance(1_000_000)
        self.srv = FakeSrv()
        self.well_known = FakeWellKnown()
        self.overrides: dict[str, str] = {}
        self.discovery = ServerDiscovery(
            clock_time=self.clock.seconds,
            srv=self.srv,
            well_known=self.well_known,
            overrides=self.overrides,
            rng=random.Random(1),
        )

    def _resolve(self, name: str) -> Route:
        d = defer.ensureDeferred(self.discovery.resolve(name))
        return self.successResultOf(d)

    # Step 1: IP literals.

    def test_ip_literal_goes_straight_there(self) -> None:
        self.assertEqual(
            self._resolve("192.0.2.7"),
            Route("https", (("192.0.2.7", 8448),), "192.0.2.7", "192.0.2.7"),
        )
        self.assertEqual(
            self._resolve("192.0.2.7:8000"),
            Route("https", (("192.0.2.7", 8000),), "192.0.2.7:8000", "192.0.2.7"),
        )
        self.assertEqual(
            self._resolve("[2001:db8::1]:8000"),
            Route("https", (("2001:db8::1", 8000),), "[2001:db8::1]:8000", "2001:db8::1"),
        )
        self.assertEqual(self.well_known.asked, [])
        self.assertEqual(self.srv.asked, [])

    # Step 2: an explicit port.

    def test_explicit_port_goes_straight_there(self) -> None:
        self.well_known.delegate("example.org", "elsewhere.org")
        self.assertEqual(
            self._resolve("example.org:8001"),
            Route("https", (("example.org", 8001),), "example.org:8001", "example.org"),
        )
        self.assertEqual(self.well_known.asked, [])
        self.assertEqual(self.srv.asked, [])

    # Step 3: .well-known delegation.

    def test_well_known_to_ip_literal(self) -> None:
        self.well_known.delegate("example.org", "192.0.2.9")
        self.assertEqual(
            self._resolve("example.org"),
            Route("https", (("192.0.2.9", 8448),), "192.0.2.9", "192.0.2.9"),
        )
        self.well_known.delegate("example.net", "[2001:db8::9]:443")
        self.assertEqual(
            self._resolve("example.net"),
            Route("https", (("2001:db8::9", 443),), "[2001:db8::9]:443", "2001:db8::9"),
        )
        self.assertEqual(self.srv.asked, [])

    def test_well_known_to_host_and_port(self) -> None:
        self.well_known.delegate("example.org", "matrix.example.org:443")
        self.assertEqual(
            self._resolve("example.org"),
            Route(
                "https",
                (("matrix.example.org", 443),),
                "matrix.example.org:443",
                "matrix.example.org",
            ),
        )
        self.assertEqual(self.srv.asked, [])

    def test_well_known_to_host_with_srv(self) -> None:
        self.well_known.delegate("example.org", "matrix.example.org")
        self.srv.records["_matrix-fed._tcp.matrix.example.org"] = [
            SrvRecord(10, 0, "fed1.example.org.", 8500)
        ]
        self.srv.records["_matrix._tcp.matrix.example.org"] = [
            SrvRecord(10, 0, "old.example.org.", 8600)
        ]
        route = self._resolve("example.org")
        # The certificate and Host are the delegated name's, not the SRV target's.
        self.assertEqual(
            route,
            Route(
                "https", (("fed1.example.org", 8500),), "matrix.example.org", "matrix.example.org"
            ),
        )
        self.assertEqual(self.srv.asked, ["_matrix-fed._tcp.matrix.example.org"])

    def test_well_known_to_host_with_deprecated_srv(self) -> None:
        self.well_known.delegate("example.org", "matrix.example.org")
        self.srv.records["_matrix._tcp.matrix.example.org"] = [
            SrvRecord(10, 0, "old.example.org.", 8600)
        ]
        self.assertEqual(
            self._resolve("example.org"),
            Route(
                "https", (("old.example.org", 8600),), "matrix.example.org", "matrix.example.org"
            ),
        )
        self.assertEqual(
            self.srv.asked,
            ["_matrix-fed._tcp.matrix.example.org", "_matrix._tcp.matrix.example.org"],
        )

    def test_well_known_to_host_without_srv(self) -> None:
        self.well_known.delegate("example.org", "matrix.example.org")
        self.srv.fail.add("_matrix-fed._tcp.matrix.example.org")
        self.assertEqual(
            self._resolve("example.org"),
            Route(
                "https", (("matrix.example.org", 8448),), "matrix.example.org", "matrix.example.org"
            ),
        )

    # Steps 4-6: no delegation.

    def test_bad_well_known_answers_fall_back_to_srv_of_the_hostname(self) -> None:
        bad: list[WellKnownAnswer | Exception] = [
            WellKnownAnswer(404, b"{}", {}),
            WellKnownAnswer(200, b"not json", {}),
            WellKnownAnswer(200, b"[1]", {}),
            WellKnownAnswer(200, b'{"m.server": 5}', {}),
            WellKnownAnswer(200, b'{"m.server": "bad name:x"}', {}),
            WellKnownAnswer(200, b"{}", {}),
            ConnectionRefusedError("refused"),
        ]
        self.srv.records["_matrix-fed._tcp.h.org"] = [SrvRecord(0, 0, "srv.h.org", 9000)]
        for answer in bad:
            self.well_known.answers.clear()
            self.well_known.answers["h.org"] = answer
            self.clock.advance(10_000)  # past any cached error
            with self.assertLogs("synapse_lite.federation.discovery", "INFO") as logs:
                route = self._resolve("h.org")
            self.assertEqual(route, Route("https", (("srv.h.org", 9000),), "h.org", "h.org"))
            self.assertIn("No delegation for h.org", logs.output[0])

    def test_deprecated_srv_then_port_8448(self) -> None:
        self.srv.records["_matrix._tcp.h.org"] = [SrvRecord(0, 0, "old.h.org", 9001)]
        self.assertEqual(
            self._resolve("h.org"), Route("https", (("old.h.org", 9001),), "h.org", "h.org")
        )
        self.assertEqual(self.srv.asked, ["_matrix-fed._tcp.h.org", "_matrix._tcp.h.org"])
        self.assertEqual(
            self._resolve("plain.org"),
            Route("https", (("plain.org", 8448),), "plain.org", "plain.org"),
        )

    # Caching.

    def test_well_known_cached_for_its_max_age_then_asked_again(self) -> None:
        self.well_known.delegate(
            "example.org", "m.example.org:443", {"cache-control": "max-age=600"}
        )
        self._resolve("example.org")
        self.clock.advance(599)
        self.well_known.delegate("example.org", "n.example.org:443")
        self.assertEqual(self._resolve("example.org").host_header, "m.example.org:443")
        self.clock.advance(2)
        self.assertEqual(self._resolve("example.org").host_header, "n.example.org:443")
        self.assertEqual(self.well_known.asked, ["example.org", "example.org"])

    def test_errors_cached_with_exponential_backoff_up_to_an_hour(self) -> None:
        self.well_known.answers["h.org"] = WellKnownAnswer(500, b"", {})
        fetched_at = []
        for _ in range(5 * 60 * 6):  # every 10 s for 5 hours
            asked = len(self.well_known.asked)
            self._resolve("h.org")
            if len(self.well_known.asked) > asked:
                fetched_at.append(self.clock.seconds())
            self.clock.advance(10)
        periods = [b - a for a, b in itertools.pairwise(fetched_at)]
        # 2, 4, 8, 16, 32 minutes, then capped at an hour.
        self.assertEqual(periods[:8], [120, 240, 480, 960, 1920, 3600, 3600, 3600])

    def test_a_success_after_errors_resets_the_backoff(self) -> None:
        self.well_known.answers["h.org"] = WellKnownAnswer(500, b"", {})
        self._resolve("h.org")
        self.clock.advance(121)
        self.well_known.delegate("h.org", "d.h.org:1", {"cache-control": "max-age=60"})
        self.assertEqual(self._resolve("h.org").host_header, "d.h.org:1")
        self.well_known.answers["h.org"] = WellKnownAnswer(500, b"", {})
        self.clock.advance(61)
        self._resolve("h.org")
        asked = len(self.well_known.asked)
        self.clock.advance(121)
        self._resolve("h.org")
        self.assertEqual(len(self.well_known.asked), asked + 1)

    def test_concurrent_lookups_share_one_fetch(self) -> None:
        gate: defer.Deferred[None] = defer.Deferred()
        fetch = self.well_known.fetch

        async def slow_fetch(hostname: str) -> WellKnownAnswer:
            await gate
            return await fetch(hostname)

        self.well_known.fetch = slow_fetch  # type: ignore[method-assign]
        self.well_known.delegate("example.org", "m.example.org:443")
        first = defer.ensureDeferred(self.discovery.resolve("example.org"))
        second = defer.ensureDeferred(self.discovery.resolve("example.org"))
        self.assertNoResult(first)
        gate.callback(None)
        self.assertEqual(self.successResultOf(first).host_header, "m.example.org:443")
        self.assertEqual(self.successResultOf(second).host_header, "m.example.org:443")
        self.assertEqual(self.well_known.asked, ["example.org"])

    # Override.

    def test_destinations_override_everything(self) -> None:
        self.overrides["example.org"] = "http://127.0.0.1:8009"
        route = self._resolve("example.org")
        self.assertEqual(route.scheme, "http")
        self.assertEqual(route.targets, (("127.0.0.1", 8009),))
        self.assertEqual(route.host_header, "127.0.0.1:8009")
        self.assertTrue(route.operator_named)
        self.assertEqual(self.well_known.asked, [])

    def test_not_a_server_name(self) -> None:
        for name in ["", "a b", "host:0", "host:99999", "[::1", "[nope]:80", "h:x"]:
            d = defer.ensureDeferred(self.discovery.resolve(name))
            self.failureResultOf(d, ServerNameError)


class PureStepsTestCase(unittest.TestCase):
    def test_parse_server_name(self) -> None:
        self.assertEqual(parse_server_name("example.org"), ("example.org", None))
        self.assertEqual(parse_server_name("example.org:80"), ("example.org", 80))
        self.assertEqual(parse_server_name("[::1]:80"), ("[::1]", 80))
        self.assertEqual(parse_server_name("1.2.3.4"), ("1.2.3.4", None))
        for bad in ["", "ex_ample.org", "a:", ":80", "[::1]x", "a:123456"]:
            with self.assertRaises(ServerNameError, msg=bad):
                parse_server_name(bad)

    def test_parse_well_known(self) -> None:
        self.assertEqual(parse_well_known(200, b'{"m.server": "a.org:443"}'), "a.org:443")
        with self.assertRaisesRegex(ValueError, "HTTP 302"):
            parse_well_known(302, b"")

    def test_cache_seconds(self) -> None:
        now = 1_000_000.0
        self.assertEqual(well_known_cache_seconds({}, now), 24 * 3600)
        self.assertEqual(well_known_cache_seconds({"cache-control": "max-age=10"}, now), 10)
        self.assertEqual(
            well_known_cache_seconds({"cache-control": "public, max-age=999999"}, now), 48 * 3600
        )
        self.assertEqual(well_known_cache_seconds({"cache-control": "no-store"}, now), 0)
        self.assertEqual(
            well_known_cache_seconds({"expires": "Mon, 12 Jan 1970 13:47:40 GMT"}, now), 60
        )
        self.assertEqual(well_known_cache_seconds({"expires": "garbage"}, now), 0)

    def test_srv_order(self) -> None:
        records = [
            SrvRecord(20, 0, "c.org.", 3),
            SrvRecord(10, 1, "a.org.", 1),
            SrvRecord(10, 1000, "b.org.", 2),
        ]
        firsts = {order_srv_records(records, random.Random(seed))[0] for seed in range(20)}
        # The heavy record comes first almost always; the low priority last always.
        self.assertIn(("b.org", 2), firsts)
        for seed in range(20):
            self.assertEqual(order_srv_records(records, random.Random(seed))[-1], ("c.org", 3))
        self.assertEqual(order_srv_records([SrvRecord(0, 0, ".", 0)], random.Random(0)), [])
