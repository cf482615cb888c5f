"""Replication commands: exact wire forms, round trips, and strict parsing.

Every command is parsed from and printed to the forms of the reference's wire
table; every malformed line raises CommandParseError and nothing else.
"""

from __future__ import annotations

import string
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial import unittest

from synapse_lite.replication.tcp.commands import (
    COMMAND_MAP,
    INTERNAL_ERROR_PREFIX,
    MAX_JSON_DEPTH,
    MAX_LINE_LENGTH,
    AuthCommand,
    CheckedCommand,
    ClearUserSyncCommand,
    Command,
    CommandEncodeError,
    CommandParseError,
    ErrorCommand,
    FederationAckCommand,
    NameCommand,
    PingCommand,
    PositionCommand,
    RdataCommand,
    RemoteServerUpCommand,
    ReplicateCommand,
    ServerCommand,
    SubscribeCommand,
    UserIpCommand,
    UserSyncCommand,
    command_line,
    parse_command_from_line,
)

# -- the reference's examples --------------------------------------------------------


class ReferenceExamplesTestCase(unittest.TestCase):
    def test_parse_one_word_command(self) -> None:
        cmd = parse_command_from_line("REPLICATE")
        self.assertIsInstance(cmd, ReplicateCommand)

    def test_parse_rdata(self) -> None:
        line = (
            'RDATA events master 6287863 ["ev", ["$eventid:example.com",'
            ' "!roomid:example.com", "m.room.message", null, null, null]]'
        )
        cmd = parse_command_from_line(line)
        assert isinstance(cmd, RdataCommand)
        self.assertEqual(cmd.stream_name, "events")
        self.assertEqual(cmd.instance_name, "master")
        self.assertEqual(cmd.token, 6287863)
        self.assertEqual(
            cmd.row,
            [
                "ev",
                [
                    "$eventid:example.com",
                    "!roomid:example.com",
                    "m.room.message",
                    None,
                    None,
                    None,
                ],
            ],
        )

    def test_parse_rdata_batch(self) -> None:
        line = 'RDATA presence master batch ["@foo:example.com", "online"]'
        cmd = parse_command_from_line(line)
        assert isinstance(cmd, RdataCommand)
        self.assertEqual(cmd.stream_name, "presence")
        self.assertEqual(cmd.instance_name, "master")
        self.assertIsNone(cmd.token)
        self.assertEqual(cmd.row, ["@foo:example.com", "online"])


# -- exact wire forms ----------------------------------------------------------------

# Each command, and the one line that stands for it.
WIRE_FORMS: list[tuple[Command, str]] = [
    (ServerCommand("example.com"), "SERVER example.com"),
    (NameCommand("worker1"), "NAME worker1"),
    (ServerCommand("example.com", "a1b2"), "SERVER example.com @a1b2"),
    (NameCommand("worker1", "a1b2"), "NAME worker1 @a1b2"),
    (AuthCommand("s3cret with spaces"), "AUTH s3cret with spaces"),
    (ReplicateCommand(), "REPLICATE"),
    (SubscribeCommand(("events", "caches")), "SUBSCRIBE events caches"),
    (SubscribeCommand(()), "SUBSCRIBE"),
    (
        RdataCommand("events", "master", 12, ["ev", [1, "a b"]]),
        'RDATA events master 12 ["ev",[1,"a b"]]',
    ),
    (RdataCommand("caches", "w1", None, []), "RDATA caches w1 batch []"),
    (PositionCommand("events", "persister1", 5, 9), "POSITION events persister1 5 9"),
    (PositionCommand("backfill", "master", -7, -3), "POSITION backfill master -7 -3"),
    (ErrorCommand("ping timeout"), "ERROR ping timeout"),
    (PingCommand("1700000000000"), "PING 1700000000000"),
    (PingCommand(""), "PING"),
    (
        UserSyncCommand("inst1", "@u:example.com", "DEV", True, 1234),
        "USER_SYNC inst1 @u:example.com DEV start 1234",
    ),
    (
        UserSyncCommand("inst1", "@u:example.com", None, False, 1234),
        "USER_SYNC inst1 @u:example.com None end 1234",
    ),
    (ClearUserSyncCommand("inst1"), "CLEAR_USER_SYNC inst1"),
    (CheckedCommand("events", 1234, "k3Yid0", "c2ln+/"), "CHECKED events 1234 k3Yid0 c2ln+/"),
    (FederationAckCommand("fed_sender1", 42), "FEDERATION_ACK fed_sender1 42"),
    (
        UserIpCommand("@u:example.com", "tok", "1.2.3.4", "Mozilla/5.0 (X11)", "DEV", 99),
        'USER_IP @u:example.com ["tok","1.2.3.4","Mozilla/5.0 (X11)","DEV",99]',
    ),
    (
        UserIpCommand("@u:example.com", "tok", "::1", "", None, 0),
        'USER_IP @u:example.com ["tok","::1","",null,0]',
    ),
    (RemoteServerUpCommand("other.example.org"), "REMOTE_SERVER_UP other.example.org"),
]


