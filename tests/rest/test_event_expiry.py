"""Self-destructing events (MSC2228, behind
``experimental_features.msc2228_self_destructing_events``): an event whose
content names an integer ``org.matrix.self_destruct_after`` has its content
pruned at that time, on every process; off by default, and then nothing is
recorded or pruned."""

from __future__ import annotations

import time
import urllib.parse
from typing import Any

from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase

AFTER = "org.matrix.self_destruct_after"


def now_ms() -> int:
    return int(time.time() * 1000)


class EventExpiryTestCase(DatabaseTestCase):
    async def start(self, enabled: bool) -> None:
        extra: dict[str, Any] = {}
        if enabled:
            extra["experimental_features"] = {"msc2228_self_destructing_events": True}
        self.servers, clients, _ = start_cluster(
            self,
            self.test_db,
            workers=["writer", "reader"],
            stream_writers={"events": ["writer"]},
            **extra,
        )
        await eventually(lambda: all(hs.replication.connected for hs in self.servers.values()))
        self.alice = await ClientApi(self, clients["reader"].base_url).register("alice")
        self.on_main = clients["main"].as_user(self.alice.token)
        self.room = await self.alice.create_room(preset="public_chat")

    async def send(self, content: dict[str, Any]) -> str:
        path = f"/rooms/{self.room}/send/m.room.message/{len(content)}-{now_ms()}"
        return str((await self.alice.ok("PUT", path, content))["event_id"])

    async def content(self, client: ClientApi, event_id: str) -> Any:
        event = await client.ok("GET", f"/rooms/{self.room}/event/{urllib.parse.quote(event_id)}")
        return event["content"]

    async def expiries(self) -> list[Any]:
        return await self.servers["main"].store.db_pool.select(
            "t", "SELECT event_id FROM event_expiry"
        )

    async def test_content_pruned_at_its_time_on_every_process(self) -> None:
        await self.start(enabled=True)
        doomed = {"msgtype": "m.text", "body": "soon gone", AFTER: now_ms() + 300}
        doomed_id = await self.send(doomed)
        kept_id = await self.send({"msgtype": "m.text", "body": "stays"})
        odd_id = await self.send({"msgtype": "m.text", "body": "odd", AFTER: "soon"})
        # Read (and cached) everywhere before its time.
        for client in (self.alice, self.on_main):
            await eventually(
                lambda c=client: self.content(c, doomed_id),  # type: ignore[misc]
                what="the event on every process",
            )
            self.assertEqual((await self.content(client, doomed_id))["body"], "soon gone")
        self.assertEqual(await self.expiries(), [(doomed_id,)])

        async def pruned_everywhere() -> bool:
            contents = [await self.content(c, doomed_id) for c in (self.alice, self.on_main)]
            return contents == [{}, {}]

        await eventually(pruned_everywhere, timeout=10, what="the content pruned everywhere")
        page = await self.alice.ok("GET", f"/rooms/{self.room}/messages?dir=b&limit=5")
        by_id = {e["event_id"]: e["content"] for e in page["chunk"]}
        self.assertEqual(by_id[doomed_id], {})
        self.assertEqual(by_id[kept_id]["body"], "stays")
        self.assertEqual(by_id[odd_id]["body"], "odd")  # not a time: no expiry
        self.assertEqual(await self.expiries(), [])

    async def test_off_by_default(self) -> None:
        await self.start(enabled=False)
        event_id = await self.send({"msgtype": "m.text", "body": "stays", AFTER: now_ms() - 1})
        self.assertEqual(await self.expiries(), [])
        self.assertEqual((await self.content(self.alice, event_id))["body"], "stays")
