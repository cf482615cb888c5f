"""The main process: ``python -m synapse_lite.app.homeserver -c homeserver.yaml``."""

from __future__ import annotations

import sys

from synapse_lite.app.process import run_process


def main() -> None:
    sys.exit(run_process(sys.argv[1:], worker=False))


if __name__ == "__main__":
    main()
