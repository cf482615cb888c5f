"""``synapse-lite audit``: the command line of the Spark audit.

The audit itself lives in the top-level ``spark/`` directory of the source tree
(it is submitted to Spark clusters as it is, with ``spark-submit
spark/audit.py``). This module finds and runs the job; its arguments, shared
with ``spark/audit.py``, are in ``audit_arguments.py``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

#: The source tree: the parent of the ``synapse_lite`` package directory.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(args: argparse.Namespace) -> int:
    """Run the audit job from ``spark/``; the exit code (0 clean, 1 findings, 2 error)."""
    if not os.path.isfile(os.path.join(REPO_ROOT, "spark", "audit.py")):
        sys.stderr.write(
            f"audit: error: the Spark audit is not installed here (no spark/audit.py in"
            f" {REPO_ROOT}); it ships with the source tree: run it from a checkout of"
            " synapse_lite\n"
        )
        return 2
    if REPO_ROOT not in sys.path:
        sys.path.insert(0, REPO_ROOT)
    audit = importlib.import_module("spark.audit")
    code: int = audit.run(args)
    return code
