"""Progress lines for long audits: our own, in place of Spark's console bar.

Each step prints one line when it ends (rows and rows/s where it counts rows).
While Spark works, a watcher thread prints the running stages every few
seconds, so a ten-minute audit on a cluster never looks hung.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO


class Step:
    """One timed step; set ``rows`` to have its rate printed."""

    def __init__(self) -> None:
        self.rows: int | None = None


class Progress:
    """Writes ``audit: ...`` lines to ``out`` (nothing when ``out`` is None)."""

    def __init__(self, out: TextIO | None, watch_interval: float = 10.0) -> None:
        self._out = out
        self._lock = threading.Lock()
        self.watch_interval = watch_interval

    def line(self, message: str) -> None:
        if self._out is None:
            return
        with self._lock:
            self._out.write(f"audit: {message}\n")
            self._out.flush()

    @contextmanager
    def step(self, name: str) -> Iterator[Step]:
        """Time the block and report it, with its rate if it set ``rows``."""
        step = Step()
        start = time.monotonic()
        yield step
        elapsed = time.monotonic() - start
        if step.rows is None:
            self.line(f"{name} in {elapsed:.1f} s")
        else:
            rate = step.rows / elapsed if elapsed > 0 else float(step.rows)
            self.line(f"{name}: {step.rows:,} rows in {elapsed:.1f} s ({rate:,.0f} rows/s)")

    @contextmanager
    def watch_spark(self, spark: Any) -> Iterator[None]:
        """Report Spark's running stages every ``watch_interval`` seconds."""
        stop = threading.Event()
        tracker = spark.sparkContext.statusTracker()

        def watch() -> None:
            while not stop.wait(self.watch_interval):
                try:
                    stages = [tracker.getStageInfo(i) for i in tracker.getActiveStageIds()]
                except Exception:
                    return  # the session is going away
                parts = [
                    f"stage {s.stageId} {s.numCompletedTasks}/{s.numTasks} tasks"
                    for s in stages
                    if s is not None
                ]
                if parts:
                    self.line("spark running: " + ", ".join(parts))

        thread = threading.Thread(target=watch, name="audit-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=1)
