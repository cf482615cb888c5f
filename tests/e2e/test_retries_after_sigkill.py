"""End to end: a client write answered 200, the writer that served it
SIGKILLed and restarted, the client's retry of the same request: the write is
delivered once.

Real processes (``main``, a reader ``sync1``, the events writer
``persister1``, ``writer1`` for typing). The retry goes to the process that
answered first and, with the same access token, to another process (as a
load balancer may send it), so neither process's memory can answer it: only
what the writer stored with the write can. To-device, account data, receipts
and presence are covered the same way in ``test_position_claims``.

Runs on the suite's database (SQLite, or PostgreSQL with
``SYNAPSE_LITE_TEST_DB=postgres``) with TCP replication; the typing tests
over Redis too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from twisted.internet import reactor, task
from twisted.trial import unittest

from tests.harness.client_api import ClientApi
from tests.harness.databases import (
    END_TO_END,
    create_test_database,
    one_engine_only,
)
from tests.harness.processes import ServerProcesses, layout_config
from tests.harness.services import require_redis

WORKERS = {
    "sync1": ["client", "replication", "health", "metrics"],
    "persister1": ["replication", "health", "metrics"],
    "writer1": ["replication", "health", "metrics"],
}
WRITERS = {"events": ["persister1"], "typing": "writer1"}


async def sleep(seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


class _SigkillTestCase(unittest.TestCase):
    """The processes, Alice and Bob in a public room, and the helpers."""

    timeout = 300
    transport = "tcp"
    engine = "postgres"

    async def setUp(self) -> None:  # type: ignore[override]
        one_engine_only(self.engine, END_TO_END)
        if self.transport == "redis":
            require_redis()
        self.test_db = create_test_database(self.engine)
        self.addCleanup(self.test_db.drop)
        config = layout_config(self.test_db, WORKERS, WRITERS, transport=self.transport)
        self.servers = ServerProcesses(self, config)
        await self.servers.start()
        self.alice = await ClientApi(self, self.servers.url("main")).register("alice")
        # Alice's access token on another process.
        self.alice_elsewhere = ClientApi(self, self.servers.url("sync1")).as_user(self.alice.token)
        self.bob = await ClientApi(self, self.servers.url("sync1")).register("bob")
        self.room = await self.alice.create_room(preset="public_chat")
        await self.bob.ok("POST", f"/rooms/{self.room}/join", {})
        joined = (await self.bob.sync())["next_batch"]
        await self.alice.send(self.room, "before")
        # A token after everything so far (a reader may lag the writer).
        seen = await self.sync_until(
            joined, lambda s: "before" in [e["content"].get("body") for e in self.timeline(s)]
        )
        self.since = seen["next_batch"]

    async def restart(self, name: str) -> None:
        await self.servers.kill(name)
        await self.servers.start(name)

    # Helpers

    def timeline(self, sync: dict[str, Any]) -> list[dict[str, Any]]:
        joined = sync.get("rooms", {}).get("join", {}).get(self.room, {})
        return list(joined.get("timeline", {}).get("events", []))

    def typing(self, sync: dict[str, Any]) -> list[list[str]]:
        """The ``user_ids`` of each ``m.typing`` in the room's ephemeral events."""
        joined = sync.get("rooms", {}).get("join", {}).get(self.room, {})
        return [
            e["content"]["user_ids"]
            for e in joined.get("ephemeral", {}).get("events", [])
            if e["type"] == "m.typing"
        ]

    async def sync_until(
        self, since: str, done: Callable[[dict[str, Any]], bool], timeout: float = 60
    ) -> dict[str, Any]:
        """Bob's incremental /sync from ``since`` until ``done`` holds."""
        deadline = time.monotonic() + timeout
        while True:
            sync = await self.bob.sync(since=since)
            if done(sync):
                return dict(sync)
            if time.monotonic() > deadline:
                raise AssertionError(f"not seen within {timeout} s: {sync}")
            await sleep(0.2)


