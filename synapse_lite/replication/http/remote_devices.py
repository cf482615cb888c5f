"""Changes of our copy of a remote user's device list (delta 0150), which
announce a change on the device_lists stream, so run on that user's
device_lists writer (``config.writers.writer_for("device_lists",
user_id)``): ``handlers/remote_devices.py`` makes and serves the call."""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.codec.kinds import Checked, Custom, DecodeContext, Str, UserId, wire
from synapse_lite.replication.http.calls import InternalCall
from synapse_lite.replication.http.e2e_keys import KeysChanged, device_lists_position

#: What a :class:`RemoteDeviceListWrite` does with its ``data``.
REPLACE = "replace"  # {stream_id, devices: [{device_id, display_name, keys}], cross_signing}
UPDATE = "update"  # {stream_id, device: {...}, deleted}
SIGNING = "signing"  # {keys: {key type: key}}
CHANGED = "changed"  # {device_ids, stale}: no copy to update; tell clients
KINDS = (REPLACE, UPDATE, SIGNING, CHANGED)


def _decode_data(data: Any, context: DecodeContext) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise SynapseError(400, "'data' must be an object", Codes.BAD_JSON)
    return data


def _check_kind(kind: str, context: DecodeContext) -> None:
    if kind not in KINDS:
        raise SynapseError(400, f"'kind' must be one of {', '.join(KINDS)}", Codes.BAD_JSON)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RemoteDeviceListWrite:
    """One change of a remote user's list, already checked by the process
    that received it from the user's server."""

    user_id: str = attr.ib(metadata=wire(UserId()))
    kind: str = attr.ib(metadata=wire(Checked(Str(), _check_kind, example=CHANGED)))
    data: dict[str, Any] = attr.ib(
        metadata=wire(Custom(_decode_data, example=lambda context: {"device_ids": ["D"]}))
    )


WRITE_REMOTE_DEVICE_LIST = InternalCall(
    "write_remote_device_list",
    RemoteDeviceListWrite,
    KeysChanged,
    answer_position=device_lists_position,
)
