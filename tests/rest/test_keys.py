"""End-to-end encryption keys over HTTP: upload, query, claim (exactly once
under concurrent claims on two processes), changes, the /sync counts, and bad
input refused with nothing stored."""

from __future__ import annotations

import time
from typing import Any

from twisted.internet import defer

from synapse_lite.handlers import e2e_keys
from synapse_lite.handlers.e2e_keys import MAX_ONE_TIME_KEYS_PER_UPLOAD
from tests.harness.client_api import ClientApi, serve, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase, make_homeserver
from tests.harness.spec import assert_spec_response

KEYS_API = "keys.yaml"


def device_keys(client: ClientApi, curve: str = "curvepublic") -> dict[str, Any]:
    """Identity keys as a client signs them (the signature is not checked)."""
    user, device = client.user_id, client.device_id
    assert user is not None and device is not None
    return {
        "user_id": user,
        "device_id": device,
        "algorithms": ["m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"],
        "keys": {f"curve25519:{device}": curve, f"ed25519:{device}": "edpublic"},
        "signatures": {user: {f"ed25519:{device}": "sig"}},
    }


def one_time_keys(count: int, prefix: str = "k") -> dict[str, Any]:
    return {
        f"signed_curve25519:{prefix}{i:03d}": {
            "key": f"otk-{prefix}{i:03d}",
            "signatures": {"@x:test": {"ed25519:D": "sig"}},
        }
        for i in range(count)
    }


class KeysTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(self, self.test_db, workers=["reader"])
        self.main_url = clients["main"].base_url
        self.reader_url = clients["reader"].base_url
        self.alice = await ClientApi(self, self.main_url).register("alice")
        self.bob = await ClientApi(self, self.main_url).register("bob")

    def on_reader(self, client: ClientApi) -> ClientApi:
        other = ClientApi(self, self.reader_url).as_user(client.token)
        other.user_id, other.device_id = client.user_id, client.device_id
        return other

    async def test_upload_query_and_sync_counts(self) -> None:
        body = {
            "device_keys": device_keys(self.alice),
            "one_time_keys": one_time_keys(5),
            "fallback_keys": {
                "signed_curve25519:fb1": {
                    "key": "fallback",
                    "fallback": True,
                    "signatures": {"@x:test": {"ed25519:D": "sig"}},
                }
            },
        }
        # Uploaded on the reader: the identity keys go to the device_lists writer.
        uploaded = await self.on_reader(self.alice).ok("POST", "/keys/upload", body)
        self.assertEqual(uploaded, {"one_time_key_counts": {"signed_curve25519": 5}})
        assert_spec_response(self, KEYS_API, "/keys/upload", "POST", 200, uploaded)
        # The same upload again is a client retrying: nothing changes.
        again = await self.alice.ok("POST", "/keys/upload", body)
        self.assertEqual(again["one_time_key_counts"]["signed_curve25519"], 5)

        queried = await self.bob.ok(
            "POST", "/keys/query", {"device_keys": {self.alice.user_id: []}}
        )
        assert_spec_response(self, KEYS_API, "/keys/query", "POST", 200, queried)
        keys = queried["device_keys"][self.alice.user_id][self.alice.device_id]
        self.assertEqual(keys["keys"], device_keys(self.alice)["keys"])
        self.assertIn("unsigned", keys)
        self.assertEqual(queried["failures"], {})
        # A remote user: a failure for its server, not an error.
        remote = await self.bob.ok("POST", "/keys/query", {"device_keys": {"@carol:elsewhere": []}})
        self.assertIn("elsewhere", remote["failures"])
        self.assertEqual(remote["device_keys"], {})

        sync = await self.on_reader(self.alice).sync()
        self.assertEqual(sync["device_one_time_keys_count"], {"signed_curve25519": 5})
        self.assertEqual(sync["device_unused_fallback_key_types"], ["signed_curve25519"])

    async def test_claims_are_exactly_once_across_two_processes(self) -> None:
        """20 concurrent claims, half on each process, for a device with 10
        one-time keys and a fallback key: the 10 keys once each, then the
        fallback key 10 times."""
        await self.alice.ok(
            "POST",
            "/keys/upload",
            {
                "device_keys": device_keys(self.alice),
                "one_time_keys": one_time_keys(10),
                "fallback_keys": {
                    "signed_curve25519:fb": {"key": "fb", "fallback": True, "signatures": {}}
                },
            },
        )
        claimers = [self.bob, self.on_reader(self.bob)]
        body = {"one_time_keys": {self.alice.user_id: {self.alice.device_id: "signed_curve25519"}}}
        results = await defer.gatherResults(
            [
                defer.ensureDeferred(claimers[i % 2].ok("POST", "/keys/claim", body))
                for i in range(20)
            ]
        )
        for result in results:
            assert_spec_response(self, KEYS_API, "/keys/claim", "POST", 200, result)
        key_ids = [
            next(iter(r["one_time_keys"][self.alice.user_id][self.alice.device_id]))
            for r in results
        ]
        one_time = [k for k in key_ids if k != "signed_curve25519:fb"]
        self.assertEqual(sorted(one_time), sorted(one_time_keys(10)))
        self.assertEqual(key_ids.count("signed_curve25519:fb"), 10)
        sync = await self.alice.sync()
        self.assertEqual(sync["device_one_time_keys_count"], {"signed_curve25519": 0})
        self.assertEqual(sync["device_unused_fallback_key_types"], [])

    async def test_sync_counts_follow_changes_made_on_another_process(self) -> None:
        """The reader keeps the counts it served (issue 35: a /sync reads
        nothing for them) and forgets them when an upload, a claim or the
        device's deletion on main changes them."""
        reader, store = self.on_reader(self.alice), self.servers["reader"].store
        fallback = {"signed_curve25519:fb": {"key": "fb", "fallback": True, "signatures": {}}}

        async def counts() -> tuple[Any, Any]:
            sync = await reader.sync()
            return sync["device_one_time_keys_count"], sync["device_unused_fallback_key_types"]

        self.assertEqual(await counts(), ({"signed_curve25519": 0}, []))
        reads: list[str] = []
        read = store.db_pool.runInteraction

        async def counting(desc: str, *args: Any, **kwargs: Any) -> Any:
            reads.append(desc)
            return await read(desc, *args, **kwargs)

        self.patch(store.db_pool, "runInteraction", counting)
        await counts()
        self.assertNotIn("get_device_key_counts", reads)
        await self.alice.ok(
            "POST", "/keys/upload", {"one_time_keys": one_time_keys(3), "fallback_keys": fallback}
        )
        expected = ({"signed_curve25519": 3}, ["signed_curve25519"])
        await eventually(lambda: self._is(counts(), expected), what="the upload's counts")
        body = {"one_time_keys": {self.alice.user_id: {self.alice.device_id: "signed_curve25519"}}}
        for _ in range(4):
            await self.bob.ok("POST", "/keys/claim", body)
        expected = ({"signed_curve25519": 0}, [])
        await eventually(lambda: self._is(counts(), expected), what="the claims' counts")

    async def _is(self, value: Any, expected: Any) -> bool:
        return bool(await value == expected)

    async def test_claim_unknown_device_and_remote_user(self) -> None:
        result = await self.bob.ok(
            "POST",
            "/keys/claim",
            {
                "one_time_keys": {
                    self.alice.user_id: {"NOSUCHDEVICE": "signed_curve25519"},
                    "@carol:elsewhere": {"D": "signed_curve25519"},
                }
            },
        )
        self.assertEqual(result["one_time_keys"], {})
        self.assertIn("elsewhere", result["failures"])

    async def test_as_strict_as_the_spec_and_no_stricter(self) -> None:
        """The spec requires ``signatures`` (an object) but not the device's
        own signature in it, and says key ids *should* name the device: an
        upload without either is stored as it came."""
        keys = {
            **device_keys(self.alice),
            "keys": {"ed25519:test": "c3op6BJi8aUnDGA541Q6TbTPmbiy1GqGv-zzXDQM9Us"},
            "signatures": {},
        }
        await self.alice.ok("POST", "/keys/upload", {"device_keys": keys})
        queried = await self.bob.ok(
            "POST", "/keys/query", {"device_keys": {self.alice.user_id: []}}
        )
        stored = queried["device_keys"][self.alice.user_id][self.alice.device_id]
        self.assertEqual(stored["keys"], keys["keys"])
        self.assertEqual(stored["signatures"], {})

    async def test_bad_uploads_store_nothing(self) -> None:
        good = device_keys(self.alice)
        cases: list[tuple[dict[str, Any], int, str]] = [
            ({"device_keys": {**good, "user_id": self.bob.user_id}}, 400, "M_INVALID_PARAM"),
            ({"device_keys": {**good, "device_id": "OTHER"}}, 400, "M_INVALID_PARAM"),
            ({"device_keys": {**good, "keys": {"nocolon": "k"}}}, 400, "M_BAD_JSON"),
            ({"device_keys": {**good, "keys": {"curve25519:": "k"}}}, 400, "M_BAD_JSON"),
            ({"device_keys": {**good, "algorithms": "olm"}}, 400, "M_BAD_JSON"),
            (
                {"device_keys": {k: v for k, v in good.items() if k != "signatures"}},
                400,
                "M_BAD_JSON",
            ),
            ({"device_keys": {**good, "signatures": "sig"}}, 400, "M_BAD_JSON"),
            ({"device_keys": {**good, "signatures": {"not-a-user": {}}}}, 400, "M_BAD_JSON"),
            ({"one_time_keys": {"signed_curve25519:a": 5}}, 400, "M_BAD_JSON"),
            ({"one_time_keys": {"signed_curve25519:a": {"key": ""}}}, 400, "M_BAD_JSON"),
            ({"one_time_keys": ["x"]}, 400, "M_BAD_JSON"),
            (
                {"one_time_keys": one_time_keys(MAX_ONE_TIME_KEYS_PER_UPLOAD + 1)},
                413,
                "M_TOO_LARGE",
            ),
            # A bad part refuses the good ones with it.
            (
                {"device_keys": good, "one_time_keys": {"signed_curve25519:a": 5}},
                400,
                "M_BAD_JSON",
            ),
        ]
        for body, code, errcode in cases:
            status, error = await self.alice.request("POST", "/keys/upload", body)
            self.assertEqual((status, error["errcode"]), (code, errcode), body)
        queried = await self.bob.ok(
            "POST", "/keys/query", {"device_keys": {self.alice.user_id: []}}
        )
        self.assertEqual(queried["device_keys"][self.alice.user_id], {})
        counts = await self.alice.ok("POST", "/keys/upload", {})
        self.assertEqual(counts["one_time_key_counts"], {"signed_curve25519": 0})

    async def test_one_time_key_reused_with_other_contents_is_refused(self) -> None:
        await self.alice.ok("POST", "/keys/upload", {"one_time_keys": one_time_keys(2)})
        changed = one_time_keys(3)
        changed["signed_curve25519:k001"] = {"key": "different", "signatures": {}}
        status, error = await self.alice.request("POST", "/keys/upload", {"one_time_keys": changed})
        self.assertEqual((status, error["errcode"]), (400, "M_INVALID_PARAM"))
        self.assertIn("signed_curve25519:k001", error["error"])
        counts = await self.alice.ok("POST", "/keys/upload", {})
        self.assertEqual(counts["one_time_key_counts"], {"signed_curve25519": 2})

    async def test_stored_one_time_keys_per_device_are_capped(self) -> None:
        """An upload that would take the device past its cap is refused
        (400 M_TOO_LARGE, nothing of it stored); a repeat of stored keys is
        not new; a claim makes room. (The cap is lowered for the test.)"""
        self.assertGreaterEqual(e2e_keys.MAX_ONE_TIME_KEYS_PER_DEVICE, MAX_ONE_TIME_KEYS_PER_UPLOAD)
        self.patch(e2e_keys, "MAX_ONE_TIME_KEYS_PER_DEVICE", 5)
        await self.alice.ok("POST", "/keys/upload", {"one_time_keys": one_time_keys(3)})
        status, error = await self.alice.request(
            "POST", "/keys/upload", {"one_time_keys": one_time_keys(3, "n")}
        )
        self.assertEqual((status, error["errcode"]), (400, "M_TOO_LARGE"))
        self.assertEqual(error["max_one_time_keys"], 5)
        self.assertIn("3 one-time keys stored", error["error"])
        counts = await self.alice.ok("POST", "/keys/upload", {})
        self.assertEqual(counts["one_time_key_counts"], {"signed_curve25519": 3})
        # Up to the cap exactly; the same keys again add nothing and are accepted.
        both = {**one_time_keys(3), **one_time_keys(2, "n")}
        counts = await self.alice.ok("POST", "/keys/upload", {"one_time_keys": both})
        self.assertEqual(counts["one_time_key_counts"], {"signed_curve25519": 5})
        counts = await self.alice.ok("POST", "/keys/upload", {"one_time_keys": both})
        self.assertEqual(counts["one_time_key_counts"], {"signed_curve25519": 5})
        status, error = await self.alice.request(
            "POST", "/keys/upload", {"one_time_keys": one_time_keys(1, "m")}
        )
        self.assertEqual((status, error["errcode"]), (400, "M_TOO_LARGE"))
        # Another device of the same user has its own cap.
        login = await ClientApi(self, self.main_url).ok(
            "POST",
            "/login",
            {
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": "alice"},
                "password": "secret-pw",
            },
        )
        other = ClientApi(self, self.main_url).as_user(login["access_token"])
        await other.ok("POST", "/keys/upload", {"one_time_keys": one_time_keys(5)})
        # A claim frees one place.
        claim = {"one_time_keys": {self.alice.user_id: {self.alice.device_id: "signed_curve25519"}}}
        claimed = await self.bob.ok("POST", "/keys/claim", claim)
        self.assertEqual(len(claimed["one_time_keys"][self.alice.user_id][self.alice.device_id]), 1)
        counts = await self.alice.ok(
            "POST", "/keys/upload", {"one_time_keys": one_time_keys(1, "m")}
        )
        self.assertEqual(counts["one_time_key_counts"], {"signed_curve25519": 5})

    async def test_bad_queries_and_claims(self) -> None:
        for path, body in [
            ("/keys/query", {"device_keys": ["@a:test"]}),
            ("/keys/query", {"device_keys": {"not-a-user": []}}),
            ("/keys/query", {"device_keys": {self.alice.user_id: "D"}}),
            ("/keys/claim", {"one_time_keys": {self.alice.user_id: "D"}}),
            ("/keys/claim", {"one_time_keys": {"nope": {}}}),
            ("/keys/claim", {"one_time_keys": {self.alice.user_id: {"D": 3}}}),
        ]:
            status, error = await self.bob.request("POST", path, body)
            self.assertEqual(status, 400, (path, body, error))
            self.assertIn(error["errcode"], ("M_BAD_JSON", "M_INVALID_PARAM"))

    async def test_device_list_changes_in_sync_and_keys_changes(self) -> None:
        room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room}", {})
        since = (await self.bob.sync())["next_batch"]
        await self.alice.ok("POST", "/keys/upload", {"device_keys": device_keys(self.alice)})
        bob_on_reader = self.on_reader(self.bob)
        later = await bob_on_reader.sync(since=since)
        while self.alice.user_id not in later["device_lists"]["changed"]:
            later = await bob_on_reader.sync(since=since, timeout=2000)
        changes = await self.bob.ok("GET", f"/keys/changes?from={since}&to={later['next_batch']}")
        assert_spec_response(self, KEYS_API, "/keys/changes", "GET", 200, changes)
        self.assertIn(self.alice.user_id, changes["changed"])

        # Bob leaves the only room they share: alice is "left" for him.
        await self.bob.ok("POST", f"/rooms/{room}/leave", {})
        after = await self.bob.sync(since=later["next_batch"])
        self.assertEqual(after["device_lists"]["left"], [self.alice.user_id])

    async def test_a_parked_sync_on_the_writer_is_woken(self) -> None:
        """The device_lists writer wakes its own /sync requests (other
        processes are woken by the stream's rows)."""
        room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/join/{room}", {})
        since = (await self.bob.sync())["next_batch"]
        for i in range(3):
            while True:  # let anything pending go by
                settled = await self.bob.sync(since=since)
                if settled["next_batch"] == since:
                    break
                since = settled["next_batch"]
            started = time.monotonic()
            parked = defer.ensureDeferred(self.bob.sync(since=since, timeout=30_000))
            keys = device_keys(self.alice, curve=f"curve{i}")
            await self.alice.ok("POST", "/keys/upload", {"device_keys": keys})
            woken = await parked
            while self.alice.user_id not in woken["device_lists"]["changed"]:
                woken = await self.bob.sync(since=woken["next_batch"], timeout=30_000)
            self.assertLess(time.monotonic() - started, 10)
            since = woken["next_batch"]

    async def test_no_backup_is_not_found(self) -> None:
        status, error = await self.alice.request("GET", "/room_keys/version")
        self.assertEqual((status, error["errcode"]), (404, "M_NOT_FOUND"))

    async def test_keys_changes_needs_tokens(self) -> None:
        status, error = await self.alice.request("GET", "/keys/changes?from=s1_0_0_0_0_0_0")
        self.assertEqual((status, error["errcode"]), (400, "M_MISSING_PARAM"))
        status, error = await self.alice.request("GET", "/keys/changes?from=bad&to=bad")
        self.assertEqual((status, error["errcode"]), (400, "M_INVALID_PARAM"))


