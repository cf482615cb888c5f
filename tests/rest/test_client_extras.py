"""What clients call at start-up and in daily use besides rooms and /sync:
honest discovery, the small start-up endpoints, room tags, profiles, single
events and their context, redactions, forgetting, and the room directory.
Every answer of the happy paths is validated against the Matrix spec's
OpenAPI response schemas."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import urllib.parse
from typing import Any

from synapse_lite.http.server import JsonResource
from synapse_lite.rest.client.versions import VERSION_MODULES, supported_versions
from tests.harness.client_api import ClientApi, ThreeUsersTestCase, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase
from tests.harness.spec import assert_spec_response


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


class DiscoveryTestCase(ThreeUsersTestCase):
    async def test_versions_claim_only_what_is_routed(self) -> None:
        body = await self.alice.ok("GET", "/_matrix/client/versions")
        assert_spec_response(self, "versions.yaml", "/versions", "GET", 200, body)
        self.assertEqual(body["unstable_features"], {})

        async def servlet(request: Any) -> tuple[int, Any]:
            return 200, {}

        resource = JsonResource()
        self.assertEqual(supported_versions(resource), [])
        required = [m for _, added in VERSION_MODULES for m in added]
        for method, path in required[:-1]:
            resource.register_paths(method, re.escape(path), servlet, "x")
        # Everything but threads: up to the version before threads came in.
        self.assertEqual(supported_versions(resource), ["r0.6.1", "v1.1", "v1.2", "v1.3"])
        method, path = required[-1]
        resource.register_paths(method, re.escape(path), servlet, "x")
        self.assertEqual(supported_versions(resource)[-1], "v1.6")
        # Whatever this server claims, it routes.
        routes = await self.alice.ok("GET", "/_matrix/client/versions")
        for version, added in VERSION_MODULES:
            if version in routes["versions"]:
                for method, path in added:
                    _, answer = await self.alice.request(method, path, {})
                    self.assertNotEqual(answer.get("errcode"), "M_UNRECOGNIZED", path)

    async def test_capabilities(self) -> None:
        body = await self.alice.ok("GET", "/capabilities")
        assert_spec_response(self, "capabilities.yaml", "/capabilities", "GET", 200, body)
        caps = body["capabilities"]
        self.assertEqual(caps["m.set_displayname"], {"enabled": True})
        self.assertEqual(caps["m.set_avatar_url"], {"enabled": True})
        self.assertEqual(caps["m.3pid_changes"], {"enabled": False})
        self.assertEqual(caps["m.room_versions"]["default"], "10")

    async def test_start_up_endpoints(self) -> None:
        threepids = await self.alice.ok("GET", "/account/3pid")
        self.assertEqual(threepids, {"threepids": []})
        assert_spec_response(
            self, "administrative_contact.yaml", "/account/3pid", "GET", 200, threepids
        )
        self.assertEqual(await self.alice.ok("GET", "/thirdparty/protocols"), {})
        self.assertEqual(await self.alice.ok("GET", "/voip/turnServer"), {})
        for path in ("/account/3pid", "/thirdparty/protocols", "/voip/turnServer"):
            code, body = await self.alice.request("GET", path, token=None)
            self.assertEqual((code, body["errcode"]), (401, "M_MISSING_TOKEN"))


class TurnTestCase(DatabaseTestCase):
    async def test_turn_credentials_as_coturn_checks_them(self) -> None:
        _, clients, _ = start_cluster(
            self,
            self.test_db,
            turn={"uris": ["turn:turn.test:3478?transport=udp"], "shared_secret": "s3cret"},
        )
        alice = await clients["main"].register("alice")
        body = await alice.ok("GET", "/voip/turnServer")
        assert_spec_response(self, "voip.yaml", "/voip/turnServer", "GET", 200, body)
        self.assertEqual(body["uris"], ["turn:turn.test:3478?transport=udp"])
        self.assertEqual(body["ttl"], 86400)
        expiry, _, user = body["username"].partition(":")
        self.assertEqual(user, alice.user_id)
        self.assertTrue(expiry.isdigit())
        expected = hmac.new(b"s3cret", body["username"].encode(), hashlib.sha1).digest()
        self.assertEqual(base64.b64decode(body["password"]), expected)


class TagsTestCase(ThreeUsersTestCase):
    async def test_put_get_delete_and_sync(self) -> None:
        room = await self.alice.create_room()
        base = f"/user/{self.alice.user_id}/rooms/{room}/tags"
        empty = await self.alice.ok("GET", base)
        self.assertEqual(empty, {"tags": {}})
        before = await self.alice.sync()
        await self.alice.ok("PUT", f"{base}/m.favourite", {"order": 0.5})
        await self.alice.ok("PUT", f"{base}/u.work", {})
        tags = await self.alice.ok("GET", base)
        assert_spec_response(
            self, "tags.yaml", "/user/{userId}/rooms/{roomId}/tags", "GET", 200, tags
        )
        self.assertEqual(tags, {"tags": {"m.favourite": {"order": 0.5}, "u.work": {}}})
        after = await self.alice.sync(since=before["next_batch"])
        data = after["rooms"]["join"][room]["account_data"]["events"]
        self.assertIn({"type": "m.tag", "content": tags}, data)
        await self.alice.ok("DELETE", f"{base}/u.work")
        self.assertEqual(
            await self.alice.ok("GET", base), {"tags": {"m.favourite": {"order": 0.5}}}
        )

    async def test_bad_input(self) -> None:
        room = await self.alice.create_room()
        base = f"/user/{self.alice.user_id}/rooms/{room}/tags"
        code, body = await self.bob.request("GET", base)
        self.assertEqual((code, body["errcode"]), (403, "M_FORBIDDEN"))
        code, body = await self.bob.request("PUT", f"{base}/x", {})
        self.assertEqual(code, 403)
        for bad in ({"order": 2}, {"order": "first"}, {"order": True}):
            code, body = await self.alice.request("PUT", f"{base}/x", bad)
            self.assertEqual((code, body["errcode"]), (400, "M_BAD_JSON"), bad)
        code, body = await self.alice.request("PUT", f"{base}/x", [1])
        self.assertEqual(code, 400)
        code, body = await self.alice.request(
            "PUT", f"/user/{self.alice.user_id}/rooms/not-a-room/tags/x", {}
        )
        self.assertEqual((code, body["errcode"]), (400, "M_INVALID_PARAM"))
        self.assertEqual(await self.alice.ok("GET", base), {"tags": {}})


class TagsOnWriterTestCase(DatabaseTestCase):
    async def test_tag_written_by_the_account_data_writer(self) -> None:
        servers, clients, _ = start_cluster(
            self, self.test_db, workers=["worker1"], stream_writers={"account_data": "worker1"}
        )
        alice = await clients["main"].register("alice")
        room = await alice.create_room()
        await alice.ok("PUT", f"/user/{alice.user_id}/rooms/{room}/tags/m.lowpriority", {})
        on_worker = clients["worker1"].as_user(alice.token)
        tags = await on_worker.ok("GET", f"/user/{alice.user_id}/rooms/{room}/tags")
        self.assertEqual(tags, {"tags": {"m.lowpriority": {}}})
        [writer] = await servers["main"].store.db_pool.select(
            "t", "SELECT instance_name FROM room_tags_revisions"
        )
        self.assertEqual(writer[0], "worker1")


__all__ = ["Any", "ClientApi", "eventually", "q"]
