"""The stream definitions: consistent with each other, with the wire, with
/sync tokens, with the config and with the table in docs/workers.md."""

from __future__ import annotations

import os
import re
from typing import Any

import attr
from twisted.trial import unittest

from synapse_lite.codec.kinds import DecodeContext, wire_fields
from synapse_lite.codec.rows import InvalidRow, RowCodec, TaggedRowCodec
from synapse_lite.config.homeserver import read_homeserver_config
from synapse_lite.config.validation import ConfigError
from synapse_lite.streams import catalog
from synapse_lite.streams.catalog import BUILTIN_STREAMS
from synapse_lite.streams.definition import (
    CatchUp,
    Reader,
    StreamCatalog,
    StreamDefinition,
    WriterRule,
)
from synapse_lite.tokens import FIRST_TOKEN_POSITIONS

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "workers.md")

#: One row of each row type, as a writer would build it.
SAMPLE_ROWS: dict[str, list[Any]] = {
    "events": [
        catalog.EventsStreamEventRow(
            "$e", "!r:x", "m.room.member", "@u:x", None, None, "join", False, False, True
        ),
        catalog.EventsStreamCurrentStateRow("!r:x", "m.room.member", "@u:x", "$e"),
    ],
    "presence": [catalog.PresenceStreamRow("@u:x", "online", 1, 0, 2, None, True)],
    "typing": [catalog.TypingStreamRow("!r:x", ["@u:x"])],
    "receipts": [catalog.ReceiptsStreamRow("!r:x", "m.read", "@u:x", "$e", None, {"ts": 1})],
    "account_data": [catalog.AccountDataStreamRow("@u:x", None, "m.direct")],
    "to_device": [catalog.ToDeviceStreamRow("@u:x")],
    "device_lists": [catalog.DeviceListsStreamRow("@u:x", "DEV")],
    "backfill": [catalog.BackfillStreamRow("$e", "!r:x", "m.room.message", None, None, None)],
    "caches": [catalog.CachesStreamRow("get_user_by_access_token", ["abc"], 5)],
    "federation": [catalog.FederationStreamRow("device_messages", {"destination": "b"})],
    "push_rules": [catalog.PushRulesStreamRow("@u:x")],
    "pushers": [catalog.PushersStreamRow("@u:x", "org.app", "key", False)],
}


