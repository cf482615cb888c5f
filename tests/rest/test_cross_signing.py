"""Cross-signing keys and signatures, and deleting or renaming devices, with
user-interactive auth where the spec asks for it."""

from __future__ import annotations

from typing import Any

from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.server import DatabaseTestCase
from tests.harness.spec import assert_spec_response
from tests.rest.test_keys import device_keys, one_time_keys


def cross_key(
    user_id: str, usage: str, public: str, signed_by: str | None = None
) -> dict[str, Any]:
    key: dict[str, Any] = {
        "user_id": user_id,
        "usage": [usage],
        "keys": {f"ed25519:{public}": public},
    }
    if signed_by is not None:
        key["signatures"] = {user_id: {f"ed25519:{signed_by}": "sig"}}
    return key


def keys_of(client: ClientApi, master: str = "MASTER") -> dict[str, Any]:
    user = client.user_id
    assert user is not None
    return {
        "master_key": cross_key(user, "master", master),
        "self_signing_key": cross_key(user, "self_signing", f"SSK{master}", signed_by=master),
        "user_signing_key": cross_key(user, "user_signing", f"USK{master}", signed_by=master),
    }


def password_auth(client: ClientApi, session: str, password: str = "secret-pw") -> dict[str, Any]:
    return {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": client.user_id},
        "password": password,
        "session": session,
    }


class CrossSigningTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        _, clients, _ = start_cluster(self, self.test_db, workers=["reader"])
        self.main_url = clients["main"].base_url
        self.alice = await ClientApi(self, self.main_url).register("alice")
        self.bob = await ClientApi(self, self.main_url).register("bob")

    async def test_upload_query_and_replace_with_password(self) -> None:
        # The first upload needs no password.
        await self.alice.ok("POST", "/keys/device_signing/upload", keys_of(self.alice))
        queried = await self.alice.ok(
            "POST", "/keys/query", {"device_keys": {self.alice.user_id: []}}
        )
        assert_spec_response(self, "keys.yaml", "/keys/query", "POST", 200, queried)
        self.assertEqual(
            queried["master_keys"][self.alice.user_id]["keys"], {"ed25519:MASTER": "MASTER"}
        )
        self.assertIn(self.alice.user_id, queried["self_signing_keys"])
        self.assertIn(self.alice.user_id, queried["user_signing_keys"])
        # Another user sees the master and self-signing keys, not the user-signing key.
        by_bob = await self.bob.ok("POST", "/keys/query", {"device_keys": {self.alice.user_id: []}})
        self.assertIn(self.alice.user_id, by_bob["master_keys"])
        self.assertEqual(by_bob["user_signing_keys"], {})

        # The same keys again: a retry, no password needed.
        await self.alice.ok("POST", "/keys/device_signing/upload", keys_of(self.alice))
        # New keys: a 401 with the flows, then a wrong password, then the right one.
        status, challenge = await self.alice.request(
            "POST", "/keys/device_signing/upload", keys_of(self.alice, "NEW")
        )
        self.assertEqual(status, 401)
        self.assertEqual(challenge["flows"], [{"stages": ["m.login.password"]}])
        session = challenge["session"]
        body = {**keys_of(self.alice, "NEW"), "auth": password_auth(self.alice, session, "wrong")}
        status, refused = await self.alice.request("POST", "/keys/device_signing/upload", body)
        self.assertEqual((status, refused["errcode"]), (401, "M_FORBIDDEN"))
        body["auth"] = password_auth(self.alice, session)
        await self.alice.ok("POST", "/keys/device_signing/upload", body)
        queried = await self.bob.ok(
            "POST", "/keys/query", {"device_keys": {self.alice.user_id: []}}
        )
        self.assertEqual(queried["master_keys"][self.alice.user_id]["keys"], {"ed25519:NEW": "NEW"})

    async def test_bad_cross_signing_keys(self) -> None:
        user = self.alice.user_id
        assert user is not None
        good = keys_of(self.alice)
        for body in [
            {},
            {"master_key": {**good["master_key"], "user_id": self.bob.user_id}},
            {"master_key": {**good["master_key"], "usage": ["self_signing"]}},
            {"master_key": {**good["master_key"], "keys": {"ed25519:A": "B"}}},
            {"master_key": {**good["master_key"], "keys": {}}},
            # Self-signing without a master key, or not signed by it.
            {"self_signing_key": good["self_signing_key"]},
            {**good, "self_signing_key": cross_key(user, "self_signing", "S", signed_by="OTHER")},
        ]:
            status, error = await self.alice.request("POST", "/keys/device_signing/upload", body)
            self.assertEqual(status, 400, (body, error))
        queried = await self.bob.ok("POST", "/keys/query", {"device_keys": {user: []}})
        self.assertEqual(queried["master_keys"], {})

    async def test_signatures_upload(self) -> None:
        alice = self.alice
        assert alice.user_id is not None and alice.device_id is not None
        await alice.ok("POST", "/keys/upload", {"device_keys": device_keys(alice)})
        await alice.ok("POST", "/keys/device_signing/upload", keys_of(alice))
        await self.bob.ok("POST", "/keys/device_signing/upload", keys_of(self.bob, "BOBM"))
        signed_device = {
            **device_keys(alice),
            "signatures": {alice.user_id: {"ed25519:SSKMASTER": "device-sig"}},
        }
        bob_master = cross_key(self.bob.user_id or "", "master", "BOBM")
        bob_master["signatures"] = {alice.user_id: {"ed25519:USKMASTER": "bob-sig"}}
        answer = await alice.ok(
            "POST",
            "/keys/signatures/upload",
            {
                alice.user_id: {
                    alice.device_id: signed_device,
                    "NOSUCHKEY": {"user_id": alice.user_id, "signatures": {}},
                },
                self.bob.user_id: {"BOBM": bob_master},
            },
        )
        assert_spec_response(
            self, "cross_signing.yaml", "/keys/signatures/upload", "POST", 200, answer
        )
        self.assertEqual(list(answer["failures"]), [alice.user_id])
        self.assertEqual(answer["failures"][alice.user_id]["NOSUCHKEY"]["errcode"], "M_NOT_FOUND")

        by_bob = await self.bob.ok(
            "POST", "/keys/query", {"device_keys": {alice.user_id: [], self.bob.user_id: []}}
        )
        device = by_bob["device_keys"][alice.user_id][alice.device_id]
        self.assertEqual(device["signatures"][alice.user_id]["ed25519:SSKMASTER"], "device-sig")
        # Alice's signature of bob's master key is alice's own business.
        self.assertNotIn(
            alice.user_id, by_bob["master_keys"][self.bob.user_id].get("signatures", {})
        )
        by_alice = await alice.ok("POST", "/keys/query", {"device_keys": {self.bob.user_id: []}})
        self.assertEqual(
            by_alice["master_keys"][self.bob.user_id]["signatures"][alice.user_id],
            {"ed25519:USKMASTER": "bob-sig"},
        )
        # Signed with a key that may not sign it: a failure, nothing stored.
        wrong = {**device_keys(alice), "signatures": {alice.user_id: {"ed25519:USKMASTER": "x"}}}
        answer = await alice.ok(
            "POST", "/keys/signatures/upload", {alice.user_id: {alice.device_id: wrong}}
        )
        self.assertEqual(
            answer["failures"][alice.user_id][alice.device_id]["errcode"], "M_INVALID_SIGNATURE"
        )


