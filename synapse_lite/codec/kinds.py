"""Field kinds: how one field of a wire type is read from JSON and checked.

A wire type is a frozen attrs class whose fields carry their kind in their
metadata, :func:`wire`: ``user_id: str = attr.ib(metadata=wire(LocalUserId()))``
(plain ``attr.ib``, so mypy and attrs see an ordinary field). A kind's
:meth:`~FieldKind.decode` takes the field's JSON value (:data:`ABSENT` when
an object lacks the key), the field's key (for messages) and the
:class:`DecodeContext`, and returns the value or raises a
:class:`~synapse_lite.api.errors.SynapseError` (a 400 naming the field; 413
for content over the size limit, as the client API answers). The wording of
every refusal comes from ``http/fields.py`` and ``api/identifiers.py``, as
for client requests. :meth:`~FieldKind.encode` gives the JSON value back
(the value itself for most kinds) and :meth:`~FieldKind.example` a valid
value, from which the tests build an instance of every wire type.

Stream rows use the plain type kinds (:class:`OfType`, :class:`Strings`,
:class:`Nullable`), which accept what the rows' attrs validators accepted
before this module existed; internal-call bodies use the stricter ones, with
the limits of the client API.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import attr

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import (
    MAX_ID_LENGTH,
    check_identifier_text,
    check_room_id,
    is_valid_user_id,
)
from synapse_lite.http.fields import (
    MAX_STRING_LENGTH,
    bool_value,
    dict_value,
    int_value,
    list_value,
    str_value,
)


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


#: The JSON value of a key an object does not have.
ABSENT: Final = _Absent()


@attr.s(slots=True, frozen=True, auto_attribs=True)
class DecodeContext:
    """What a kind may need besides the value: this homeserver's name (to
    tell its users from other servers'); None where nothing needs it (rows)."""

    server_name: str | None = None

    def local_server(self) -> str:
        if self.server_name is None:
            raise AssertionError("decoding a local user id needs the server name")
        return self.server_name


def _present(value: Any) -> Any:
    """A value as the ``http/fields.py`` checks take it: absent is None."""
    return None if value is ABSENT else value


class FieldKind:
    """How one field is read, checked and written (see the module docstring)."""

    #: False when :meth:`encode` may change a value (codecs skip the call
    #: for a type whose kinds all keep their values).
    encodes_as_is: bool = True

    #: When all :meth:`decode` does is check that a value has one of these
    #: types and return it as it is: the types (codecs then check with one
    #: ``isinstance`` and call :meth:`decode` only to explain a refusal).
    #: None: :meth:`decode` must be called.
    plain_types: tuple[type[Any], ...] | None = None

    def decode(self, value: Any, key: str, context: DecodeContext) -> Any:
        raise NotImplementedError

    def encode(self, value: Any) -> Any:
        return value

    def example(self, context: DecodeContext) -> Any:
        """A valid value (as decoded)."""
        raise NotImplementedError


_KIND = "synapse_lite.codec.kind"
_KEY = "synapse_lite.codec.key"


def wire(kind: FieldKind, *, key: str | None = None) -> dict[str, Any]:
    """The metadata of an attrs field of ``kind``, on the wire under ``key``
    (default: the field's name)."""
    return {_KIND: kind, _KEY: key}


@attr.s(slots=True, frozen=True, auto_attribs=True)
class WireField:
    """One field of a wire type: its attribute, its key and its kind (None:
    declared without one, any JSON value, checked only by the class's own
    attrs validators)."""

    name: str
    key: str
    kind: FieldKind | None


def wire_fields(cls: type[Any]) -> tuple[WireField, ...]:
    """The fields of the attrs class ``cls``, in declaration order."""
    return tuple(
        WireField(a.name, a.metadata.get(_KEY) or a.name, a.metadata.get(_KIND))
        for a in attr.fields(cls)
    )


# Plain types (stream rows).


