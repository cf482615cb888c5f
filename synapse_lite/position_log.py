"""The position log: what a process announced, handed out and finished.

When enabled, each process appends JSON lines to ``positions-<instance>.jsonl``
in its data directory. The Spark audit (``spark/audit.py``) reads these files and
checks that no position was announced or handed to a client before every id it
covers had finished. Lines:

* ``{"kind": "finished", "ts", "process", "stream", "writer", "id", "committed"}``
  (``id`` as stored: backfill's count down from -1)
* ``{"kind": "position", "ts", "process", "stream", "writer", "position", "purpose"}``
  where ``purpose`` says what the position was for (``announce``, ``rdata``,
  ``sync``, ``pagination`` ...). ``writer`` is :data:`STREAM_WIDE` for the
  stream's persisted-up-to position (``persisted_upto_position()``), which
  covers the ids of every writer; otherwise the position is that writer's and
  covers only its ids. Positions count up on every stream.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import IO

#: The ``writer`` of a position record that covers every writer of the stream.
STREAM_WIDE = "*"


class PositionLog:
    """Appends position records for one process; safe from any thread."""

    def __init__(self, path: str, process: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self._process = process
        self._lock = threading.Lock()
        self._file: IO[str] | None = open(path, "a", encoding="utf-8", buffering=1)

    def _write(self, record: dict[str, object]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            if self._file is not None:
                self._file.write(line)

    def id_finished(self, stream: str, writer: str, stream_id: int, committed: bool) -> None:
        """An id this process allocated has finished."""
        self._write(
            {
                "kind": "finished",
                "ts": int(time.time() * 1000),
                "process": self._process,
                "stream": stream,
                "writer": writer,
                "id": stream_id,
                "committed": committed,
            }
        )

    def position(self, stream: str, writer: str, position: int, purpose: str) -> None:
        """This process announced, or handed to a client, ``position`` of ``writer``."""
        self._write(
            {
                "kind": "position",
                "ts": int(time.time() * 1000),
                "process": self._process,
                "stream": stream,
                "writer": writer,
                "position": position,
                "purpose": purpose,
            }
        )

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def position_log_path(data_dir: str, instance_name: str) -> str:
    """Where a process's position log lives."""
    return os.path.join(data_dir, f"positions-{instance_name}.jsonl")
