"""The real matrix-js-sdk (the SDK Element is built on) against the server.

Each scenario is a small Node script in ``tests/e2e/js/``; see
:mod:`tests.harness.node` for how they run and when they are skipped.
"""

from __future__ import annotations

import json

from twisted.internet import reactor
from twisted.internet.task import deferLater

from synapse_lite.server import HomeServer
from tests.harness.client_api import (
    DEFAULT_LAYOUT_STREAM_WRITERS,
    DEFAULT_LAYOUT_WORKERS,
    ClientApi,
    caught_up_with_writers,
    start_cluster,
)
from tests.harness.databases import END_TO_END, one_engine_only
from tests.harness.node import require_js_sdk, run_script
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase


async def alice_and_bob_on_the_sync_worker(
    test: DatabaseTestCase,
) -> tuple[dict[str, HomeServer], str, ClientApi, ClientApi]:
    """The default layout (/sync long polls of 2 s at most) and two users
    registered through its /sync worker, where the router sends sliding
    sync and /sync: the processes, that worker's URL, alice and bob."""
    servers, clients, _ = start_cluster(
        test,
        test.test_db,
        workers=DEFAULT_LAYOUT_WORKERS,
        stream_writers=DEFAULT_LAYOUT_STREAM_WRITERS,
        limits={"max_sync_timeout_ms": 2000},
    )
    base = clients["synchrotron1"].base_url
    alice = await ClientApi(test, base).register("alice")
    bob = await ClientApi(test, base).register("bob")
    return servers, base, alice, bob


def login_argument(client: ClientApi) -> str:
    """A user's login as the scripts take it."""
    return json.dumps(
        {"user_id": client.user_id, "access_token": client.token, "device_id": client.device_id}
    )


class JsSdkLoginTestCase(DatabaseTestCase):
    async def test_login_and_whoami(self) -> None:
        one_engine_only("sqlite", END_TO_END)
        require_js_sdk()
        _, clients, _ = start_cluster(self, self.test_db)
        main = clients["main"]
        await ClientApi(self, main.base_url).register("alice", "alice-pw")
        served = await main.ok("GET", "/_matrix/client/versions")
        result = await run_script("login.mjs", main.base_url, "alice", "alice-pw")
        self.assertEqual(result["login_user"], "@alice:test.local")
        self.assertEqual(result["whoami"]["user_id"], "@alice:test.local")
        self.assertEqual(result["versions"], served["versions"])


class JsSdkEncryptionTestCase(DatabaseTestCase):
    async def test_encrypted_chat_cross_signing_and_backup(self) -> None:
        """Two Rust-crypto clients chat in an encrypted room and decrypt each
        other; alice's device is verified by cross-signing; a new device of
        hers restores the room key from the key backup."""
        one_engine_only("postgres", END_TO_END)
        require_js_sdk()
        _, clients, _ = start_cluster(self, self.test_db, workers=["reader"])
        base = clients["main"].base_url
        logins = []
        for name in ("alice", "bob"):
            client = await ClientApi(self, base).register(name, "pw-" + name)
            logins.append(
                {
                    "user_id": client.user_id,
                    "access_token": client.token,
                    "device_id": client.device_id,
                }
            )
        second = await ClientApi(self, base).ok(
            "POST",
            "/login",
            {"type": "m.login.password", "user": "alice", "password": "pw-alice"},
        )
        logins.append({k: second[k] for k in ("user_id", "access_token", "device_id")})
        result = await run_script(
            "encrypted_chat.mjs", base, *(json.dumps(login) for login in logins), "pw-alice"
        )
        # Let the clients' last long-polls (2 s) end before the servers stop.
        await deferLater(reactor, 2.5, lambda: None)
        self.assertTrue(result["encrypted_room"])
        self.assertEqual(result["bob_decrypted"], "hello bob")
        self.assertEqual(result["alice_decrypted"], "hello alice")
        self.assertTrue(result["cross_signing_ready"])
        self.assertTrue(result["own_device_cross_signing_verified"])
        self.assertGreaterEqual(result["backed_up_keys"], 1)
        self.assertGreaterEqual(result["restored_keys"], 1)
        self.assertTrue(result["restored_version_matches"])


