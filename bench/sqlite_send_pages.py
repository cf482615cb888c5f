"""What one message send writes on SQLite, this code against baseline
checkouts: ``python -m bench.sqlite_send_pages [--baseline DIR]...``.

    python -m bench.sqlite_send_pages [--baseline DIR]... [--messages 300]
                                      [--sends 5]

For each tree, a child Python whose ``PYTHONPATH`` is that tree runs one
main process in process (``bench.in_process``, a throwaway SQLite database,
pool connections as the server opens them), creates a room, sends
``--messages`` messages through ``persist_as_writer`` (the database grows
to a realistic size), checkpoints and empties the WAL, sends ``--sends``
more and reads the WAL: the pages (WAL frames) each commit wrote, by table
or index (SQLite's ``dbstat``). Every page of a commit is a 4 KiB frame
written to the WAL (two ``pwrite`` calls) and later copied to the database
by a checkpoint, so this is what a send's commit costs grows with. Prints
figures only.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sqlite3
import struct
import subprocess
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENDER = "@member0:test.local"
WAL_HEADER, FRAME_HEADER, PAGE = 32, 24, 4096


def _wal_pages(path: str) -> tuple[list[int], int]:
    """The page numbers of the WAL's frames, and how many commits they make."""
    with open(path + "-wal", "rb") as f:
        data = f.read()
    pages, commits, offset = [], 0, WAL_HEADER
    while offset + FRAME_HEADER + PAGE <= len(data):
        page, size_after_commit = struct.unpack(">II", data[offset : offset + 8])
        pages.append(page)
        commits += 1 if size_after_commit else 0
        offset += FRAME_HEADER + PAGE
    return pages, commits


def _child(messages: int, sends: int) -> None:
    """In the child: measure and print one JSON line."""
    from twisted.internet import defer, task

    from bench.in_process import with_main_process
    from synapse_lite.events import EventSpec
    from synapse_lite.handlers.auth import Requester

    result: dict[str, Any] = {}

    async def measure(hs: Any) -> None:
        handlers = hs.handlers
        requester = Requester(SENDER, "DEV", "x")
        room = await handlers.room_creation.create_room(requester, {"preset": "public_chat"})

        async def send(count: int) -> None:
            for i in range(count):
                content = {"msgtype": "m.text", "body": f"message {i} for the room"}
                now = handlers.clock.time_msec()
                message = EventSpec("m.room.message", None, SENDER, content, now)
                await handlers.events.persist_as_writer(room, [message])

        await send(messages)
        path = handlers.events._store.db_pool.engine.path
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        await send(sends)
        pages, commits = _wal_pages(path)
        names = dict(conn.execute("SELECT pageno, name FROM dbstat"))
        conn.close()
        by_name = collections.Counter(names.get(p, "?") for p in pages)
        result.update(
            frames=len(pages) / sends,
            commits=commits / sends,
            by_name={k: v / sends for k, v in by_name.items()},
        )
        import synapse_lite

        print(json.dumps({**result, "code": synapse_lite.__file__}), flush=True)

    async def run(reactor: Any) -> None:
        await with_main_process(reactor, "sqlite", measure)

    task.react(lambda reactor: defer.ensureDeferred(run(reactor)))


def _run_tree(tree: str, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=tree)
    command = [sys.executable, os.path.abspath(__file__), "--child", str(args.messages),
               str(args.sends)]  # fmt: skip
    out = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=False)
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            found: dict[str, Any] = json.loads(line)
            if not str(found.pop("code")).startswith(tree + os.sep):
                raise RuntimeError(f"the child ran other code than {tree}'s")
            return found
    raise RuntimeError(f"{tree}: no result\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", action="append", default=[], help="another checkout")
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--sends", type=int, default=5)
    args = parser.parse_args()
    trees = {"this": ROOT}
    trees.update((os.path.basename(os.path.abspath(b)), os.path.abspath(b)) for b in args.baseline)
    figures = {name: _run_tree(tree, args) for name, tree in trees.items()}
    print(f"SQLite, pages written per message send (after {args.messages} messages):")
    print(f"{'':40s}" + "".join(f"{n[:14]:>15s}" for n in trees))
    for key in ("frames", "commits"):
        print(f"{key:40s}" + "".join(f"{figures[n][key]:15.1f}" for n in trees))
    names = sorted({k for f in figures.values() for k in f["by_name"]})
    names.sort(key=lambda k: -max(f["by_name"].get(k, 0) for f in figures.values()))
    for name in names:
        row = "".join(f"{figures[n]['by_name'].get(name, 0):15.1f}" for n in trees)
        print(f"  {name[:38]:38s}{row}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
