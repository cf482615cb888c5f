"""Running our Node scripts, which drive the server with the real matrix-js-sdk.

The scripts and the SDK's pinned version live in ``tests/e2e/js/``; CI installs
the SDK there with ``npm ci``. A test needing them is skipped with the reason
when Node or the installed SDK is missing, except under ``CI=true``, where that
is a failure (see :mod:`tests.harness.services`).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from twisted.internet import utils
from twisted.trial.unittest import SkipTest

from tests.harness.services import ServiceMissing, in_ci

JS_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "e2e", "js")


class NodeScriptFailed(AssertionError):
    """A Node script exited non-zero; its output is in the message."""


def require_js_sdk() -> str:
    """The path of ``node``; skip (fail under CI) without Node or the SDK."""
    node = shutil.which("node")
    if node is None:
        message = "node is not installed (Node 20 runs the matrix-js-sdk tests)"
    elif not os.path.isdir(os.path.join(JS_DIR, "node_modules", "matrix-js-sdk")):
        message = f"matrix-js-sdk is not installed: cd {JS_DIR} && npm ci"
    else:
        return node
    if in_ci():
        raise ServiceMissing(message + " (CI=true: a missing dependency is a failure)")
    raise SkipTest(message)


async def run_script(script: str, *args: str, env: dict[str, str] | None = None) -> Any:
    """Run ``tests/e2e/js/<script>`` with ``args``; the JSON its last line of
    standard output holds. Raises :class:`NodeScriptFailed` with everything the
    script printed when it exits non-zero or prints no JSON."""
    node = require_js_sdk()
    out, err, code = await utils.getProcessOutputAndValue(
        node,
        (os.path.join(JS_DIR, script), *args),
        env={**os.environ, **(env or {})},
        path=JS_DIR,
    )
    stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    if code != 0:
        raise NodeScriptFailed(f"{script} exited with {code}:\n{stdout}\n{stderr}")
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        raise NodeScriptFailed(f"{script} printed no JSON:\n{stdout}\n{stderr}") from None
