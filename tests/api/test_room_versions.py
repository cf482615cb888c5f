"""The room version table: what each of the spec's versions 1 to 12 does."""

from __future__ import annotations

from twisted.trial import unittest

from synapse_lite.api.room_versions import (
    DEFAULT_ROOM_VERSION,
    KNOWN_ROOM_VERSIONS,
    SPEC_ROOM_VERSIONS,
    EventIdFormat,
    StateResolution,
)


class RoomVersionTable(unittest.TestCase):
    def test_spec_versions(self) -> None:
        self.assertEqual(list(SPEC_ROOM_VERSIONS), [str(n) for n in range(1, 13)])
        # All are created and served; the default stays 10 (docs/event-graph.md).
        self.assertEqual(list(KNOWN_ROOM_VERSIONS), [str(n) for n in range(1, 13)])
        self.assertEqual(DEFAULT_ROOM_VERSION.identifier, "10")

    def test_creators(self) -> None:
        content = {"creator": "@c:hs", "additional_creators": ["@b:hs", 1]}
        by_version = {
            v: SPEC_ROOM_VERSIONS[v].creators("@a:hs", content) for v in ("10", "11", "12")
        }
        self.assertEqual(by_version, {"10": {"@c:hs"}, "11": {"@a:hs"}, "12": {"@a:hs", "@b:hs"}})

    def test_features(self) -> None:
        def having(feature: str) -> list[int]:
            return [int(k) for k, v in SPEC_ROOM_VERSIONS.items() if getattr(v, feature)]

        self.assertEqual(having("enforce_key_validity"), list(range(5, 13)))
        self.assertEqual(having("redaction_auth_rule"), [1, 2])
        self.assertEqual(having("knocking"), list(range(7, 13)))
        self.assertEqual(having("restricted_joins"), list(range(8, 13)))
        self.assertEqual(having("knock_restricted"), list(range(10, 13)))
        self.assertEqual(having("integer_power_levels"), list(range(10, 13)))
        self.assertEqual(having("updated_redaction_rules"), [11, 12])
        self.assertEqual(having("hashed_room_ids"), [12])
        algorithms = [v.state_resolution for v in SPEC_ROOM_VERSIONS.values()]
        self.assertEqual(
            algorithms,
            [StateResolution.V1] + [StateResolution.V2] * 10 + [StateResolution.V2_1],
        )
        formats = [v.event_ids for v in SPEC_ROOM_VERSIONS.values()]
        self.assertEqual(formats[:3], [
            EventIdFormat.SERVER_SUFFIXED, EventIdFormat.SERVER_SUFFIXED,
            EventIdFormat.REFERENCE_HASH_BASE64,
        ])  # fmt: skip
        self.assertEqual(set(formats[3:]), {EventIdFormat.REFERENCE_HASH_URL_SAFE})
