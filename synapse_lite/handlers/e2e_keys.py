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
from synapse_lite.handlers.device import wake_for_device_change
from synapse_lite.replication.http.e2e_keys import (
    UPLOAD_CROSS_SIGNING_KEYS,
    UPLOAD_DEVICE_KEYS,
    UPLOAD_SIGNATURES,
    CrossSigningUpload,
    DeviceKeysUpload,
    KeysChanged,
    SignaturesUpload,
)
from synapse_lite.storage.databases.main.end_to_end_keys import (
    KeyTriple,
    OneTimeKeyConflict,
    OneTimeKeyLimit,
    public_key,
)

if TYPE_CHECKING:
    from synapse_lite.config.homeserver import HomeServerConfig
    from synapse_lite.handlers.auth import Requester
    from synapse_lite.handlers.remote_devices import RemoteDeviceLists
    from synapse_lite.handlers.ui_auth import InteractiveAuthHandler
    from synapse_lite.notifier import Notifier
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.storage.databases.main import GenericWorkerStore

#: One-time keys one upload may carry (more: 413 M_TOO_LARGE). Clients upload
#: about half of the 50 keys they keep, so this is far above any real client.
MAX_ONE_TIME_KEYS_PER_UPLOAD = 1_000
#: One-time keys a device may have stored, all algorithms together (an upload
#: that would pass it: 400 M_TOO_LARGE, nothing stored). Clients keep about
#: 50 on the server; this is five full uploads, so only a runaway client
#: reaches it, and it bounds what one device can make the database hold.
MAX_ONE_TIME_KEYS_PER_DEVICE = 5_000
#: Fallback keys one upload may carry (one per algorithm).
MAX_FALLBACK_KEYS_PER_UPLOAD = 10
#: Users one query or claim may name, and devices per user in a claim.
MAX_USERS_PER_REQUEST = 1_000
MAX_DEVICES_PER_USER = 1_000
#: The longest algorithm name, key id or key (public keys are 43 characters
#: of unpadded base64; signatures 86).
MAX_KEY_TEXT = 1_024
#: Keys one signatures upload may sign.
MAX_SIGNED_KEYS_PER_UPLOAD = 1_000
#: The cross-signing key types, and the ``usage`` each key must state.
CROSS_SIGNING_TYPES = {
    "master_key": "master",
    "self_signing_key": "self_signing",
    "user_signing_key": "user_signing",
}


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
        # The spec: key ids "should be" <algorithm>:<device_id>; a key id of
        # another name is the client's business, its shape is ours.
        _split_key_id(key_id, "device_keys.keys")
        _check_text(key, f"device_keys.keys.{key_id}")
    # Required by the spec's DeviceKeys, and well formed; the spec does not
    # ask the server to check that the device signed its keys (other
    # devices verify the signatures before trusting them), so {} is taken.
    if "signatures" not in keys:
        raise bad("device_keys.signatures is required (an object; may be empty)")
    check_signatures(keys["signatures"], "device_keys")
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


def check_cross_signing_key(key: object, user_id: str, usage: str, where: str) -> dict[str, Any]:
    """A cross-signing key of ``user_id`` for ``usage``: one ed25519 public key."""
    if not isinstance(key, dict):
        raise bad(f"{where} must be an object")
    if key.get("user_id") != user_id:
        raise bad(f"{where}.user_id must be your user id, {user_id}", Codes.INVALID_PARAM)
    usages = key.get("usage")
    if not isinstance(usages, list) or usage not in usages:
        raise bad(f"{where}.usage must contain {usage!r}", Codes.INVALID_PARAM)
    keys = key.get("keys")
    if not isinstance(keys, dict) or len(keys) != 1:
        raise bad(f"{where}.keys must hold exactly one key")
    ((key_id, public),) = keys.items()
    algorithm, name = _split_key_id(key_id, f"{where}.keys")
    _check_text(public, f"{where}.keys.{key_id}")
    if algorithm != "ed25519" or name != public:
        raise bad(
            f"{where}.keys: the key id must be 'ed25519:<the public key>'", Codes.INVALID_PARAM
        )
    if "signatures" in key:
        check_signatures(key["signatures"], where)
    return key


def parse_key_query(body: dict[str, Any]) -> dict[str, list[str]]:
    """``{user: [device ids]}`` of a ``/keys/query`` body (ours, or another
    server's ``/user/keys/query``); 400 (413 when too many) otherwise."""
    queries = body.get("device_keys")
    if not isinstance(queries, dict):
        raise bad("device_keys must be an object of user id to a list of device ids")
    if len(queries) > MAX_USERS_PER_REQUEST:
        raise SynapseError(
            413, f"device_keys: at most {MAX_USERS_PER_REQUEST} users", Codes.TOO_LARGE
        )
    for user_id, device_ids in queries.items():
        if not is_valid_user_id(user_id):
            raise bad(f"device_keys: {user_id!r} is not a user id", Codes.INVALID_PARAM)
        if not isinstance(device_ids, list) or not all(isinstance(d, str) for d in device_ids):
            raise bad(f"device_keys.{user_id} must be a list of device ids")
    return queries


