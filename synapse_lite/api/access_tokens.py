"""The form of access tokens: ``syl_<localpart>.<random>``.

The random part (32 bytes, URL-safe base64) is what makes a token a secret;
only its SHA-256 is stored. The user's localpart, URL-safe base64 without
padding, is there in the clear so that a proxy can send one user's requests to
one process without a database lookup (``docs/routing.md``): the router, and
the nginx and haproxy configurations ``synapse-lite routes`` writes, hash it.
It is a hint for routing only; a request is authenticated by the whole token.
Tokens issued before this form (``syl_<random>``) keep working; proxies then
hash the whole token, which keeps each device on one process.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets

PREFIX = "syl_"
#: The localpart field: URL-safe base64 without padding, then a dot.
_LOCALPART = re.compile(r"syl_([A-Za-z0-9_-]{1,255})\.")
#: The same, for proxies' regular expressions (PCRE).
LOCALPART_PATTERN = r"syl_([A-Za-z0-9_-]+)\."


def generate_access_token(user_id: str) -> str:
    """A new token for ``user_id`` (``@localpart:server``)."""
    localpart = user_id[1:].split(":", 1)[0]
    encoded = base64.urlsafe_b64encode(localpart.encode("utf-8")).rstrip(b"=").decode("ascii")
    return f"{PREFIX}{encoded}.{secrets.token_urlsafe(32)}"


def localpart_of_token(token: str) -> str | None:
    """The localpart a token names, or None (an older token, or not ours)."""
    match = _LOCALPART.match(token)
    if match is None:
        return None
    encoded = match.group(1)
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