class CatalogTestCase(unittest.TestCase):
    def test_every_stream_is_complete(self) -> None:
        for definition in BUILTIN_STREAMS:
            with self.subTest(definition.name):
                if definition.ids is not None:
                    self.assertEqual(definition.catch_up, CatchUp.DATABASE)
                    self.assertIsNotNone(definition.rows_from_store)
                    self.assertTrue(definition.ids.tables)
                else:
                    self.assertEqual(definition.catch_up, CatchUp.WRITER_MEMORY)
                    self.assertFalse(definition.keeps_positions)
                self.assertRegex(definition.name, r"^[a-z_]+$")  # a word on the wire
                self.assertTrue(definition.description)

    def test_rows_round_trip_through_the_wire_form(self) -> None:
        self.assertEqual(set(SAMPLE_ROWS), set(BUILTIN_STREAMS.names()))
        for name, rows in SAMPLE_ROWS.items():
            definition = BUILTIN_STREAMS[name]
            for row in rows:
                wire = definition.encode_row(row)
                self.assertIsInstance(wire, list)
                self.assertEqual(definition.parse_row(wire), row, name)

    def test_every_row_field_declares_its_kind(self) -> None:
        """Rows travel by the same field kinds as internal-call bodies; a
        value of another JSON type is refused naming the field, or is one
        the kind takes (null for an optional field; a bool is an int). The
        codec's check by types alone accepts exactly what the kinds do."""
        for name, rows in SAMPLE_ROWS.items():
            definition = BUILTIN_STREAMS[name]
            self.assertEqual(
                sorted(t.__name__ for t in definition.codec.row_types),
                sorted({type(r).__name__ for r in rows}),
            )
            for row in rows:
                wire = definition.encode_row(row)
                fields = wire[1] if isinstance(definition.codec, TaggedRowCodec) else wire
                for index, declared in enumerate(wire_fields(type(row))):
                    self.assertIsNotNone(declared.kind, f"{name}: {declared.name}")
                    refused = 0
                    for value in (None, True, 3, "text", ["x"], {"k": 1}):
                        changed = list(fields)
                        changed[index] = value
                        wrong = [wire[0], changed] if fields is not wire else changed
                        try:
                            definition.parse_row(wrong)
                        except InvalidRow as e:
                            self.assertIn(f"'{declared.key}'", str(e))
                            refused += 1
                        else:
                            # Accepted: the kind itself takes it too.
                            assert declared.kind is not None
                            declared.kind.decode(value, declared.key, DecodeContext())
                    self.assertGreater(refused, 0, f"{name}: {declared.name} takes anything")

    def test_rows_that_do_not_fit_are_refused_with_the_reason(self) -> None:
        receipts = BUILTIN_STREAMS["receipts"]
        for wire, reason in [
            ({"room_id": "!r"}, "must be a JSON list"),
            (["!r:x", "m.read"], "has 6 fields, not 2"),
            (["!r:x", "m.read", "@u:x", "$e", None, "not a dict"], "bad receipts row"),
        ]:
            with self.assertRaises(InvalidRow) as cm:
                receipts.parse_row(wire)
            self.assertIn(reason, str(cm.exception))
        events = BUILTIN_STREAMS["events"]
        with self.assertRaises(InvalidRow) as cm:
            events.parse_row(["nope", []])
        self.assertIn("unknown events row type 'nope'", str(cm.exception))

    def test_token_order_keeps_the_tokens_already_handed_out(self) -> None:
        """The first positions of a token are those every token ever handed
        out has; new streams may only be appended."""
        names = BUILTIN_STREAMS.sync_token_streams()
        self.assertEqual(names[0], "events")
        self.assertEqual(
            names[1 : 1 + FIRST_TOKEN_POSITIONS],
            ["presence", "typing", "receipts", "account_data", "to_device", "device_lists"],
        )

    def test_writer_keys(self) -> None:
        self.assertEqual(
            BUILTIN_STREAMS.writer_keys(),
            {
                "events": True,
                "presence": False,
                "typing": False,
                "receipts": False,
                "account_data": False,
                "to_device": False,
                "device_lists": True,
                "push_rules": False,
                "pushers": False,
            },
        )

    def test_two_streams_of_one_name_are_refused(self) -> None:
        with self.assertRaises(ValueError):
            BUILTIN_STREAMS.with_streams(BUILTIN_STREAMS["typing"])

    def test_config_accepts_writers_of_added_streams_only(self) -> None:
        @attr.s(frozen=True, slots=True, auto_attribs=True)
        class Row:
            x: str

        extra = StreamDefinition(
            name="extra", description="x", codec=RowCodec(Row), writers=WriterRule("extra")
        )
        data = {
            "server_name": "test.local",
            "worker_replication_secret": "s",
            "listeners": [{"port": 1, "resources": ["client", "replication"]}],
            "workers": {"w1": {"listeners": [{"port": 2, "resources": ["replication"]}]}},
            "stream_writers": {"extra": "w1"},
        }
        config = read_homeserver_config(
            data, "/tmp/x.yaml", StreamCatalog([*BUILTIN_STREAMS, extra])
        )
        self.assertEqual(config.writers.writers("extra"), ("w1",))
        self.assertEqual(config.writers.streams_written_by("w1"), ["caches", "extra"])
        with self.assertRaises(ConfigError) as cm:
            read_homeserver_config(data, "/tmp/x.yaml")
        self.assertIn("extra", str(cm.exception))

    def test_docs_table_matches_the_definitions(self) -> None:
        with open(DOCS, encoding="utf-8") as f:
            text = f.read()
        section = text.split("## Every stream and who writes it", 1)[1].split("\n## ", 1)[0]
        rows = [
            [cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in section.splitlines()
            if re.match(r"^\| `", line)
        ]
        expected = [
            [
                f"`{d.name}`",
                d.description,
                d.writers.describe(),
                "yes" if d.keeps_positions else "no",
                d.catch_up.value,
                "yes" if d.in_sync_token else "no",
            ]
            for d in BUILTIN_STREAMS
        ]
        self.assertEqual(rows, expected)


class SubscriptionsTestCase(unittest.TestCase):
    """Which streams each part of a process reads (``StreamDefinition.read_by``)."""

    def test_docs_table_matches_the_catalog(self) -> None:
        with open(DOCS, encoding="utf-8") as f:
            text = f.read()
        section = text.split("## Subscriptions by role", 1)[1].split("\n## ", 1)[0]
        table = [line for line in section.splitlines() if line.startswith("|")]
        self.assertEqual(table, BUILTIN_STREAMS.subscriptions_table())

    def test_the_media_worker_and_the_router_read_no_events(self) -> None:
        for reader in (Reader.MEDIA, Reader.ROUTER):
            self.assertEqual(BUILTIN_STREAMS.read_by([reader]), ["caches"])

    def test_every_part_reads_the_caches_stream(self) -> None:
        # Access tokens, deactivations and writer retirements travel on it.
        for reader in Reader:
            self.assertIn("caches", BUILTIN_STREAMS.read_by([reader]))

    def test_every_stream_has_a_reader_beside_the_main_process(self) -> None:
        for definition in BUILTIN_STREAMS:
            self.assertTrue(definition.read_by, definition.name)
