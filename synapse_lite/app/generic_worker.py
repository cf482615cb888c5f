"""A worker process: ``python -m synapse_lite.app.generic_worker -c homeserver.yaml
-c worker.yaml`` (or ``--worker-name NAME`` for a worker declared inline)."""

from __future__ import annotations

import sys

from synapse_lite.app.process import run_process


def main() -> None:
    sys.exit(run_process(sys.argv[1:], worker=True))


if __name__ == "__main__":
    main()
