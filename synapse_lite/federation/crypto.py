"""Signing as the Matrix server-server spec defines it.

* Canonical JSON: UTF-8, keys sorted, no insignificant whitespace, integers
  only (within ``±(2**53 - 1)``), no floats.
* Unpadded base64 (standard alphabet, ``=`` stripped).
* ``sign_json`` / ``verify_signed_json``: an ed25519 signature over the
  canonical JSON of an object without its ``signatures`` and ``unsigned``
  keys, stored under ``signatures[server_name][key_id]``.
* The server's signing key lives in the data directory as one line
  ``ed25519 <version> <unpadded base64 seed>``; the key id is
  ``ed25519:<version>``.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import secrets
import string
from typing import Any

import attr
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey as NaclSigningKey
from nacl.signing import VerifyKey

#: The file in ``data_dir`` holding the server's signing key.
SIGNING_KEY_FILE = "signing.key"
ALGORITHM = "ed25519"
#: Largest integer canonical JSON allows (in magnitude).
MAX_CANONICAL_INT = 2**53 - 1


class CanonicalJsonError(ValueError):
    """A value cannot be encoded as canonical JSON (a float, a huge integer)."""


class SignatureError(ValueError):
    """A signature is missing, malformed or does not verify."""


class SigningKeyFileError(RuntimeError):
    """The signing key file is missing (on a worker) or unreadable."""


def encode_base64(data: bytes) -> str:
    """Unpadded standard base64."""
    return base64.b64encode(data).decode("ascii").rstrip("=")


def decode_base64(text: str) -> bytes:
    """Decode unpadded (or padded) standard base64; ``ValueError`` if it is not."""
    if not isinstance(text, str) or not text.isascii():
        raise ValueError("not base64 text")
    stripped = text.rstrip("=")
    try:
        return base64.b64decode(stripped + "=" * (-len(stripped) % 4), validate=True)
    except binascii.Error as e:
        raise ValueError(f"not base64: {e}") from None


def check_canonical(value: Any, depth: int = 0) -> None:
    """:class:`CanonicalJsonError` unless ``value`` can be canonical JSON."""
    if depth > 100:
        raise CanonicalJsonError("nested too deeply")
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, int):
        if abs(value) > MAX_CANONICAL_INT:
            raise CanonicalJsonError(f"integer {value} is out of the canonical JSON range")
        return
    if isinstance(value, float):
        raise CanonicalJsonError("floats are not allowed in canonical JSON")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalJsonError("object keys must be strings")
            check_canonical(item, depth + 1)
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            check_canonical(item, depth + 1)
        return
    raise CanonicalJsonError(f"{type(value).__name__} is not JSON")


#: Keys sorted, no spaces, characters as they are: made once, where
#: ``json.dumps`` with these options makes an encoder per call.
_COMPACT_SORTED = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def compact_sorted_json(value: Any) -> str:
    """``value`` as JSON with its keys sorted and no spaces, unchecked: the
    canonical form when ``check_canonical`` accepts ``value`` (what the
    caller knows, or does not need; floats are encoded as JSON does)."""
    return _COMPACT_SORTED.encode(value)


def canonical_json(value: Any) -> bytes:
    """The canonical JSON encoding of ``value``; :class:`CanonicalJsonError` if none."""
    check_canonical(value)
    return _COMPACT_SORTED.encode(value).encode("utf-8")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class SigningKey:
    """This server's ed25519 key: its version (the part after ``ed25519:``)
    and its 32-byte seed."""

    version: str
    seed: bytes = attr.ib(repr=False)

    @property
    def key_id(self) -> str:
        return f"{ALGORITHM}:{self.version}"

    def _nacl(self) -> NaclSigningKey:
        return NaclSigningKey(self.seed)

    @property
    def verify_key_base64(self) -> str:
        return encode_base64(bytes(self._nacl().verify_key))

    def sign(self, message: bytes) -> str:
        """The unpadded base64 signature of ``message``."""
        return encode_base64(self._nacl().sign(message).signature)

    @classmethod
    def generate(cls) -> SigningKey:
        alphabet = string.ascii_letters + string.digits
        version = "a_" + "".join(secrets.choice(alphabet) for _ in range(4))
        return cls(version, bytes(NaclSigningKey.generate()))

    def to_line(self) -> str:
        return f"{ALGORITHM} {self.version} {encode_base64(self.seed)}\n"

    @classmethod
    def from_line(cls, line: str, where: str) -> SigningKey:
        parts = line.split()
        if len(parts) != 3 or parts[0] != ALGORITHM:
            raise SigningKeyFileError(
                f"{where}: expected one line 'ed25519 <version> <base64 seed>'"
            )
        try:
            seed = decode_base64(parts[2])
        except ValueError:
            raise SigningKeyFileError(f"{where}: the seed is not base64") from None
        if len(seed) != 32:
            raise SigningKeyFileError(f"{where}: the seed must be 32 bytes, not {len(seed)}")
        return cls(parts[1], seed)


def signing_key_path(data_dir: str) -> str:
    return os.path.join(data_dir, SIGNING_KEY_FILE)


def load_or_create_signing_key(data_dir: str, create: bool) -> SigningKey:
    """Read the server's key from ``data_dir``; with ``create`` (the main
    process) make one first if there is none.

    Created atomically, mode 0600: a worker reading at the same moment sees
    either no file or the whole key.
    """
    path = signing_key_path(data_dir)
    if create and not os.path.exists(path):
        os.makedirs(data_dir, exist_ok=True)
        key = SigningKey.generate()
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key.to_line())
        try:
            os.link(tmp, path)  # fails if another process made one meanwhile
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    try:
        with open(path, encoding="ascii") as f:
            return SigningKey.from_line(f.read(), path)
    except FileNotFoundError:
        raise SigningKeyFileError(
            f"{path} does not exist: the main process creates the signing key on its first"
            " start; start it before this worker"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise SigningKeyFileError(f"{path} cannot be read: {e}") from None


def signed_part(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("signatures", "unsigned")}


def sign_json(obj: dict[str, Any], server_name: str, key: SigningKey) -> dict[str, Any]:
    """A copy of ``obj`` with our signature added under ``signatures``."""
    signature = key.sign(canonical_json(signed_part(obj)))
    signatures = {k: dict(v) for k, v in obj.get("signatures", {}).items()}
    signatures.setdefault(server_name, {})[key.key_id] = signature
    return {**obj, "signatures": signatures}


def verify_signature(message: bytes, signature_b64: str, verify_key_b64: str) -> None:
    """Check one signature; :class:`SignatureError` if it does not verify."""
    try:
        signature = decode_base64(signature_b64)
        key = VerifyKey(decode_base64(verify_key_b64))
        key.verify(message, signature)
    except BadSignatureError:
        raise SignatureError("the signature does not verify") from None
    except Exception as e:  # bad base64, wrong key or signature length (nacl's own errors)
        raise SignatureError(f"malformed signature or key: {e}") from None


def verify_signed_json(
    obj: dict[str, Any], server_name: str, key_id: str, verify_key_b64: str
) -> None:
    """Check ``server_name``'s signature with ``key_id`` on ``obj``."""
    signatures = obj.get("signatures")
    if not isinstance(signatures, dict) or not isinstance(signatures.get(server_name), dict):
        raise SignatureError(f"not signed by {server_name}")
    signature = signatures[server_name].get(key_id)
    if not isinstance(signature, str):
        raise SignatureError(f"no signature of {server_name} with {key_id}")
    try:
        message = canonical_json(signed_part(obj))
    except CanonicalJsonError as e:
        raise SignatureError(f"the signed object is not canonical JSON: {e}") from None
    verify_signature(message, signature, verify_key_b64)
