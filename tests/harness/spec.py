"""Responses checked against the Matrix spec's OpenAPI files.

The spec is kept beside the repository (``../shared/matrix-spec``, see its
SOURCE.md; :func:`_spec_root` says where else it is looked for).
:func:`response_schema` resolves a response's JSON schema (its ``$ref``s
followed across files); :func:`assert_spec_response` validates a
body with it. Without the spec's files the check is skipped (a failure under
``CI=true``).
"""

from __future__ import annotations

import os
from typing import Any

import jsonschema
import yaml
from twisted.trial import unittest

from tests.harness.services import ServiceMissing, in_ci


def _spec_root() -> str:
    """Where the spec's client-server API files are: ``$SYNAPSE_LITE_MATRIX_SPEC``
    (the copy's top directory), else ``../shared/matrix-spec`` beside this
    checkout, else the workplace's ``/work/shared/matrix-spec`` (a clone made
    elsewhere, as CI makes one, has no ``../shared``)."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    candidates = [
        os.environ.get("SYNAPSE_LITE_MATRIX_SPEC", ""),
        os.path.join(here, "..", "shared", "matrix-spec"),
        "/work/shared/matrix-spec",
    ]
    for top in candidates:
        if top and os.path.isdir(os.path.join(top, "api", "client-server")):
            return os.path.normpath(os.path.join(top, "api", "client-server"))
    return os.path.normpath(os.path.join(candidates[1], "api", "client-server"))


SPEC_ROOT = _spec_root()

_files: dict[str, Any] = {}


def _load(path: str) -> Any:
    path = os.path.normpath(path)
    if path not in _files:
        with open(path, encoding="utf-8") as f:
            _files[path] = yaml.safe_load(f)
    return _files[path]


def _pointer(document: Any, pointer: str) -> Any:
    for part in pointer.lstrip("/").split("/"):
        if part:
            document = document[part.replace("~1", "/").replace("~0", "~")]
    return document


def _resolve(value: Any, path: str) -> Any:
    """``value`` (from the file at ``path``) with every ``$ref`` replaced."""
    if isinstance(value, dict):
        if "$ref" in value:
            target, _, pointer = value["$ref"].partition("#")
            target_path = os.path.join(os.path.dirname(path), target) if target else path
            resolved = _pointer(_load(target_path), pointer)
            return _resolve(resolved, target_path)
        # Examples are not copied with the spec (SOURCE.md) and never checked.
        return {
            k: v if k in ("example", "examples") else _resolve(v, path) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_resolve(v, path) for v in value]
    return value


def response_schema(api_file: str, path: str, method: str, code: int) -> Any:
    """The JSON schema of one response of the spec (``path`` as the spec
    writes it, e.g. ``/media/v3/upload``)."""
    file_path = os.path.join(SPEC_ROOT, api_file)
    if not os.path.exists(file_path):
        message = f"the Matrix spec's API files are not at {os.path.normpath(SPEC_ROOT)}"
        if in_ci():
            raise ServiceMissing(message)
        raise unittest.SkipTest(message)
    document = _load(file_path)
    response = document["paths"][path][method.lower()]["responses"][str(code)]
    response = _resolve(response, file_path)
    return response["content"]["application/json"]["schema"]


def assert_spec_response(
    testcase: unittest.TestCase, api_file: str, path: str, method: str, code: int, body: Any
) -> None:
    """Fail ``testcase`` unless ``body`` is what the spec says that response is."""
    schema = response_schema(api_file, path, method, code)
    try:
        jsonschema.validate(body, schema)
    except jsonschema.ValidationError as e:
        testcase.fail(f"{method} {path} {code}: {body!r} does not match the spec: {e.message}")
