"""End to end: a bridge built on a real application service framework
(mautrix-python, ``tests/appservice/mautrix_bridge.py``) against the
generated default layout run by ``synapse-lite run``, with an ``appservice``
worker of its own sending the transactions, everyone talking through the
router.

The bridge registers its bot, the bot and a puppet join a user's room and the
puppet speaks; the user's messages reach the bridge in transactions. Then the
sending worker is SIGKILLed with a transaction processed by the bridge but
not yet answered (the bridge holds the answer), messages are sent while it is
down, and the supervisor restarts it: every message reaches the bridge once,
in order, and the only transaction sent twice is the one in flight at the
kill, under the same id with the same events (which the framework ignores, as
the spec asks of a service). Last, an unknown alias and user in the
bridge's namespaces are looked up and made by the bridge while the lookup
waits.

Runs on the suite's engine: SQLite with TCP replication, or PostgreSQL with
Redis (``SYNAPSE_LITE_TEST_DB``). Skipped without mautrix.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from twisted.trial import unittest

from tests.appservice.registrations import irc_registration, write_registrations
from tests.appservice.test_mautrix import HAVE_MAUTRIX, BridgeProcess, start_bridge
from tests.harness.client_api import ClientApi, q
from tests.harness.databases import END_TO_END, create_test_database, one_engine_only
from tests.harness.launcher import (
    SynapseLiteCommand,
    edit_config,
    free_port_block,
    generated_config,
    temp_dir,
)
from tests.harness.polling import eventually
from tests.harness.services import require_redis

SERVER_NAME = "test.local"
#: The worker added to the default layout to send the transactions.
SENDER = "appservice1"
BEFORE_KILL = 4
WHILE_DOWN = 3


def transactions(bridge: BridgeProcess) -> list[dict[str, Any]]:
    """Every transaction request the bridge received, repeats included:
    ``{"txn", "event_ids", "path"}``."""
    return [line for line in bridge.lines if "txn" in line]


class AppServiceProcessesTestCase(unittest.TestCase):
    timeout = 240
    if not HAVE_MAUTRIX:
        skip = "mautrix is not installed (pip install mautrix)"

    async def test_bridge_on_the_default_layout_survives_a_killed_sender(self) -> None:
        one_engine_only("sqlite", END_TO_END)
        test_db = create_test_database()
        self.addCleanup(test_db.drop)
        redis = test_db.engine_name != "sqlite"
        if redis:
            require_redis()
        directory = temp_dir()
        # The layout's 9 ports (the router's federation port the last), the
        # sender worker's and the bridge's.
        base = free_port_block(11)
        sender_port, bridge_port = base + 9, base + 10
        path = generated_config(
            directory,
            test_db,
            layout="default",
            base_port=base,
            server_name=SERVER_NAME,
            enable_registration=True,
            replication="redis" if redis else "tcp",
        )
        [registration] = write_registrations(irc_registration(f"http://127.0.0.1:{bridge_port}"))

        def add_sender(config: dict[str, Any]) -> None:
            config["workers"][SENDER] = {
                "listeners": [
                    {
                        "port": sender_port,
                        "bind_address": "127.0.0.1",
                        "resources": ["health", "metrics"],
                    }
                ]
            }
            config["appservice_instances"] = [SENDER]
            config["app_service_config_files"] = [registration]

        edit_config(path, add_sender)
        command = SynapseLiteCommand(self, ["run", "-c", path], directory, directory)
        await command.start().wait_for_line(r"processes up in")
        self.assertIn(SENDER, command.running_pids())
        router = f"http://127.0.0.1:{base}"

        # The bot registers itself through the router.
        bridge = await start_bridge(self, router, bridge_port, SERVER_NAME)

        alice = await ClientApi(self, router).register("alice")
        room_id = await alice.create_room(preset="public_chat")
        bridge.command(f"join {room_id}")
        await eventually(lambda: bridge.seen("sent") or bridge.seen("error"), timeout=20)
        self.assertEqual(bridge.seen("error"), [])
        messages = await alice.ok("GET", f"/rooms/{room_id}/messages?dir=b&limit=10")
        said = [(e["sender"], e["content"].get("body")) for e in messages["chunk"]]
        self.assertIn(("@_irc_puppet:test.local", "hi from irc"), said)

        sent = [await alice.send(room_id, f"before {i}") for i in range(BEFORE_KILL)]
        await eventually(
            lambda: f"before {BEFORE_KILL - 1}" in bridge.bodies(), timeout=20, what="delivery"
        )

        # A transaction processed by the bridge, its answer held: the kill
        # leaves it unacknowledged.
        bridge.command("hold")
        await eventually(lambda: bridge.seen("hold"), timeout=10)
        held_at = len(transactions(bridge))
        sent.append(await alice.send(room_id, "in flight"))
        await eventually(
            lambda: "in flight" in bridge.bodies(), timeout=20, what="the held transaction"
        )
        in_flight = transactions(bridge)[held_at]
        self.assertIn(sent[-1], in_flight["event_ids"])
        mark = command.mark()
        os.kill(command.running_pids()[SENDER], signal.SIGKILL)
        bridge.command("release")
        sent += [await alice.send(room_id, f"while down {i}") for i in range(WHILE_DOWN)]
        await command.wait_for_line(rf"Restarted {SENDER} \(pid \d+\)", timeout=60, after=mark)
        sent.append(await alice.send(room_id, "after the restart"))
        await eventually(
            lambda: "after the restart" in bridge.bodies(),
            timeout=60,
            what="the messages sent while the sender was down",
        )

        # Once each, in order (the puppet's message came first).
        self.assertEqual(
            [b for b in bridge.bodies() if b != "hi from irc"],
            [f"before {i}" for i in range(BEFORE_KILL)]
            + ["in flight"]
            + [f"while down {i}" for i in range(WHILE_DOWN)]
            + ["after the restart"],
        )
        events = [e["event_id"] for e in bridge.seen("event") if e["type"] == "m.room.message"]
        self.assertEqual([e for e in events if e in sent], sent)
        # On the wire: the only id sent twice is the one in flight at the
        # kill, with the same events both times.
        attempts = transactions(bridge)
        by_id: dict[str, list[list[str]]] = {}
        for attempt in attempts:
            by_id.setdefault(attempt["txn"], []).append(attempt["event_ids"])
        repeated = {txn: tries for txn, tries in by_id.items() if len(tries) > 1}
        self.assertEqual(list(repeated), [in_flight["txn"]], attempts)
        self.assertEqual(repeated[in_flight["txn"]], [in_flight["event_ids"]] * 2)
        # Every transaction went to the versioned path.
        self.assertEqual(
            {a["path"].rsplit("/", 1)[0] for a in attempts}, {"/_matrix/app/v1/transactions"}
        )

        # Queries, asked by whichever process serves the lookup (a reader
        # here): the bridge makes the alias (its createRoom goes through
        # the router while the lookup waits) and the user.
        answer = await alice.ok("GET", "/directory/room/" + q("#_irc_chan:test.local"))
        self.assertEqual(bridge.seen("made_alias"), ["#_irc_chan:test.local"])
        [made] = [line["room_id"] for line in bridge.lines if "made_alias" in line]
        self.assertEqual(answer["room_id"], made)
        await alice.ok("GET", "/profile/" + q("@_irc_ghost:test.local"))
        self.assertEqual(bridge.seen("made_user"), ["@_irc_ghost:test.local"])
        self.assertEqual(bridge.seen("error"), [])
