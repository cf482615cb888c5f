"""The authorisation rules of room versions 1 to 12 (event_graph/authorisation.py):
a table of events, each breaking (or keeping) one rule, and property tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attr
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial import unittest

from synapse_lite.api.room_versions import SPEC_ROOM_VERSIONS
from synapse_lite.event_graph.authorisation import (
    EventAuthError,
    auth_events_state,
    auth_types_for_event,
    authorise,
    redaction_applies,
)
from synapse_lite.event_graph.pdu import Pdu
from synapse_lite.federation.crypto import SigningKey, sign_json
from tests.event_graph.rooms import ALICE, BOB, CAROL, EVE, Room

ALL = [str(n) for n in range(1, 13)]


def check(room: Room, event: Pdu) -> None:
    """Authorise ``event`` against the state before it (its parents')."""
    state = {}
    for parent in event.prev_event_ids:
        state.update(room.state(parent))
    authorise(room.version, event, state)


def joined(version: str, users: dict[str, int] | None = None, **create: Any) -> Room:
    """A public room with Bob joined (and Alice, its creator, at 100)."""
    room = Room(version, **create)
    room.standard(users)
    room.member(BOB, "join")
    return room


def unlevelled(version: str) -> Room:
    """A public room with no power levels event, Bob joined."""
    room = Room(version)
    room.member(ALICE, "join")
    room.add("m.room.join_rules", ALICE, {"join_rule": "public"}, state_key="")
    room.member(BOB, "join")
    return room


def ruled(version: str, join_rule: str) -> Room:
    """A room as :func:`joined` gives it, with ``join_rule``."""
    room = joined(version)
    room.add("m.room.join_rules", ALICE, {"join_rule": join_rule}, state_key="")
    return room


def restricted_join(room: Room, authoriser: str) -> Pdu:
    """Carol's join, authorised by ``authoriser``."""
    return room.member(CAROL, "join", content={"join_authorised_via_users_server": authoriser})


def power_levels(room: Room, sender: str, users: dict[str, Any] | None = None, **named: Any) -> Pdu:
    """A power levels event giving ``users`` (and Alice 100 before version
    12, where creators are never listed) and the ``named`` levels."""
    levels = {**_v12_admin(room), **(users or {})}
    return room.add("m.room.power_levels", sender, {"users": levels, **named}, state_key="")


def _v12_admin(room: Room) -> dict[str, int]:
    return {} if room.version.hashed_room_ids else {ALICE: 100}


#: (name, versions, the event to check (its room made too), expected failure or None).
Case = tuple[str, list[str], Callable[[str], tuple[Room, Pdu]], str | None]

CASES: list[Case] = [
    ("creator's join after create", ALL, lambda v: (r := Room(v), r.member(ALICE, "join")), None),
    (
        "other's join after create",
        ALL,
        lambda v: (r := Room(v), r.member(BOB, "join")),
        "invite only",
    ),
    ("public join", ALL, lambda v: (r := joined(v), r.member(CAROL, "join")), None),
    (
        "join for another",
        ALL,
        lambda v: (r := joined(v), r.member(CAROL, "join", sender=BOB)),
        "join only themselves",
    ),
    (
        "banned join",
        ALL,
        lambda v: (
            r := joined(v),
            r.member(CAROL, "ban", sender=ALICE),
            r.member(CAROL, "join"),
        )[::2],
        "banned",
    ),
    (
        "invite-only join",
        ALL,
        lambda v: (r := ruled(v, "invite"), r.member(CAROL, "join")),
        "invite only",
    ),
    (
        "invited join",
        ALL,
        lambda v: (
            r := joined(v),
            r.add("m.room.join_rules", ALICE, {"join_rule": "invite"}, state_key=""),
            r.member(CAROL, "invite", sender=BOB),
            r.member(CAROL, "join"),
        )[::3],
        None,
    ),
    (
        "knock",
        ALL[6:],
        lambda v: (r := ruled(v, "knock"), r.member(CAROL, "knock")),
        None,
    ),
    (
        "knock before version 7",
        ALL[:6],
        lambda v: (r := ruled(v, "knock"), r.member(CAROL, "knock")),
        "unknown membership",
    ),
    (
        "knock on a public room",
        ALL[6:],
        lambda v: (r := joined(v), r.member(CAROL, "knock")),
        "admits no knock",
    ),
    (
        "restricted join authorised",
        ALL[7:],
        lambda v: (
            r := ruled(v, "restricted"),
            restricted_join(r, ALICE),
        ),
        None,
    ),
    (
        "restricted join by a powerless authoriser",
        ALL[7:],
        lambda v: (
            r := joined(v, {"@x:a": 1}),
            power_levels(r, ALICE, None, invite=50),
            r.add("m.room.join_rules", ALICE, {"join_rule": "restricted"}, state_key=""),
            restricted_join(r, BOB),
        )[::3],
        "may not invite",
    ),
    (
        "restricted before version 8",
        ALL[:7],
        lambda v: (
            r := ruled(v, "restricted"),
            restricted_join(r, ALICE),
        ),
        "admits no join",
    ),
    (
        "knock_restricted join",
        ALL[9:],
        lambda v: (
            r := ruled(v, "knock_restricted"),
            restricted_join(r, ALICE),
        ),
        None,
    ),
    (
        "join right after create by content.creator (1-10)",
        ALL[:10],
        lambda v: (r := Room(v, named_creator=BOB), r.member(BOB, "join")),
        None,
    ),
    (
        "join right after create by its sender, not content.creator (1-10)",
        ALL[:10],
        lambda v: (r := Room(v, named_creator=BOB), r.member(ALICE, "join")),
        "invite only",
    ),
    (
        "join right after create by its sender (11 on)",
        ALL[10:],
        lambda v: (r := Room(v, named_creator=BOB), r.member(ALICE, "join")),
        None,
    ),
    (
        "restricted join authorised by a non-member",
        ALL[7:],
        lambda v: (r := ruled(v, "restricted"), restricted_join(r, EVE)),
        "joined authoriser",
    ),
    (
        "knock by a banned user",
        ALL[6:],
        lambda v: (
            r := ruled(v, "knock"),
            r.member(CAROL, "ban", sender=ALICE),
            r.member(CAROL, "knock"),
        )[::2],
        "cannot knock from ban",
    ),
    (
        "knock for another",
        ALL[6:],
        lambda v: (r := ruled(v, "knock"), r.member(CAROL, "knock", sender=BOB)),
        "only for themselves",
    ),
    (
        "leave after a knock (7 on)",
        ALL[6:],
        lambda v: (
            r := ruled(v, "knock"),
            r.member(CAROL, "knock"),
            r.member(CAROL, "leave"),
        )[::2],
        None,
    ),
    ("invite", ALL, lambda v: (r := joined(v), r.member(CAROL, "invite", sender=BOB)), None),
    (
        "invite by a non-member",
        ALL,
        lambda v: (r := joined(v), r.member(CAROL, "invite", sender=EVE)),
        "not joined",
    ),
    (
        "invite of a member",
        ALL,
        lambda v: (r := joined(v), r.member(BOB, "invite", sender=ALICE)),
        "membership is join",
    ),
    (
        "invite below the invite level",
        ALL,
        lambda v: (
            r := joined(v),
            power_levels(r, ALICE, None, invite=50),
            r.member(CAROL, "invite", sender=BOB),
        )[::2],
        "may not invite",
    ),
    ("leave", ALL, lambda v: (r := joined(v), r.member(BOB, "leave")), None),
    (
        "leave without being in",
        ALL,
        lambda v: (r := joined(v), r.member(CAROL, "leave")),
        "cannot leave",
    ),
    ("kick", ALL, lambda v: (r := joined(v), r.member(BOB, "leave", sender=ALICE)), None),
    (
        "kick of a higher user",
        ALL,
        lambda v: (r := joined(v), r.member(ALICE, "leave", sender=BOB)),
        "may not kick",
    ),
    ("ban", ALL, lambda v: (r := joined(v), r.member(BOB, "ban", sender=ALICE)), None),
    (
        "ban of a higher user",
        ALL,
        lambda v: (r := joined(v), r.member(ALICE, "ban", sender=BOB)),
        "may not ban",
    ),
    (
        "unban below the ban level",
        ALL,
        lambda v: (
            r := joined(v, {BOB: 50}),
            r.member(CAROL, "ban", sender=ALICE),
            power_levels(r, ALICE, {BOB: 50}, ban=60),
            r.member(CAROL, "leave", sender=BOB),
        )[::3],
        "may not unban",
    ),
    (
        "unknown membership",
        ALL,
        lambda v: (r := joined(v), r.member(BOB, "dance")),
        "unknown membership",
    ),
    (
        "message from a non-member",
        ALL,
        lambda v: (r := joined(v), r.add("m.room.message", EVE, {})),
        "not joined",
    ),
    (
        "state below state_default",
        ALL,
        lambda v: (r := joined(v), r.add("m.room.topic", BOB, {}, state_key="")),
        "too low",
    ),
    (
        # The spec's m.room.power_levels text once said 0 here; it was
        # corrected (matrix-spec#1479) to the rules' 50: without it anyone
        # who joined could take a room its creator set up without levels.
        "state without a power levels event needs 50",
        ALL,
        lambda v: (r := unlevelled(v), r.add("m.room.power_levels", BOB, {}, state_key="")),
        "too low",
    ),
    (
        "the creator's state without a power levels event",
        ALL,
        lambda v: (r := unlevelled(v), r.add("m.room.topic", ALICE, {}, state_key="")),
        None,
    ),
    (
        "state key of another user",
        ALL,
        lambda v: (
            r := joined(v, {BOB: 50}),
            r.add("m.custom", BOB, {}, state_key=ALICE),
        ),
        "starting with @",
    ),
    (
        "aliases of the sender's server (versions 1-5)",
        ALL[:5],
        lambda v: (r := joined(v), r.add("m.room.aliases", EVE, {}, state_key="e")),
        None,
    ),
    (
        "aliases of another server (versions 1-5)",
        ALL[:5],
        lambda v: (r := joined(v), r.add("m.room.aliases", EVE, {}, state_key="a")),
        "sender's server",
    ),
    (
        "aliases from a non-member (version 6 on)",
        ALL[5:],
        lambda v: (r := joined(v), r.add("m.room.aliases", EVE, {}, state_key="e")),
        "not joined",
    ),
    (
        "redaction of another server's event below the redact level (1-2)",
        ALL[:2],
        lambda v: (r := joined(v), r.add("m.room.redaction", BOB, {"redacts": "$x:elsewhere"})),
        "may not redact",
    ),
    (
        "redaction below the redact level (3 on: no rule)",
        ALL[2:],
        lambda v: (r := joined(v), r.add("m.room.redaction", BOB, {"redacts": "$x:elsewhere"})),
        None,
    ),
    (
        "third-party invite below the invite level",
        ALL,
        lambda v: (
            r := joined(v),
            power_levels(r, ALICE, None, invite=50),
            r.add("m.room.third_party_invite", BOB, {}, state_key="tok"),
        )[::2],
        "may not invite",
    ),
    (
        "no federation",
        ALL,
        lambda v: (r := joined(v, None, **{"m.federate": False}), r.add("m.room.message", BOB, {})),
        "does not federate",
    ),
    (
        "power levels raised above the sender's",
        ALL,
        lambda v: (
            r := joined(v, {BOB: 50}),
            power_levels(r, BOB, {BOB: 50, CAROL: 60}, state_default=50),
        ),
        "above its own",
    ),
    (
        "power levels demoting an equal",
        ALL,
        lambda v: (
            r := joined(v, {BOB: 50, CAROL: 50}),
            power_levels(r, BOB, {BOB: 50, CAROL: 0}),
        ),
        "may not change users",
    ),
    (
        "power levels changing ban above the sender's",
        ALL,
        lambda v: (
            r := joined(v, {BOB: 50}),
            power_levels(r, BOB, {BOB: 50}, ban=70),
        ),
        "may not change 'ban'",
    ),
    (
        "power levels lowering oneself",
        ALL,
        lambda v: (
            r := joined(v, {BOB: 50}),
            power_levels(r, BOB, {BOB: 10}),
        ),
        None,
    ),
    (
        "string power levels (before 10)",
        ALL[:9],
        lambda v: (
            r := joined(v),
            r.add(
                "m.room.power_levels", ALICE, {"users": {ALICE: "100"}, "ban": "50"}, state_key=""
            ),
        ),
        None,
    ),
    (
        "float power levels, truncated (1-5)",
        ALL[:5],
        lambda v: (
            r := joined(v, {BOB: 50}),
            power_levels(r, BOB, {BOB: 50.9, CAROL: 50.57}),
        ),
        None,
    ),
    (
        "float power levels above the sender's once truncated (1-5)",
        ALL[:5],
        lambda v: (
            r := joined(v, {BOB: 50}),
            power_levels(r, BOB, {BOB: 50, CAROL: 51.2}),
        ),
        "above its own",
    ),
    (
        "float power levels (6 on)",
        ALL[5:],
        lambda v: (r := joined(v, {BOB: 50}), power_levels(r, BOB, {BOB: 50, CAROL: 10.5})),
        "integers",
    ),
    (
        "string power levels (10 on)",
        ALL[9:],
        lambda v: (
            r := joined(v),
            power_levels(r, ALICE, None, ban="50"),
        ),
        "not an integer",
    ),
    (
        "notifications raised above the sender's (6 on)",
        ALL[5:],
        lambda v: (
            r := joined(v, {BOB: 50}),
            power_levels(r, BOB, {BOB: 50}, notifications={"room": 60}),
        ),
        "above its own",
    ),
    (
        "creators in users (12)",
        ["12"],
        lambda v: (
            r := joined(v),
            r.add("m.room.power_levels", ALICE, {"users": {ALICE: 100}}, state_key=""),
        ),
        "creators",
    ),
    (
        "additional creator kicks anyone (12)",
        ["12"],
        lambda v: (
            r := joined(v, {BOB: 100}, additional_creators=[CAROL]),
            r.member(CAROL, "join"),
            r.member(BOB, "leave", sender=CAROL),
        )[::2],
        None,
    ),
    (
        "creator cannot be kicked (12)",
        ["12"],
        lambda v: (r := joined(v, {BOB: 100}), r.member(ALICE, "leave", sender=BOB)),
        "may not kick",
    ),
]


class AuthRuleTable(unittest.TestCase):
    def test_cases(self) -> None:
        for name, versions, make, failure in CASES:
            for version in versions:
                made = make(version)
                self.assertEqual(len(made), 2, name)
                room, event = made
                where = f"{name} (v{version})"
                if failure is None:
                    try:
                        check(room, event)
                    except EventAuthError as e:
                        self.fail(f"{where}: rejected: {e.reason}")
                else:
                    with self.assertRaises(EventAuthError, msg=where) as caught:
                        check(room, event)
                    self.assertIn(failure, caught.exception.reason, where)


class CreateRules(unittest.TestCase):
    def _create(self, version: str, **kw: Any) -> Pdu:
        return attr.evolve(Room(version).create, **kw)

    def test_create(self) -> None:
        for version in ALL:
            v = SPEC_ROOM_VERSIONS[version]
            authorise(v, Room(version).create, {})
            self.assertRaises(
                EventAuthError, authorise, v, self._create(version, prev_event_ids=("$x",)), {}
            )
            bad_version = self._create(version, content={"room_version": "99", "creator": ALICE})
            self.assertRaises(EventAuthError, authorise, v, bad_version, {})
        self.assertRaises(
            EventAuthError, authorise, SPEC_ROOM_VERSIONS["10"], self._create("10", content={}), {}
        )
        authorise(SPEC_ROOM_VERSIONS["11"], self._create("11", content={}), {})
        other_server = self._create("10", room_id="!r:elsewhere")
        self.assertRaises(EventAuthError, authorise, SPEC_ROOM_VERSIONS["10"], other_server, {})
        bad_creators = self._create("12", content={"additional_creators": ["nope"]})
        self.assertRaises(EventAuthError, authorise, SPEC_ROOM_VERSIONS["12"], bad_creators, {})

    def test_v12_room_id_must_be_the_create_events(self) -> None:
        room = joined("12")
        event = room.add("m.room.message", BOB, {})
        moved = attr.evolve(event, room_id="!other")
        with self.assertRaises(EventAuthError):
            check(room, moved)


class AuthEventSelection(unittest.TestCase):
    def test_selection(self) -> None:
        room = joined("10")
        join = room.member(CAROL, "join", content={"join_authorised_via_users_server": ALICE})
        self.assertEqual(
            auth_types_for_event(room.version, join),
            {
                ("m.room.create", ""),
                ("m.room.power_levels", ""),
                ("m.room.join_rules", ""),
                ("m.room.member", CAROL),
                ("m.room.member", ALICE),
            },
        )
        v12 = joined("12")
        message = v12.add("m.room.message", BOB, {})
        self.assertEqual(
            auth_types_for_event(v12.version, message),
            {("m.room.power_levels", ""), ("m.room.member", BOB)},
        )

    def test_auth_events_state(self) -> None:
        room = joined("10")
        message = room.add("m.room.message", BOB, {})
        auth = [room.events[e] for e in message.auth_event_ids]
        state = auth_events_state(room.version, message, auth)
        authorise(room.version, message, state)
        topic = room.add("m.room.topic", ALICE, {}, state_key="")
        for bad, why in [
            ([*auth, topic], "not one to select"),
            ([*auth, auth[0]], "two auth events"),
            ([a for a in auth if a.type != "m.room.create"], "no create event"),
        ]:
            with self.assertRaises(EventAuthError) as caught:
                auth_events_state(room.version, message, bad)
            self.assertIn(why, caught.exception.reason)
        with self.assertRaises(EventAuthError):
            auth_events_state(room.version, message, auth, rejected={auth[0].event_id})
        with self.assertRaises(EventAuthError):
            auth_events_state(
                room.version, message, [attr.evolve(auth[0], room_id="!x:a"), *auth[1:]]
            )
        v12 = joined("12")
        message = v12.add("m.room.message", BOB, {})
        auth = [v12.events[e] for e in message.auth_event_ids]
        self.assertNotIn(v12.create, auth)
        with self.assertRaises(EventAuthError):
            auth_events_state(v12.version, message, auth)
        authorise(v12.version, message, auth_events_state(v12.version, message, auth, v12.create))


class ThirdPartyInvites(unittest.TestCase):
    def test_signed_invite(self) -> None:
        key = SigningKey.generate()
        for version in ("1", "10", "12"):
            room = joined(version)
            room.add(
                "m.room.third_party_invite",
                BOB,
                {"public_key": key.verify_key_base64},
                state_key="tok",
            )
            signed = sign_json({"mxid": CAROL, "token": "tok"}, "idserver", key)
            invite = room.member(
                CAROL, "invite", sender=BOB, content={"third_party_invite": {"signed": signed}}
            )
            check(room, invite)
            self.assertIn(
                ("m.room.third_party_invite", "tok"), auth_types_for_event(room.version, invite)
            )
            forged = {**signed, "mxid": EVE}
            wrong = room.member(
                EVE, "invite", sender=BOB, content={"third_party_invite": {"signed": forged}}
            )
            self.assertRaises(EventAuthError, check, room, wrong)
            by_other = room.member(
                CAROL, "invite", sender=ALICE, content={"third_party_invite": {"signed": signed}}
            )
            self.assertRaises(EventAuthError, check, room, by_other)


#: Content keys the rules read, and some they do not.
KEYS = [
    "membership", "users", "users_default", "events", "notifications", "ban", "kick",
    "invite", "state_default", "join_rule", "third_party_invite", "signed", "mxid", "token",
    "signatures", "join_authorised_via_users_server", "room_version", "creator",
    "additional_creators", "m.federate", "other",
]  # fmt: skip

USERS = st.sampled_from([ALICE, BOB, CAROL, EVE])


class Properties(unittest.TestCase):
    @settings(max_examples=60, deadline=None)
    @given(
        version=st.sampled_from(ALL),
        steps=st.lists(
            st.tuples(
                st.sampled_from(["topic", "message", "join", "invite", "kick", "ban"]), USERS
            ),
            max_size=12,
        ),
    )
    def test_the_creator_may_always_act_in_a_room_it_set_up(
        self, version: str, steps: list[tuple[str, str]]
    ) -> None:
        """Whatever others do (when allowed), the creator (100, or
        infinite in 12) sends state, messages and kicks others."""
        room = joined(version)
        for action, user in steps:
            if action == "topic":
                event = room.add("m.room.topic", ALICE, {"topic": user}, state_key="")
            elif action == "message":
                event = room.add("m.room.message", ALICE, {})
            elif action == "join":
                event = room.member(user, "join")
            elif action == "invite":
                event = room.member(user, "invite", sender=BOB)
            elif action == "kick" and user != ALICE:
                event = room.member(user, "leave", sender=ALICE)
            elif action == "kick":
                continue
            else:
                event = room.member(user, "ban", sender=BOB)
            try:
                check(room, event)
            except EventAuthError:
                # Drop what the rules refuse, as a server would (keep the
                # state of the event before it).
                room.state_after[event.event_id] = dict(room.state_after[event.prev_event_ids[0]])
                if event.sender == ALICE:
                    raise
        check(room, room.add("m.room.topic", ALICE, {"topic": "end"}, state_key=""))

    @settings(max_examples=60, deadline=None)
    @given(
        version=st.sampled_from(ALL),
        sender_level=st.integers(0, 100),
        before=st.integers(0, 100),
        after=st.integers(0, 100),
    )
    def test_no_one_grants_or_takes_more_than_their_own_power(
        self, version: str, sender_level: int, before: int, after: int
    ) -> None:
        room = joined(version, {BOB: sender_level, CAROL: before})
        room.member(CAROL, "join")
        users = {**_v12_admin(room), BOB: sender_level, CAROL: after}
        change = room.add("m.room.power_levels", BOB, {"users": users}, state_key="")
        allowed = before == after or (before < sender_level and after <= sender_level)
        if sender_level < 50:  # state_default: BOB may not send power levels at all
            allowed = False
        try:
            check(room, change)
            self.assertTrue(allowed, (sender_level, before, after))
        except EventAuthError:
            self.assertFalse(allowed, (sender_level, before, after))

    @settings(max_examples=60, deadline=None)
    @given(version=st.sampled_from(ALL), bob=st.integers(0, 100), carol=st.integers(0, 100))
    def test_kick_and_ban_need_more_power_than_the_target(
        self, version: str, bob: int, carol: int
    ) -> None:
        for membership, needed in (("leave", "kick"), ("ban", "ban")):
            room = joined(version, {BOB: bob, CAROL: carol})
            room.member(CAROL, "join")
            event = room.member(CAROL, membership, sender=BOB)
            allowed = bob >= 50 and carol < bob
            try:
                check(room, event)
                self.assertTrue(allowed, needed)
            except EventAuthError:
                self.assertFalse(allowed, needed)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.text(max_size=5)
    | st.sampled_from(
        [ALICE, BOB, "join", "invite", "leave", "ban", "knock", "public", "restricted"]
    ),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(KEYS), children, max_size=4)
    ),
    max_leaves=12,
)


