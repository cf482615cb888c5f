"""Logging for one process: every line carries the process's name, so the
launcher can merge the lines of all processes."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from twisted.logger import STDLibLogObserver, globalLogBeginner


class _InstanceFilter(logging.Filter):
    def __init__(self, instance_name: str) -> None:
        super().__init__()
        self.instance_name = instance_name

    def filter(self, record: logging.LogRecord) -> bool:
        record.instance = self.instance_name
        return True


def setup_logging(instance_name: str, level: str, stream: TextIO | None = None) -> None:
    """Log to ``stream`` (stderr) with the process name on every line (the
    launcher merges the lines of all processes)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(_InstanceFilter(instance_name))
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(instance)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("synapse_lite.storage.txn").setLevel(max(logging.INFO, root.level))
    globalLogBeginner.beginLoggingTo([STDLibLogObserver()], redirectStandardIO=False)