class TypingAfterSigkillTestCase(_SigkillTestCase):
    engine = "sqlite"

    async def test_typing_retried_after_its_writer_restarts(self) -> None:
        """Typing lives in its writer's memory: the restart forgets it, the
        retry sets it again; the room shows Alice typing (once), and a later
        change still reaches /sync."""
        alice = self.alice.user_id
        typing = f"/rooms/{self.room}/typing/{alice}"
        on = {"typing": True, "timeout": 60_000}
        await self.alice.ok("PUT", typing, on)
        seen = await self.sync_until(self.since, lambda s: [alice] in self.typing(s))
        typed_since = seen["next_batch"]

        await self.restart("writer1")
        await self.alice.ok("PUT", typing, on)
        await self.alice_elsewhere.ok("PUT", typing, on)

        # A token of the writer's previous run is answered with the new run's
        # state: empty until the retry's row reaches the reader, then Alice.
        sync = await self.sync_until(self.since, lambda s: self.typing(s) not in ([], [[]]))
        self.assertEqual(self.typing(sync), [[alice]], sync)
        # A /sync that had seen Alice typing sees nothing else (or the same).
        for user_ids in self.typing(await self.bob.sync(since=typed_since)):
            self.assertEqual(user_ids, [alice])
        # The stream goes on after the writer's restart: the end of typing
        # reaches a /sync that had seen Alice typing.
        latest = (await self.bob.sync(since=typed_since))["next_batch"]
        await self.alice.ok("PUT", typing, {"typing": False})
        sync = await self.sync_until(latest, lambda s: self.typing(s) != [])
        self.assertEqual(self.typing(sync), [[]])

    async def test_typing_after_a_restart_reaches_a_reader_not_polling(self) -> None:
        """A reader whose token holds a position of the typing writer's
        previous run (and who was not long-polling when followers reset) is
        shown the new run's changes at once: positions carry the writer's run,
        and a token of another run gets the whole current state."""
        alice, bob = self.alice.user_id, self.bob.user_id
        await self.alice.ok("PUT", f"/rooms/{self.room}/typing/{alice}", {"typing": True})
        await self.alice.ok("PUT", f"/rooms/{self.room}/typing/{alice}", {"typing": False})
        seen = await self.sync_until(self.since, lambda s: self.typing(s)[-1:] == [[]])
        await self.restart("writer1")
        # Two changes in the new run: its serial is back where Bob's token is.
        await self.alice.ok("PUT", f"/rooms/{self.room}/typing/{alice}", {"typing": True})
        await self.bob.ok("PUT", f"/rooms/{self.room}/typing/{bob}", {"typing": True})
        both = sorted([str(alice), str(bob)])
        # Once the reader holds both (seen from a token of before any typing)...
        await self.sync_until(self.since, lambda s: self.typing(s)[-1:] == [both])
        # ...a token of the writer's previous run is shown them too.
        sync = await self.bob.sync(since=seen["next_batch"])
        self.assertEqual(self.typing(sync), [both])


class TypingAfterSigkillOverRedisTestCase(TypingAfterSigkillTestCase):
    transport = "redis"
    engine = "postgres"


class RetriesAfterSigkillTestCase(_SigkillTestCase):
    async def test_message_and_state_retried_after_the_events_writer_restarts(self) -> None:
        """``PUT /send/{type}/{txnId}`` and ``PUT /state/...`` answered, the
        room's events writer SIGKILLed and restarted, the same requests again
        (on the same process and on another): the same event ids, one event
        each in the timeline."""
        send = f"/rooms/{self.room}/send/m.room.message/retry-1"
        message = {"msgtype": "m.text", "body": "once"}
        topic = f"/rooms/{self.room}/state/m.room.topic"
        first = (await self.alice.ok("PUT", send, message))["event_id"]
        first_topic = (await self.alice.ok("PUT", topic, {"topic": "once"}))["event_id"]

        await self.restart("persister1")
        for client in (self.alice, self.alice_elsewhere):
            self.assertEqual((await client.ok("PUT", send, message))["event_id"], first)
            self.assertEqual(
                (await client.ok("PUT", topic, {"topic": "once"}))["event_id"], first_topic
            )
        # A new transaction id after the restart is a new message.
        await self.alice.ok("PUT", f"/rooms/{self.room}/send/m.room.message/retry-2", message)

        sync = await self.sync_until(
            self.since, lambda s: sum(e["type"] == "m.room.message" for e in self.timeline(s)) >= 2
        )
        timeline = self.timeline(sync)
        self.assertEqual([e["event_id"] for e in timeline].count(first), 1)
        self.assertEqual(
            [e["content"].get("body") for e in timeline if e["type"] == "m.room.message"],
            ["once", "once"],
        )
        self.assertEqual(
            [e["event_id"] for e in timeline if e["type"] == "m.room.topic"], [first_topic]
        )

    async def test_redaction_retried_after_the_events_writer_restarts(self) -> None:
        """``PUT /redact/{eventId}/{txnId}`` answered, the events writer
        SIGKILLed and restarted, the same request again (on the same process
        and on another): the same redaction, once in the timeline. A txnId is
        scoped to its endpoint: one used by a /send is a new redaction here."""
        secret = await self.alice.send(self.room, "secret", txn_id="shared-txn")
        other = await self.alice.send(self.room, "other")
        redact = f"/rooms/{self.room}/redact/{secret}/redact-1"
        first = (await self.alice.ok("PUT", redact, {"reason": "oops"}))["event_id"]

        await self.restart("persister1")
        for client in (self.alice, self.alice_elsewhere):
            self.assertEqual(
                (await client.ok("PUT", redact, {"reason": "oops"}))["event_id"], first
            )
        second = (await self.alice.ok("PUT", f"/rooms/{self.room}/redact/{other}/shared-txn", {}))[
            "event_id"
        ]
        self.assertNotEqual(second, secret)

        sync = await self.sync_until(
            self.since,
            lambda s: sum(e["type"] == "m.room.redaction" for e in self.timeline(s)) >= 2,
        )
        redactions = [e for e in self.timeline(sync) if e["type"] == "m.room.redaction"]
        self.assertEqual([e["event_id"] for e in redactions], [first, second])
        self.assertEqual([e.get("redacts") for e in redactions], [secret, other])
        redacted = {e["event_id"]: e["content"] for e in self.timeline(sync)}
        self.assertEqual((redacted[secret], redacted[other]), ({}, {}))
