"""Internal-call bodies on the wire: a JSON object of a type's fields, by key.

Every field of a body type declares its kind (:func:`~.kinds.wire`). Decoding
reads each field's key (absent keys are the kind's business: an error, null
or a default), so a malformed body is a 400 naming the field, worded as the
client API words it, and a 413 where content is over the size limit. Keys
the type does not know are ignored, as they were when each body decoded
itself: a process of a newer version may send more. After the fields, a type
may check rules across them in a ``check_decoded()`` method, raising the
same errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.codec.kinds import ABSENT, DecodeContext, FieldKind, wire_fields

T = TypeVar("T")


class ObjectCodec(Generic[T]):
    """The JSON object form of one attrs class (see the module docstring)."""

    def __init__(self, cls: type[T]) -> None:
        self.cls = cls
        fields = wire_fields(cls)
        kindless = [f.name for f in fields if f.kind is None]
        if kindless:
            raise TypeError(f"{cls.__name__}: no kind declared for {', '.join(kindless)}")
        #: ``(attribute, key, kind)`` of every field, in declaration order.
        self.fields: tuple[tuple[str, str, FieldKind], ...] = tuple(
            (f.name, f.key, f.kind) for f in fields if f.kind is not None
        )
        self._check = getattr(cls, "check_decoded", None)
        #: Keys and attributes of a type whose kinds all keep their values.
        self._as_is: tuple[tuple[str, str], ...] | None = None
        if all(kind.encodes_as_is for _, _, kind in self.fields):
            self._as_is = tuple((key, name) for name, key, _ in self.fields)

    def encode(self, value: T) -> dict[str, Any]:
        if self._as_is is not None:
            return {key: getattr(value, name) for key, name in self._as_is}
        return {key: kind.encode(getattr(value, name)) for name, key, kind in self.fields}

    def decode(self, body: Mapping[str, Any], context: DecodeContext) -> T:
        """The instance ``body`` describes, or a :class:`SynapseError`."""
        values: dict[str, Any] = {}
        for name, key, kind in self.fields:
            try:
                values[name] = kind.decode(body.get(key, ABSENT), key, context)
            except SynapseError as e:
                raise _naming(e, key) from None
        try:
            decoded = self.cls(**values)
        except (TypeError, ValueError) as e:  # the class's own attrs validators
            raise SynapseError(400, f"Bad {self.cls.__name__}: {e}", Codes.BAD_JSON) from None
        if self._check is not None:
            self._check(decoded)
        return decoded


def _naming(error: SynapseError, key: str) -> SynapseError:
    """``error``, saying which field it is about if it does not yet."""
    if f"'{key}'" in error.msg:
        return error
    return SynapseError(error.code, f"{error.msg} (field '{key}')", error.errcode, error.additional)


_CODECS: dict[type[Any], ObjectCodec[Any]] = {}


def object_codec(cls: type[T]) -> ObjectCodec[T]:
    """The codec of ``cls``, built on first use."""
    codec = _CODECS.get(cls)
    if codec is None:
        codec = _CODECS.setdefault(cls, ObjectCodec(cls))
    return codec


def encode_object(value: Any) -> dict[str, Any]:
    return object_codec(type(value)).encode(value)


def decode_object(cls: type[T], body: Mapping[str, Any], context: DecodeContext) -> T:
    return object_codec(cls).decode(body, context)


def example_of(cls: type[T], context: DecodeContext) -> T:
    """An instance of ``cls`` made of its fields' examples (valid by
    construction: what the codec's tests round-trip)."""
    codec = object_codec(cls)
    return cls(**{name: kind.example(context) for name, _, kind in codec.fields})


class Nested(FieldKind):
    """A JSON object with the fields of another wire type, ``cls``
    (``not_an_object``: the refusal of anything else)."""

    encodes_as_is = False

    def __init__(self, cls: type[Any], not_an_object: str) -> None:
        self.cls = cls
        self._not_an_object = not_an_object
        self._codec: ObjectCodec[Any] | None = None

    @property
    def codec(self) -> ObjectCodec[Any]:
        # Built on first use: the type may be declared after the kind.
        if self._codec is None:
            self._codec = object_codec(self.cls)
        return self._codec

    def decode(self, value: Any, key: str, context: DecodeContext) -> Any:
        if not isinstance(value, dict):
            raise SynapseError(400, self._not_an_object, Codes.BAD_JSON)
        return self.codec.decode(value, context)

    def encode(self, value: Any) -> Any:
        return self.codec.encode(value)

    def example(self, context: DecodeContext) -> Any:
        return example_of(self.cls, context)
