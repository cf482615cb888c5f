"""Server-side key backup: versions, keys with the spec's replace-if-better
rule, etag and count, and the errors of the wrong or a missing version."""

from __future__ import annotations

from typing import Any

from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.server import DatabaseTestCase
from tests.harness.spec import assert_spec_response

BACKUP_API = "key_backup.yaml"
ALGORITHM = "m.megolm_backup.v1.curve25519-aes-sha2"


def key(first: int, forwarded: int, verified: bool, data: str) -> dict[str, Any]:
    return {
        "first_message_index": first,
        "forwarded_count": forwarded,
        "is_verified": verified,
        "session_data": {"ciphertext": data, "ephemeral": "e", "mac": "m"},
    }


class KeyBackupTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        _, clients, _ = start_cluster(self, self.test_db)
        self.alice = await ClientApi(self, clients["main"].base_url).register("alice")
        self.bob = await ClientApi(self, clients["main"].base_url).register("bob")

    async def new_version(self, client: ClientApi) -> str:
        body = {"algorithm": ALGORITHM, "auth_data": {"public_key": "pk"}}
        created = await client.ok("POST", "/room_keys/version", body)
        assert_spec_response(self, BACKUP_API, "/room_keys/version", "POST", 200, created)
        return str(created["version"])

    async def test_versions(self) -> None:
        status, error = await self.alice.request("GET", "/room_keys/version")
        self.assertEqual((status, error["errcode"]), (404, "M_NOT_FOUND"))
        first = await self.new_version(self.alice)
        second = await self.new_version(self.alice)
        current = await self.alice.ok("GET", "/room_keys/version")
        assert_spec_response(self, BACKUP_API, "/room_keys/version", "GET", 200, current)
        self.assertEqual(
            current,
            {
                "version": second,
                "algorithm": ALGORITHM,
                "auth_data": {"public_key": "pk"},
                "etag": "0",
                "count": 0,
            },
        )
        self.assertEqual(
            (await self.alice.ok("GET", f"/room_keys/version/{first}"))["version"], first
        )
        # Bob sees none of alice's.
        status, _ = await self.bob.request("GET", f"/room_keys/version/{first}")
        self.assertEqual(status, 404)

        await self.alice.ok(
            "PUT",
            f"/room_keys/version/{second}",
            {"algorithm": ALGORITHM, "auth_data": {"public_key": "pk2"}, "version": second},
        )
        self.assertEqual(
            (await self.alice.ok("GET", "/room_keys/version"))["auth_data"], {"public_key": "pk2"}
        )
        for body, code in [
            ({"algorithm": "other", "auth_data": {}}, 400),
            ({"algorithm": ALGORITHM, "auth_data": {}, "version": first}, 400),
            ({"algorithm": ALGORITHM}, 400),
        ]:
            status, _ = await self.alice.request("PUT", f"/room_keys/version/{second}", body)
            self.assertEqual(status, code, body)

        await self.alice.ok("DELETE", f"/room_keys/version/{second}")
        self.assertEqual((await self.alice.ok("GET", "/room_keys/version"))["version"], first)
        status, error = await self.alice.request("DELETE", f"/room_keys/version/{second}")
        self.assertEqual((status, error["errcode"]), (404, "M_NOT_FOUND"))
        # A deleted version's number is not handed out again.
        self.assertNotIn(await self.new_version(self.alice), (first, second))

    async def test_auth_data_is_opaque_but_for_the_specs_algorithm(self) -> None:
        """auth_data and session_data are "algorithm-dependent": objects for
        the spec's algorithm, anything (but absent or null) otherwise. The
        version named by the client as a number names the same version."""
        created = await self.alice.ok(
            "POST", "/room_keys/version", {"algorithm": "org.example.v1", "auth_data": "opaque"}
        )
        version = created["version"]
        self.assertEqual((await self.alice.ok("GET", "/room_keys/version"))["auth_data"], "opaque")
        await self.alice.ok(
            "PUT",
            f"/room_keys/version/{version}",
            {"algorithm": "org.example.v1", "auth_data": ["changed"], "version": int(version)},
        )
        current = await self.alice.ok("GET", f"/room_keys/version/{version}")
        self.assertEqual(current["auth_data"], ["changed"])
        # Its keys' session_data is as opaque; a room id needs no server part.
        opaque_key = {**key(3, 0, False, "x"), "session_data": "opaque"}
        await self.alice.ok("PUT", f"/room_keys/keys/!abcd/1234?version={version}", opaque_key)
        stored = await self.alice.ok("GET", f"/room_keys/keys/!abcd/1234?version={version}")
        self.assertEqual(stored["session_data"], "opaque")
        for body, errcode in [
            ({"algorithm": ALGORITHM, "auth_data": "opaque"}, "M_BAD_JSON"),
            ({"algorithm": ALGORITHM, "auth_data": {"public_key": 5}}, "M_BAD_JSON"),
            ({"algorithm": "org.example.v1", "auth_data": None}, "M_MISSING_PARAM"),
            ({"algorithm": "org.example.v1"}, "M_MISSING_PARAM"),
        ]:
            status, error = await self.alice.request("POST", "/room_keys/version", body)
            self.assertEqual((status, error["errcode"]), (400, errcode), body)

    async def test_more_than_ten_versions(self) -> None:
        # Numbers, not text: the eleventh is above the ninth and current.
        versions = [await self.new_version(self.alice) for _ in range(11)]
        self.assertEqual([int(v) for v in versions], sorted(int(v) for v in versions))
        self.assertEqual(len(set(versions)), 11)
        current = await self.alice.ok("GET", "/room_keys/version")
        self.assertEqual(current["version"], versions[-1])

    async def test_keys_replace_if_better_with_etag_and_count(self) -> None:
        version = await self.new_version(self.alice)
        room, other_room = "!room:test.local", "!other:test.local"
        path = f"/room_keys/keys?version={version}"
        put = await self.alice.ok(
            "PUT",
            path,
            {
                "rooms": {
                    room: {"sessions": {"s1": key(5, 1, False, "a"), "s2": key(0, 0, True, "b")}},
                    other_room: {"sessions": {"s3": key(0, 0, False, "c")}},
                }
            },
        )
        self.assertEqual(put, {"etag": "1", "count": 3})
        # Worse keys change nothing (and the etag stays).
        for worse in (key(6, 0, False, "x"), key(5, 2, False, "x")):
            unchanged = await self.alice.ok(
                "PUT", f"/room_keys/keys/{room}/s1?version={version}", worse
            )
            self.assertEqual(unchanged, {"etag": "1", "count": 3})
        stored = await self.alice.ok("GET", f"/room_keys/keys/{room}/s1?version={version}")
        self.assertEqual(stored["session_data"]["ciphertext"], "a")
        # Better: verified; then a lower first index; then fewer forwards.
        for better, data in (
            (key(9, 9, True, "verified"), "verified"),
            (key(3, 9, True, "lower index"), "lower index"),
            (key(3, 2, True, "fewer forwards"), "fewer forwards"),
        ):
            await self.alice.ok("PUT", f"/room_keys/keys/{room}/s1?version={version}", better)
            stored = await self.alice.ok("GET", f"/room_keys/keys/{room}/s1?version={version}")
            self.assertEqual(stored["session_data"]["ciphertext"], data)
        # An unverified key never replaces a verified one.
        await self.alice.ok(
            "PUT", f"/room_keys/keys/{room}/s1?version={version}", key(0, 0, False, "x")
        )
        stored = await self.alice.ok("GET", f"/room_keys/keys/{room}/s1?version={version}")
        self.assertEqual(stored["session_data"]["ciphertext"], "fewer forwards")

        everything = await self.alice.ok("GET", path)
        self.assertEqual(sorted(everything["rooms"]), sorted([room, other_room]))
        one_room = await self.alice.ok("GET", f"/room_keys/keys/{room}?version={version}")
        self.assertEqual(sorted(one_room["sessions"]), ["s1", "s2"])
        current = await self.alice.ok("GET", "/room_keys/version")
        self.assertEqual((current["etag"], current["count"]), ("4", 3))

        deleted = await self.alice.ok("DELETE", f"/room_keys/keys/{room}/s2?version={version}")
        self.assertEqual(deleted, {"etag": "5", "count": 2})
        deleted = await self.alice.ok("DELETE", path)
        self.assertEqual(deleted["count"], 0)
        status, _ = await self.alice.request("GET", f"/room_keys/keys/{room}/s1?version={version}")
        self.assertEqual(status, 404)

    async def test_wrong_and_missing_versions_and_bad_keys(self) -> None:
        old = await self.new_version(self.alice)
        new = await self.new_version(self.alice)
        status, error = await self.alice.request(
            "PUT", f"/room_keys/keys/!r:test.local/s?version={old}", key(0, 0, False, "x")
        )
        self.assertEqual(
            (status, error["errcode"], error["current_version"]),
            (403, "M_WRONG_ROOM_KEYS_VERSION", new),
        )
        status, error = await self.alice.request("GET", "/room_keys/keys?version=999")
        self.assertEqual((status, error["errcode"]), (404, "M_NOT_FOUND"))
        status, error = await self.alice.request("GET", "/room_keys/keys")
        self.assertEqual((status, error["errcode"]), (400, "M_MISSING_PARAM"))
        for bad in (
            {
                "first_message_index": -1,
                "forwarded_count": 0,
                "is_verified": False,
                "session_data": {},
            },
            {
                "first_message_index": 0,
                "forwarded_count": 0,
                "is_verified": "no",
                "session_data": {},
            },
            {
                "first_message_index": 0,
                "forwarded_count": 0,
                "is_verified": False,
                "session_data": 1,
            },
            {"first_message_index": 0},
        ):
            status, error = await self.alice.request(
                "PUT", f"/room_keys/keys/!r:test.local/s?version={new}", bad
            )
            self.assertEqual((status, error["errcode"]), (400, "M_BAD_JSON"), bad)
        status, error = await self.alice.request(
            "PUT", f"/room_keys/keys?version={new}", {"rooms": {"not-a-room": {"sessions": {}}}}
        )
        self.assertEqual(status, 400)
        self.assertEqual((await self.alice.ok("GET", "/room_keys/version"))["count"], 0)
