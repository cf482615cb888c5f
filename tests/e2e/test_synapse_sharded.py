"""End to end: the core of the Synapse interoperability scenario (issue 31)
with our side as real processes in the sharded federation layout (issue
32): the router (a client port, and the federation port of our server name
``localhost:<port>``, HTTPS with a certificate from the test's CA), the main
process, an events writer ``persister1``, two federation readers and two
federation senders, under ``synapse-lite run``. A real Synapse
(``tests/harness/synapse_peer.py``) reaches us only through the router's
federation port; we reach it through our senders (and readers, for keys).

In steps sharing one start of each server:

* **join by alias, both ways**: Synapse's user sam joins alice's room of
  ours by its alias, alice joins sam's room of Synapse by its alias;
* **messages in order, both ways**: in each room, each of the two sends a
  batch of 20; the other side reads it in order, once;
* **typing and receipts, both ways** in Synapse's room;
* **Synapse down and back**: Synapse stopped while alice sends 20, started
  again: sam reads the 20 in order, once (our sender that owns Synapse
  retries what it kept);
* **ours down and back**: our router, all of us Synapse can reach, killed
  (SIGKILL) while sam sends 10 in his room (Synapse's log shows a refused
  transaction), restarted by the launcher: alice reads the 10 in order,
  once (Synapse retries the transaction, through the router to a reader);
* **a kick each way**: alice kicks sam from her room, sam kicks alice from
  his; each side sees it.

SQLite with TCP replication (the embedded default; the scenario runs on one
engine: docs/testing.md, "Decisions"); skipped with the reason when Synapse
cannot be installed here, a failure under ``CI=true``.
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
from typing import Any

from twisted.trial import unittest

from tests.e2e import test_federation_workers as workers
from tests.federation.test_edus import readers_in, typing_in
from tests.federation.test_synapse_scenario import reads_exactly
from tests.harness.client_api import ClientApi, q
from tests.harness.databases import END_TO_END, one_engine_only
from tests.harness.polling import eventually
from tests.harness.processes import free_port
from tests.harness.synapse_peer import SynapsePeer, synapse_or_skip, sync_until
from tests.harness.tls import TestCA

SENDERS = ["sender1", "sender2"]
READERS = ["reader1", "reader2"]
CROSSING_SECONDS = 30.0


class SynapseShardedTestCase(unittest.TestCase):
    # A cold install of Synapse takes minutes; a warm run, under a minute.
    timeout = 1200

    # The config helpers of the federation workers test (borrowed:
    # subclassing it would run its test here too).
    write_config: Any = workers.FederationWorkersTestCase.write_config
    load: Any = workers.FederationWorkersTestCase.load
    edit: Any = workers.FederationWorkersTestCase.edit
    run_server: Any = workers.FederationWorkersTestCase.run_server
    client_url: Any = workers.FederationWorkersTestCase.client_url

    async def test_scenario_with_our_side_sharded(self) -> None:
        one_engine_only("sqlite", END_TO_END)
        transport = "tcp"
        python = await synapse_or_skip(self)
        ca = TestCA(tempfile.mkdtemp(prefix="synapse_sharded_ca_"))
        self.synapse = SynapsePeer(python, ca)
        await self.synapse.start(self)
        self.path = self.server_config(ca, transport)
        self.our_run = await self.run_server(self.path)
        self.alice = await ClientApi(self, self.client_url(self.load(self.path))).register("alice")
        self.sam = await ClientApi(self, self.synapse.client_url).register("sam")

        await self.step_join_by_alias_both_ways()
        await self.step_messages_in_order_both_ways()
        await self.step_typing_and_receipts_both_ways()
        await self.step_synapse_down_and_back()
        await self.step_ours_down_and_back()
        await self.step_a_kick_each_way()

    # Steps

    async def step_join_by_alias_both_ways(self) -> None:
        self.ours = await self.alice.create_room(preset="public_chat", room_alias_name="ours")
        self.theirs = await self.sam.create_room(preset="public_chat", room_alias_name="theirs")
        for user, alias, room_id in (
            (self.sam, f"#ours:{self.server_name}", self.ours),
            (self.alice, f"#theirs:{self.synapse.server_name}", self.theirs),
        ):
            joined = await user.ok("POST", f"/join/{q(alias)}", {})
            self.assertEqual(joined["room_id"], room_id)
        for room_id in (self.ours, self.theirs):
            for user in (self.alice, self.sam):
                await self.members_are(user, room_id, {self.alice.user_id, self.sam.user_id})

    async def step_messages_in_order_both_ways(self) -> None:
        for room_id in (self.ours, self.theirs):
            for sender, reader in ((self.alice, self.sam), (self.sam, self.alice)):
                batch = [f"{sender.user_id} in {room_id} {i:02d}" for i in range(20)]
                for body in batch:
                    await sender.send(room_id, body)
                await reads_exactly(reader, room_id, batch, f"{sender.user_id}'s in {room_id}")

    async def step_typing_and_receipts_both_ways(self) -> None:
        room_id = self.theirs
        for typist, watcher in ((self.sam, self.alice), (self.alice, self.sam)):
            since = (await watcher.sync())["next_batch"]
            await typist.ok(
                "PUT",
                f"/rooms/{q(room_id)}/typing/{q(typist.user_id)}",
                {"typing": True, "timeout": 30000},
            )
            await self.sees(
                watcher,
                since,
                lambda s, t=typist: t.user_id in (typing_in(s, room_id) or []),
                f"{typist.user_id} typing",
            )
        event_id = await self.sam.send(room_id, "read me")
        await reads_exactly(self.alice, room_id, ["read me"], "the message to read")
        for reader, watcher in ((self.alice, self.sam), (self.sam, self.alice)):
            since = (await watcher.sync())["next_batch"]
            await reader.ok("POST", f"/rooms/{q(room_id)}/receipt/m.read/{q(event_id)}", {})
            await self.sees(
                watcher,
                since,
                lambda s, r=reader: readers_in(s, room_id).get(r.user_id or "") == event_id,
                f"{reader.user_id}'s receipt",
            )

    async def step_synapse_down_and_back(self) -> None:
        self.synapse.stop()
        batch = [f"while Synapse down {i:02d}" for i in range(20)]
        for body in batch:
            await self.alice.send(self.ours, body)
        await self.synapse.restart()
        await reads_exactly(self.sam, self.ours, batch, "sent while Synapse was down")

    async def step_ours_down_and_back(self) -> None:
        # The router is all of us Synapse can reach: killed (SIGKILL), we
        # are down for it until the launcher has started it again (after
        # its restart delay, 1 s at least).
        mark = self.our_run.mark()
        synapse_mark = self.synapse.log_size()
        os.kill(self.our_run.running_pids()["router"], signal.SIGKILL)
        await self.our_run.wait_for_line(r"router \(pid \d+\) died", after=mark)
        batch = [f"while ours down {i:02d}" for i in range(10)]
        for body in batch:
            await self.sam.send(self.theirs, body)
        await self.our_run.wait_for_line(
            r"router .*Listening on .*federation; TLS", after=mark, timeout=CROSSING_SECONDS
        )
        # Synapse did try us while we were down (so it backs off, and will
        # send only its newest event of the room when it catches up).
        self.assertRegex(
            self.synapse.log_since(synapse_mark), f"{re.escape(self.server_name)}.*(refused|Failed)"
        )
        # Synapse retries a server that failed only after its backoff, or
        # at once when that server asks it anything (docs/federation.md):
        # our message does.
        await self.alice.send(self.theirs, "ours is back")
        await reads_exactly(self.alice, self.theirs, batch, "sent while ours was down")

    async def step_a_kick_each_way(self) -> None:
        for kicker, kicked, room_id in (
            (self.alice, self.sam, self.ours),
            (self.sam, self.alice, self.theirs),
        ):
            await kicker.ok("POST", f"/rooms/{q(room_id)}/kick", {"user_id": kicked.user_id})
            await self.members_are(kicker, room_id, {kicker.user_id})

            await self.sees_own_leave(kicked, room_id)

    # Helpers

    def server_config(self, ca: TestCA, transport: str) -> str:
        port = free_port()
        self.server_name = f"localhost:{port}"
        certificate, key = ca.issue("ours", ["localhost"])
        path: str = self.write_config(
            self.server_name,
            transport,
            {
                "persister1": ["client", "replication", "health"],
                **{r: ["federation", "keys", "health"] for r in READERS},
                **{s: ["health"] for s in SENDERS},
            },
            router={
                "listeners": [
                    {"port": free_port(), "resources": ["client", "health"]},
                    {
                        "port": port,
                        "resources": ["federation"],
                        "tls_certificate_path": certificate,
                        "tls_private_key_path": key,
                    },
                ]
            },
            federation_sender_instances=list(SENDERS),
            federation={
                "extra_ca_paths": [ca.ca_path],
                "ip_range_allowlist": ["127.0.0.0/8"],
                "retry": {"initial_seconds": 0.5, "max_seconds": 1},
            },
        )
        self.edit(path, lambda c: c.update(stream_writers={"events": ["persister1"]}))
        return path

    async def sees_own_leave(self, user: ClientApi, room_id: str) -> None:
        async def seen() -> bool:
            # A user who left may read the state at their leaving.
            code, member = await user.request(
                "GET", f"/rooms/{q(room_id)}/state/m.room.member/{q(user.user_id)}"
            )
            return code == 200 and member.get("membership") == "leave"

        await eventually(seen, timeout=CROSSING_SECONDS, what=f"{user.user_id} sees the kick")

    async def members_are(self, viewer: ClientApi, room_id: str, expected: set[Any]) -> None:
        async def are() -> bool:
            code, answer = await viewer.request("GET", f"/rooms/{q(room_id)}/joined_members")
            return code == 200 and set(answer["joined"]) == expected

        await eventually(
            are, timeout=CROSSING_SECONDS, what=f"{viewer.user_id}: members {expected}"
        )

    async def sees(self, user: ClientApi, since: str, check: Any, what: str) -> None:
        await sync_until(user, since, check, what, timeout=CROSSING_SECONDS)
