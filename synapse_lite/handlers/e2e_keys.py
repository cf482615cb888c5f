"""End-to-end encryption keys: ``/keys/upload``, ``/keys/query``, ``/keys/claim``.

Everything a client uploads is checked for shape before anything is stored
(a bad upload stores nothing). A device's identity keys announce a change on
the device_lists stream, so they are stored by the user's writer of it (the
``upload_device_keys`` internal call); one-time and fallback keys are stored
and claimed by whichever process has the request, straight in the database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import is_mine_id, is_valid_user_id
from synapse_lite.replication.http.devices import device_lists_writer_for
from synapse_lite.replication.http.e2e_keys import (
    UPLOAD_DEVICE_KEYS,
    DeviceKeysUpload,
    KeysChanged,
)
from synapse_lite.storage.databases.main.end_to_end_keys import KeyTriple, OneTimeKeyConflict

if TYPE_CHECKING:
    from synapse_lite.config.homeserver import HomeServerConfig
    from synapse_lite.handlers.auth import Requester
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.storage.databases.main import GenericWorkerStore

#: One-time keys one upload may carry (more: 413 M_TOO_LARGE). Clients upload
#: about half of the 50 keys they keep, so this is far above any real client.
MAX_ONE_TIME_KEYS_PER_UPLOAD = 1_000
#: Fallback keys one upload may carry (one per algorithm).
MAX_FALLBACK_KEYS_PER_UPLOAD = 10
#: Users one query or claim may name, and devices per user in a claim.
MAX_USERS_PER_REQUEST = 1_000
MAX_DEVICES_PER_USER = 1_000
#: The longest algorithm name, key id or key (public keys are 43 characters
#: of unpadded base64; signatures 86).
MAX_KEY_TEXT = 1_024


def bad(message: str, errcode: str = Codes.BAD_JSON) -> SynapseError:
    return SynapseError(400, message, errcode)


def _check_text(value: object, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_TEXT:
        raise bad(f"{where} must be a non-empty string of at most {MAX_KEY_TEXT} characters")
    return value


def _split_key_id(key_id: object, where: str) -> tuple[str, str]:
    """``algorithm:id`` -> ``(algorithm, id)``."""
    text = _check_text(key_id, where)
    algorithm, sep, rest = text.partition(":")
    if not sep or not algorithm or not rest:
        raise bad(f"{where}: key id {text!r} must be '<algorithm>:<key id>'")
    return algorithm, rest


def check_signatures(value: object, where: str) -> dict[str, dict[str, str]]:
    """``{user_id: {"algorithm:key_id": signature}}``, well formed (the
    signatures themselves are for the other devices to verify)."""
    if not isinstance(value, dict):
        raise bad(f"{where}.signatures must be an object")
    for user_id, signed in value.items():
        if not is_valid_user_id(user_id):
            raise bad(f"{where}.signatures: {user_id!r} is not a user id")
        if not isinstance(signed, dict):
            raise bad(f"{where}.signatures.{user_id} must be an object")
        for key_id, signature in signed.items():
            _split_key_id(key_id, f"{where}.signatures.{user_id}")
            _check_text(signature, f"{where}.signatures.{user_id}.{key_id}")
    return value


def check_device_keys(keys: object, user_id: str, device_id: str) -> dict[str, Any]:
    """The ``device_keys`` of an upload, for the uploading device only."""
    if not isinstance(keys, dict):
        raise bad("device_keys must be an object")
    if keys.get("user_id") != user_id:
        raise bad(f"device_keys.user_id must be your user id, {user_id}", Codes.INVALID_PARAM)
    if keys.get("device_id") != device_id:
        raise bad(
            f"device_keys.device_id must be the device of your access token, {device_id}",
            Codes.INVALID_PARAM,
        )
    algorithms = keys.get("algorithms")
    if (
        not isinstance(algorithms, list)
        or not algorithms
        or not all(isinstance(a, str) and a and len(a) <= MAX_KEY_TEXT for a in algorithms)
    ):
        raise bad("device_keys.algorithms must be a non-empty list of strings")
    public_keys = keys.get("keys")
    if not isinstance(public_keys, dict) or not public_keys:
        raise bad("device_keys.keys must be a non-empty object")
    for key_id, key in public_keys.items():
        _, key_device = _split_key_id(key_id, "device_keys.keys")
        if key_device != device_id:
            raise bad(
                f"device_keys.keys: {key_id!r} must name your device ('<algorithm>:{device_id}')",
                Codes.INVALID_PARAM,
            )
        _check_text(key, f"device_keys.keys.{key_id}")
    signatures = check_signatures(keys.get("signatures"), "device_keys")
    if user_id not in signatures:
        raise bad("device_keys must be signed by the device (signatures has no entry of yours)")
    return keys


def check_one_time_keys(value: object, where: str, fallback: bool) -> list[KeyTriple]:
    """``{"algorithm:key_id": key}`` where a key is a string or a signed object."""
    if not isinstance(value, dict):
        raise bad(f"{where} must be an object")
    limit = MAX_FALLBACK_KEYS_PER_UPLOAD if fallback else MAX_ONE_TIME_KEYS_PER_UPLOAD
    if len(value) > limit:
        raise SynapseError(
            413, f"{where}: {len(value)} keys in one upload; at most {limit}", Codes.TOO_LARGE
        )
    triples: list[KeyTriple] = []
    algorithms: set[str] = set()
    for key_id, key in value.items():
        algorithm, name = _split_key_id(key_id, where)
        if isinstance(key, dict):
            _check_text(key.get("key"), f"{where}.{key_id}.key")
            check_signatures(key.get("signatures"), f"{where}.{key_id}")
        else:
            _check_text(key, f"{where}.{key_id}")
        if fallback:
            if algorithm in algorithms:
                raise bad(f"{where}: one fallback key per algorithm ({algorithm!r} twice)")
            algorithms.add(algorithm)
        triples.append((algorithm, name, key))
    return triples


class E2eKeysHandler:
    """Uploads, queries and claims of device keys."""

    def __init__(
        self, store: GenericWorkerStore, calls: InternalCalls, config: HomeServerConfig
    ) -> None:
        self._store = store
        self._calls = calls
        self._config = config
        self._server_name = config.server_name

    async def upload_keys(self, requester: Requester, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /keys/upload``: the counts of the device's one-time keys after it."""
        user_id, device_id = requester.user_id, requester.device_id
        device_keys = None
        if body.get("device_keys") is not None:
            device_keys = check_device_keys(body["device_keys"], user_id, device_id)
        one_time: list[KeyTriple] = []
        if body.get("one_time_keys") is not None:
            one_time = check_one_time_keys(body["one_time_keys"], "one_time_keys", False)
        fallback: list[KeyTriple] = []
        if body.get("fallback_keys") is not None:
            fallback = check_one_time_keys(body["fallback_keys"], "fallback_keys", True)
        # A conflicting one-time key refuses the upload before anything else is stored.
        if one_time:
            try:
                await self._store.add_one_time_keys(user_id, device_id, one_time)
            except OneTimeKeyConflict as e:
                raise bad(
                    f"one_time_keys: {e.key_id} was already uploaded with other contents",
                    Codes.INVALID_PARAM,
                ) from None
        if fallback:
            await self._store.set_fallback_keys(user_id, device_id, fallback)
        if device_keys is not None:
            await self._calls.call(
                UPLOAD_DEVICE_KEYS,
                DeviceKeysUpload(user_id, device_id, device_keys),
                instance=device_lists_writer_for(self._config, user_id),
            )
        counts = await self._store.count_one_time_keys(user_id, device_id)
        return {"one_time_key_counts": {"signed_curve25519": 0, **counts}}

    async def store_device_keys(self, upload: DeviceKeysUpload) -> KeysChanged:
        """Serves :data:`UPLOAD_DEVICE_KEYS` (on the user's device_lists writer)."""
        if await self._store.get_device(upload.user_id, upload.device_id) is None:
            raise SynapseError(404, "Unknown device", Codes.NOT_FOUND)
        changed = await self._store.set_device_keys(upload.user_id, upload.device_id, upload.keys)
        return KeysChanged(changed)

    async def query_keys(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /keys/query``: local users' keys; remote servers under
        ``failures`` (this server does not yet ask other servers)."""
        queries = body.get("device_keys")
        if not isinstance(queries, dict):
            raise bad("device_keys must be an object of user id to a list of device ids")
        if len(queries) > MAX_USERS_PER_REQUEST:
            raise SynapseError(
                413, f"device_keys: at most {MAX_USERS_PER_REQUEST} users", Codes.TOO_LARGE
            )
        local: dict[str, list[str]] = {}
        failures: dict[str, Any] = {}
        for user_id, device_ids in queries.items():
            if not is_valid_user_id(user_id):
                raise bad(f"device_keys: {user_id!r} is not a user id", Codes.INVALID_PARAM)
            if not isinstance(device_ids, list) or not all(isinstance(d, str) for d in device_ids):
                raise bad(f"device_keys.{user_id} must be a list of device ids")
            if is_mine_id(user_id, self._server_name):
                local[user_id] = device_ids
            else:
                server = user_id.split(":", 1)[1]
                failures[server] = {
                    "status": 503,
                    "message": "Keys of users on other servers are not available yet",
                }
        device_keys = await self._store.get_device_keys(local)
        return {"device_keys": device_keys, "failures": failures}

    async def claim_keys(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /keys/claim``: one key per device named, each handed out once."""
        wanted = body.get("one_time_keys")
        if not isinstance(wanted, dict):
            raise bad("one_time_keys must be an object of user id to {device id: algorithm}")
        if len(wanted) > MAX_USERS_PER_REQUEST:
            raise SynapseError(
                413, f"one_time_keys: at most {MAX_USERS_PER_REQUEST} users", Codes.TOO_LARGE
            )
        claims: list[tuple[str, str, str]] = []
        failures: dict[str, Any] = {}
        for user_id, devices in wanted.items():
            if not is_valid_user_id(user_id):
                raise bad(f"one_time_keys: {user_id!r} is not a user id", Codes.INVALID_PARAM)
            if not isinstance(devices, dict):
                raise bad(f"one_time_keys.{user_id} must be an object of device id to algorithm")
            if len(devices) > MAX_DEVICES_PER_USER:
                raise SynapseError(
                    413,
                    f"one_time_keys.{user_id}: at most {MAX_DEVICES_PER_USER} devices",
                    Codes.TOO_LARGE,
                )
            for device_id, algorithm in devices.items():
                _check_text(device_id, f"one_time_keys.{user_id}: device id")
                _check_text(algorithm, f"one_time_keys.{user_id}.{device_id}")
            if is_mine_id(user_id, self._server_name):
                claims += [(user_id, d, a) for d, a in devices.items()]
            else:
                failures[user_id.split(":", 1)[1]] = {
                    "status": 503,
                    "message": "Keys of users on other servers are not available yet",
                }
        taken = await self._store.claim_one_time_keys(claims)
        result: dict[str, dict[str, dict[str, Any]]] = {}
        for (user_id, device_id, algorithm), (key_id, key) in taken.items():
            result.setdefault(user_id, {})[device_id] = {f"{algorithm}:{key_id}": key}
        return {"one_time_keys": result, "failures": failures}
