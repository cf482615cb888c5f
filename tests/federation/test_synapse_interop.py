"""Interoperability with a real Synapse on loopback, both ways, over HTTPS
verified against a test CA (``tests/harness/synapse_peer.py``): each server
fetches the other's keys, and signed federation requests go each way
(``/version``, ``/query/profile``, to-device messages in transactions),
and each side's clients read the other's profiles and aliases
(``/query/profile``, ``/query/directory``).

Skipped with the reason when Synapse cannot be installed here; a failure
under ``CI=true``.
"""

from __future__ import annotations

import json
import tempfile
import urllib.parse
from typing import Any, cast

import attr
from twisted.internet import reactor, task
from twisted.trial import unittest
from twisted.web.resource import Resource
from twisted.web.server import Site

from synapse_lite.config.federation import TrustedKeyServer
from synapse_lite.federation.client import FederationClient
from synapse_lite.federation.crypto import SigningKey, load_or_create_signing_key, sign_json
from synapse_lite.federation.keyring import KEY_PATH, Keyring, parse_key_document
from synapse_lite.server import HomeServer
from synapse_lite.storage.id_generators import generator as id_generators
from tests.harness.client_api import ClientApi
from tests.harness.synapse_peer import (
    SynapsePeer,
    free_port,
    listen_tls_closing,
    start_our_server,
    synapse_or_skip,
)
from tests.harness.tls import TestCA

_reactor = cast(Any, reactor)


