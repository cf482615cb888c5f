"""What other servers answer to profile and alias queries is checked before
our clients see it; their failures become 404s that say why."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.trial import unittest

from synapse_lite.api.errors import NotFoundError, SynapseError
from synapse_lite.federation.client import FederationRequestError
from synapse_lite.federation.queries import FederationQueries, RemoteUnavailable


class ScriptedClient:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.paths: list[tuple[str, str]] = []

    async def get_json(self, destination: str, path: str, signed: bool = True) -> Any:
        self.paths.append((destination, path))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class FederationQueriesTestCase(unittest.TestCase):
    def ask(self, answer: Any, coroutine_of: Any) -> tuple[defer.Deferred[Any], ScriptedClient]:
        client = ScriptedClient(answer)
        queries = FederationQueries(lambda: client)  # type: ignore[arg-type, return-value]
        return defer.ensureDeferred(coroutine_of(queries)), client

    def test_profile(self) -> None:
        d, client = self.ask(
            {"displayname": "B", "avatar_url": None, "extra": 1},
            lambda q: q.profile("@b:b.test"),
        )
        self.assertEqual(self.successResultOf(d), {"displayname": "B"})
        self.assertEqual(
            client.paths, [("b.test", "/_matrix/federation/v1/query/profile?user_id=%40b%3Ab.test")]
        )
        d, client = self.ask(
            {"avatar_url": "mxc://b/x"}, lambda q: q.profile("@b:b.test", "avatar_url")
        )
        self.assertEqual(self.successResultOf(d), {"avatar_url": "mxc://b/x"})
        self.assertTrue(client.paths[0][1].endswith("&field=avatar_url"))

    def test_bad_answers_and_failures(self) -> None:
        bad_profiles: list[Any] = [[], {"displayname": 5}, "x"]
        for answer in bad_profiles:
            d, _ = self.ask(answer, lambda q: q.profile("@b:b.test"))
            failure = self.failureResultOf(d, RemoteUnavailable)
            self.assertEqual(failure.value.code, 404)
        bad_aliases: list[Any] = [
            {},
            {"room_id": "x", "servers": []},
            {"room_id": "!r", "servers": [1]},
        ]
        for answer in bad_aliases:
            d, _ = self.ask(answer, lambda q: q.directory("#a:b.test"))
            self.failureResultOf(d, RemoteUnavailable)
        d, _ = self.ask(
            FederationRequestError("b.test", "answered 404", 404),
            lambda q: q.directory("#a:b.test"),
        )
        self.failureResultOf(d, NotFoundError)
        d, _ = self.ask(
            FederationRequestError("b.test", "not reached"), lambda q: q.directory("#a:b.test")
        )
        self.assertIn("not reached", self.failureResultOf(d, RemoteUnavailable).value.msg)
        d, client = self.ask({}, lambda q: q.directory("#a:bad name"))
        self.assertEqual(self.failureResultOf(d, SynapseError).value.code, 400)
        self.assertEqual(client.paths, [])

    def test_directory(self) -> None:
        d, _ = self.ask(
            {"room_id": "!r:b.test", "servers": ["b.test"]}, lambda q: q.directory("#a:b.test")
        )
        self.assertEqual(self.successResultOf(d), {"room_id": "!r:b.test", "servers": ["b.test"]})
