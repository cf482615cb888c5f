"""Run one synapse_lite process under cProfile (what ``bench/follow_cost.py
--profile NAME`` starts instead of the plain process).

    python bench/profiled_process.py OUT.prof -m synapse_lite.app.generic_worker ARGS...

The statistics are written to OUT.prof when the process exits (SIGTERM stops
it cleanly) and whenever it gets SIGUSR2; read them with ``python -m pstats``.
"""

from __future__ import annotations

import atexit
import cProfile
import runpy
import signal
import sys


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        raise SystemExit(__doc__)
    out, module = sys.argv[1], sys.argv[3]
    sys.argv = [module, *sys.argv[4:]]
    profiler = cProfile.Profile()

    def dump(signum: int, frame: object) -> None:
        # Dumping stops the profiler (``create_stats`` disables it): go on
        # profiling, so that two dumps frame a window of the run.
        profiler.dump_stats(out)
        profiler.enable()

    signal.signal(signal.SIGUSR2, dump)
    atexit.register(profiler.dump_stats, out)
    profiler.enable()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