class SynapseInteropTestCase(unittest.TestCase):
    """One Synapse for the whole class (CI time: about 3 s a start), started
    by the first test and stopped after the last (or when the process
    exits, when only some run); each test has a server of ours of its own,
    so Synapse users are named per test."""

    # A cold install of Synapse takes minutes; a warm run, seconds.
    timeout = 1200
    _shared: SynapsePeer | None = None
    _tests_left: int | None = None

    async def setUp(self) -> None:  # type: ignore[override]
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)
        python = await synapse_or_skip(self)
        cls = type(self)
        if cls._shared is None or cls._shared.has_exited():
            peer = SynapsePeer(python, TestCA(tempfile.mkdtemp(prefix="interop_ca_")))
            await peer.start(None)
            cls._shared = peer
            cls._tests_left = len([n for n in dir(cls) if n.startswith("test_")])
        self.addCleanup(self._last_stops_synapse)
        self.synapse = cls._shared
        self.ca = self.synapse.ca
        self.hs, self.client_url = self.start_ours()

    def _last_stops_synapse(self) -> None:
        cls = type(self)
        cls._tests_left = (cls._tests_left or 1) - 1
        if cls._tests_left <= 0 and cls._shared is not None:
            cls._shared.stop()
            cls._shared = None

    def start_ours(self) -> tuple[HomeServer, str]:
        return start_our_server(self, self.ca)

    async def eventually(self, probe: Any, what: str, seconds: float = 30) -> Any:
        deadline = _reactor.seconds() + seconds
        while True:
            result = await probe()
            if result:
                return result
            if _reactor.seconds() > deadline:
                self.fail(
                    f"{what} did not happen in {seconds}s; Synapse said: "
                    f"{self.synapse.last_words()[-800:]}"
                )
            await task.deferLater(_reactor, 0.2, lambda: None)

    async def test_keys_and_requests_both_ways(self) -> None:
        hs, synapse = self.hs, self.synapse
        assert hs.keyring is not None
        # Our signed client (the process's own is inside its keyring and sender).
        client = FederationClient(
            hs.config.federation,
            _reactor,
            load_or_create_signing_key(hs.config.data_dir, create=False),
            hs.config.server_name,
        )
        self.addCleanup(client.close)

        # We fetch Synapse's keys (discovery of an IP literal, TLS with the
        # test CA, loopback allowed) and check its self-signature.
        document = await client.get_json(synapse.server_name, KEY_PATH, signed=False)
        keys, _ = parse_key_document(document, synapse.server_name)
        key_id = next(iter(keys))
        self.assertEqual(await hs.keyring.get_verify_key(synapse.server_name, key_id), keys[key_id])

        # Synapse fetches ours, as a notary answering for us. (Asked for no
        # key id in particular it answers from its cache only, unlike the
        # spec's "should query for all keys": docs/federation.md.)
        our_key = load_or_create_signing_key(hs.config.data_dir, create=False)
        answer = await client.post_json(
            synapse.server_name,
            "/_matrix/key/v2/query",
            {
                "server_keys": {
                    hs.config.server_name: {our_key.key_id: {"minimum_valid_until_ts": None}}
                }
            },
            signed=False,
        )
        [ours] = answer["server_keys"]
        self.assertEqual(ours["server_name"], hs.config.server_name)
        self.assertIn(synapse.server_name, ours["signatures"])

        # Signed requests from us, which Synapse verifies with our key.
        version = await client.get_json(synapse.server_name, "/_matrix/federation/v1/version")
        self.assertEqual(version["server"]["name"], "Synapse")
        carol = await ClientApi(self, synapse.client_url).register("carol")
        await carol.ok("PUT", f"/profile/{carol.user_id}/displayname", {"displayname": "Carol"})
        profile = await client.get_json(
            synapse.server_name,
            f"/_matrix/federation/v1/query/profile?user_id={carol.user_id}&field=displayname",
        )
        self.assertEqual(profile, {"displayname": "Carol"})

        # To-device, us -> Synapse: our sender's transaction, signed.
        alice = await ClientApi(self, self.client_url).register("alice")
        carol_since = (await carol.sync())["next_batch"]
        await alice.ok(
            "PUT",
            "/sendToDevice/m.test/t1",
            {"messages": {carol.user_id: {"*": {"hello": "carol"}}}},
        )

        async def carol_got() -> Any:
            events = (await carol.sync(since=carol_since)).get("to_device", {}).get("events", [])
            return [e for e in events if e["type"] == "m.test"]

        [event] = await self.eventually(carol_got, "carol's to-device message")
        self.assertEqual((event["sender"], event["content"]), (alice.user_id, {"hello": "carol"}))

        # To-device, Synapse -> us: Synapse's transaction, verified with its key.
        alice_since = (await alice.sync())["next_batch"]
        await carol.ok(
            "PUT",
            "/sendToDevice/m.test/t2",
            {"messages": {alice.user_id: {"*": {"hello": "alice"}}}},
        )

        async def alice_got() -> Any:
            events = (await alice.sync(since=alice_since)).get("to_device", {}).get("events", [])
            return [e for e in events if e["type"] == "m.test"]

        [event] = await self.eventually(alice_got, "alice's to-device message")
        self.assertEqual((event["sender"], event["content"]), (carol.user_id, {"hello": "alice"}))

        # Profiles and aliases, each side's clients asking about the other's.
        await alice.ok("PUT", f"/profile/{alice.user_id}/displayname", {"displayname": "Alice"})
        self.assertEqual(
            (await carol.ok("GET", f"/profile/{alice.user_id}"))["displayname"], "Alice"
        )
        self.assertEqual(
            await alice.ok("GET", f"/profile/{carol.user_id}"), {"displayname": "Carol"}
        )
        room_id = await carol.create_room()
        alias = urllib.parse.quote(f"#lobby:{synapse.server_name}")
        await carol.ok("PUT", f"/directory/room/{alias}", {"room_id": room_id})
        resolved = await alice.ok("GET", f"/directory/room/{alias}")
        self.assertEqual(resolved["room_id"], room_id)
        self.assertIn(synapse.server_name, resolved["servers"])
        code, _ = await alice.request(
            "GET", "/directory/room/" + urllib.parse.quote(f"#none:{synapse.server_name}")
        )
        self.assertEqual(code, 404)
        room_id = await alice.create_room()
        ours = urllib.parse.quote(f"#ours:{hs.config.server_name}")
        await alice.ok("PUT", f"/directory/room/{ours}", {"room_id": room_id})
        self.assertEqual((await carol.ok("GET", f"/directory/room/{ours}"))["room_id"], room_id)

    async def test_room_shared_both_ways(self) -> None:
        """A Synapse user joins one of our rooms (Synapse's make_join and
        send_join against us), then messages go both ways: ours reach
        Synapse in our transactions, Synapse's reach us in its, each seen
        by the other side's client, in order."""
        synapse = self.synapse
        alice = await ClientApi(self, self.client_url).register("alice")
        carol = await ClientApi(self, synapse.client_url).register("carla")
        room_id = await alice.create_room(preset="public_chat", name="Shared")
        await alice.send(room_id, "before carol")
        server = urllib.parse.quote(self.hs.config.server_name)
        joined = await carol.ok(
            "POST", f"/join/{urllib.parse.quote(room_id)}?server_name={server}", {}
        )
        self.assertEqual(joined["room_id"], room_id)

        async def members() -> Any:
            found = await alice.ok("GET", f"/rooms/{urllib.parse.quote(room_id)}/joined_members")
            return carol.user_id in found["joined"]

        await self.eventually(members, "carol's join on our side")

        # Ours -> Synapse.
        for i in range(3):
            await alice.send(room_id, f"to carol {i}")

        async def carol_sees() -> Any:
            path = f"/rooms/{urllib.parse.quote(room_id)}/messages?dir=b&limit=20"
            chunk = (await carol.ok("GET", path))["chunk"]
            bodies = [
                e["content"].get("body") for e in reversed(chunk) if e["type"] == "m.room.message"
            ]
            return bodies if "to carol 2" in bodies else None

        bodies = await self.eventually(carol_sees, "our messages on Synapse")
        self.assertEqual(
            [b for b in bodies if b.startswith("to carol")], [f"to carol {i}" for i in range(3)]
        )

        # Synapse -> ours.
        since = (await alice.sync())["next_batch"]
        for i in range(3):
            await carol.send(room_id, f"to alice {i}")
        seen: list[str] = []

        async def alice_sees() -> Any:
            nonlocal since
            answer = await alice.sync(since=since)
            since = answer["next_batch"]
            room = answer.get("rooms", {}).get("join", {}).get(room_id, {})
            seen.extend(
                e["content"]["body"]
                for e in room.get("timeline", {}).get("events", [])
                if e["type"] == "m.room.message" and e["sender"] == carol.user_id
            )
            return "to alice 2" in seen

        await self.eventually(alice_sees, "Synapse's messages on our side")
        self.assertEqual(seen, [f"to alice {i}" for i in range(3)])

    async def test_synapse_as_our_notary(self) -> None:
        """A server that has gone away: its key is had from Synapse, which
        fetched it earlier, when Synapse is one of our trusted key servers;
        the answer carries both signatures and is checked."""
        hs, synapse = self.hs, self.synapse
        gone_key = SigningKey.generate()
        gone_port = free_port()
        gone = f"localhost:{gone_port}"
        document = sign_json(
            {
                "server_name": gone,
                "verify_keys": {gone_key.key_id: {"key": gone_key.verify_key_base64}},
                "old_verify_keys": {},
                "valid_until_ts": int(_reactor.seconds() * 1000) + 3_600_000,
            },
            gone,
            gone_key,
        )
        root = Resource()
        root.putChild(b"_matrix", _Static(json.dumps(document).encode()))
        stop_gone = listen_tls_closing(
            gone_port, Site(root), self.ca.server_options("gone", ["localhost"])
        )
        self.addCleanup(stop_gone)
        client = FederationClient(
            hs.config.federation,
            _reactor,
            load_or_create_signing_key(hs.config.data_dir, create=False),
            hs.config.server_name,
        )
        self.addCleanup(client.close)
        criteria = {"minimum_valid_until_ts": None}
        answer = await client.post_json(
            synapse.server_name,
            "/_matrix/key/v2/query",
            {"server_keys": {gone: {gone_key.key_id: criteria}}},
            signed=False,
        )
        self.assertEqual([d["server_name"] for d in answer["server_keys"]], [gone])
        await stop_gone()

        config = attr.evolve(
            hs.config.federation, trusted_key_servers=(TrustedKeyServer(synapse.server_name),)
        )
        keyring = Keyring(
            store=hs.store,
            clock=hs.clock,
            config=config,
            client=client,
            signing_key=load_or_create_signing_key(hs.config.data_dir, create=False),
            server_name=hs.config.server_name,
        )
        with self.assertLogs("synapse_lite.federation.keyring", "INFO") as logs:
            key = await keyring.get_verify_key(gone, gone_key.key_id)
        self.assertEqual(key, gone_key.verify_key_base64)
        self.assertIn(f"from {synapse.server_name}", logs.output[-1])


class _Static(Resource):
    isLeaf = True

    def __init__(self, body: bytes) -> None:
        super().__init__()
        self._body = body

    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"Content-Type", b"application/json")
        return self._body