class HostileContent(unittest.TestCase):
    @settings(max_examples=150, deadline=None)
    @given(
        version=st.sampled_from(ALL),
        event_type=st.sampled_from(
            ["m.room.member", "m.room.power_levels", "m.room.join_rules", "m.room.create"]
        ),
        content=st.dictionaries(st.sampled_from(KEYS), JSON, max_size=5),
        state_key=st.sampled_from([None, "", ALICE, CAROL]),
    )
    def test_any_content_is_allowed_or_refused_with_a_reason(
        self, version: str, event_type: str, content: dict[str, Any], state_key: str | None
    ) -> None:
        room = joined(version)
        event = room.add(event_type, BOB, content, state_key=state_key)
        try:
            check(room, event)
        except EventAuthError as e:
            self.assertTrue(e.reason)


class SelectionMatchesTheRules(unittest.TestCase):
    @settings(max_examples=60, deadline=None)
    @given(
        version=st.sampled_from(ALL),
        steps=st.lists(
            st.tuples(
                st.sampled_from(["topic", "levels", "rule", "join", "invite", "leave", "ban"]),
                USERS,
                USERS,
                st.integers(0, 100),
            ),
            max_size=12,
        ),
    )
    def test_auth_events_decide_as_the_state_they_were_selected_from(
        self, version: str, steps: list[tuple[str, str, str, int]]
    ) -> None:
        """The rules read only the keys the selection cites: an event is
        allowed by its auth events exactly when it is by the whole state
        they were selected from."""
        room = joined(version)
        for action, sender, target, level in steps:
            if action == "topic":
                event = room.add("m.room.topic", sender, {"topic": "t"}, state_key="")
            elif action == "levels":
                event = power_levels(room, sender, {target: level})
            elif action == "rule":
                rule = ["public", "invite", "knock", "restricted"][level % 4]
                event = room.add("m.room.join_rules", sender, {"join_rule": rule}, state_key="")
            else:
                event = room.member(target, action, sender=sender)
            state = room.state(event.prev_event_ids[0])
            auth = [room.events[e] for e in event.auth_event_ids]
            by_auth = auth_events_state(room.version, event, auth, create=room.create)
            outcomes: list[str | None] = []
            for chosen in (state, by_auth):
                try:
                    authorise(room.version, event, chosen)
                    outcomes.append(None)
                except EventAuthError as e:
                    outcomes.append(e.reason)
            self.assertEqual(outcomes[0], outcomes[1], (action, sender, target))


