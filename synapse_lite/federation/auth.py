"""The ``X-Matrix`` Authorization header of server-to-server requests.

``Authorization: X-Matrix origin="a.example",destination="b.example",
key="ed25519:v1",sig="<base64>"`` where the signature is the origin's, over the
canonical JSON of ``{method, uri, origin, destination[, content]}`` (``uri`` is
the path with its query string, as sent).
"""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.federation.crypto import SigningKey, canonical_json

SCHEME = "X-Matrix"
#: Longest header we bother to parse (a real one is a few hundred bytes).
MAX_HEADER_LENGTH = 4096


class AuthHeaderError(ValueError):
    """The Authorization header is missing or not a well-formed X-Matrix one."""


@attr.s(slots=True, frozen=True, auto_attribs=True)
class XMatrixAuth:
    """One parsed X-Matrix header."""

    origin: str
    key_id: str
    signature: str
    destination: str | None = None

    def to_header(self) -> str:
        params = [("origin", self.origin)]
        if self.destination is not None:
            params.append(("destination", self.destination))
        params += [("key", self.key_id), ("sig", self.signature)]
        return SCHEME + " " + ",".join(f'{k}="{_quote(v)}"' for k, v in params)


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def request_json(
    method: str, uri: str, origin: str, destination: str, content: Any = None
) -> dict[str, Any]:
    """The object whose canonical JSON a request signature covers."""
    obj: dict[str, Any] = {
        "method": method,
        "uri": uri,
        "origin": origin,
        "destination": destination,
    }
    if content is not None:
        obj["content"] = content
    return obj


def sign_request(
    key: SigningKey, origin: str, destination: str, method: str, uri: str, content: Any = None
) -> str:
    """The Authorization header value for a request we send."""
    message = canonical_json(request_json(method, uri, origin, destination, content))
    return XMatrixAuth(origin, key.key_id, key.sign(message), destination).to_header()


def _split_params(text: str) -> list[tuple[str, str]]:
    """``k=v,k="v, with \\"quotes\\""`` -> pairs; values may be quoted or bare."""
    pairs: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t,":
            i += 1
        if i >= n:
            break
        eq = text.find("=", i)
        if eq < 0:
            raise AuthHeaderError(f"parameter without '=' at {text[i : i + 20]!r}")
        name = text[i:eq].strip().lower()
        i = eq + 1
        while i < n and text[i] in " \t":
            i += 1
        if i < n and text[i] == '"':
            i += 1
            value = []
            while True:
                if i >= n:
                    raise AuthHeaderError("unterminated quoted value")
                c = text[i]
                if c == "\\" and i + 1 < n:
                    value.append(text[i + 1])
                    i += 2
                elif c == '"':
                    i += 1
                    break
                else:
                    value.append(c)
                    i += 1
            pairs.append((name, "".join(value)))
            while i < n and text[i] in " \t":
                i += 1
            if i < n and text[i] != ",":
                raise AuthHeaderError("expected ',' after a quoted value")
        else:
            end = text.find(",", i)
            end = n if end < 0 else end
            pairs.append((name, text[i:end].strip()))
            i = end
    return pairs


def parse_auth_header(header: bytes | str) -> XMatrixAuth:
    """Parse one Authorization header; :class:`AuthHeaderError` if it is not X-Matrix."""
    if isinstance(header, bytes):
        try:
            header = header.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthHeaderError("the header is not UTF-8") from None
    if len(header) > MAX_HEADER_LENGTH:
        raise AuthHeaderError("the header is too long")
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != SCHEME.lower():
        raise AuthHeaderError(f"not an {SCHEME} header")
    params: dict[str, str] = {}
    for name, value in _split_params(rest):
        if name in params:
            raise AuthHeaderError(f"parameter {name!r} given twice")
        params[name] = value
    missing = [p for p in ("origin", "key", "sig") if not params.get(p)]
    if missing:
        raise AuthHeaderError(f"missing {', '.join(missing)}")
    return XMatrixAuth(params["origin"], params["key"], params["sig"], params.get("destination"))
