"""The check after a :class:`~tests.harness.load.LoadRun`: is every
acknowledged message in the database once, and did every member's /sync return
it exactly once, in the room's stream order? Did typing reach everyone after
the fault? Shared by ``tests/e2e/test_faults.py`` and ``bench/soak.py``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import attr

from tests.harness.load import LoadRun


@attr.s(slots=True, frozen=True, auto_attribs=True)
class StoredEvent:
    """One of the run's messages as the ``events`` table holds it."""

    event_id: str
    room_id: str
    body: str


def stored_events(connect: Callable[[], Any], tag: str) -> list[StoredEvent]:
    """The run's messages in the database, in stream order."""
    conn = connect()
    try:
        cursor = conn.cursor()
        cursor.execute(
            "SELECT event_id, room_id, content FROM events WHERE type = 'm.room.message'"
            " ORDER BY stream_ordering"
        )
        result = []
        for event_id, room_id, content in cursor.fetchall():
            body = json.loads(content).get("body", "")
            if body.startswith(tag + " "):
                result.append(StoredEvent(event_id, room_id, body))
        return result
    finally:
        conn.close()


@attr.s(slots=True, auto_attribs=True)
class DeliveryReport:
    """What a run's clients were told, against what the database holds and
    what each member's /sync returned. ``lost``, ``duplicated`` and
    ``misordered`` must all be 0."""

    acknowledged: int
    #: acknowledged events missing from the database or from some member's /sync
    lost: int
    #: extra copies: a message body stored twice, or an event /sync returned twice
    duplicated: int
    #: (member, room) pairs whose /sync order differs from the stream order, plus
    #: stored pairs of one sender's messages in a room out of send order
    misordered: int
    #: stored but never acknowledged (the client gave up): must still be delivered
    unacknowledged: int
    #: seconds from the repair until every member had every event acked before it
    catch_up: float
    #: longest time from an ack to the last member's /sync returning the event
    max_lag: float
    #: longest time from a message's first send attempt to its ack (retries included)
    max_send: float
    errors: Counter[tuple[str, str]]
    #: members whose /sync did not follow the typist after the repair: saw no
    #: typing change after it, or did not end on the last acknowledged state
    typing_stuck: int
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.misordered or self.typing_stuck)

    def errors_text(self) -> str:
        if not self.errors:
            return "0"
        kinds = ", ".join(f"{who} {kind} x{n}" for (who, kind), n in sorted(self.errors.items()))
        return f"{sum(self.errors.values())} ({kinds})"


def check_delivery(
    run: LoadRun, connect: Callable[[], Any], repaired_at: float | None = None
) -> DeliveryReport:
    """Compare ``run``'s acks and each member's /sync with the database."""
    stored = stored_events(connect, run.tag)
    problems: list[str] = []
    stored_ids = Counter(e.event_id for e in stored)
    body_copies = Counter(e.body for e in stored)
    duplicated = sum(n - 1 for n in body_copies.values())
    if duplicated:
        twice = [b for b, n in body_copies.items() if n > 1][:3]
        problems.append(f"bodies stored more than once: {twice}")
    lost_ids = {e for e in run.acks if e not in stored_ids}
    if lost_ids:
        problems.append(f"acknowledged but not stored: {sorted(lost_ids)[:3]}")
    misordered = 0
    # One sender's messages in one room: stored in the order they were sent.
    last_seq: dict[tuple[str, str], int] = {}
    for event in stored:
        _, sender, seq = event.body.rsplit(" ", 2)
        key = (sender, event.room_id)
        n = int(seq[1:])
        if key in last_seq and n < last_seq[key]:
            misordered += 1
            problems.append(f"{event.body} stored after n{last_seq[key]}")
        last_seq[key] = max(n, last_seq.get(key, -1))
    by_room: dict[str, list[str]] = {}
    for event in stored:
        by_room.setdefault(event.room_id, []).append(event.event_id)
    all_seen_at: dict[str, float] = {}
    for user_id, received in run.received.items():
        copies = Counter(event_id for _, event_id, _ in received)
        extra = sum(n - 1 for n in copies.values())
        if extra:
            duplicated += extra
            problems.append(f"{user_id}: {extra} events returned more than once")
        missing = set(run.acks) - copies.keys()
        if missing:
            lost_ids |= missing
            problems.append(f"{user_id}: {len(missing)} acknowledged events never returned")
        for room_id, expected in by_room.items():
            got = [e for r, e, _ in received if r == room_id]
            if got != expected:
                misordered += 1
                problems.append(
                    f"{user_id} in {room_id}: /sync returned {len(got)} events,"
                    f" {len(expected)} stored, or in another order"
                )
        first_seen: dict[str, float] = {}
        for _, event_id, at in received:
            first_seen.setdefault(event_id, at)
        for event_id, at in first_seen.items():
            all_seen_at[event_id] = max(all_seen_at.get(event_id, 0.0), at)
    lags = [
        all_seen_at[a.event_id] - a.acked_at
        for a in run.acks.values()
        if a.event_id in all_seen_at and a.event_id not in lost_ids
    ]
    catch_up = 0.0
    if repaired_at is not None:
        for ack in run.acks.values():
            if ack.acked_at <= repaired_at and ack.event_id in all_seen_at:
                catch_up = max(catch_up, all_seen_at[ack.event_id] - repaired_at)
    typing_stuck = 0
    for user_id, seen in run.typing_seen.items():
        after = [typing for at, typing in seen if repaired_at is None or at >= repaired_at]
        final = run.typing_acked[0] if run.typing_acked else None
        if not after or after[-1] != final:
            typing_stuck += 1
            problems.append(
                f"{user_id}: typing seen after the repair {after[-3:]}, last set {final}"
            )
    return DeliveryReport(
        acknowledged=len(run.acks),
        lost=len(lost_ids),
        duplicated=duplicated,
        misordered=misordered,
        unacknowledged=len(set(stored_ids) - run.acks.keys()),
        catch_up=catch_up,
        max_lag=max(lags, default=0.0),
        max_send=max((a.acked_at - a.first_try_at for a in run.acks.values()), default=0.0),
        errors=run.errors,
        typing_stuck=typing_stuck,
        problems=problems,
    )