class RedactionAppliesTest(unittest.TestCase):
    """``redaction_applies``: which accepted redactions redact their target
    (the spec's "Handling redactions")."""

    def setUp(self) -> None:
        self.room = joined("10")
        self.message = self.room.add("m.room.message", BOB, {"body": "hi"})

    def redaction(self, sender: str, target: str, room_id: str | None = None) -> Pdu:
        event = self.room.add("m.room.redaction", sender, {"redacts": target}, ts=None)
        event = attr.evolve(event, redacts=target)
        return attr.evolve(event, room_id=room_id) if room_id is not None else event

    def applies(self, redaction: Pdu, target: Pdu | None = None) -> bool:
        state = self.room.state(redaction.event_id)
        return redaction_applies(self.room.version, redaction, target or self.message, state)

    def test_own_server_applies(self) -> None:
        self.assertTrue(self.applies(self.redaction(BOB, self.message.event_id)))

    def test_another_server_needs_the_power_to_redact(self) -> None:
        self.room.member(CAROL, "join")
        # Carol (server c, level 0) may not redact Bob's (server b) event.
        self.assertFalse(self.applies(self.redaction(CAROL, self.message.event_id)))
        # Alice (level 100, redact default 50) may.
        self.assertTrue(self.applies(self.redaction(ALICE, self.message.event_id)))

    def test_another_room_and_itself_never_apply(self) -> None:
        other_room = self.redaction(BOB, self.message.event_id, room_id="!other:b")
        self.assertFalse(self.applies(other_room))
        itself = self.redaction(BOB, "$x")
        self.assertFalse(self.applies(itself, itself))

    def test_versions_1_and_2_trust_the_rules(self) -> None:
        self.room = joined("1")
        self.message = self.room.add("m.room.message", BOB, {"body": "hi"})
        self.room.member(CAROL, "join")
        # Accepted there means the rules checked it (event id domains).
        self.assertTrue(self.applies(self.redaction(CAROL, self.message.event_id)))
