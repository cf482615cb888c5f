"""Two homeservers in the test process, each on its own database, talking
federation over real loopback HTTP: delivery, signatures, replays, keys, and
an inbound request on a worker that is not the to_device writer."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any, cast

import treq
from twisted.internet import reactor, task

from synapse_lite.federation.auth import XMatrixAuth, request_json, sign_request
from synapse_lite.federation.crypto import (
    SigningKey,
    canonical_json,
    load_or_create_signing_key,
    verify_signed_json,
)
from synapse_lite.server import HomeServer
from synapse_lite.storage.id_generators import generator as id_generators
from tests.harness.client_api import ClientApi
from tests.harness.federation import LoopbackServers, to_device_transaction
from tests.harness.polling import eventually
from tests.harness.processes import NO_KEEPALIVE

_reactor = cast(Any, reactor)


class TwoServersTestCase(LoopbackServers):
    """``a.test`` (one process) and ``b.test`` (main + ``fed1``, a worker that
    serves federation while main writes to_device). Other servers reach b
    through its last process: the worker, which is not the to_device writer."""

    def setUp(self) -> None:
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)
        retry = {"retry": {"initial_seconds": 0.2, "max_seconds": 1}}
        self.a = self.make_server("a.test", [], federation=retry)
        self.b = self.make_server("b.test", ["fed1"], federation=retry)
        self.connect(self.a, self.b)

    async def users(self) -> tuple[ClientApi, ClientApi]:
        alice = await ClientApi(self, self.client_url(self.a["main"])).register("alice")
        bob = await ClientApi(self, self.client_url(self.b["main"])).register("bob")
        return alice, bob

    def client_url(self, hs: HomeServer) -> str:
        location = hs.config.instance_map[hs.instance_name]
        return location.base_url

    async def to_device_events(self, bob: ClientApi, since: str) -> list[Any]:
        return list((await bob.sync(since=since))["to_device"]["events"])

    async def put_send(
        self, origin_key: SigningKey, txn_id: str, body: dict[str, Any], origin: str = "a.test"
    ) -> tuple[int, Any]:
        path = f"/_matrix/federation/v1/send/{txn_id}"
        header = sign_request(origin_key, origin, "b.test", "PUT", path, body)
        return await self.raw_put(path, body, [header])

    async def raw_put(self, path: str, body: Any, auth: list[str]) -> tuple[int, Any]:
        headers: dict[Any, Any] = {"Content-Type": ["application/json"]}
        if auth:
            headers["Authorization"] = auth
        response = await treq.put(
            self.urls["b.test"] + path,
            data=json.dumps(body).encode(),
            headers=headers,
            pool=NO_KEEPALIVE,
        )
        content = await treq.content(response)
        return response.code, json.loads(content)

    def edu_body(self, message_id: str, bob: ClientApi, content: Any) -> dict[str, Any]:
        assert bob.user_id is not None
        return to_device_transaction(message_id, bob.user_id, content, origin_server_ts=1)

    async def wait_for_events(self, bob: ClientApi, since: str, n: int) -> list[Any]:
        deadline = reactor.seconds() + 10
        while True:
            events = await self.to_device_events(bob, since)
            if len(events) >= n or reactor.seconds() > deadline:
                return events
            await task.deferLater(reactor, 0.05, lambda: None)

    # Scenarios

    async def test_delivery_exactly_once(self) -> None:
        alice, bob = await self.users()
        since = (await bob.sync())["next_batch"]
        for i in range(3):
            await alice.ok(
                "PUT", f"/sendToDevice/m.test/t{i}", {"messages": {bob.user_id: {"*": {"n": i}}}}
            )
        events = await self.wait_for_events(bob, since, 3)
        self.assertEqual([e["content"]["n"] for e in events], [0, 1, 2])
        self.assertEqual(events[0]["sender"], "@alice:a.test")

        async def outbox_empty() -> bool:
            # Emptied once b's answer to the transaction is back at a, which
            # can be after bob's /sync already has the messages.
            rows = await self.a["main"].store.db_pool.select(
                "t", "SELECT COUNT(*) FROM device_federation_outbox"
            )
            return bool(rows[0][0] == 0)

        await eventually(outbox_empty, timeout=10, what="a's outbox emptied")
        # b fetched and cached a's key.
        keys = await self.b["main"].store.get_server_keys("a.test")
        self.assertIn(
            load_or_create_signing_key(self.a["main"].config.data_dir, create=False).key_id, keys
        )

    async def test_forged_and_replayed(self) -> None:
        _, bob = await self.users()
        since = (await bob.sync())["next_batch"]
        a_key = load_or_create_signing_key(self.a["main"].config.data_dir, create=False)
        forger = SigningKey(a_key.version, bytes(32))  # a's key id, wrong key
        body = self.edu_body("m1", bob, {"x": 1})

        code, answer = await self.put_send(forger, "t1", body)
        self.assertEqual((code, answer["errcode"]), (401, "M_UNAUTHORIZED"))
        code, _ = await self.raw_put("/_matrix/federation/v1/send/t1", body, [])
        self.assertEqual(code, 401)
        # Signed for another destination, and the request body changed after signing.
        path = "/_matrix/federation/v1/send/t1"
        sig = a_key.sign(canonical_json(request_json("PUT", path, "a.test", "c.test", body)))
        wrong_dest = XMatrixAuth("a.test", a_key.key_id, sig, "c.test").to_header()
        self.assertEqual((await self.raw_put(path, body, [wrong_dest]))[0], 401)
        header = sign_request(a_key, "a.test", "b.test", "PUT", path, body)
        changed = self.edu_body("m1", bob, {"x": 2})
        self.assertEqual((await self.raw_put(path, changed, [header]))[0], 401)
        # An origin that is no server name: malformed, 400, no key looked up.
        bad_origin = XMatrixAuth("localhost:http", a_key.key_id, sig, "b.test").to_header()
        code, answer = await self.raw_put(path, body, [bad_origin])
        self.assertEqual((code, answer["errcode"]), (400, "M_UNAUTHORIZED"))
        self.assertEqual(await self.to_device_events(bob, since), [])

        # The real thing, then replays: same transaction, and same message in another.
        first = await self.put_send(a_key, "t1", body)
        self.assertEqual(first, (200, {"pdus": {}}))
        self.assertEqual(await self.put_send(a_key, "t1", body), first)
        self.assertEqual((await self.put_send(a_key, "t2", body))[0], 200)
        events = await self.to_device_events(bob, since)
        self.assertEqual([e["content"] for e in events], [{"x": 1}])

    async def test_pdus_refused_and_bad_edus_ignored(self) -> None:
        _, bob = await self.users()
        since = (await bob.sync())["next_batch"]
        key = load_or_create_signing_key(self.a["main"].config.data_dir, create=False)
        body = self.edu_body("m2", bob, {"ok": True})
        body["pdus"] = [{"event_id": "$e1", "type": "m.room.message"}, "junk"]
        body["edus"] += [
            {"edu_type": "m.typing", "content": {}},
            "junk",
            {"edu_type": "m.direct_to_device", "content": {"sender": "@mallory:evil.test"}},
        ]
        code, answer = await self.put_send(key, "t3", body)
        self.assertEqual(code, 200)
        self.assertIn("error", answer["pdus"]["$e1"])
        events = await self.to_device_events(bob, since)
        self.assertEqual([e["content"] for e in events], [{"ok": True}])
        code, _ = await self.put_send(key, "t4", {**body, "origin": "c.test"})
        self.assertEqual(code, 403)

    async def test_hostile_bodies_are_refused_or_ignored_never_500(self) -> None:
        _, bob = await self.users()
        since = (await bob.sync())["next_batch"]
        key = load_or_create_signing_key(self.a["main"].config.data_dir, create=False)

        def edu(**content: Any) -> dict[str, Any]:
            base = {"sender": "@alice:a.test", "type": "t", "message_id": "m", "messages": {}}
            return {"edus": [{"edu_type": "m.direct_to_device", "content": {**base, **content}}]}

        bodies: list[tuple[dict[str, Any], int]] = [
            ({"pdus": {}}, 400),
            ({"edus": "x"}, 400),
            ({"pdus": [1] * 51}, 400),
            ({"edus": [{}] * 101}, 400),
            (edu(message_id="x" * 300), 200),
            (edu(message_id=5), 200),
            (edu(sender="not a user"), 200),
            (edu(type=["t"]), 200),
            (edu(messages={bob.user_id: "no"}), 200),
            (edu(messages={bob.user_id: {"D" * 300: {}}}), 200),
            (edu(messages={"@bob:c.test": {"D": {}}}), 200),
            (edu(messages=[]), 200),
        ]
        for i, (body, expected) in enumerate(bodies):
            code, answer = await self.put_send(key, f"h{i}", body)
            self.assertEqual(code, expected, f"{body}: {answer}")
        self.assertEqual(await self.to_device_events(bob, since), [])

    async def test_expired_key_is_fetched_again(self) -> None:
        _, bob = await self.users()
        key = load_or_create_signing_key(self.a["main"].config.data_dir, create=False)
        await self.put_send(key, "k1", self.edu_body("k1", bob, {}))
        store = self.b["main"].store
        await store.store_server_keys("a.test", {key.key_id: (key.verify_key_base64, 1)})
        keyring = self.b["fed1"].keyring
        assert keyring is not None
        keyring._cache.clear()
        keyring._last_fetch.clear()
        code, _ = await self.put_send(key, "k2", self.edu_body("k2", bob, {}))
        self.assertEqual(code, 200)
        keys = await store.get_server_keys("a.test")
        self.assertGreater(keys[key.key_id][1], 1)

    async def test_key_document(self) -> None:
        response = await treq.get(self.urls["a.test"] + "/_matrix/key/v2/server", pool=NO_KEEPALIVE)
        document = json.loads(await treq.content(response))
        from synapse_lite.federation.keyring import parse_key_document

        keys, valid_until = parse_key_document(document, "a.test")
        key = load_or_create_signing_key(self.a["main"].config.data_dir, create=False)
        self.assertEqual(keys, {key.key_id: key.verify_key_base64})
        self.assertGreater(valid_until, self.a["main"].clock.time_msec())

    async def test_notary(self) -> None:
        """a answers for b's keys (fetched from b, stored as b signed them)
        with its own signature added, by GET and POST."""
        b_key = load_or_create_signing_key(self.b["main"].config.data_dir, create=False)
        a_key = load_or_create_signing_key(self.a["main"].config.data_dir, create=False)
        response = await treq.get(
            self.urls["a.test"] + "/_matrix/key/v2/query/b.test", pool=NO_KEEPALIVE
        )
        [document] = json.loads(await treq.content(response))["server_keys"]
        verify_signed_json(document, "b.test", b_key.key_id, b_key.verify_key_base64)
        verify_signed_json(document, "a.test", a_key.key_id, a_key.verify_key_base64)
        stored = await self.a["main"].store.get_server_key_json("b.test")
        assert stored is not None
        self.assertEqual(list(stored["signatures"]), ["b.test"])
        response = await treq.post(
            self.urls["a.test"] + "/_matrix/key/v2/query",
            data=json.dumps(
                {"server_keys": {"b.test": {}, "a.test": {}, "nowhere.invalid:8448": {}}}
            ).encode(),
            pool=NO_KEEPALIVE,
        )
        self.assertEqual(response.code, 200)
        answer = json.loads(await treq.content(response))
        self.assertEqual(
            sorted(d["server_name"] for d in answer["server_keys"]), ["a.test", "b.test"]
        )
        response = await treq.post(
            self.urls["a.test"] + "/_matrix/key/v2/query",
            data=b'{"server_keys": []}',
            pool=NO_KEEPALIVE,
        )
        self.assertEqual(response.code, 400)
        await treq.content(response)

    async def test_remote_profiles_and_aliases(self) -> None:
        """a's clients see b's users' profiles and b's aliases, asked of b
        (served on b's federation worker)."""
        alice, bob = await self.users()
        await bob.ok("PUT", f"/profile/{bob.user_id}/displayname", {"displayname": "Bob B"})
        profile = await alice.ok("GET", f"/profile/{bob.user_id}")
        self.assertEqual(profile, {"displayname": "Bob B"})
        field = await alice.ok("GET", f"/profile/{bob.user_id}/displayname")
        self.assertEqual(field, {"displayname": "Bob B"})
        code, answer = await alice.request("GET", "/profile/@nobody:b.test")
        self.assertEqual((code, answer["errcode"]), (404, "M_NOT_FOUND"))

        room_id = await bob.create_room()
        await bob.ok("PUT", "/directory/room/%23lobby:b.test", {"room_id": room_id})
        resolved = await alice.ok("GET", "/directory/room/%23lobby:b.test")
        self.assertEqual(resolved, {"room_id": room_id, "servers": ["b.test"]})
        code, answer = await alice.request("GET", "/directory/room/%23nothing:b.test")
        self.assertEqual((code, answer["errcode"]), (404, "M_NOT_FOUND"))
        # A server nobody can reach: 404, saying so; a name that is no server: 400.
        self.a["main"].config.federation.destinations["gone.test"] = "http://127.0.0.1:1"
        code, answer = await alice.request("GET", "/directory/room/%23x:gone.test")
        self.assertEqual(code, 404)
        self.assertIn("no answer could be had from gone.test", answer["error"])
        code, _ = await alice.request("GET", "/profile/@x:bad%20name")
        self.assertEqual(code, 400)

    async def test_query_endpoints_served(self) -> None:
        _, bob = await self.users()
        await bob.ok("PUT", f"/profile/{bob.user_id}/displayname", {"displayname": "Bob B"})
        key = load_or_create_signing_key(self.a["main"].config.data_dir, create=False)

        async def get(path: str, signed: bool = True) -> tuple[int, Any]:
            headers: dict[Any, Any] = {}
            if signed:
                headers["Authorization"] = [
                    sign_request(key, "a.test", "b.test", "GET", path, None)
                ]
            response = await treq.get(
                self.urls["b.test"] + path, headers=headers, pool=NO_KEEPALIVE
            )
            return response.code, json.loads(await treq.content(response))

        base = "/_matrix/federation/v1/query"
        user = urllib.parse.quote(str(bob.user_id))
        self.assertEqual(
            await get(f"{base}/profile?user_id={user}"), (200, {"displayname": "Bob B"})
        )
        self.assertEqual(await get(f"{base}/profile?user_id={user}&field=avatar_url"), (200, {}))
        self.assertEqual((await get(f"{base}/profile?user_id={user}", signed=False))[0], 401)
        self.assertEqual((await get(f"{base}/profile?user_id={user}&field=x"))[0], 400)
        self.assertEqual((await get(f"{base}/profile?user_id=%40x%3Aa.test"))[0], 400)
        self.assertEqual((await get(f"{base}/profile"))[0], 400)
        self.assertEqual((await get(f"{base}/profile?user_id=%40nobody%3Ab.test"))[0], 404)
        self.assertEqual((await get(f"{base}/directory?room_alias=%23x%3Aa.test"))[0], 400)
        self.assertEqual((await get(f"{base}/directory?room_alias=%23none%3Ab.test"))[0], 404)
