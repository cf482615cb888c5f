"""A small bridge built with mautrix-python's appservice module (the
framework the mautrix-* bridges use), run as its own process by
``test_mautrix.py``. It reads commands on stdin, one per line, and prints
what happens as JSON lines on stdout:

- ``join ROOM``: the bot joins ``ROOM``, then ``@_irc_puppet`` joins and
  says ``hi from irc`` (prints ``{"sent": event_id}``);
- ``down`` / ``up``: stop / start the service's HTTP listener;
- ``hold`` / ``release``: from ``hold`` on, each transaction is processed
  but its answer waits for ``release`` (as if the answer were lost);
- every event received in a transaction prints ``{"event": ...}``, and
  every transaction request, repeats included, prints ``{"txn": id,
  "event_ids": [...]}`` as it arrives (before the framework's own
  de-duplication).

Queries: an alias ``#_irc_*`` is made (a room created with it by the bot)
and a user ``@_irc_*`` registered when the homeserver asks.

Arguments: homeserver URL, port to listen on, and optionally the server
name (default ``test.local``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, cast

from aiohttp import web
from mautrix.appservice import AppService
from mautrix.types import Event, RoomAlias, RoomID, UserID

DOMAIN = sys.argv[3] if len(sys.argv) > 3 else "test.local"


def say(data: dict) -> None:
    print(json.dumps(data), flush=True)


async def main(hs_url: str, port: int) -> None:
    appservice: AppService
    #: Set while answers are held: each held answer waits for it to be cleared.
    released = asyncio.Event()
    released.set()

    @web.middleware
    async def watch_transactions(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method != "PUT" or "/transactions/" not in request.path:
            return await handler(request)
        body = await request.json()
        txn_id = request.match_info.get("transaction_id", request.path.rsplit("/", 1)[-1])
        event_ids = [e.get("event_id") for e in body.get("events", [])]
        say({"txn": txn_id, "event_ids": event_ids, "path": request.path})
        try:
            response = await handler(request)
        except web.HTTPOk as answered:  # mautrix answers a repeated id this way
            response = answered
        await released.wait()
        return response

    # mautrix answers 404 to an empty (falsy) result: say something.
    async def query_alias(alias: RoomAlias) -> dict:
        localpart = alias[1:].split(":")[0]
        room_id = await appservice.intent.create_room(alias_localpart=localpart)
        say({"made_alias": alias, "room_id": room_id})
        return {"room_id": room_id}

    async def query_user(user_id: UserID) -> dict:
        await appservice.intent.user(user_id).ensure_registered()
        say({"made_user": user_id})
        return {"user_id": user_id}

    appservice = AppService(
        server=hs_url,
        domain=DOMAIN,
        as_token="irc-as-token",
        hs_token="irc-hs-token",
        bot_localpart="_irc_bot",
        id="irc",
        # mautrix annotates these as taking the request; it calls them with
        # the alias and the user id.
        query_alias=cast(Any, query_alias),
        query_user=cast(Any, query_user),
        aiohttp_params={"middlewares": [watch_transactions]},
    )

    async def on_event(event: Event) -> None:
        say({"event": event.serialize()})

    appservice.matrix_event_handler(on_event)
    await appservice.start(host="127.0.0.1", port=port)
    await appservice.intent.ensure_registered()
    say({"ready": True})
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().strip():
        command, _, argument = line.partition(" ")
        room_id = RoomID(argument)
        try:
            if command == "join":
                await appservice.intent.ensure_joined(room_id)
                puppet = appservice.intent.user(UserID(f"@_irc_puppet:{DOMAIN}"))
                await puppet.ensure_joined(room_id)
                say({"sent": await puppet.send_text(room_id, "hi from irc")})
            elif command == "hold":
                released.clear()
                say({"hold": True})
            elif command == "release":
                released.set()
                say({"release": True})
            elif command == "down":
                assert appservice.runner is not None
                await appservice.runner.cleanup()
                say({"down": True})
            elif command == "up":
                appservice.runner = web.AppRunner(appservice.app)
                await appservice.runner.setup()
                await web.TCPSite(appservice.runner, "127.0.0.1", port).start()
                say({"up": True})
        except Exception as e:  # reported to the test, which fails on it
            say({"error": f"{command}: {e!r}"})
    await appservice.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
