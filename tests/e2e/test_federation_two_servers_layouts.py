"""End to end: two homeservers of ours as real processes, federating over
TLS with certificates of a test CA (issue 31's first test), once as
monoliths and once in the ``default`` layout (the router, whose federation
port serves TLS, the main process, a /sync worker, two events writers and
the media worker; docs/workers.md).

The servers have distinct names with ports, found as the spec says (no
``federation.destinations``): ``localhost:<port>`` (a host name resolved to
127.0.0.1, certificate for ``localhost``) and ``127.0.0.1:<port>`` (an IP
literal, certificate for the address). Each trusts the test CA
(``federation.extra_ca_paths``, verification on) and allows 127.0.0.0/8
(``federation.ip_range_allowlist``). alice is on a, bob on b.

One scenario per layout walks the issue's Build list through the client
API, in order (each step's name says which bullet):

well-known and keys (b's notary asked for a's keys) · join by alias ·
messages both ways · typing and receipts · presence · device keys query
and claim, a device list update, a to-device message · profile and
directory · ``publicRooms?server=`` · invite, accept, leave · server ACL
deny (no events nor typing to b, b's events refused) then allow · spaces
hierarchy across servers · remote media · backfill (a late joiner
paginates history) · a knock accepted · a restricted join · redactions.

``SYNAPSE_LITE_TEST_TIMES=1`` prints each step's time; each server's merged
process logs are kept in its directory (``output.log``).

The servers are started once per layout (one test per class). The database
is the run's engine (``SYNAPSE_LITE_TEST_DB``), with TCP replication.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, cast

import treq
from treq.client import HTTPClient
from twisted.internet import reactor, task
from twisted.trial import unittest
from twisted.web.client import Agent, HTTPConnectionPool

from synapse_lite.http.tls import https_policy_trusting
from tests.federation.test_edus import readers_in, typing_in
from tests.harness.client_api import ClientApi
from tests.harness.databases import (
    END_TO_END,
    create_test_database,
    one_engine_only,
)
from tests.harness.launcher import (
    LaunchedServer,
    SynapseLiteCommand,
    edit_config,
    free_port_block,
    generated_config,
    temp_dir,
)
from tests.harness.tls import TestCA
from tests.media.test_endpoints import MediaClient

_reactor = cast(Any, reactor)
#: How long one step may wait for the other server.
DEADLINE_SECONDS = 30.0
#: How long a step waits to be sure something did NOT arrive.
QUIET_SECONDS = 2.0


def q(value: str | None) -> str:
    """An id as one segment of a path."""
    assert value is not None
    return urllib.parse.quote(value, safe="")


class Homeserver:
    """One launched server: its name, client URL and federation URL."""

    def __init__(self, name: str, launched: LaunchedServer, federation_url: str) -> None:
        self.name = name
        self.launched = launched
        self.federation_url = federation_url

    @property
    def client_url(self) -> str:
        specs = self.launched.specs()
        process = "router" if "router" in specs else "main"
        return specs[process].url_of("client")


class _TwoServersScenario:
    """The scenario; a subclass per layout makes it a test case."""

    layout = ""
    #: The engine its layout runs on (``one_engine_only``).
    engine = ""
    timeout = 600

    # The TestCase methods the subclasses bring.
    addCleanup: Callable[..., None]
    assertEqual: Callable[..., None]
    assertIn: Callable[..., None]
    assertNotIn: Callable[..., None]
    assertTrue: Callable[..., None]

    async def test_every_bullet_end_to_end(self) -> None:
        one_engine_only(self.engine, END_TO_END)
        self.ca = TestCA(temp_dir("synapse_lite_ca_"))
        self.pool = HTTPConnectionPool(_reactor, persistent=False)
        self.https = HTTPClient(
            Agent(_reactor, https_policy_trusting((self.ca.ca_path,)), pool=self.pool)
        )
        a_port, b_port = free_port_block(1), free_port_block(1)
        started = time.monotonic()
        self.a = await self.start_server(f"localhost:{a_port}", a_port, "localhost")
        self.b = await self.start_server(f"127.0.0.1:{b_port}", b_port, "127.0.0.1")
        self.log(f"{self.layout}: both servers up in {time.monotonic() - started:.1f}s")
        self.alice = await ClientApi(cast(Any, self), self.a.client_url).register("alice")
        self.bob = await ClientApi(cast(Any, self), self.b.client_url).register("bob")

        started = time.monotonic()
        steps: list[Callable[[], Awaitable[None]]] = [
            self.step_keys_fetched,
            self.step_join_by_alias,
            self.step_messages_both_ways,
            self.step_typing_and_receipts,
            self.step_presence,
            self.step_device_keys_query_and_claim,
            self.step_profile_and_directory,
            self.step_public_rooms_of_the_other_server,
            self.step_invite_accept_leave,
            self.step_server_acl_deny_then_allow,
            self.step_spaces_hierarchy,
            self.step_remote_media,
            self.step_backfill_for_a_late_joiner,
            self.step_knock_accepted,
            self.step_restricted_join,
            self.step_redactions,
        ]
        for step in steps:
            begun = time.monotonic()
            await step()
            self.log(f"{self.layout}: {step.__name__} {time.monotonic() - begun:.1f}s")
        self.log(f"{self.layout}: scenario {time.monotonic() - started:.1f}s")

    # Servers

    async def start_server(self, name: str, port: int, host: str) -> Homeserver:
        """Generate ``self.layout``'s config for ``name``, with its
        federation listener on ``port`` serving TLS with a certificate for
        ``host``, and run it."""
        test_db = create_test_database()
        self.addCleanup(test_db.drop)
        directory = temp_dir()
        path = generated_config(
            directory, test_db, layout=self.layout, enable_registration=True, server_name=name
        )
        certificate, key = self.ca.issue(host.replace(".", "_"), [host])
        tls = {"tls_certificate_path": certificate, "tls_private_key_path": key}

        def federate(config: dict[str, Any]) -> None:
            config["rate_limiting"] = {"enabled": False}
            config["position_log"] = False
            config["federation"] = {
                "extra_ca_paths": [self.ca.ca_path],
                "ip_range_allowlist": ["127.0.0.0/8"],
                "retry": {"initial_seconds": 0.5, "max_seconds": 2},
                "request_timeout_seconds": 20,
                # Served on the federation port too (the router sends
                # /.well-known to main).
                "well_known_server": name,
            }
            if "router" in config:
                # The router's federation port: TLS, on the port of the name.
                for listener in config["router"]["listeners"]:
                    if listener["resources"] == ["federation"]:
                        listener.update(port=port, **tls)
            else:
                # The monolith: its one listener stays plain HTTP for the
                # clients; other servers come to a TLS listener of their own.
                config["listeners"].append(
                    {"port": port, "resources": ["federation", "keys"], **tls}
                )

        edit_config(path, federate)
        command = SynapseLiteCommand(cast(Any, self), ["run", "-c", path], directory, directory)
        self.addCleanup(self.keep_output, command, directory)
        await command.start().wait_for_line(r"processes up in", timeout=120)
        launched = LaunchedServer(command, path, directory, test_db)
        return Homeserver(name, launched, f"https://{host}:{port}")

    def keep_output(self, command: SynapseLiteCommand, directory: str) -> None:
        """The processes' merged logs, kept beside the config (cleanups run
        before the command's own, which stops it)."""
        with open(os.path.join(directory, "output.log"), "w") as f:
            f.write(command.output())

    def log(self, line: str) -> None:
        if os.environ.get("SYNAPSE_LITE_TEST_TIMES"):
            print(line)

    # Helpers

    async def until(self, check: Callable[[], Awaitable[Any]], what: str) -> Any:
        """``check()``'s first true answer, polled until the deadline."""
        deadline = time.monotonic() + DEADLINE_SECONDS
        while True:
            answer = await check()
            if answer:
                return answer
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await task.deferLater(_reactor, 0.1, lambda: None)

    async def bodies(self, client: ClientApi, room_id: str, limit: int = 50) -> list[str]:
        """The newest ``limit`` messages of ``room_id`` as ``client`` reads
        them, oldest first."""
        page = await client.ok("GET", f"/rooms/{q(room_id)}/messages?dir=b&limit={limit}")
        return [
            e["content"].get("body", "")
            for e in reversed(page["chunk"])
            if e["type"] == "m.room.message"
        ]

    async def sees(self, client: ClientApi, room_id: str, body: str) -> None:
        async def check() -> bool:
            return body in await self.bodies(client, room_id)

        await self.until(check, f"{client.user_id} to read {body!r}")

    async def until_membership(
        self, client: ClientApi, room_id: str, user_id: str | None, membership: str
    ) -> None:
        async def check() -> bool:
            return await client.membership(room_id, user_id) == membership

        await self.until(check, f"{user_id} {membership} in {room_id} for {client.user_id}")

    async def sync_until(
        self, client: ClientApi, check: Callable[[Any], Any], what: str, since: str | None = None
    ) -> Any:
        async def poll() -> Any:
            sync = await client.sync(since=since, timeout=500)
            return sync if check(sync) else None

        return await self.until(poll, what)

    async def federation_request(
        self, server: Homeserver, method: str, path: str, body: Any = None
    ) -> tuple[int, Any]:
        """An unsigned request to ``server``'s federation port over TLS,
        trusting the test CA alone (the certificate is checked)."""
        data = None if body is None else json.dumps(body).encode()
        response = await self.https.request(method, server.federation_url + path, data=data)
        content = await treq.content(response)
        return response.code, json.loads(content)

    # Steps, in the order of the issue's Build list

    async def step_keys_fetched(self) -> None:
        """Reaching and keys: a's well-known and key document over TLS; b,
        asked as a notary, fetches a's keys (TLS to a name with a port,
        checked against the CA) and answers them signed by a and by itself."""
        code, known = await self.federation_request(self.a, "GET", "/.well-known/matrix/server")
        self.assertEqual((code, known), (200, {"m.server": self.a.name}))
        code, own = await self.federation_request(self.a, "GET", "/_matrix/key/v2/server")
        self.assertEqual((code, own["server_name"]), (200, self.a.name))
        code, answer = await self.federation_request(
            self.b, "POST", "/_matrix/key/v2/query", {"server_keys": {self.a.name: {}}}
        )
        self.assertEqual(code, 200, answer)
        (keys,) = answer["server_keys"]
        self.assertEqual(keys["server_name"], self.a.name)
        self.assertEqual(set(keys["verify_keys"]), set(own["verify_keys"]))
        self.assertEqual(set(keys["signatures"]), {self.a.name, self.b.name})

    async def step_join_by_alias(self) -> None:
        self.lobby = await self.alice.create_room(
            preset="public_chat", room_alias_name="lobby", name="Lobby"
        )
        alias = f"#lobby:{self.a.name}"
        joined = await self.bob.ok("POST", f"/join/{q(alias)}", {})
        self.assertEqual(joined["room_id"], self.lobby)
        await self.until_membership(self.alice, self.lobby, self.bob.user_id, "join")

    async def step_messages_both_ways(self) -> None:
        sent = []
        for i in range(4):
            sender, reader = (self.alice, self.bob) if i % 2 == 0 else (self.bob, self.alice)
            body = f"turn {i}"
            await sender.send(self.lobby, body)
            sent.append(body)
            await self.sees(reader, self.lobby, body)
        self.assertEqual(await self.bodies(self.alice, self.lobby), sent)
        self.assertEqual(await self.bodies(self.bob, self.lobby), sent)

    async def step_typing_and_receipts(self) -> None:
        path = f"/rooms/{q(self.lobby)}/typing/{q(self.bob.user_id)}"
        await self.bob.ok("PUT", path, {"typing": True, "timeout": 30000})
        await self.sync_until(
            self.alice,
            lambda s: typing_in(s, self.lobby) == [self.bob.user_id],
            "bob typing, on a",
        )
        path = f"/rooms/{q(self.lobby)}/typing/{q(self.alice.user_id)}"
        await self.alice.ok("PUT", path, {"typing": True, "timeout": 30000})
        await self.sync_until(
            self.bob,
            lambda s: self.alice.user_id in (typing_in(s, self.lobby) or []),
            "alice typing, on b",
        )
        for client in (self.alice, self.bob):
            path = f"/rooms/{q(self.lobby)}/typing/{q(client.user_id)}"
            await client.ok("PUT", path, {"typing": False})
        page = await self.bob.ok("GET", f"/rooms/{q(self.lobby)}/messages?dir=b&limit=1")
        last = page["chunk"][0]["event_id"]
        await self.bob.ok("POST", f"/rooms/{q(self.lobby)}/receipt/m.read/{q(last)}", {})
        await self.sync_until(
            self.alice,
            lambda s: readers_in(s, self.lobby).get(self.bob.user_id or "") == last,
            "bob's receipt, on a",
        )
        await self.alice.ok("POST", f"/rooms/{q(self.lobby)}/receipt/m.read/{q(last)}", {})
        await self.sync_until(
            self.bob,
            lambda s: readers_in(s, self.lobby).get(self.alice.user_id or "") == last,
            "alice's receipt, on b",
        )

    async def step_presence(self) -> None:
        body = {"presence": "unavailable", "status_msg": "on b"}
        await self.bob.ok("PUT", f"/presence/{q(self.bob.user_id)}/status", body)

        def bobs(sync: Any) -> Any:
            for event in sync.get("presence", {}).get("events", []):
                if event["sender"] == self.bob.user_id:
                    return event["content"].get("status_msg") == "on b"
            return False

        await self.sync_until(self.alice, bobs, "bob's presence, on a")

    async def step_device_keys_query_and_claim(self) -> None:
        bob, device = self.bob.user_id or "", self.bob.device_id or ""
        keys = {
            "user_id": bob,
            "device_id": device,
            "algorithms": ["m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"],
            "keys": {f"curve25519:{device}": "curveB", f"ed25519:{device}": "edB"},
            "signatures": {},
        }
        otk = {"key": "otk-of-bob", "signatures": {}}
        await self.bob.ok(
            "POST",
            "/keys/upload",
            {"device_keys": keys, "one_time_keys": {"signed_curve25519:K1": otk}},
        )
        answer = await self.alice.ok("POST", "/keys/query", {"device_keys": {bob: []}})
        self.assertEqual(answer["failures"], {})
        got = answer["device_keys"][bob][device]
        self.assertEqual(got["keys"][f"curve25519:{device}"], "curveB")
        claim = {"one_time_keys": {bob: {device: "signed_curve25519"}}}
        claimed = await self.alice.ok("POST", "/keys/claim", claim)
        self.assertEqual(claimed["one_time_keys"][bob][device], {"signed_curve25519:K1": otk})
        again = await self.alice.ok("POST", "/keys/claim", claim)
        self.assertEqual(again["one_time_keys"].get(bob, {}), {})
        # A device change reaches a as an m.device_list_update.
        since = (await self.alice.sync())["next_batch"]
        await self.bob.ok("PUT", f"/devices/{q(device)}", {"display_name": "bob's phone"})
        await self.sync_until(
            self.alice,
            lambda s: bob in s.get("device_lists", {}).get("changed", []),
            "bob in alice's device_lists.changed",
            since=since,
        )
        # And to-device messages (there before rooms).
        since = (await self.bob.sync())["next_batch"]
        message = {"messages": {bob: {device: {"hello": "from a"}}}}
        await self.alice.ok("PUT", "/sendToDevice/m.test/t1", message)
        await self.sync_until(
            self.bob,
            lambda s: (
                [e["content"] for e in s.get("to_device", {}).get("events", [])]
                == [{"hello": "from a"}]
            ),
            "alice's to-device message, on b",
            since=since,
        )

    async def step_profile_and_directory(self) -> None:
        path = f"/profile/{q(self.bob.user_id)}/displayname"
        await self.bob.ok("PUT", path, {"displayname": "Bob of B"})
        profile = await self.alice.ok("GET", f"/profile/{q(self.bob.user_id)}")
        self.assertEqual(profile["displayname"], "Bob of B")
        self.b_room = await self.bob.create_room(
            preset="public_chat", visibility="public", room_alias_name="bside", name="B Side"
        )
        alias = f"#bside:{self.b.name}"
        resolved = await self.alice.ok("GET", f"/directory/room/{q(alias)}")
        self.assertEqual(resolved["room_id"], self.b_room)
        self.assertIn(self.b.name, resolved["servers"])

    async def step_public_rooms_of_the_other_server(self) -> None:
        answer = await self.alice.ok("GET", f"/publicRooms?server={q(self.b.name)}")
        rooms = {r["room_id"]: r for r in answer["chunk"]}
        self.assertIn(self.b_room, rooms)
        self.assertEqual(rooms[self.b_room]["name"], "B Side")
        self.assertNotIn(self.lobby, rooms)  # a's room, not in b's directory

    async def step_invite_accept_leave(self) -> None:
        room = await self.alice.create_room(preset="private_chat", name="Private")
        await self.alice.ok("POST", f"/rooms/{q(room)}/invite", {"user_id": self.bob.user_id})
        await self.sync_until(
            self.bob, lambda s: room in s.get("rooms", {}).get("invite", {}), "bob's invite"
        )
        await self.bob.ok("POST", f"/join/{q(room)}", {})
        await self.until_membership(self.alice, room, self.bob.user_id, "join")
        await self.bob.send(room, "thanks for the invite")
        await self.sees(self.alice, room, "thanks for the invite")
        await self.bob.ok("POST", f"/rooms/{q(room)}/leave", {})
        await self.until_membership(self.alice, room, self.bob.user_id, "leave")

    async def step_server_acl_deny_then_allow(self) -> None:
        """alice's room denies b: a sends b nothing (events, typing) and
        refuses b's events; allowed again, both ways work."""
        acl_path = f"/rooms/{q(self.lobby)}/state/m.room.server_acl/"
        # ACL entries name hosts (ports are not compared): b's is an IP literal.
        deny = {"allow": ["*"], "deny": [self.b.name.rsplit(":", 1)[0]]}
        await self.alice.ok("PUT", acl_path, deny)
        typing = f"/rooms/{q(self.lobby)}/typing/{q(self.alice.user_id)}"
        bob_since = (await self.bob.sync())["next_batch"]
        await self.alice.ok("PUT", typing, {"typing": True, "timeout": 30000})
        await self.alice.send(self.lobby, "while b is denied")
        await self.bob.send(self.lobby, "from a denied b")
        await task.deferLater(_reactor, QUIET_SECONDS, lambda: None)
        self.assertNotIn("while b is denied", await self.bodies(self.bob, self.lobby))
        self.assertNotIn("from a denied b", await self.bodies(self.alice, self.lobby))
        quiet = await self.bob.sync(since=bob_since)
        self.assertNotIn(self.alice.user_id, typing_in(quiet, self.lobby) or [])
        await self.alice.ok("PUT", typing, {"typing": False})

        await self.alice.ok("PUT", acl_path, {"allow": ["*"]})
        await self.alice.send(self.lobby, "b allowed again")
        await self.sees(self.bob, self.lobby, "b allowed again")
        await self.bob.send(self.lobby, "b speaks again")
        await self.sees(self.alice, self.lobby, "b speaks again")

    async def step_spaces_hierarchy(self) -> None:
        """bob asks his server for a space of a's: b asks a (/hierarchy)."""
        self.space = await self.alice.create_room(
            preset="public_chat",
            name="A Space",
            creation_content={"type": "m.space"},
            room_version="10",
        )
        await self.alice.ok(
            "PUT",
            f"/rooms/{q(self.space)}/state/m.space.child/{q(self.lobby)}",
            {"via": [self.a.name]},
        )
        answer = await self.bob.ok("GET", f"/_matrix/client/v1/rooms/{q(self.space)}/hierarchy")
        rooms = {r["room_id"]: r for r in answer["rooms"]}
        self.assertEqual(set(rooms), {self.space, self.lobby})
        self.assertEqual(rooms[self.space]["room_type"], "m.space")
        self.assertEqual(rooms[self.lobby]["name"], "Lobby")

    async def step_remote_media(self) -> None:
        """bob downloads alice's upload: b's media process fetches it from
        a's (federation media through a's federation port)."""
        content = secrets.token_bytes(100_000)
        alice_media = MediaClient(self.a.client_url, self.alice.token)
        uri = await alice_media.upload(content, "application/octet-stream", "blob.bin")
        bob_media = MediaClient(self.b.client_url, self.bob.token)
        for _ in range(2):  # the second from b's copy
            got = await bob_media.download(uri)
            self.assertEqual((got.code, got.body == content), (200, True), got.body[:200])

    async def step_backfill_for_a_late_joiner(self) -> None:
        room = await self.alice.create_room(preset="public_chat", name="History")
        history = [f"old {i}" for i in range(25)]
        for body in history:
            await self.alice.send(room, body)
        await self.bob.ok("POST", f"/join/{q(room)}?server_name={q(self.a.name)}", {})
        # Back from now, page by page: past bob's join, b fetches the rest
        # from a (/backfill).
        read: list[str] = []
        token = ""
        for _ in range(20):
            page = await self.bob.ok("GET", f"/rooms/{q(room)}/messages?dir=b&limit=10{token}")
            read += [e["content"]["body"] for e in page["chunk"] if e["type"] == "m.room.message"]
            if "end" not in page or not page["chunk"]:
                break
            token = f"&from={q(page['end'])}"
        self.assertEqual(list(reversed(read)), history)

    async def step_knock_accepted(self) -> None:
        room = await self.alice.create_room(preset="private_chat", name="Knock", room_version="10")
        await self.alice.ok(
            "PUT", f"/rooms/{q(room)}/state/m.room.join_rules/", {"join_rule": "knock"}
        )
        await self.bob.ok(
            "POST", f"/knock/{q(room)}?server_name={q(self.a.name)}", {"reason": "let me in"}
        )
        await self.until_membership(self.alice, room, self.bob.user_id, "knock")
        await self.alice.ok("POST", f"/rooms/{q(room)}/invite", {"user_id": self.bob.user_id})
        await self.sync_until(
            self.bob, lambda s: room in s.get("rooms", {}).get("invite", {}), "bob's invite"
        )
        await self.bob.ok("POST", f"/join/{q(room)}", {})
        await self.until_membership(self.alice, room, self.bob.user_id, "join")

    async def step_restricted_join(self) -> None:
        """A room of a's restricted to the space's members: bob is refused,
        joins the space, then joins, a vouching for him."""
        room = await self.alice.create_room(
            preset="private_chat", name="Members only", room_version="10"
        )
        rule = {"type": "m.room_membership", "room_id": self.space}
        await self.alice.ok(
            "PUT",
            f"/rooms/{q(room)}/state/m.room.join_rules/",
            {"join_rule": "restricted", "allow": [rule]},
        )
        via = f"?server_name={q(self.a.name)}"
        code, answer = await self.bob.request("POST", f"/join/{q(room)}{via}", {})
        self.assertEqual(code, 403, answer)
        await self.bob.ok("POST", f"/join/{q(self.space)}{via}", {})
        await self.bob.ok("POST", f"/join/{q(room)}{via}", {})
        code, member = await self.alice.request(
            "GET", f"/rooms/{q(room)}/state/m.room.member/{q(self.bob.user_id)}"
        )
        self.assertEqual(code, 200, member)
        self.assertEqual(
            (member["membership"], member["join_authorised_via_users_server"]),
            ("join", self.alice.user_id),
        )

    async def step_redactions(self) -> None:
        """Each redacts a message of their own; the other sees it redacted."""
        for sender, reader in ((self.alice, self.bob), (self.bob, self.alice)):
            body = f"regretted by {sender.user_id}"
            event_id = await sender.send(self.lobby, body)
            await self.sees(reader, self.lobby, body)
            await sender.ok(
                "PUT",
                f"/rooms/{q(self.lobby)}/redact/{q(event_id)}/r{secrets.token_hex(4)}",
                {"reason": "oops"},
            )

            async def redacted(reader: ClientApi = reader, event_id: str = event_id) -> bool:
                code, event = await reader.request(
                    "GET", f"/rooms/{q(self.lobby)}/event/{q(event_id)}"
                )
                return code == 200 and event["content"] == {}

            await self.until(redacted, f"{event_id} redacted for {reader.user_id}")


class MonolithsTestCase(_TwoServersScenario, unittest.TestCase):
    layout = "monolith"
    engine = "postgres"


class DefaultLayoutsTestCase(_TwoServersScenario, unittest.TestCase):
    layout = "default"
    engine = "sqlite"