def parse_key_claims(body: dict[str, Any]) -> dict[str, dict[str, str]]:
    """``{user: {device: algorithm}}`` of a ``/keys/claim`` body (ours, or
    another server's ``/user/keys/claim``); 400 (413 when too many) otherwise."""
    wanted = body.get("one_time_keys")
    if not isinstance(wanted, dict):
        raise bad("one_time_keys must be an object of user id to {device id: algorithm}")
    if len(wanted) > MAX_USERS_PER_REQUEST:
        raise SynapseError(
            413, f"one_time_keys: at most {MAX_USERS_PER_REQUEST} users", Codes.TOO_LARGE
        )
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
    return wanted


class E2eKeysHandler:
    """Uploads, queries and claims of device keys."""

    def __init__(
        self,
        store: GenericWorkerStore,
        calls: InternalCalls,
        config: HomeServerConfig,
        notifier: Notifier,
        remote: RemoteDeviceLists | None = None,
    ) -> None:
        """``remote``: other servers' users' keys (None: they are failures)."""
        self._store = store
        self._calls = calls
        self._config = config
        self._notifier = notifier
        self._server_name = config.server_name
        self._remote = remote

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
                await self._store.add_one_time_keys(
                    user_id, device_id, one_time, MAX_ONE_TIME_KEYS_PER_DEVICE
                )
            except OneTimeKeyConflict as e:
                raise bad(
                    f"one_time_keys: {e.key_id} was already uploaded with other contents",
                    Codes.INVALID_PARAM,
                ) from None
            except OneTimeKeyLimit as e:
                # 400, not 413: the request is within the per-upload limit; it is
                # the device's stored total that would be too large. Claims
                # free room, so the client can upload again later.
                raise SynapseError(
                    400,
                    f"one_time_keys: the device has {e.stored} one-time keys stored and"
                    f" {e.new} new ones would pass the limit of {e.max_stored}",
                    Codes.TOO_LARGE,
                    {"max_one_time_keys": e.max_stored},
                ) from None
        if fallback:
            await self._store.set_fallback_keys(user_id, device_id, fallback)
        if device_keys is not None:
            await self._calls.call(
                UPLOAD_DEVICE_KEYS,
                DeviceKeysUpload(user_id, device_id, device_keys),
                instance=self._config.writers.writer_for("device_lists", user_id),
            )
        counts = await self._store.count_one_time_keys(user_id, device_id)
        return {"one_time_key_counts": {"signed_curve25519": 0, **counts}}

    async def store_device_keys(self, upload: DeviceKeysUpload) -> KeysChanged:
        """Serves :data:`UPLOAD_DEVICE_KEYS` (on the user's device_lists writer)."""
        if await self._store.get_device(upload.user_id, upload.device_id) is None:
            raise SynapseError(404, "Unknown device", Codes.NOT_FOUND)
        written = await self._store.set_device_keys(upload.user_id, upload.device_id, upload.keys)
        if written is not None:
            await wake_for_device_change(self._store, self._notifier, upload.user_id)
        return KeysChanged(written)

    async def query_keys(self, body: dict[str, Any], viewer: str) -> dict[str, Any]:
        """``POST /keys/query`` by ``viewer``: local users' device and
        cross-signing keys; remote users' from our copy of their lists or
        their servers (``handlers/remote_devices.py``), a server that could
        not answer under ``failures``."""
        local: dict[str, list[str]] = {}
        remote: dict[str, list[str]] = {}
        for user_id, device_ids in parse_key_query(body).items():
            if is_mine_id(user_id, self._server_name):
                local[user_id] = device_ids
            else:
                remote[user_id] = device_ids
        result = await self.local_keys(local, viewer)
        result["failures"] = {}
        if remote and self._remote is not None:
            theirs = await self._remote.query(remote)
            for part in ("device_keys", "master_keys", "self_signing_keys", "failures"):
                result[part].update(theirs[part])
            # The viewer's own signatures of remote users' master keys (made
            # with their user-signing key) are kept here, never sent to the
            # other server: only the viewer is shown them.
            mine = await self._store.get_signatures_of_other_users(viewer, sorted(remote))
            for user_id, key in list(result["master_keys"].items()):
                signatures = mine.get(user_id, {}).get(public_key(key))
                if signatures:
                    merged = {**key.get("signatures", {})}
                    merged[viewer] = {**merged.get(viewer, {}), **signatures}
                    result["master_keys"][user_id] = {**key, "signatures": merged}
        elif remote:
            for user_id in remote:
                result["failures"][user_id.split(":", 1)[1]] = {
                    "status": 503,
                    "message": "This process does not ask other servers",
                }
        return result

    async def local_keys(self, local: dict[str, list[str]], viewer: str | None) -> dict[str, Any]:
        """Device and cross-signing keys of our users ``{user: [device ids]}``
        (every device for []), as ``viewer`` sees them (a user-signing key
        only by its owner; None: another server, which never sees one)."""
        device_keys = await self._store.get_device_keys(local, viewer)
        cross = await self._store.get_cross_signing_keys(list(local), viewer)
        result: dict[str, Any] = {
            "device_keys": device_keys,
            "master_keys": {},
            "self_signing_keys": {},
            "user_signing_keys": {},
        }
        for user_id, by_type in cross.items():
            for field, usage in CROSS_SIGNING_TYPES.items():
                # A user-signing key is shown to its owner only.
                if usage in by_type and (usage != "user_signing" or user_id == viewer):
                    result[field.replace("_key", "_keys")][user_id] = by_type[usage]
        return result

    async def claim_keys(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /keys/claim``: one key per device named, each handed out once."""
        claims: list[tuple[str, str, str]] = []
        remote: dict[str, dict[str, str]] = {}
        for user_id, devices in parse_key_claims(body).items():
            if is_mine_id(user_id, self._server_name):
                claims += [(user_id, d, a) for d, a in devices.items()]
            else:
                remote[user_id] = devices
        result = await self.claim_local_keys(claims)
        failures: dict[str, Any] = {}
        if remote and self._remote is not None:
            theirs = await self._remote.claim(remote)
            result.update(theirs["one_time_keys"])
            failures = theirs["failures"]
        else:
            for user_id in remote:
                failures[user_id.split(":", 1)[1]] = {
                    "status": 503,
                    "message": "This process does not ask other servers",
                }
        return {"one_time_keys": result, "failures": failures}

    async def claim_local_keys(
        self, claims: list[tuple[str, str, str]]
    ) -> dict[str, dict[str, dict[str, Any]]]:
        """One key per ``(user, device, algorithm)`` of our users, each
        handed out once: ``{user: {device: {"algorithm:key_id": key}}}``."""
        taken = await self._store.claim_one_time_keys(claims)
        result: dict[str, dict[str, dict[str, Any]]] = {}
        for (user_id, device_id, algorithm), (key_id, key) in taken.items():
            result.setdefault(user_id, {})[device_id] = {f"{algorithm}:{key_id}": key}
        return result

    # Cross-signing

    async def upload_cross_signing_keys(
        self, requester: Requester, body: dict[str, Any], ui_auth: InteractiveAuthHandler
    ) -> dict[str, Any]:
        """``POST /keys/device_signing/upload``. Replacing keys needs
        user-interactive auth; a user's first master key does not (the spec
        since v1.11: a new device sets cross-signing up without a password)."""
        user_id = requester.user_id
        uploaded: dict[str, dict[str, Any]] = {}
        for field, usage in CROSS_SIGNING_TYPES.items():
            if body.get(field) is not None:
                uploaded[usage] = check_cross_signing_key(body[field], user_id, usage, field)
        if not uploaded:
            raise bad("Upload at least one of master_key, self_signing_key, user_signing_key")
        stored = (await self._store.get_cross_signing_keys([user_id])).get(user_id, {})
        master = uploaded.get("master") or stored.get("master")
        if master is None:
            raise bad("Upload a master_key first: the other keys are signed by it")
        master_id = f"ed25519:{public_key(master)}"
        for usage in ("self_signing", "user_signing"):
            key = uploaded.get(usage)
            if key is not None and master_id not in key.get("signatures", {}).get(user_id, {}):
                raise bad(f"{usage}_key must be signed by the master key {master_id}")
        if all(
            _without_signatures(stored.get(u)) == _without_signatures(k)
            for u, k in uploaded.items()
        ):
            return {}  # a repeat of the stored keys (a client retrying)
        if "master" in stored:
            await ui_auth.check_password(requester.user_id, body, "replace cross-signing keys")
        await self._calls.call(
            UPLOAD_CROSS_SIGNING_KEYS,
            CrossSigningUpload(user_id, uploaded),
            instance=self._config.writers.writer_for("device_lists", user_id),
        )
        return {}

    async def store_cross_signing_keys(self, upload: CrossSigningUpload) -> KeysChanged:
        """Serves :data:`UPLOAD_CROSS_SIGNING_KEYS` (on the user's device_lists writer)."""
        written = await self._store.set_cross_signing_keys(upload.user_id, upload.keys)
        await wake_for_device_change(self._store, self._notifier, upload.user_id)
        return KeysChanged(written)

    async def upload_signatures(self, requester: Requester, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /keys/signatures/upload``: the requester's signatures of
        their own devices and master key, and of other users' master keys
        (of this server or another: kept here, shown to the signer alone).
        Each signed key that cannot be signed so is a failure, not an error."""
        signer = requester.user_id
        if sum(len(v) for v in body.values() if isinstance(v, dict)) > MAX_SIGNED_KEYS_PER_UPLOAD:
            raise SynapseError(
                413, f"At most {MAX_SIGNED_KEYS_PER_UPLOAD} keys per upload", Codes.TOO_LARGE
            )
        own = (await self._store.get_cross_signing_keys([signer], signer)).get(signer, {})
        own_devices = set(await self._store.get_device_ids(signer))
        signatures: list[list[str]] = []
        failures: dict[str, dict[str, Any]] = {}

        def fail(user_id: str, key_id: str, message: str, errcode: str) -> None:
            failures.setdefault(user_id, {})[key_id] = {"errcode": errcode, "error": message}

        for user_id, signed_keys in body.items():
            if not is_valid_user_id(user_id):
                raise bad(f"{user_id!r} is not a user id", Codes.INVALID_PARAM)
            if not isinstance(signed_keys, dict):
                raise bad(f"{user_id} must be an object of key id to signed key")
            for key_id, signed in signed_keys.items():
                _check_text(key_id, f"{user_id}: key id")
                if not isinstance(signed, dict) or signed.get("user_id") != user_id:
                    raise bad(f"{user_id}.{key_id} must be a key of {user_id}")
                mine = check_signatures(signed.get("signatures"), f"{user_id}.{key_id}").get(
                    signer, {}
                )
                allowed = await self._signing_keys_for(signer, own, own_devices, user_id, key_id)
                if allowed is None:
                    fail(user_id, key_id, "No such key to sign", Codes.NOT_FOUND)
                    continue
                valid = {k: v for k, v in mine.items() if k in allowed}
                if not valid:
                    fail(
                        user_id,
                        key_id,
                        "Not signed by a key of yours that may sign it"
                        f" ({', '.join(sorted(allowed)) or 'none uploaded yet'})",
                        "M_INVALID_SIGNATURE",
                    )
                    continue
                signatures += [[user_id, key_id, k, v] for k, v in valid.items()]
        if signatures:
            await self._calls.call(
                UPLOAD_SIGNATURES,
                SignaturesUpload(signer, signatures),
                instance=self._config.writers.writer_for("device_lists", signer),
            )
        return {"failures": failures}

    async def _signing_keys_for(
        self,
        signer: str,
        own: dict[str, dict[str, Any]],
        own_devices: set[str],
        user_id: str,
        key_id: str,
    ) -> set[str] | None:
        """The key ids of ``signer``'s that may sign ``user_id``'s key
        ``key_id`` (None: no such key to sign): their self-signing key for
        their own devices, any of their devices for their master key, their
        user-signing key for another user's master key."""
        if user_id == signer:
            if key_id in own_devices:
                if "self_signing" not in own:
                    return set()
                return {f"ed25519:{public_key(own['self_signing'])}"}
            if "master" in own and key_id == public_key(own["master"]):
                return {f"ed25519:{d}" for d in own_devices}
            return None
        if is_mine_id(user_id, self._server_name):
            theirs = (await self._store.get_cross_signing_keys([user_id])).get(user_id, {})
        else:
            theirs = await self._remote_master_key(user_id)
        if "master" not in theirs or key_id != public_key(theirs["master"]):
            return None
        if "user_signing" not in own:
            return set()
        return {f"ed25519:{public_key(own['user_signing'])}"}

    async def _remote_master_key(self, user_id: str) -> dict[str, dict[str, Any]]:
        """``{"master": key}`` of a user of another server as we know it
        (our copy of their list, else their server), {} when unknown."""
        if self._remote is None:
            return {}
        answer = await self._remote.query({user_id: []})
        master = answer["master_keys"].get(user_id)
        return {} if master is None else {"master": master}

    async def store_signatures(self, upload: SignaturesUpload) -> KeysChanged:
        """Serves :data:`UPLOAD_SIGNATURES` (on the signer's device_lists writer)."""
        written = await self._store.add_cross_signing_signatures(upload.user_id, upload.signatures)
        await wake_for_device_change(self._store, self._notifier, upload.user_id)
        return KeysChanged(written or None)


def _without_signatures(key: dict[str, Any] | None) -> dict[str, Any] | None:
    if key is None:
        return None
    return {k: v for k, v in key.items() if k != "signatures"}