class CrossSigningDeviceListsTestCase(DatabaseTestCase):
    """Who /sync tells of a cross-signing change: a user-signing key only its
    owner (others are never shown it), a signature of another user's master
    key only the signer (alone shown it); master and self-signing keys
    everyone sharing a room. Read on a worker; the unstable paths of
    MSC1756 (older clients, SyTest) work as the v3 ones."""

    async def test_who_is_told(self) -> None:
        _, clients, _ = start_cluster(self, self.test_db, workers=["reader"])
        main = clients["main"].base_url
        alice = await ClientApi(self, main).register("alice")
        bob = await ClientApi(self, main).register("bob")
        carol = await ClientApi(self, main).register("carol")
        room_id = await alice.create_room(preset="public_chat")
        for other in (bob, carol):
            await other.ok("POST", f"/join/{room_id}")
        readers = {
            c: ClientApi(self, clients["reader"].base_url).as_user(c.token)
            for c in (alice, bob, carol)
        }
        since = {c: (await readers[c].sync())["next_batch"] for c in readers}

        async def changed(client: ClientApi, expected: int = 1) -> list[str]:
            # The reader catches up with the writer before answering: poll
            # until as many users as expected are named (two changes made one
            # after the other may reach the reader in two syncs).
            async def sync() -> Any:
                body = await readers[client].sync(since=since[client])
                since[client] = body["next_batch"]
                return body

            found: set[str] = set()
            for _ in range(20):
                found |= set((await sync()).get("device_lists", {}).get("changed", []))
                if len(found) >= expected:
                    break
            return sorted(found)

        unstable = "/_matrix/client/unstable/keys/device_signing/upload"
        keys = keys_of(alice)
        await alice.ok("POST", unstable, {"master_key": keys["master_key"]})
        await bob.ok("POST", unstable, {"master_key": keys_of(bob, "BOBM")["master_key"]})
        self.assertEqual(await changed(carol, 2), sorted([alice.user_id, bob.user_id]))
        since[alice] = (await readers[alice].sync())["next_batch"]
        since[bob] = (await readers[bob].sync())["next_batch"]

        # The user-signing key: alice is told, bob is not.
        body = {"user_signing_key": keys["user_signing_key"]}
        status, challenge = await alice.request("POST", unstable, body)
        self.assertEqual(status, 401)
        body["auth"] = password_auth(alice, challenge["session"])
        await alice.ok("POST", unstable, body)
        self.assertEqual(await changed(alice), [alice.user_id])
        marker = await alice.send(room_id, "after the key")
        self.assertNotIn(alice.user_id, await self.changed_until(readers[bob], since, bob, marker))

        # Alice signs bob's master key: alice is told bob changed; carol is not.
        bob_master = cross_key(bob.user_id or "", "master", "BOBM")
        bob_master["signatures"] = {alice.user_id: {"ed25519:USKMASTER": "bob-sig"}}
        answer = await alice.ok(
            "POST",
            "/_matrix/client/unstable/keys/signatures/upload",
            {bob.user_id: {"BOBM": bob_master}},
        )
        self.assertEqual(answer["failures"], {})
        self.assertEqual(await changed(alice), [bob.user_id])
        marker = await alice.send(room_id, "after the signature")
        self.assertNotIn(
            bob.user_id, await self.changed_until(readers[carol], since, carol, marker)
        )

    async def changed_until(
        self, reader: ClientApi, since: dict[ClientApi, str], client: ClientApi, event_id: str
    ) -> set[str]:
        """Everything ``device_lists.changed`` says until the sync that has
        ``event_id`` (sent after the change: the change is in the window)."""
        found: set[str] = set()
        for _ in range(50):
            body = await reader.sync(since=since[client])
            since[client] = body["next_batch"]
            found |= set(body.get("device_lists", {}).get("changed", []))
            timelines = body.get("rooms", {}).get("join", {}).values()
            if any(e["event_id"] == event_id for t in timelines for e in t["timeline"]["events"]):
                return found
        self.fail(f"{event_id} never reached the reader")


class DevicesTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        _, clients, _ = start_cluster(self, self.test_db, workers=["reader"])
        self.reader_url = clients["reader"].base_url
        self.alice = await ClientApi(self, self.reader_url).register("alice")
        self.bob = await ClientApi(self, self.reader_url).register("bob")

    async def login(self) -> ClientApi:
        other = ClientApi(self, self.reader_url)
        answer = await other.ok(
            "POST",
            "/login",
            {"type": "m.login.password", "user": "alice", "password": "secret-pw"},
        )
        other.token, other.user_id = answer["access_token"], answer["user_id"]
        other.device_id = answer["device_id"]
        return other

    async def test_rename_device(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room}", {})
        since = (await self.bob.sync())["next_batch"]
        await self.alice.ok("PUT", f"/devices/{self.alice.device_id}", {"display_name": "Phone"})
        device = await self.alice.ok("GET", f"/devices/{self.alice.device_id}")
        self.assertEqual(device["display_name"], "Phone")
        later = await self.bob.sync(since=since)
        self.assertEqual(later["device_lists"]["changed"], [self.alice.user_id])
        status, error = await self.alice.request("PUT", "/devices/NOSUCH", {"display_name": "x"})
        self.assertEqual((status, error["errcode"]), (404, "M_NOT_FOUND"))
        status, error = await self.alice.request(
            "PUT", f"/devices/{self.alice.device_id}", {"display_name": 5}
        )
        self.assertEqual((status, error["errcode"]), (400, "M_BAD_JSON"))

    async def test_delete_device_needs_password_and_removes_keys_and_tokens(self) -> None:
        second = await self.login()
        await second.ok(
            "POST",
            "/keys/upload",
            {"device_keys": device_keys(second), "one_time_keys": one_time_keys(3)},
        )
        status, challenge = await self.alice.request("DELETE", f"/devices/{second.device_id}", {})
        self.assertEqual(status, 401)
        body = {"auth": password_auth(self.alice, challenge["session"], "wrong")}
        status, error = await self.alice.request("DELETE", f"/devices/{second.device_id}", body)
        self.assertEqual((status, error["errcode"]), (401, "M_FORBIDDEN"))
        # Bob cannot use his password for alice's device: naming another
        # user is refused outright (handlers/ui_auth.py).
        body = {"auth": password_auth(self.bob, challenge["session"])}
        status, _ = await self.alice.request("DELETE", f"/devices/{second.device_id}", body)
        self.assertEqual(status, 403)
        body = {"auth": password_auth(self.alice, challenge["session"])}
        await self.alice.ok("DELETE", f"/devices/{second.device_id}", body)

        status, _ = await second.request("GET", "/account/whoami")
        self.assertEqual(status, 401)
        queried = await self.bob.ok(
            "POST", "/keys/query", {"device_keys": {self.alice.user_id: []}}
        )
        self.assertEqual(queried["device_keys"][self.alice.user_id], {})
        claimed = await self.bob.ok(
            "POST",
            "/keys/claim",
            {"one_time_keys": {self.alice.user_id: {second.device_id: "signed_curve25519"}}},
        )
        self.assertEqual(claimed["one_time_keys"], {})
        status, error = await self.alice.request("DELETE", "/devices/NOSUCH", {})
        self.assertEqual((status, error["errcode"]), (404, "M_NOT_FOUND"))

    async def test_delete_devices(self) -> None:
        second, third = await self.login(), await self.login()
        body: dict[str, Any] = {"devices": [second.device_id, third.device_id]}
        status, challenge = await self.alice.request("POST", "/delete_devices", body)
        self.assertEqual(status, 401)
        body["auth"] = password_auth(self.alice, challenge["session"])
        await self.alice.ok("POST", "/delete_devices", body)
        devices = await self.alice.ok("GET", "/devices")
        self.assertEqual([d["device_id"] for d in devices["devices"]], [self.alice.device_id])
        for bad in ({"devices": "X"}, {"devices": [5]}, {}):
            status, error = await self.alice.request("POST", "/delete_devices", bad)
            self.assertEqual((status, error["errcode"]), (400, "M_BAD_JSON"), bad)
