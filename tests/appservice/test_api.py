"""The requests to services and the spec's legacy routes: a service that
does not serve ``/_matrix/app/v1/...`` is sent the same request on the
route's older path, and is sent there first afterwards, for a while."""

from __future__ import annotations

from twisted.internet import reactor
from twisted.trial import unittest

from synapse_lite.appservice.api import (
    LEGACY_RECHECK_SECONDS,
    NO_ANSWER,
    ApplicationServiceApi,
    ServiceAnswer,
    legacy_path,
)
from synapse_lite.appservice.registration import ApplicationService
from synapse_lite.http.tls import https_policy_trusting
from tests.appservice.fake_service import FakeApplicationService

EVENT = {"type": "m.room.message", "event_id": "$1", "room_id": "!r:test.local", "content": {}}


class LegacyPathTestCase(unittest.TestCase):
    def test_the_specs_table(self) -> None:
        self.assertEqual(legacy_path("/transactions/7"), "/transactions/7")
        self.assertEqual(legacy_path("/users/%40a%3At"), "/users/%40a%3At")
        self.assertEqual(legacy_path("/rooms/%23a%3At"), "/rooms/%23a%3At")
        self.assertEqual(
            legacy_path("/thirdparty/protocol/irc"),
            "/_matrix/app/unstable/thirdparty/protocol/irc",
        )
        self.assertEqual(
            legacy_path("/thirdparty/location"), "/_matrix/app/unstable/thirdparty/location"
        )
        # The ping came with the versioned API: nothing to fall back to.
        self.assertIsNone(legacy_path("/ping"))

    def test_which_answers_show_the_route_is_served(self) -> None:
        self.assertTrue(ServiceAnswer(200, b"{}").route_known)
        self.assertTrue(ServiceAnswer(404, b'{"errcode": "M_NOT_FOUND"}').route_known)
        self.assertFalse(ServiceAnswer(404, b'{"errcode": "M_UNRECOGNIZED"}').route_known)
        self.assertFalse(ServiceAnswer(404, b"<html>Not Found</html>").route_known)
        self.assertFalse(ServiceAnswer(500, b'{"errcode": "M_NOT_FOUND"}').route_known)
        self.assertFalse(ServiceAnswer(405, b"").route_known)


class LegacyRoutesTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.service = FakeApplicationService()
        url = self.service.listen()
        self.addCleanup(self.service.port.stopListening)
        self.registration = ApplicationService(
            id="irc",
            url=url,
            as_token="irc-as-token",
            hs_token="irc-hs-token",
            sender="@_irc_bot:test.local",
            protocols=("irc",),
        )
        self.now = 1000.0
        self.api = ApplicationServiceApi(
            reactor, https_policy_trusting(()), seconds=lambda: self.now
        )

    async def test_a_legacy_service_gets_its_transactions_on_the_old_path(self) -> None:
        self.service.routes = "legacy"
        self.assertTrue(await self.api.push_transaction(self.registration, 1, [EVENT], None))
        self.assertEqual(
            self.service.requests,
            [("PUT", "/_matrix/app/v1/transactions/1"), ("PUT", "/transactions/1")],
        )
        # The token in the query string on the old path (the header is sent too).
        self.assertEqual(self.service.access_tokens, [None, "irc-hs-token"])
        self.assertEqual(self.service.processed, {"1": [EVENT]})
        self.assertTrue(self.api.on_legacy_routes("irc"))

        # From now on the old paths first: one request each.
        del self.service.requests[:]
        self.assertTrue(await self.api.push_transaction(self.registration, 2, [EVENT], None))
        self.service.known_users.add("@_irc_a:test.local")
        self.assertTrue(await self.api.query_user(self.registration, "@_irc_a:test.local"))
        self.assertFalse(await self.api.query_alias(self.registration, "#_irc_b:test.local"))
        self.assertEqual(
            self.service.requests,
            [
                ("PUT", "/transactions/2"),
                ("GET", "/users/%40_irc_a%3Atest.local"),
                ("GET", "/rooms/%23_irc_b%3Atest.local"),
            ],
        )

    async def test_the_versioned_routes_are_tried_again_later(self) -> None:
        self.service.routes = "legacy"
        self.assertTrue(await self.api.push_transaction(self.registration, 1, [EVENT], None))
        # The service is updated; before the recheck the old paths still serve.
        self.service.routes = "both"
        self.now += LEGACY_RECHECK_SECONDS - 1
        del self.service.requests[:]
        self.assertTrue(await self.api.push_transaction(self.registration, 2, [EVENT], None))
        self.assertEqual(self.service.requests, [("PUT", "/transactions/2")])
        self.now += 2
        self.assertFalse(self.api.on_legacy_routes("irc"))
        self.assertTrue(await self.api.push_transaction(self.registration, 3, [EVENT], None))
        self.assertEqual(self.service.requests[-1], ("PUT", "/_matrix/app/v1/transactions/3"))
        self.assertEqual(self.service.access_tokens[-1], None)

    async def test_a_service_gone_back_to_the_versioned_routes_is_followed(self) -> None:
        self.service.routes = "legacy"
        self.assertTrue(await self.api.push_transaction(self.registration, 1, [EVENT], None))
        # Updated to serve the versioned routes only: the old path fails,
        # the versioned one takes it, and stays first.
        self.service.routes = "v1"
        del self.service.requests[:]
        self.assertTrue(await self.api.push_transaction(self.registration, 2, [EVENT], None))
        self.assertEqual(
            self.service.requests,
            [("PUT", "/transactions/2"), ("PUT", "/_matrix/app/v1/transactions/2")],
        )
        self.assertFalse(self.api.on_legacy_routes("irc"))

    async def test_third_party_protocols_on_the_unstable_path(self) -> None:
        self.service.routes = "legacy"
        self.service.protocols["irc"] = {"user_fields": [], "instances": []}
        answer = await self.api.request(self.registration, "GET", "/thirdparty/protocol/irc")
        self.assertEqual(
            (answer.status, answer.body), (200, b'{"user_fields": [], "instances": []}')
        )
        self.assertEqual(
            self.service.requests[-1], ("GET", "/_matrix/app/unstable/thirdparty/protocol/irc")
        )

    async def test_a_versioned_service_is_not_sent_to_old_paths(self) -> None:
        # An unknown user: M_NOT_FOUND from a route that exists stands.
        self.assertFalse(await self.api.query_user(self.registration, "@_irc_x:test.local"))
        self.assertEqual(
            self.service.requests, [("GET", "/_matrix/app/v1/users/%40_irc_x%3Atest.local")]
        )
        # Pings have no older path.
        self.service.mode = "error"
        answer = await self.api.request(self.registration, "POST", "/ping", {})
        self.assertEqual(answer.status, 500)
        self.assertEqual(self.service.requests[-1], ("POST", "/_matrix/app/v1/ping"))
        self.assertEqual(len(self.service.requests), 2)

    async def test_an_error_is_tried_on_the_old_path_once_and_reported(self) -> None:
        # The spec: any unsuccessful status falls back. A versioned service
        # failing with 500 is sent the old path too, which it does not
        # serve; the versioned answer is what the sender sees, and the
        # service stays on the versioned routes.
        self.service.mode = "error"
        answer = await self.api.request(self.registration, "PUT", "/transactions/1", {"events": []})
        self.assertEqual(answer.status, 500)
        self.assertEqual(
            self.service.requests,
            [("PUT", "/_matrix/app/v1/transactions/1"), ("PUT", "/transactions/1")],
        )
        self.assertFalse(self.api.on_legacy_routes("irc"))

    async def test_no_fall_back_when_the_service_is_unreachable(self) -> None:
        await self.service.port.stopListening()
        answer = await self.api.request(self.registration, "PUT", "/transactions/1", {"events": []})
        self.assertEqual(answer.status, NO_ANSWER)
        self.assertFalse(self.api.on_legacy_routes("irc"))
