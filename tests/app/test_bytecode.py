"""The package's bytecode written before processes start (``app/bytecode.py``)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import tempfile

from twisted.trial import unittest

import synapse_lite
from synapse_lite.app.bytecode import write_package_bytecode


def _package(files: dict[str, str]) -> str:
    root = tempfile.mkdtemp()
    for name, text in files.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return root


class WritePackageBytecodeTests(unittest.TestCase):
    def test_writes_a_cache_per_module_and_reports_them_current(self) -> None:
        root = _package({"__init__.py": "", "sub/mod.py": "VALUE = 1\n"})
        self.assertTrue(write_package_bytecode(root))
        for name in ("__init__.py", "sub/mod.py"):
            cache = importlib.util.cache_from_source(os.path.join(root, name))
            self.assertTrue(os.path.exists(cache), cache)

    def test_a_source_changed_since_gets_a_new_cache(self) -> None:
        root = _package({"mod.py": "VALUE = 1\n"})
        source = os.path.join(root, "mod.py")
        write_package_bytecode(root)
        cache = importlib.util.cache_from_source(source)
        with open(cache, "rb") as f:
            before = f.read()
        with open(source, "w") as f:
            f.write("VALUE = 2\n")
        stat = os.stat(source)
        os.utime(source, (stat.st_atime, stat.st_mtime + 10))
        self.assertTrue(write_package_bytecode(root))
        with open(cache, "rb") as f:
            self.assertNotEqual(f.read(), before)

    def test_a_source_that_does_not_compile_is_left_quietly(self) -> None:
        root = _package({"good.py": "VALUE = 1\n", "bad.py": "def (:\n"})
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            self.assertFalse(write_package_bytecode(root))
        self.assertEqual((out.getvalue(), err.getvalue()), ("", ""))
        self.assertTrue(
            os.path.exists(importlib.util.cache_from_source(os.path.join(root, "good.py")))
        )
        self.assertFalse(
            os.path.exists(importlib.util.cache_from_source(os.path.join(root, "bad.py")))
        )

    def test_a_missing_directory_is_not_an_error(self) -> None:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            # No module there, so none is out of date.
            self.assertTrue(write_package_bytecode(os.path.join(tempfile.mkdtemp(), "gone")))
        self.assertEqual((out.getvalue(), err.getvalue()), ("", ""))

    def test_the_default_is_synapse_lites_own_package_but_its_schema(self) -> None:
        self.assertTrue(write_package_bytecode())
        init = os.path.abspath(synapse_lite.__file__)
        self.assertTrue(os.path.exists(importlib.util.cache_from_source(init)))
        # The schema's deltas directory lists deltas only (its Python deltas
        # run from their source).
        deltas = os.path.join(os.path.dirname(init), "storage", "schema", "deltas")
        self.assertFalse(os.path.exists(os.path.join(deltas, "__pycache__")))