class OfType(FieldKind):
    """A value of one of ``types`` (as ``isinstance``: a bool is an int)."""

    def __init__(self, *types: type[Any]) -> None:
        self._types = types
        self._names = " or ".join(t.__name__ for t in types)
        self.plain_types = types

    def decode(self, value: Any, key: str, context: DecodeContext) -> Any:
        if not isinstance(value, self._types):
            if value is ABSENT:
                raise SynapseError(400, f"Missing '{key}'", Codes.MISSING_PARAM)
            raise SynapseError(
                400,
                f"'{key}' must be of type {self._names}, not {type(value).__name__}",
                Codes.BAD_JSON,
            )
        return value

    def example(self, context: DecodeContext) -> Any:
        return {str: "text", int: 1, bool: True, dict: {"k": "v"}, list: ["v"]}[self._types[0]]


class Strings(FieldKind):
    """A list of strings."""

    def decode(self, value: Any, key: str, context: DecodeContext) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise SynapseError(400, f"'{key}' must be a list of strings", Codes.BAD_JSON)
        return value

    def example(self, context: DecodeContext) -> list[str]:
        return ["one", "two"]


class Nullable(FieldKind):
    """``kind``, or null (an absent key, in an object, is null too)."""

    def __init__(self, kind: FieldKind) -> None:
        self.kind = kind
        self.encodes_as_is = kind.encodes_as_is
        if kind.plain_types is not None:
            self.plain_types = (*kind.plain_types, type(None))

    def decode(self, value: Any, key: str, context: DecodeContext) -> Any:
        if value is None or value is ABSENT:
            return None
        return self.kind.decode(value, key, context)

    def encode(self, value: Any) -> Any:
        return None if value is None else self.kind.encode(value)

    def example(self, context: DecodeContext) -> Any:
        return self.kind.example(context)


# The client API's limits (internal-call bodies).


class Str(FieldKind):
    """A string of at most ``max_length`` characters, without NUL."""

    def __init__(self, max_length: int = MAX_STRING_LENGTH) -> None:
        self._max_length = max_length

    def decode(self, value: Any, key: str, context: DecodeContext) -> str:
        return str_value(_present(value), key, self._max_length)

    def example(self, context: DecodeContext) -> str:
        return "text"


class Int(FieldKind):
    """An integer in ``[minimum, maximum]`` (a bool is not one)."""

    def __init__(self, minimum: int = 0, maximum: int = 2**62) -> None:
        self._minimum = minimum
        self._maximum = maximum

    def decode(self, value: Any, key: str, context: DecodeContext) -> int:
        return int_value(_present(value), key, self._minimum, self._maximum)

    def example(self, context: DecodeContext) -> int:
        return max(self._minimum, min(7, self._maximum))


class Bool(FieldKind):
    """true or false; ``default`` when the key is absent (null is refused)."""

    def __init__(self, default: bool) -> None:
        self._default = default

    def decode(self, value: Any, key: str, context: DecodeContext) -> bool:
        return bool_value(self._default if value is ABSENT else value, key)

    def example(self, context: DecodeContext) -> bool:
        return not self._default


class JsonObject(FieldKind):
    """A JSON object, then ``check(value, context)`` (sizes, shapes)."""

    def __init__(
        self,
        check: Callable[[dict[str, Any], DecodeContext], None] | None = None,
        example: dict[str, Any] | None = None,
    ) -> None:
        self._check = check
        self._example = example or {}

    def decode(self, value: Any, key: str, context: DecodeContext) -> dict[str, Any]:
        value = dict_value(_present(value), key)
        if self._check is not None:
            self._check(value, context)
        return value

    def example(self, context: DecodeContext) -> dict[str, Any]:
        return self._example


class Identifier(FieldKind):
    """An event type, state key, transaction or device id: a string of at
    most ``max_length`` UTF-8 bytes without NUL."""

    def __init__(self, max_length: int = MAX_ID_LENGTH) -> None:
        self._max_length = max_length

    def decode(self, value: Any, key: str, context: DecodeContext) -> str:
        return check_identifier_text(_present(value), key, max_length=self._max_length)

    def example(self, context: DecodeContext) -> str:
        return "m.example"


