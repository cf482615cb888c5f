"""What per-event history visibility costs, on the send path and on a read.

    python -m bench.visibility [--engine sqlite|postgres] [--events 20000]
                               [--sends 100] [--rounds 10] [--pages 200]

One main process in this Python process, on a throwaway database made the
way the tests make theirs. A room of ``--events`` messages whose history
setting changes three times (``joined``, ``invited``, ``shared``), and a
reader who joined in the middle: the per-event rules hide some of it.

* Send path: the partial index ``events_history_visibility`` is the one
  thing visibility adds to a send (the index's predicate, evaluated per
  inserted event). Sends (one event per persist, as a client's) alternate
  between rounds with the index and rounds without it (dropped and made
  again between rounds, outside the timing). Prints sends/s of each and
  their ratio (target: >= 0.95, i.e. within the noise).
* Read path: a ``/messages`` page (50 events) read from the store, the
  baseline every read pays anyway, against what visibility adds to it: the
  reader's membership history, the room's settings (cached; and read cold,
  through the index, and without it) and the rules per event. Prints ms per
  page of each and the added share (target: visibility <= 0.5 of the page
  read). And the /sync shortcut for a room whose history was always open.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from twisted.internet import defer, task

from bench.in_process import with_main_process
from synapse_lite.events import EventSpec
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.visibility import load_room_visibility, member_sees_everything
from synapse_lite.tokens import RoomStreamToken

ALICE, BOB = "@alice:test.local", "@bob:test.local"
INDEX = (
    "CREATE INDEX events_history_visibility ON events (room_id, stream_ordering)"
    " WHERE type = 'm.room.history_visibility'"
)


async def _run(reactor: Any, args: argparse.Namespace) -> None:
    async def measure(hs: Any) -> None:
        await _measure(hs, args)

    await with_main_process(reactor, args.engine, measure)


async def _timed(rounds: int, action: Callable[[], Awaitable[object]]) -> float:
    """Median seconds of one ``action`` over ``rounds``."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        await action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def _measure(hs: Any, args: argparse.Namespace) -> None:
    events, store, clock = hs.handlers.events, hs.store, hs.handlers.clock
    room_id = await hs.handlers.room_creation.create_room(
        Requester(ALICE, "DEV", "x"), {"preset": "public_chat"}
    )

    def message(body: str, sender: str = ALICE) -> EventSpec:
        return EventSpec("m.room.message", None, sender, {"msgtype": "m.text", "body": body},
                         clock.time_msec())  # fmt: skip

    def setting(value: str) -> EventSpec:
        content = {"history_visibility": value}
        return EventSpec("m.room.history_visibility", "", ALICE, content, clock.time_msec())

    changes = {
        args.events // 4: "joined",
        args.events // 2: "invited",
        3 * args.events // 4: "shared",
    }
    for start in range(0, args.events, 100):
        batch = [message(f"m{i}") for i in range(start, min(start + 100, args.events))]
        for at, value in changes.items():
            if start <= at < start + 100:
                batch.append(setting(value))
        if start <= 3 * args.events // 5 < start + 100:
            batch.append(EventSpec("m.room.member", BOB, BOB, {"membership": "join"},
                                   clock.time_msec()))  # fmt: skip
        await events.persist_as_writer(room_id, batch)
    print(f"{args.engine}: a room of {args.events} messages, 3 setting changes, Bob joined at 60%")

    async def send_round(label: int) -> float:
        started = time.perf_counter()
        for i in range(args.sends):
            await events.persist_as_writer(room_id, [message(f"r{label}.{i}", BOB)])
        return args.sends / (time.perf_counter() - started)

    async def set_index(present: bool) -> None:
        statement = INDEX if present else "DROP INDEX events_history_visibility"
        await store.db_pool.runInteraction("bench_index", lambda txn: txn.execute(statement))

    # Send path: rounds alternate, so the machine's load falls on both alike.
    await send_round(-1)
    rates: dict[bool, list[float]] = {True: [], False: []}
    present = True
    for round_number in range(args.rounds):
        for indexed in (True, False) if round_number % 2 == 0 else (False, True):
            if indexed != present:
                await set_index(indexed)
                present = indexed
                await send_round(-1)  # untimed: what the change left behind is paid here
            rates[indexed].append(await send_round(round_number))
    if not present:
        await set_index(True)
    with_index, without = statistics.median(rates[True]), statistics.median(rates[False])
    print(f"send path: {with_index:.0f} sends/s with the index, {without:.0f} without"
          f" (medians of {args.rounds} rounds of {args.sends}); ratio {with_index / without:.2f}"
          " (target >= 0.95)")  # fmt: skip

    # Read path: a page of Bob's /messages from the middle of the room, the
    # ``joined`` period before he joined, where the rules hide everything.
    settings = await store.get_history_visibility_settings(room_id)
    joined_at = next(position for position, value in settings if value == "joined")
    page_token = RoomStreamToken(joined_at + args.events // 10)
    page = await store.get_room_events_between([room_id], None, page_token, 50)

    async def read_page() -> None:
        await store.get_room_events_between([room_id], None, page_token, 50)

    async def visibility_warm() -> None:
        view = await load_room_visibility(store, BOB, room_id)
        view.filter(page)

    async def visibility_cold() -> None:
        store.get_history_visibility_settings.invalidate(room_id)
        await visibility_warm()

    shown = len((await load_room_visibility(store, BOB, room_id)).filter(page))
    read = await _timed(args.pages, read_page)
    warm = await _timed(args.pages, visibility_warm)
    cold = await _timed(args.pages, visibility_cold)
    await set_index(False)
    unindexed = await _timed(max(args.pages // 10, 3), visibility_cold)
    await set_index(True)

    def ms(seconds: float) -> str:
        return f"{seconds * 1000:.3f} ms"

    print(f"read path, per page of {len(page)} events ({shown} shown to Bob), medians of"
          f" {args.pages}:")  # fmt: skip
    print(f"  page read (baseline):                 {ms(read)}")
    print(f"  visibility, settings cached:          {ms(warm)}  ({warm / read:.2f} of the page"
          " read; target <= 0.5)")  # fmt: skip
    print(f"  visibility, settings read (index):    {ms(cold)}  ({cold / read:.2f})")
    print(f"  visibility, settings read (no index): {ms(unindexed)}  ({unindexed / read:.2f})")
    print(f"  ({len(settings)} setting events in the room)")
    open_room = await hs.handlers.room_creation.create_room(
        Requester(ALICE, "DEV", "x"), {"preset": "public_chat"}
    )
    await member_sees_everything(store, ALICE, open_room)
    shortcut = await _timed(args.pages, lambda: member_sees_everything(store, ALICE, open_room))
    print(f"/sync shortcut (history always open, a joined member): {shortcut * 1e6:.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--events", type=int, default=20_000, help="messages in the room")
    parser.add_argument("--sends", type=int, default=100, help="sends per round")
    parser.add_argument("--rounds", type=int, default=10, help="rounds with and without the index")
    parser.add_argument("--pages", type=int, default=200, help="pages read per figure")
    args = parser.parse_args()
    task.react(lambda reactor: defer.ensureDeferred(_run(reactor, args)))


if __name__ == "__main__":
    main()
