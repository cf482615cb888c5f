"""What the graph's rows cost SQLite itself: ``python -m bench.sqlite_edges``.

    python -m bench.sqlite_edges [--sends 3000] [--rounds 2]

A linear send's transaction, in plain ``sqlite3`` (WAL, ``synchronous=NORMAL``
as the engine configures its connections; no pool, no server): an events row
alone (``none``, the baseline), then with the graph's rows as delta 0080
stores them (one edge, three auth edges, the extremity moved; ``rowid``:
rowid tables, each with its primary-key index and reverse index), and the
same tables ``WITHOUT ROWID`` (``without_rowid``, an idea for the edge
tables: one B-tree fewer per row). Prints the process CPU µs per
transaction of each variant, alternating per round, and each over
``none``'s. Event ids are random, as reference hashes are. Prints figures
only; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid

VARIANTS = ("none", "rowid", "without_rowid")


def cpu_us_per_send(variant: str, sends: int) -> float:
    """Process CPU µs per transaction of ``sends`` linear sends in a fresh
    database, for ``variant`` (one of ``VARIANTS``)."""
    directory = tempfile.mkdtemp(prefix="sqlite_edges_")
    try:
        conn = sqlite3.connect(os.path.join(directory, "bench.db"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(
            "CREATE TABLE events (stream_ordering INTEGER PRIMARY KEY, event_id TEXT UNIQUE,"
            " room_id TEXT, json TEXT)"
        )
        graph = variant != "none"
        if graph:
            suffix = " WITHOUT ROWID" if variant == "without_rowid" else ""
            for table, other in (("event_edges", "prev_event_id"), ("event_auth_edges", "auth_id")):
                conn.execute(
                    f"CREATE TABLE {table} (event_id TEXT NOT NULL, {other} TEXT NOT NULL,"
                    f" PRIMARY KEY (event_id, {other})){suffix}"
                )
                conn.execute(f"CREATE INDEX {table}_rev ON {table} ({other}, event_id)")
            conn.execute(
                "CREATE TABLE event_forward_extremities (room_id TEXT NOT NULL,"
                f" event_id TEXT NOT NULL, PRIMARY KEY (room_id, event_id)){suffix}"
            )
        ids = [f"${uuid.uuid4().hex}{uuid.uuid4().hex[:11]}" for _ in range(sends + 1)]
        if graph:
            conn.execute("INSERT INTO event_forward_extremities VALUES ('!r', ?)", (ids[0],))
        auth = ids[:3]
        body = "x" * 400
        start = time.process_time()
        for i in range(1, sends + 1):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO events (event_id, room_id, json) VALUES (?, '!r', ?)", (ids[i], body)
            )
            if graph:
                conn.execute("INSERT INTO event_edges VALUES (?, ?)", (ids[i], ids[i - 1]))
                conn.execute(
                    "INSERT INTO event_auth_edges VALUES (?, ?), (?, ?), (?, ?)",
                    (ids[i], auth[0], ids[i], auth[1], ids[i], auth[2]),
                )
                conn.execute(
                    "UPDATE event_forward_extremities SET event_id = ?"
                    " WHERE room_id = '!r' AND event_id = ?",
                    (ids[i], ids[i - 1]),
                )
            conn.execute("COMMIT")
        took = time.process_time() - start
        conn.close()
        return took / sends * 1e6
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sqlite_edges", description=__doc__)
    parser.add_argument("--sends", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    print(f"SQLite {sqlite3.sqlite_version}, {args.sends} sends; CPU µs per send transaction")
    for round_ in range(args.rounds):
        order = VARIANTS if round_ % 2 == 0 else tuple(reversed(VARIANTS))
        figures = {v: cpu_us_per_send(v, args.sends) for v in order}
        base = figures["none"]
        print(
            f"round {round_ + 1}: "
            + ", ".join(f"{v} {figures[v]:.0f}" for v in VARIANTS)
            + f"; the graph's rows +{figures['rowid'] - base:.0f} (rowid),"
            f" +{figures['without_rowid'] - base:.0f} (without rowid);"
            f" without_rowid / rowid {figures['without_rowid'] / figures['rowid']:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