class JsSdkStartClientTestCase(DatabaseTestCase):
    async def test_start_client_reads_push_rules_and_syncs(self) -> None:
        one_engine_only("sqlite", END_TO_END)
        """``startClient()`` asks for ``/pushrules/`` before its first /sync
        (and retries forever without it): it must reach PREPARED."""
        require_js_sdk()
        # The client's next long-poll outlives it: keep it short.
        servers, clients, _ = start_cluster(self, self.test_db, limits={"max_sync_timeout_ms": 300})
        main = clients["main"]
        await ClientApi(self, main.base_url).register("alice", "alice-pw")
        result = await run_script("start_client.mjs", main.base_url, "alice", "alice-pw")
        notifier = servers["main"].notifier
        await eventually(lambda: not notifier._users, what="the last /sync to end")
        self.assertEqual(result["user_id"], "@alice:test.local")
        self.assertEqual(result["first_state"], "PREPARED")
        self.assertNotIn("ERROR", result["states"])
        self.assertEqual(
            result["client_push_rules"], ["content", "override", "room", "sender", "underride"]
        )
        self.assertEqual(result["override_ids"][0], ".m.rule.master")
        self.assertIn(".m.rule.is_user_mention", result["override_ids"])


class JsSdkSlidingSyncTestCase(DatabaseTestCase):
    async def test_sliding_sync_room_list_subscription_and_extensions(self) -> None:
        one_engine_only("sqlite", END_TO_END)
        """The SDK's ``SlidingSync`` (MSC4186), on the default layout's /sync
        worker: the room list in recency order, a new message moving its
        room to the top, a room subscription, to_device and e2ee."""
        require_js_sdk()
        servers, base, alice, bob = await alice_and_bob_on_the_sync_worker(self)
        rooms = []
        for i in range(4):
            room = await alice.create_room(preset="public_chat", name=f"room {i}")
            await bob.ok("POST", f"/join/{room}", {})
            rooms.append(room)
        for i, room in enumerate(rooms):
            await alice.send(room, f"hello {i}")
        await caught_up_with_writers(servers, ["persister1", "persister2"])
        logins = [login_argument(c) for c in (alice, bob)]
        result = await run_script("sliding_sync.mjs", base, *logins, json.dumps(rooms))
        # Let the client's last long-poll (2 s) end before the servers stop.
        await deferLater(reactor, 2.5, lambda: None)
        self.assertEqual(result["errors"], [])
        self.assertEqual(result["first_order"], list(reversed(rooms)))
        self.assertEqual(result["count"], 4)
        self.assertTrue(result["arrived"])
        self.assertEqual(result["after_order"], [rooms[0], *reversed(rooms[1:])])
        self.assertGreater(result["subscribed_timeline"], 1)
        self.assertGreater(result["timeline_after"], result["timeline_before"])
        self.assertTrue(result["expanded"])
        self.assertEqual(result["to_device"], {"n": 1})
        self.assertTrue(result["device_list_changed"])
        self.assertGreater(result["one_time_keys"], 0)
        self.assertEqual(
            result["extensions_asked"], ["account_data", "e2ee", "receipts", "to_device", "typing"]
        )


class JsSdkUnreadCountsTestCase(DatabaseTestCase):
    async def test_the_room_badge_follows_messages_and_the_receipt(self) -> None:
        one_engine_only("postgres", END_TO_END)
        """The SDK's room counts (Element's badge) as the default layout's
        /sync worker serves them from its kept counts: the initial count,
        three messages with a mention, then its own read receipt and one
        more message (counted from the new receipt, not on top)."""
        require_js_sdk()
        servers, base, alice, bob = await alice_and_bob_on_the_sync_worker(self)
        room = await alice.create_room(preset="public_chat")
        await bob.ok("POST", f"/join/{room}", {})
        await bob.send(room, "before the client starts")
        await bob.send(room, "and again")
        await caught_up_with_writers(servers, ["persister1", "persister2"])
        logins = [login_argument(c) for c in (alice, bob)]
        result = await run_script("unread_counts.mjs", base, *logins, room)
        # Let the client's last long-poll (2 s) end before the servers stop.
        await deferLater(reactor, 2.5, lambda: None)
        self.assertEqual(result["first"], [2, 0])
        self.assertEqual(result["after_messages"], [5, 1])
        self.assertEqual(result["after_receipt"], [1, 0])
