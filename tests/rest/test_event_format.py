"""A filter's ``event_format: federation`` and ``event_fields`` in /sync,
/messages and /context: events as federation has them (their reference
hash is their event id, our key's signature verifies), identical through the
main process and a worker. On SQLite and PostgreSQL (``SYNAPSE_LITE_TEST_DB``)."""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.parse
from typing import Any

from synapse_lite.api.room_versions import KNOWN_ROOM_VERSIONS
from synapse_lite.events import content_hashes, pruned_event
from synapse_lite.federation.crypto import (
    canonical_json,
    load_or_create_signing_key,
    verify_signed_json,
)
from synapse_lite.server import HomeServer
from synapse_lite.storage.database import LoggingTransaction
from tests.harness.client_api import ClientApi, caught_up, start_cluster
from tests.harness.server import DatabaseTestCase
from tests.harness.spec import assert_spec_response

FEDERATION = {"event_format": "federation"}
PDU_KEYS = {
    "event_id", "room_id", "type", "sender", "content", "origin_server_ts", "depth",
    "prev_events", "auth_events", "hashes", "signatures", "unsigned",
}  # fmt: skip


def as_param(definition: dict[str, Any]) -> str:
    return urllib.parse.quote(json.dumps(definition))


def without_age(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != "unsigned"} for e in events]


