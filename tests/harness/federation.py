"""Federation request bodies that tests send by hand (forged, replayed, hostile)."""

from __future__ import annotations

from typing import Any


def to_device_transaction(
    message_id: str, recipient: str, content: Any, origin_server_ts: int = 0
) -> dict[str, Any]:
    """A transaction from ``a.test`` carrying one to-device EDU from
    ``@alice:a.test`` to every device of ``recipient``."""
    return {
        "origin": "a.test",
        "origin_server_ts": origin_server_ts,
        "pdus": [],
        "edus": [
            {
                "edu_type": "m.direct_to_device",
                "content": {
                    "sender": "@alice:a.test",
                    "type": "m.test",
                    "message_id": message_id,
                    "messages": {recipient: {"*": content}},
                },
            }
        ],
    }
