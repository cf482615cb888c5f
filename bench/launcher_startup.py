"""How long `synapse-lite run` takes until every process answers /health: the
default layout (main, synchrotron1, persister1, persister2, media1) against the main
process alone (the monolith layout, the baseline), alternating, in one run.

    python bench/launcher_startup.py [--rounds 5]

Prints, for each round and layout, the seconds from spawning `synapse-lite run`
to its "processes up" line, then the median of each layout.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from synapse_lite.config.generate import GenerateOptions, write_config  # noqa: E402
from tests.harness.launcher import free_port_block  # noqa: E402


def one_start(layout: str) -> float:
    directory = tempfile.mkdtemp(prefix="bench_launcher_")
    config = os.path.join(directory, "homeserver.yaml")
    write_config(GenerateOptions(layout=layout, base_port=free_port_block(10)), config, directory)
    began = time.monotonic()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "synapse_lite.app.cli", "run", "-c", config],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONPATH=ROOT),
        text=True,
    )
    assert launcher.stdout is not None
    try:
        for line in launcher.stdout:
            if re.search(r"processes up in", line):
                return time.monotonic() - began
        raise RuntimeError(f"synapse-lite run exited with {launcher.wait()} before it was up")
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.communicate(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"monolith": [], "default": []}
    for round_number in range(1, args.rounds + 1):
        for layout in times:
            seconds = one_start(layout)
            times[layout].append(seconds)
            print(f"round {round_number}  {layout:<9} {seconds:6.2f} s", flush=True)
    for layout, values in times.items():
        print(f"median   {layout:<9} {statistics.median(values):6.2f} s  (of {len(values)})")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