class EventFormatTestCase(DatabaseTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(self, self.test_db, workers=["reader"])
        self.main = clients["main"].base_url
        self.alice = await ClientApi(self, self.main).register("alice")
        self.on_reader = ClientApi(self, clients["reader"].base_url).as_user(self.alice.token)

    def assert_is_our_pdu(
        self, hs: HomeServer, pdu: dict[str, Any], version_id: str, whole: bool = True
    ) -> None:
        """``pdu`` carries the server's verifiable signature over its
        redacted form, from version 4 its reference hash is its event id,
        and when served ``whole`` (not pruned) its ``hashes`` are of it."""
        self.assertTrue(PDU_KEYS <= set(pdu), sorted(PDU_KEYS - set(pdu)))
        self.assertEqual(set(pdu["unsigned"]), {"age"})
        key = load_or_create_signing_key(hs.config.data_dir, create=False)
        form = signed_form(pdu, version_id)
        verify_signed_json(form, hs.config.server_name, key.key_id, key.verify_key_base64)
        if version_id not in ("1", "2", "3"):
            unsigned_form = {k: v for k, v in form.items() if k != "signatures"}
            reference = hashlib.sha256(canonical_json(unsigned_form)).digest()
            encoded = base64.urlsafe_b64encode(reference).decode().rstrip("=")
            self.assertEqual("$" + encoded, pdu["event_id"])
        if whole:
            # The event id is part of the event in versions 1 and 2 only.
            dropped = ("unsigned",) if version_id in ("1", "2") else ("event_id", "unsigned")
            unhashed = {k: v for k, v in pdu.items() if k not in dropped}
            self.assertEqual(
                pdu["hashes"], content_hashes(KNOWN_ROOM_VERSIONS[version_id], unhashed)
            )

    async def test_sync_timeline_and_state_in_federation_format(self) -> None:
        room = await self.alice.create_room()
        event_id = await self.alice.send(room, "Test message")
        flt = await self.alice.ok(
            "POST",
            f"/user/{self.alice.user_id}/filter",
            {**FEDERATION, "room": {"timeline": {"limit": 1}}},
        )
        body = await self.alice.sync(filter=flt["filter_id"])
        assert_spec_response(self, "sync.yaml", "/sync", "GET", 200, body)
        entry = body["rooms"]["join"][room]
        [message] = entry["timeline"]["events"]
        self.assertEqual(message["event_id"], event_id)
        self.assertEqual(message["room_id"], room)
        self.assertEqual(message["content"], {"msgtype": "m.text", "body": "Test message"})
        self.assert_is_our_pdu(self.servers["main"], message, "10")
        # The state block too: the create event starts the chain.
        state = {e["type"]: e for e in entry["state"]["events"]}
        create = state["m.room.create"]
        self.assertEqual((create["prev_events"], create["depth"]), ([], 1))
        for event in state.values():
            self.assert_is_our_pdu(self.servers["main"], event, "10")
        # The spec's auth event selection for a message: create, power
        # levels, the sender's membership.
        chosen = ("m.room.create", "m.room.power_levels", "m.room.member")
        self.assertEqual(message["auth_events"], sorted(state[t]["event_id"] for t in chosen))
        # Each event names the one before it; depths count up.
        page = await self.alice.ok(
            "GET", f"/rooms/{room}/messages?dir=b&limit=2&filter={as_param(FEDERATION)}"
        )
        assert_spec_response(
            self, "message_pagination.yaml", "/rooms/{roomId}/messages", "GET", 200, page
        )
        newest, before = page["chunk"]
        self.assertEqual(newest["prev_events"], [before["event_id"]])
        self.assertEqual(newest["depth"], before["depth"] + 1)
        # No transaction id: federation's ``unsigned`` has none.
        sent = await self.alice.send(room, "with txn", txn_id="t1")
        incremental = await self.alice.sync(
            since=body["next_batch"], filter=as_param({**FEDERATION})
        )
        [mine] = [
            e
            for e in incremental["rooms"]["join"][room]["timeline"]["events"]
            if e["event_id"] == sent
        ]
        self.assertEqual(set(mine["unsigned"]), {"age"})

    async def test_redacted_event_keeps_its_hashes(self) -> None:
        room = await self.alice.create_room(room_version="11")
        event_id = await self.alice.send(room, "secret")
        before = await self.alice.ok(
            "GET", f"/rooms/{room}/context/{event_id}?filter={as_param(FEDERATION)}"
        )
        await self.alice.ok("PUT", f"/rooms/{room}/redact/{event_id}/r1", {"reason": "oops"})
        after = await self.alice.ok(
            "GET", f"/rooms/{room}/context/{event_id}?filter={as_param(FEDERATION)}"
        )
        assert_spec_response(
            self, "event_context.yaml", "/rooms/{roomId}/context/{eventId}", "GET", 200, after
        )
        self.assertEqual(after["event"]["content"], {})
        # The hashes are the original's (of the content as sent).
        self.assertEqual(signed_form(before["event"], "11"), signed_form(after["event"], "11"))
        self.assert_is_our_pdu(self.servers["main"], before["event"], "11")
        self.assert_is_our_pdu(self.servers["main"], after["event"], "11", whole=False)
        # Version 11 keeps ``redacts`` in the content only.
        redaction = after["events_after"][0]
        self.assertEqual(redaction["type"], "m.room.redaction")
        self.assertEqual(redaction["content"]["redacts"], event_id)
        self.assertNotIn("redacts", redaction)
        self.assert_is_our_pdu(self.servers["main"], redaction, "11")

    async def test_erased_and_left(self) -> None:
        """An erased user's event, to who joined after the erasure: pruned,
        its original's hashes and signature kept. A left room's timeline in
        the format too."""
        room = await self.alice.create_room(preset="public_chat")
        bob = await ClientApi(self, self.main).register("bob", "bob-pw")
        await bob.ok("POST", f"/join/{room}", {})
        message = await bob.send(room, "forget me")
        auth = {
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": "bob"},
            "password": "bob-pw",
        }
        await bob.ok("POST", "/account/deactivate", {"auth": auth, "erase": True})
        carol = await ClientApi(self, self.main).register("carol")
        await carol.ok("POST", f"/join/{room}", {})
        path = f"/rooms/{room}/context/{message}?filter={as_param(FEDERATION)}"
        seen = (await self.alice.ok("GET", path))["event"]
        pruned = (await carol.ok("GET", path))["event"]
        self.assertEqual(seen["content"]["body"], "forget me")
        self.assertEqual(pruned["content"], {})
        self.assertEqual(signed_form(seen, "10"), signed_form(pruned, "10"))
        self.assert_is_our_pdu(self.servers["main"], seen, "10")
        self.assert_is_our_pdu(self.servers["main"], pruned, "10", whole=False)
        # Carol leaves: the left room's timeline, up to her leave, as PDUs.
        await carol.ok("POST", f"/rooms/{room}/leave", {})
        flt = as_param({**FEDERATION, "room": {"include_leave": True}})
        left = (await carol.sync(filter=flt))["rooms"]["leave"][room]
        leave = left["timeline"]["events"][-1]
        self.assertEqual(
            (leave["type"], leave["content"]), ("m.room.member", {"membership": "leave"})
        )
        for event in left["timeline"]["events"] + left["state"]["events"]:
            # Bob's events are pruned for Carol: only their hashes differ.
            whole = event["sender"] != bob.user_id
            self.assert_is_our_pdu(self.servers["main"], event, "10", whole=whole)

    async def test_room_version_1_pdus(self) -> None:
        room = await self.alice.create_room(room_version="1")
        await self.alice.send(room, "old")
        page = await self.alice.ok(
            "GET", f"/rooms/{room}/messages?dir=b&limit=2&filter={as_param(FEDERATION)}"
        )
        newest, before = page["chunk"]
        self.assertEqual(newest["prev_events"], [[before["event_id"], {}]])
        self.assertEqual(len(newest["auth_events"]), 3)
        self.assertTrue(all(pair[1] == {} for pair in newest["auth_events"]))
        for event in page["chunk"]:
            self.assert_is_our_pdu(self.servers["main"], event, "1")

    async def test_concurrent_branches_merge_on_the_next_event(self) -> None:
        """Two forward extremities (forced: the room's first message made
        one again, as a concurrent branch ending there would) are both the
        next event's parents, and only it remains an extremity."""
        hs = self.servers["main"]
        room = await self.alice.create_room()
        first = await self.alice.send(room, "branch one")
        second = await self.alice.send(room, "branch two")
        await hs.store.db_pool.execute(
            "force_extremity",
            "INSERT INTO event_forward_extremities (room_id, event_id) VALUES (?, ?)",
            room,
            first,
        )
        hs.handlers.events._room_extremities.pop(room)  # as after a restart
        self.assertEqual(set(await hs.store.get_forward_extremities(room)), {first, second})
        merge = await self.alice.send(room, "merge")
        page = await self.alice.ok(
            "GET", f"/rooms/{room}/messages?dir=b&limit=2&filter={as_param(FEDERATION)}"
        )
        newest, before = page["chunk"]
        self.assertEqual(newest["event_id"], merge)
        self.assertEqual(newest["prev_events"], sorted([first, second]))
        self.assertEqual(newest["depth"], before["depth"] + 1)
        self.assert_is_our_pdu(hs, newest, "10")
        self.assertEqual(list(await hs.store.get_forward_extremities(room)), [merge])

    async def test_a_linear_send_writes_its_graph_in_three_statements(self) -> None:
        """A message's graph rows cost one statement per table: its edge,
        its auth edges (one multi-row INSERT) and its extremity moved with
        one UPDATE (issue 30's send drop: a statement per row)."""
        hs = self.servers["main"]
        room = await self.alice.create_room()
        await self.alice.send(room, "warm")  # the room's extremities cached
        graph_tables = ("event_edges", "event_auth_edges", "event_forward_extremities")
        statements: list[str] = []
        execute, execute_batch = LoggingTransaction.execute, LoggingTransaction.execute_batch
        execute_statements = LoggingTransaction.execute_statements

        def counting_execute(txn: LoggingTransaction, sql: str, args: Any = ()) -> None:
            statements.append(sql)
            execute(txn, sql, args)

        def counting_batch(txn: LoggingTransaction, sql: str, rows: Any) -> None:
            rows = list(rows)
            statements.extend(sql for _ in rows)
            execute_batch(txn, sql, rows)

        def counting_statements(txn: LoggingTransaction, batch: Any) -> None:
            # Several statements in one round trip (PostgreSQL) still count
            # one each.
            statements.extend(sql for sql, _ in batch)
            execute_statements(txn, batch)

        restores = [
            self.patch(LoggingTransaction, "execute", counting_execute),
            self.patch(LoggingTransaction, "execute_batch", counting_batch),
            self.patch(LoggingTransaction, "execute_statements", counting_statements),
        ]
        sent = await self.alice.send(room, "counted")
        for restore in restores:
            restore.restore()
        writes = [
            sql
            for sql in statements
            if not sql.lstrip().startswith("SELECT") and any(t in sql for t in graph_tables)
        ]
        self.assertEqual(len(writes), 3, writes)
        self.assertEqual(list(await hs.store.get_forward_extremities(room)), [sent])

    async def test_event_fields_in_messages_and_context(self) -> None:
        room = await self.alice.create_room()
        event_id = await self.alice.send(room, "hello")
        fields = {"event_fields": ["type", "content.body"]}
        page = await self.alice.ok(
            "GET", f"/rooms/{room}/messages?dir=b&limit=1&filter={as_param(fields)}"
        )
        self.assertEqual(page["chunk"], [{"type": "m.room.message", "content": {"body": "hello"}}])
        context = await self.alice.ok(
            "GET", f"/rooms/{room}/context/{event_id}?limit=2&filter={as_param(fields)}"
        )
        self.assertEqual(context["event"], {"type": "m.room.message", "content": {"body": "hello"}})
        self.assertTrue(context["state"])
        self.assertTrue(all(set(e) <= {"type", "content"} for e in context["state"]))
        # With the federation format: its fields, by the same paths.
        both = {**FEDERATION, "event_fields": ["depth", "hashes.sha256", "room_id"]}
        page = await self.alice.ok(
            "GET", f"/rooms/{room}/messages?dir=b&limit=1&filter={as_param(both)}"
        )
        [event] = page["chunk"]
        self.assertEqual(set(event), {"depth", "hashes", "room_id"})
        self.assertEqual(event["room_id"], room)
        # The room event filter still applies next to them.
        only_members = {**fields, "types": ["m.room.member"]}
        page = await self.alice.ok(
            "GET", f"/rooms/{room}/messages?dir=b&limit=1&filter={as_param(only_members)}"
        )
        self.assertEqual([e["type"] for e in page["chunk"]], ["m.room.member"])
        code, error = await self.alice.request(
            "GET", f"/rooms/{room}/messages?filter={as_param({'event_format': 'pdu'})}"
        )
        self.assertEqual((code, error["errcode"]), (400, "M_BAD_JSON"))

    async def test_same_on_main_and_worker(self) -> None:
        room = await self.alice.create_room()
        event_id = await self.alice.send(room, "everywhere")
        await caught_up(self.servers, "main")
        flt = as_param({**FEDERATION, "room": {"timeline": {"limit": 3}}})
        on_main = (await self.alice.sync(filter=flt))["rooms"]["join"][room]
        on_reader = (await self.on_reader.sync(filter=flt))["rooms"]["join"][room]
        for part in ("timeline", "state"):
            self.assertEqual(
                without_age(on_main[part]["events"]), without_age(on_reader[part]["events"])
            )
        path = f"/rooms/{room}/context/{event_id}?filter={as_param(FEDERATION)}"
        main_context = await self.alice.ok("GET", path)
        reader_context = await self.on_reader.ok("GET", path)
        self.assertEqual(
            without_age([main_context["event"], *main_context["state"]]),
            without_age([reader_context["event"], *reader_context["state"]]),
        )
        self.assert_is_our_pdu(self.servers["reader"], reader_context["event"], "10")


def signed_form(pdu: dict[str, Any], version_id: str) -> dict[str, Any]:
    """What the server's signature covers: the served PDU as the redaction
    algorithm leaves it, without ``event_id`` from version 3 (where it is
    no part of the PDU)."""
    kept = pruned_event(KNOWN_ROOM_VERSIONS[version_id], pdu)
    if version_id not in ("1", "2"):
        kept.pop("event_id", None)
    return kept
