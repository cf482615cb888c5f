"""The synapse_lite test suite (trial)."""

import os

# Only when asked: importing the module here otherwise would run it twice as
# `python -m tests.harness.timing` (which imports this package first).
if os.environ.get("SYNAPSE_LITE_TEST_TIMES"):
    from tests.harness.timing import install as _time_tests

    _time_tests()