class WireFormTestCase(unittest.TestCase):
    def test_every_command_has_a_wire_form_here(self) -> None:
        self.assertEqual({type(cmd) for cmd, _ in WIRE_FORMS}, set(COMMAND_MAP.values()))

    def test_print(self) -> None:
        for cmd, line in WIRE_FORMS:
            self.assertEqual(command_line(cmd), line)

    def test_parse(self) -> None:
        for cmd, line in WIRE_FORMS:
            self.assertEqual(parse_command_from_line(line), cmd)

    def test_from_line_and_to_line_are_inverse(self) -> None:
        for cmd, _ in WIRE_FORMS:
            self.assertEqual(type(cmd).from_line(cmd.to_line()), cmd)

    def test_secret_not_in_repr(self) -> None:
        self.assertNotIn("s3cret", repr(AuthCommand("s3cret")))

    def test_json_spaces_and_unicode(self) -> None:
        cmd = parse_command_from_line('RDATA s w 1 [ "é" , {"k" : [ 1 ,2]} , "\\u00e9"]')
        assert isinstance(cmd, RdataCommand)
        self.assertEqual(cmd.row, ["é", {"k": [1, 2]}, "é"])
        # Printed compact, UTF-8 as is.
        self.assertEqual(command_line(cmd), 'RDATA s w 1 ["é",{"k":[1,2]},"é"]')


# -- round trips of generated commands -------------------------------------------------

names = st.text(
    alphabet=st.characters(blacklist_categories=("Zs", "Zl", "Zp", "Cc", "Cs")),
    min_size=1,
    max_size=20,
).filter(lambda s: not any(c.isspace() for c in s))
int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)
free_text = st.text(max_size=40).filter(lambda s: "\n" not in s)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=15,
)

commands: st.SearchStrategy[Command] = st.one_of(
    st.builds(ServerCommand, names),
    st.builds(NameCommand, names),
    st.builds(AuthCommand, free_text.filter(bool)),
    st.just(ReplicateCommand()),
    st.builds(SubscribeCommand, st.lists(names, max_size=5).map(tuple)),
    st.builds(RdataCommand, names, names, st.none() | int64s, st.lists(json_values, max_size=5)),
    st.builds(PositionCommand, names, names, int64s, int64s),
    st.builds(ErrorCommand, free_text),
    st.builds(PingCommand, free_text),
    st.builds(
        UserSyncCommand,
        names,
        names,
        st.none() | names.filter(lambda s: s != "None"),
        st.booleans(),
        int64s,
    ),
    st.builds(ClearUserSyncCommand, names),
    st.builds(FederationAckCommand, names, int64s),
    st.builds(UserIpCommand, names, st.text(), st.text(), st.text(), st.none() | st.text(), int64s),
    st.builds(RemoteServerUpCommand, names),
    st.builds(CheckedCommand, names, int64s, names, names),
)


class RoundTripPropertyTestCase(unittest.TestCase):
    @settings(max_examples=300, deadline=None)
    @given(commands)
    def test_round_trip(self, cmd: Command) -> None:
        line = command_line(cmd)
        self.assertNotIn("\n", line)
        self.assertLessEqual(len(line.encode("utf-8")), MAX_LINE_LENGTH)
        self.assertEqual(parse_command_from_line(line), cmd)
        self.assertEqual(type(cmd).from_line(cmd.to_line()), cmd)


# -- strict parsing ------------------------------------------------------------------

