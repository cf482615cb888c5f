"""Registration files for tests: written to a temporary directory, named
in a config by absolute path."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import yaml

SERVER_NAME = "test.local"


def irc_registration(url: str | None = None, **changes: Any) -> dict[str, Any]:
    """A service holding ``@_irc_*`` and ``@irc-*`` exclusively and ``#_irc_*`` aliases."""
    data: dict[str, Any] = {
        "id": "irc",
        "url": url,
        "as_token": "irc-as-token",
        "hs_token": "irc-hs-token",
        "sender_localpart": "_irc_bot",
        "namespaces": {
            "users": [
                {"exclusive": True, "regex": f"@_irc_.*:{SERVER_NAME}"},
                {"exclusive": True, "regex": f"@irc-.*:{SERVER_NAME}"},
            ],
            "aliases": [{"exclusive": True, "regex": f"#_irc_.*:{SERVER_NAME}"}],
            "rooms": [],
        },
        "rate_limited": False,
    }
    data.update(changes)
    return data


def write_registrations(*registrations: dict[str, Any]) -> list[str]:
    """The absolute paths of the files written, for ``app_service_config_files``."""
    directory = tempfile.mkdtemp(prefix="synapse_lite_as_")
    paths = []
    for i, data in enumerate(registrations):
        path = os.path.join(directory, f"registration{i}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(data, f)
        paths.append(path)
    return paths
