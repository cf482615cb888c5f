"""Redactions received over federation (docs/federation.md, "Redactions"):
a user of a.test redacts their message in a room of b.test; b.test's
clients read it redacted and b.test serves it redacted to other servers
(its signatures still verify, its content hash no longer matches).
SQLite and PostgreSQL (``SYNAPSE_LITE_TEST_DB``)."""

from __future__ import annotations

import urllib.parse

from synapse_lite.api.room_versions import KNOWN_ROOM_VERSIONS
from synapse_lite.event_graph.hashing import content_hash_matches
from synapse_lite.federation.crypto import load_or_create_signing_key
from tests.harness.federation import TwoServers
from tests.harness.polling import eventually


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


class ReceivedRedactionsTestCase(TwoServers):
    async def test_a_remote_redaction_is_applied_and_served_redacted(self) -> None:
        for identifier in ("1", "10"):
            await self.redact_in_version(identifier)

    async def redact_in_version(self, identifier: str) -> None:
        alice = await self.client(self.b).register(f"alice{identifier}")
        room_id = await alice.create_room(preset="public_chat", room_version=identifier)
        carol = await self.client(self.a).register(f"carol{identifier}")
        await carol.ok("POST", f"/join/{q(room_id)}?server_name=b.test", {})
        event_id = await carol.send(room_id, "a secret")
        path = f"/rooms/{q(room_id)}/event/{q(event_id)}"

        async def arrived() -> bool:
            code, _ = await alice.request("GET", path)
            return code == 200

        await eventually(arrived, timeout=10, what="carol's message on b.test")
        txn = f"r{identifier}"
        redaction = await carol.ok("PUT", f"/rooms/{q(room_id)}/redact/{q(event_id)}/{txn}", {})

        async def redacted() -> bool:
            event = await alice.ok("GET", path)
            return event["content"] == {}

        await eventually(redacted, timeout=10, what="the redaction on b.test")
        event = await alice.ok("GET", path)
        self.assertEqual(event["unsigned"]["redacted_because"]["event_id"], redaction["event_id"])
        self.assertEqual(event["unsigned"]["redacted_by"], redaction["event_id"])
        # Served redacted to other servers: the content gone, the hash stale.
        key = load_or_create_signing_key(self.a["main"].config.data_dir, create=False)
        code, body = await self.signed_request(
            key, "a.test", "b.test", "GET", f"/_matrix/federation/v1/event/{q(event_id)}"
        )
        self.assertEqual(code, 200, body)
        [pdu] = body["pdus"]
        self.assertNotIn("body", pdu["content"])
        self.assertIn("a.test", pdu["signatures"])
        self.assertFalse(content_hash_matches(KNOWN_ROOM_VERSIONS[identifier], pdu))

    async def test_an_erased_users_events_are_served_pruned(self) -> None:
        # dave of b.test is erased: other servers asking for his message
        # afterwards get it pruned (hashes of the original, b.test's
        # signature still good), as b.test's own later readers do.
        dave = await self.client(self.b).register("dave", password="dave-pw")
        room_id = await dave.create_room(preset="public_chat")
        carol = await self.client(self.a).register("carol")
        await carol.ok("POST", f"/join/{q(room_id)}?server_name=b.test", {})
        event_id = await dave.send(room_id, "mine to forget")
        key = load_or_create_signing_key(self.a["main"].config.data_dir, create=False)
        path = f"/_matrix/federation/v1/event/{q(event_id)}"
        code, body = await self.signed_request(key, "a.test", "b.test", "GET", path)
        self.assertEqual((code, body["pdus"][0]["content"]["body"]), (200, "mine to forget"))
        auth = {
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": dave.user_id},
            "password": "dave-pw",
        }
        await dave.ok("POST", "/account/deactivate", {"auth": auth, "erase": True})
        code, body = await self.signed_request(key, "a.test", "b.test", "GET", path)
        self.assertEqual(code, 200, body)
        [pdu] = body["pdus"]
        self.assertEqual(pdu["content"], {})
        self.assertIn("b.test", pdu["signatures"])
        self.assertFalse(content_hash_matches(KNOWN_ROOM_VERSIONS["10"], pdu))