MALFORMED_LINES = [
    # framing and names
    "",
    " ",
    "REPLICATE ",
    "PING ",
    "ERROR ",
    " REPLICATE",
    "replicate",
    "NOPE",
    "REPLICATE now",
    "PING a\nb",
    "SERVER",
    "SERVER ",
    "SERVER two words",
    "SERVER tab\there",
    "NAME ",
    "NAME a\x00b",
    "AUTH",
    "AUTH ",
    "REMOTE_SERVER_UP ",
    "CLEAR_USER_SYNC a b",
    "SUBSCRIBE ",
    "SUBSCRIBE events  caches",
    "SUBSCRIBE events\x00",
    # RDATA
    "RDATA",
    "RDATA events",
    "RDATA events master",
    "RDATA events master 1",
    "RDATA  master 1 []",
    "RDATA events  1 []",
    "RDATA events master  []",
    "RDATA events master 1e3 []",
    "RDATA events master +5 []",
    "RDATA events master 0x10 []",
    "RDATA events master 007 []",
    "RDATA events master -0 []",
    "RDATA events master 1.0 []",
    "RDATA events master ١٢ []",  # Arabic-Indic digits: int() takes them, we do not
    "RDATA events master 1_000 []",
    "RDATA events master 9223372036854775808 []",
    "RDATA events master -9223372036854775809 []",
    "RDATA events master 99999999999999999999999 []",
    "RDATA events master BATCH []",
    "RDATA events master 1 ",
    "RDATA events master 1 {}",
    'RDATA events master 1 "row"',
    "RDATA events master 1 5",
    "RDATA events master 1 null",
    "RDATA events master 1 [",
    "RDATA events master 1 [1,]",
    "RDATA events master 1 [1] [2]",
    "RDATA events master 1  [1]",
    "RDATA events master 1 [1] ",
    "RDATA events master 1 [NaN]",
    "RDATA events master 1 [Infinity]",
    "RDATA events master 1 [-Infinity]",
    "RDATA events master 1 [1e999]",
    "RDATA events master 1 [" + "1" * 5000 + "]",
    'RDATA events master 1 ["\\ud800"]',
    'RDATA events master 1 ["\\udc00x"]',
    'RDATA events master 1 ["a\tb"]',
    "RDATA events master 1 " + "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1),
    "RDATA events master 1 " + "[" * 5000 + "]" * 5000,
    "RDATA events master 1 " + '[{"a":' * 3000 + "1" + "}]" * 3000,
    "RDATA events master 1 " + "[" * 8000,
    # POSITION
    "POSITION events master 1",
    "POSITION events master 1 2 3",
    "POSITION events master one 2",
    "POSITION events master 1 2.0",
    "POSITION events master 1  2",
    "POSITION events master 1 2 ",
    "POSITION events master 1 ' 5'",
    # USER_SYNC
    "USER_SYNC inst @u:x DEV start",
    "USER_SYNC inst @u:x DEV begin 5",
    "USER_SYNC inst @u:x DEV start 5 extra",
    "USER_SYNC inst @u:x DEV start five",
    "USER_SYNC inst @u:x  start 5",
    # FEDERATION_ACK
    "FEDERATION_ACK fed",
    "FEDERATION_ACK fed 1 2",
    "FEDERATION_ACK fed x",
    # USER_IP
    "USER_IP @u:x",
    "USER_IP @u:x []",
    'USER_IP @u:x ["t","ip","ua",null]',
    'USER_IP @u:x ["t","ip","ua",null,5,6]',
    'USER_IP @u:x ["t","ip","ua",null,5.0]',
    'USER_IP @u:x ["t","ip","ua",null,true]',
    'USER_IP @u:x ["t","ip","ua",null,"5"]',
    'USER_IP @u:x ["t","ip","ua",7,5]',
    'USER_IP @u:x ["t",null,"ua",null,5]',
    'USER_IP @u:x {"t":1}',
    'USER_IP @u:x ["t","ip","ua",null,99999999999999999999]',
    # too long
    "PING " + "x" * MAX_LINE_LENGTH,
    "PING " + "é" * (MAX_LINE_LENGTH // 2),
    # not UTF-8 encodable (a str that cannot have come off the wire)
    "PING \udc80",
]


class MalformedLineTestCase(unittest.TestCase):
    def test_malformed_lines_are_refused(self) -> None:
        for line in MALFORMED_LINES:
            try:
                cmd = parse_command_from_line(line)
            except CommandParseError as e:
                # Refused by a rule, not by the catch-all for parser bugs.
                self.assertFalse(str(e).startswith(INTERNAL_ERROR_PREFIX), line[:60])
            else:
                self.fail(f"{line[:60]!r} parsed as {cmd!r}")

    def test_longest_line_accepted(self) -> None:
        line = "PING " + "x" * (MAX_LINE_LENGTH - 5)
        self.assertEqual(parse_command_from_line(line), PingCommand("x" * (MAX_LINE_LENGTH - 5)))

    def test_messages_are_clear(self) -> None:
        def error(line: str) -> str:
            with self.assertRaises(CommandParseError) as cm:
                parse_command_from_line(line)
            return str(cm.exception)

        self.assertEqual(error("NOPE x"), "unknown command 'NOPE'")
        self.assertIn("token must be a decimal integer, got '1e3'", error("RDATA s m 1e3 []"))
        self.assertIn("RDATA needs 4 fields", error("RDATA s m 1"))
        self.assertIn("row must be a JSON array", error("RDATA s m 1 {}"))
        self.assertIn("nested", error("RDATA s m 1 " + "[" * 2000 + "]" * 2000))
        # AUTH errors never echo the secret.
        self.assertNotIn("hunter2", error("AUTH hunter2\nx"))


# Characters that make up commands and JSON, so fuzzing reaches deep into parsers.
_FUZZ_ALPHABET = string.ascii_letters + string.digits + ' []{}",:.-+eE\\/_@!$\t\x00é'


def _fuzz_lines() -> st.SearchStrategy[str]:
    prefixed = st.tuples(
        st.sampled_from(sorted(COMMAND_MAP)), st.text(alphabet=_FUZZ_ALPHABET, max_size=60)
    ).map(lambda t: f"{t[0]} {t[1]}")
    return st.one_of(st.text(max_size=60), prefixed)


class FuzzTestCase(unittest.TestCase):
    @settings(max_examples=1000, deadline=None)
    @given(_fuzz_lines())
    def test_only_command_parse_error_escapes(self, line: str) -> None:
        try:
            cmd = parse_command_from_line(line)
        except CommandParseError as e:
            self.assertFalse(str(e).startswith(INTERNAL_ERROR_PREFIX), str(e))
        else:
            # What parses prints back to a line that parses to the same.
            self.assertEqual(parse_command_from_line(command_line(cmd)), cmd)

    @settings(max_examples=300, deadline=None)
    @given(
        st.sampled_from(["RDATA s w 1 ", "USER_IP @u:x "]),
        st.text(alphabet='[]{}",:0123456789.eE-+ \\utrfalsn', max_size=40),
    )
    def test_json_fuzz(self, prefix: str, text: str) -> None:
        try:
            parse_command_from_line(prefix + text)
        except CommandParseError as e:
            self.assertFalse(str(e).startswith(INTERNAL_ERROR_PREFIX), str(e))


# -- serialising refuses what would not parse ------------------------------------------


class EncodeRefusalTestCase(unittest.TestCase):
    def test_refused(self) -> None:
        deep: Any = []
        for _ in range(MAX_JSON_DEPTH):
            deep = [deep]
        cases: list[Command] = [
            PingCommand("a\nb"),
            ErrorCommand("x" * MAX_LINE_LENGTH),
            RdataCommand("events", "master", 1, ["x" * MAX_LINE_LENGTH]),
            RdataCommand("events", "master", 1, ["é" * (MAX_LINE_LENGTH // 2)]),
            RdataCommand("my events", "master", 1, []),
            RdataCommand("", "master", 1, []),
            RdataCommand("events", "master", True, []),
            RdataCommand("events", "master", 2**63, []),
            RdataCommand("events", "master", 1, [float("nan")]),
            RdataCommand("events", "master", 1, [object()]),
            RdataCommand("events", "master", 1, [deep]),
            RdataCommand("events", "master", 1, ["\ud800"]),
            RdataCommand("events", "master", 1, ("not", "a", "list")),  # type: ignore[arg-type]
            PositionCommand("events", "mas\nter", 1, 2),
            PositionCommand("events", "master", 1, 2.5),  # type: ignore[arg-type]
            UserSyncCommand("inst", "@u:x", "None", True, 1),
            UserSyncCommand("inst", "@u:x", "DEV ICE", True, 1),
            UserIpCommand("@u:x", "t", "ip", "ua", None, True),
            UserIpCommand("@u:x", "t", "ip", "ua\ud800", None, 1),
            AuthCommand(""),
            AuthCommand("a\nb"),
            NameCommand("two words"),
            SubscribeCommand(("events", "two words")),
            SubscribeCommand(("",)),
        ]
        for cmd in cases:
            try:
                line = command_line(cmd)
            except CommandEncodeError:
                pass
            else:
                self.fail(f"{cmd!r:.80} printed as {line!r:.80}")

    def test_exactly_max_length_is_allowed(self) -> None:
        cmd = PingCommand("x" * (MAX_LINE_LENGTH - len("PING ")))
        self.assertEqual(len(command_line(cmd)), MAX_LINE_LENGTH)
        with self.assertRaises(CommandEncodeError):
            command_line(PingCommand("x" * (MAX_LINE_LENGTH - len("PING ")) + "x"))

    def test_deepest_allowed_row(self) -> None:
        row: Any = []
        for _ in range(MAX_JSON_DEPTH - 1):
            row = [row]
        cmd = RdataCommand("events", "master", 1, row)
        self.assertEqual(parse_command_from_line(command_line(cmd)), cmd)
