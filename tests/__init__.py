"""The synapse_lite test suite (trial)."""

import os

from synapse_lite.app.bytecode import write_package_bytecode

# The servers the tests start read the package's bytecode instead of each
# compiling every module again (``synapse_lite/app/bytecode.py``).
write_package_bytecode()

# Only when asked: importing the module here otherwise would run it twice as
# `python -m tests.harness.timing` (which imports this package first).
if os.environ.get("SYNAPSE_LITE_TEST_TIMES"):
    from tests.harness.timing import install as _time_tests

    _time_tests()
