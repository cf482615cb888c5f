"""Stream rows on the wire: the JSON list of a row's fields, in declaration order."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from synapse_lite.api.errors import SynapseError
from synapse_lite.codec.kinds import DecodeContext, FieldKind, wire_fields

RowT = TypeVar("RowT")

#: Rows carry no local ids: nothing to tell apart.
_ROW_CONTEXT = DecodeContext()


class InvalidRow(ValueError):
    """A row received over replication does not fit the stream's row type."""


class RowCodec(Generic[RowT]):
    """How rows of one type travel: the wire form is the JSON list of the
    row's fields, in declaration order, each checked by its kind (and by
    any attrs validators of the class)."""

    def __init__(self, row_type: type[RowT]) -> None:
        self.row_type = row_type
        fields = wire_fields(row_type)
        self._names = tuple(f.name for f in fields)
        #: ``(position, key, kind)`` of each field declared with a kind.
        self._checks: tuple[tuple[int, str, FieldKind], ...] = tuple(
            (i, f.key, f.kind) for i, f in enumerate(fields) if f.kind is not None
        )
        if not all(kind.encodes_as_is for _, _, kind in self._checks):
            raise ValueError(f"{row_type.__name__}: a row's fields travel as they are")
        #: The types each field may have, when its kind (if any) checks no
        #: more than that (None: each kind decodes). A follower decodes every
        #: row it receives: one ``isinstance`` per field, not a call (issue 35).
        plain = [object if f.kind is None else f.kind.plain_types for f in fields]
        self._plain_types: tuple[Any, ...] | None = (
            None if any(types is None for types in plain) else tuple(plain)
        )

    @property
    def row_types(self) -> list[type[Any]]:
        return [self.row_type]

    def encode(self, row: RowT) -> list[Any]:
        return [getattr(row, name) for name in self._names]

    def decode(self, wire: Any, stream_name: str) -> RowT:
        """The row from its wire form; :class:`InvalidRow` if it does not fit."""
        if not isinstance(wire, list):
            raise InvalidRow(f"a {stream_name} row must be a JSON list, not {type(wire).__name__}")
        if len(wire) != len(self._names):
            raise InvalidRow(f"a {stream_name} row has {len(self._names)} fields, not {len(wire)}")
        plain = self._plain_types
        if plain is None or not all(map(isinstance, wire, plain)):
            self._check_kinds(wire, stream_name)
        try:
            return self.row_type(*wire)
        except (TypeError, ValueError) as e:
            raise InvalidRow(f"bad {stream_name} row: {e}") from None

    def _check_kinds(self, wire: list[Any], stream_name: str) -> None:
        """Each field's kind decodes it: :class:`InvalidRow` for the first
        that does not fit."""
        for index, key, kind in self._checks:
            try:
                kind.decode(wire[index], key, _ROW_CONTEXT)
            except SynapseError as e:
                raise InvalidRow(f"bad {stream_name} row: {e.msg}") from None


class TaggedRowCodec(RowCodec[Any]):
    """Rows of several types on one stream: ``[tag, [fields...]]`` on the wire,
    the tag being the type's ``TypeId``."""

    def __init__(self, row_types: Iterable[type[Any]]) -> None:
        self._codecs: dict[str, RowCodec[Any]] = {t.TypeId: RowCodec(t) for t in row_types}
        self._tags: dict[type[Any], str] = {c.row_type: tag for tag, c in self._codecs.items()}

    @property
    def row_types(self) -> list[type[Any]]:
        return list(self._tags)

    def encode(self, row: Any) -> list[Any]:
        tag = self._tags[type(row)]
        return [tag, self._codecs[tag].encode(row)]

    def decode(self, wire: Any, stream_name: str) -> Any:
        if not isinstance(wire, list) or len(wire) != 2 or not isinstance(wire[0], str):
            raise InvalidRow(f"a {stream_name} row must be [type, [fields...]]")
        codec = self._codecs.get(wire[0])
        if codec is None:
            raise InvalidRow(f"unknown {stream_name} row type {wire[0]!r}")
        return codec.decode(wire[1], stream_name)