class DeviceListWritersTestCase(DatabaseTestCase):
    """``stream_writers.device_lists`` with two writers: each user's changes
    on one of them, seen by /sync on every process, across a writer restart."""

    async def test_two_writers_and_a_restart(self) -> None:
        servers, clients, bus = start_cluster(
            self,
            self.test_db,
            workers=["dl1", "dl2", "reader"],
            stream_writers={"device_lists": ["dl1", "dl2"]},
        )
        config = servers["main"].config
        # Two users whose changes go to different writers.
        names: dict[str, str] = {}
        for i in range(50):
            user_id = f"@user{i}:{config.server_name}"
            names.setdefault(config.writers.writer_for("device_lists", user_id), f"user{i}")
        self.assertEqual(set(names), {"dl1", "dl2"})
        reader_url = clients["reader"].base_url
        alice = await ClientApi(self, reader_url).register(names["dl1"])
        bob = await ClientApi(self, reader_url).register(names["dl2"])
        room = await alice.create_room(preset="public_chat")
        await bob.ok("POST", f"/join/{room}", {})
        bob_on_main = ClientApi(self, clients["main"].base_url).as_user(bob.token)
        since_reader = (await bob.sync())["next_batch"]
        since_main = (await bob_on_main.sync())["next_batch"]

        await alice.ok("POST", "/keys/upload", {"device_keys": device_keys(alice)})
        await bob.ok("POST", "/keys/upload", {"device_keys": device_keys(bob)})
        for client, since in ((bob, since_reader), (bob_on_main, since_main)):
            seen: set[str] = set()
            while {alice.user_id, bob.user_id} - seen:
                answer = await client.sync(since=since, timeout=2000)
                seen |= set(answer["device_lists"]["changed"])
                since = answer["next_batch"]
        # Alice's device row is on dl1, bob's on dl2.
        rows = await servers["main"].store.db_pool.select(
            "t", "SELECT user_id, instance_name FROM device_lists_stream"
        )
        self.assertIn((alice.user_id, "dl1"), rows)
        self.assertIn((bob.user_id, "dl2"), rows)

        # Alice's writer restarts; her next change is seen all the same.
        old = servers["dl1"]
        bus.leave(next(e for e in bus.endpoints if e.hs is old))
        await old.service.stopService()
        restarted = make_homeserver(self, old.config, "dl1")
        serve(self, restarted)
        bus.join(restarted)
        await alice.ok(
            "POST", "/keys/upload", {"device_keys": device_keys(alice, curve="new-curve")}
        )
        while (
            alice.user_id
            not in (answer := await bob.sync(since=since, timeout=2000))["device_lists"]["changed"]
        ):
            since = answer["next_batch"]
        queried = await bob.ok("POST", "/keys/query", {"device_keys": {alice.user_id: []}})
        keys = queried["device_keys"][alice.user_id][alice.device_id]["keys"]
        self.assertEqual(keys[f"curve25519:{alice.device_id}"], "new-curve")