class RoomId(FieldKind):
    def decode(self, value: Any, key: str, context: DecodeContext) -> str:
        return check_room_id(str_value(_present(value), key))

    def example(self, context: DecodeContext) -> str:
        return f"!room:{context.server_name or 'example.org'}"


def is_local_user(user_id: object, server_name: str) -> bool:
    return is_valid_user_id(user_id) and str(user_id).endswith(":" + server_name)


class LocalUserId(FieldKind):
    """A user id of this homeserver."""

    def decode(self, value: Any, key: str, context: DecodeContext) -> str:
        user_id = str_value(_present(value), key)
        if not is_local_user(user_id, context.local_server()):
            raise SynapseError(400, f"'{key}' must be a local user id", Codes.BAD_JSON)
        return user_id

    def example(self, context: DecodeContext) -> str:
        return f"@alice:{context.local_server()}"


class UserId(FieldKind):
    """A user id of any homeserver (a remote user's typing or receipt that
    another server sent us, checked by the federation handler)."""

    def decode(self, value: Any, key: str, context: DecodeContext) -> str:
        user_id = str_value(_present(value), key)
        if not is_valid_user_id(user_id):
            raise SynapseError(400, f"'{key}' must be a user id", Codes.BAD_JSON)
        return user_id

    def example(self, context: DecodeContext) -> str:
        return "@carol:remote.example"


class Checked(FieldKind):
    """``kind``, then ``check(value, context)``, which raises on a refusal
    (``example``: a value the check takes, when ``kind``'s would not be)."""

    def __init__(
        self,
        kind: FieldKind,
        check: Callable[[Any, DecodeContext], None],
        example: Any = None,
    ) -> None:
        self.kind = kind
        self._check = check
        self._example = example
        self.encodes_as_is = kind.encodes_as_is

    def decode(self, value: Any, key: str, context: DecodeContext) -> Any:
        value = self.kind.decode(value, key, context)
        self._check(value, context)
        return value

    def encode(self, value: Any) -> Any:
        return self.kind.encode(value)

    def example(self, context: DecodeContext) -> Any:
        return self.kind.example(context) if self._example is None else self._example


class Custom(FieldKind):
    """A shape of its own: ``decode(value, context)`` (None for an absent
    key, unless ``required``: then an absent key is missing) returns the
    value or raises; ``encode`` gives its JSON form; ``example`` is a valid
    value, given the context."""

    def __init__(
        self,
        decode: Callable[[Any, DecodeContext], Any],
        example: Callable[[DecodeContext], Any],
        encode: Callable[[Any], Any] | None = None,
        required: bool = False,
    ) -> None:
        self._decode = decode
        self._example = example
        self._encode = encode
        self._required = required
        self.encodes_as_is = encode is None

    def decode(self, value: Any, key: str, context: DecodeContext) -> Any:
        if value is ABSENT and self._required:
            raise SynapseError(400, f"Missing '{key}'", Codes.MISSING_PARAM)
        return self._decode(_present(value), context)

    def encode(self, value: Any) -> Any:
        return value if self._encode is None else self._encode(value)

    def example(self, context: DecodeContext) -> Any:
        return self._example(context)


class ListOf(FieldKind):
    """A JSON array of ``min_items`` to ``max_items`` values of ``kind``
    (``what`` they are, for the message)."""

    def __init__(self, kind: FieldKind, min_items: int, max_items: int, what: str) -> None:
        self.kind = kind
        self._min_items = min_items
        self._max_items = max_items
        self._what = what
        self.encodes_as_is = kind.encodes_as_is

    def decode(self, value: Any, key: str, context: DecodeContext) -> list[Any]:
        items = list_value(_present(value), key)
        if not self._min_items <= len(items) <= self._max_items:
            raise SynapseError(
                400,
                f"'{key}' must hold {self._min_items} to {self._max_items} {self._what}",
                Codes.BAD_JSON,
            )
        return [self.kind.decode(item, key, context) for item in items]

    def encode(self, value: Any) -> Any:
        if self.encodes_as_is:
            return value
        return [self.kind.encode(item) for item in value]

    def example(self, context: DecodeContext) -> list[Any]:
        return [self.kind.example(context) for _ in range(max(self._min_items, 2))]
