"""The package's compiled bytecode, written before processes are started.

Every synapse_lite process imports some 330 modules. Where Python may not
write bytecode caches (``PYTHONDONTWRITEBYTECODE``, as this project's
machines set it), each process compiles all of them from source again: about
0.4 s of CPU per process start here, paid by every worker the launcher starts
and by every server the test suite starts (docs/testing.md). Python still
reads caches that exist, so writing them once, before the processes start,
takes that off every start after. A cache whose source changed since is
ignored (recompiled in memory), so a stale one costs nothing but the check.
"""

from __future__ import annotations

import compileall
import os
import re

import synapse_lite

#: Paths not compiled: the schema's Python deltas run once, from their
#: source, and the directory listing them holds nothing else.
_NOT_COMPILED = re.compile(r"[/\\]storage[/\\]schema[/\\]")


def write_package_bytecode(package_dir: str | None = None) -> bool:
    """Compile the sources under ``package_dir`` (synapse_lite's by default)
    into their ``__pycache__`` where the cache is missing or older than the
    source. Quiet; never raises: a
    package directory that cannot be written (an installed, read-only copy,
    whose installer compiled it) or a source that does not compile leaves
    things as they were, for the import to report. True if every module's
    cache is now current."""
    if package_dir is None:
        package_dir = os.path.dirname(os.path.abspath(synapse_lite.__file__))
    try:
        return bool(compileall.compile_dir(package_dir, rx=_NOT_COMPILED, quiet=2, workers=1))
    except Exception:  # an optimisation: never stop a start for it
        return False
